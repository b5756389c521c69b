"""Route listing the models sessions may use: what a client offers when a session is made."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel, Field

from app.api.bodies import JSONRoute
from app.api.deps import Config, Tenant
from app.api.errors import error_responses
from app.llm.catalog import offered_models

router = APIRouter(prefix="/v1/models", tags=["models"], route_class=JSONRoute)


class Model(BaseModel):
    id: str = Field(description="The model string a session's config or an ask names.")
    provider: str = Field(description='"openai", "anthropic", "local" or "compat".')


class ModelList(BaseModel):
    default_model: str = Field(description="The model of sessions that name none.")
    data: list[Model] = Field(
        description="The default model, then one for each configured provider. Other names a "
        "configured provider serves work too."
    )


@router.get("", operation_id="listModels", responses=error_responses(401, 422))
async def list_models(tenant: Tenant, settings: Config) -> ModelList:
    """The models of the configured providers."""
    return ModelList(
        default_model=settings.default_model,
        data=[Model(id=m, provider=m.partition(":")[0]) for m in offered_models(settings)],
    )
