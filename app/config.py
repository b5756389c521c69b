"""Settings: the one source of configuration, read from THREADLINE_* environment variables."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="THREADLINE_", env_file=".env", extra="ignore")

    database_url: str | None = Field(
        default=None,
        description=(
            "Postgres URL (postgresql://user:pass@host/db). Unset: `threadline serve` starts an "
            "embedded cluster under data_dir."
        ),
    )
    data_dir: Path = Field(
        default=Path(".threadline"),
        description="Where the embedded Postgres cluster and the development key live.",
    )
    host: str = Field(default="127.0.0.1", description="Address the API binds to.")
    port: int = Field(default=8000, ge=0, le=65535, description="Port the API binds to.")
    dev_key: bool = Field(
        default=True,
        description=(
            "With the embedded database, create a development tenant and API key on first start "
            "and print it on every start."
        ),
    )
    default_model: str = Field(
        default="local:gemma-3-270m",
        description="The model of sessions that name none (provider:name).",
    )
    context_policy: dict[str, Any] = Field(
        default_factory=dict,
        description="Server-wide context policy fields (JSON), under each session's and ask's.",
    )
    max_request_bytes: int = Field(
        default=1_048_576, ge=1024, description="Request bodies above this size answer 413."
    )
    max_append_entries: int = Field(
        default=1000, ge=1, description="Most entries one append request may carry."
    )
    max_page_size: int = Field(default=500, ge=1, description="Largest `limit` a list accepts.")
    db_pool_size: int = Field(
        default=20, ge=1, description="Pooled connections per process (as many again overflow)."
    )
    log_level: str = Field(default="info", description="uvicorn/app log level.")

    @property
    def embedded(self) -> bool:
        return self.database_url is None

    @property
    def sqlalchemy_url(self) -> str:
        """The database URL in the asyncpg dialect SQLAlchemy needs."""
        if self.database_url is None:
            raise RuntimeError("no database URL: start the embedded cluster first")
        return to_asyncpg_url(self.database_url)


def to_asyncpg_url(url: str) -> str:
    for prefix in ("postgresql+asyncpg://", "postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+asyncpg://" + url[len(prefix) :]
    raise ValueError(f"not a PostgreSQL URL: {url!r}")
