"""Routes for completion webhooks: register, list, read, delete, and the delivery log."""

from __future__ import annotations

from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Query, Response

from app.api.bodies import JSONRoute
from app.api.deps import Config, Engine, Tenant
from app.api.errors import error_responses
from app.api.schemas import (
    Webhook,
    WebhookCreate,
    WebhookCreated,
    WebhookDelivery,
    WebhookDeliveryList,
    WebhookList,
)
from app.credentials import vault_for
from app.services import webhooks as service
from app.services.errors import Invalid

router = APIRouter(prefix="/v1/webhooks", tags=["webhooks"], route_class=JSONRoute)


@router.post(
    "",
    operation_id="createWebhook",
    status_code=201,
    responses=error_responses(400, 401, 404, 413, 422),
)
async def create_webhook(
    body: WebhookCreate, engine: Engine, tenant: Tenant, settings: Config
) -> WebhookCreated:
    """Every run of the tenant (or of `session_id`) that ends, or waits for client tools, is
    POSTed to `url`, signed with the returned secret (Standard Webhooks)."""
    row = await service.register(
        engine,
        tenant,
        url=body.url,
        session_id=str(body.session_id) if body.session_id else None,
        event_types=list(body.event_types) if body.event_types else None,
        vault=vault_for(settings),
    )
    return WebhookCreated.from_row(row)


@router.get("", operation_id="listWebhooks", responses=error_responses(401, 422))
async def list_webhooks(engine: Engine, tenant: Tenant) -> WebhookList:
    return WebhookList(
        data=[Webhook.from_row(r) for r in await service.list_endpoints(engine, tenant)]
    )


@router.get("/{webhook_id}", operation_id="getWebhook", responses=error_responses(401, 404, 422))
async def get_webhook(webhook_id: UUID, engine: Engine, tenant: Tenant) -> Webhook:
    return Webhook.from_row(await service.get_endpoint(engine, tenant, str(webhook_id)))


@router.delete(
    "/{webhook_id}",
    operation_id="deleteWebhook",
    status_code=204,
    responses=error_responses(401, 404, 422),
)
async def delete_webhook(webhook_id: UUID, engine: Engine, tenant: Tenant) -> Response:
    await service.delete_endpoint(engine, tenant, str(webhook_id))
    return Response(status_code=204)


@router.get(
    "/{webhook_id}/deliveries",
    operation_id="listWebhookDeliveries",
    responses=error_responses(401, 404, 422),
)
async def list_deliveries(
    webhook_id: UUID,
    engine: Engine,
    tenant: Tenant,
    settings: Config,
    limit: Annotated[int, Query(ge=1, le=1000)] = 20,
    cursor: Annotated[str | None, Query(max_length=512)] = None,
) -> WebhookDeliveryList:
    """The endpoint's newest deliveries: attempts, the receiver's last answer, when delivered."""
    if limit > settings.max_page_size:
        raise Invalid(
            "limit_too_large",
            f"limit may be at most {settings.max_page_size}",
            {"loc": ["query", "limit"], "max": settings.max_page_size},
        )
    page = await service.deliveries(engine, tenant, str(webhook_id), limit, cursor)
    return WebhookDeliveryList(
        data=[WebhookDelivery.from_row(r) for r in page.items],
        has_more=page.next_cursor is not None,
        next_cursor=page.next_cursor,
    )
