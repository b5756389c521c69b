"""Bodies of the usage report and of the admin API (tenants, keys, limits)."""

from __future__ import annotations

from datetime import date, datetime
from typing import Annotated

from pydantic import BaseModel, Field, StringConstraints

from app.api.schemas import Strict
from app.services import keys as keys_service
from app.services import quotas

TENANT_NAME_PATTERN = r"^[A-Za-z0-9_.:@-]{1,128}$"
TenantName = Annotated[
    str,
    StringConstraints(pattern=TENANT_NAME_PATTERN),
    Field(description="Letters, digits and _ . : @ -, 1 to 128."),
]
Limit = Annotated[int, Field(ge=0, le=2**53 - 1)]


class UsageDay(BaseModel):
    day: date = Field(description="The UTC day the runs ended.")
    tenant: str
    model: str
    runs: int
    input_tokens: int = Field(description="The whole prompt, cached tokens included.")
    output_tokens: int
    cached_tokens: int = Field(description="Prompt tokens read from the provider's cache.")
    cache_write_tokens: int = Field(description="Prompt tokens written to the provider's cache.")
    reasoning_tokens: int = Field(
        default=0,
        description="Of the output, tokens the model reasoned with, where the provider says "
        "(OpenAI's reasoning models); priced as output.",
    )
    cost_usd: float = Field(description="The price of the runs whose model's price is known.")
    unpriced_runs: int = Field(description="Runs of a model without a known price.")


class UsageTotals(BaseModel):
    runs: int
    input_tokens: int
    output_tokens: int
    cached_tokens: int
    cache_write_tokens: int
    reasoning_tokens: int = 0
    cost_usd: float
    unpriced_runs: int


class UsageReport(BaseModel):
    from_: date = Field(alias="from", serialization_alias="from")
    to: date
    data: list[UsageDay]
    totals: UsageTotals

    @classmethod
    def of(cls, report: quotas.UsageReport) -> UsageReport:
        return cls.model_validate(
            {
                "from": report.start,
                "to": report.end,
                "data": [UsageDay.model_validate(r, from_attributes=True) for r in report.rows],
                "totals": report.totals(),
            }
        )


class TenantCreate(Strict):
    name: TenantName


class Tenant(BaseModel):
    id: str
    name: str
    created_at: datetime
    active_keys: int


class TenantList(BaseModel):
    data: list[Tenant]


class ApiKey(BaseModel):
    """What is known of a key; never the key itself (only its hash is kept)."""

    id: str
    tenant: str
    prefix: str = Field(description="The key's first characters, to tell keys apart.")
    name: str | None
    read_only: bool
    created_at: datetime
    last_used_at: datetime | None = Field(description="To the minute.")
    revoked_at: datetime | None = Field(
        description="In the future: the key works until then (a rotation's grace period)."
    )

    @classmethod
    def of(cls, key: keys_service.ApiKey) -> ApiKey:
        return cls.model_validate(key, from_attributes=True)


class ApiKeyList(BaseModel):
    data: list[ApiKey]


class IssuedKey(ApiKey):
    key: str = Field(description="The key: shown this once, only its hash is kept.")

    @classmethod
    def issued(cls, issued: keys_service.IssuedKey) -> IssuedKey:
        return cls.model_validate({**ApiKey.of(issued.info).model_dump(), "key": issued.key})


class KeyCreate(Strict):
    name: Annotated[str, StringConstraints(max_length=200)] | None = None
    read_only: bool = Field(default=False, description="May only read (GET, stream tokens).")


class KeyRotate(Strict):
    grace_seconds: Annotated[int, Field(ge=0, le=30 * 86400)] = Field(
        default=0,
        description="The old key keeps working this long (for clients to switch); 0: revoked "
        "at once.",
    )


class LimitValues(Strict):
    """null: unlimited (in `effective`), or the server's default (in `own` and in a patch)."""

    requests_per_minute: Limit | None = None
    concurrent_runs: Limit | None = None
    input_tokens_per_day: Limit | None = None
    output_tokens_per_day: Limit | None = None
    max_sessions: Limit | None = None


class TenantLimits(BaseModel):
    tenant: str
    own: LimitValues = Field(description="Set for this tenant; null: the server's default.")
    effective: LimitValues = Field(description="In force; null: unlimited.")

    @classmethod
    def of(cls, limits: quotas.TenantLimits) -> TenantLimits:
        return cls(
            tenant=limits.tenant,
            own=LimitValues.model_validate(limits.own, from_attributes=True),
            effective=LimitValues.model_validate(limits.effective, from_attributes=True),
        )
