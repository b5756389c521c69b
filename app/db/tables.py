"""The schema as SQLAlchemy Core tables; migrations/ creates it, queries are built from it."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    Computed,
    Date,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    Numeric,
    PrimaryKeyConstraint,
    Table,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB, TSVECTOR, UUID

metadata = MetaData()

tenants = Table(
    "tenants",
    metadata,
    Column("id", UUID(as_uuid=False), primary_key=True, server_default=text("gen_random_uuid()")),
    Column("name", Text, nullable=False, unique=True),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    # New sessions expire this long after creation unless they say otherwise (null: never).
    Column("session_ttl_seconds", BigInteger),
    CheckConstraint("session_ttl_seconds > 0", name="tenants_session_ttl_positive"),
)

api_keys = Table(
    "api_keys",
    metadata,
    Column("id", UUID(as_uuid=False), primary_key=True, server_default=text("gen_random_uuid()")),
    Column(
        "tenant_id",
        UUID(as_uuid=False),
        ForeignKey("tenants.id", ondelete="CASCADE"),
        nullable=False,
        index=True,
    ),
    # sha256 of the key: keys are 256-bit random, so a fast hash is as safe as a slow one.
    Column("key_hash", Text, nullable=False, unique=True),
    Column("prefix", Text, nullable=False),
    Column("name", Text),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    # In the future: a rotated key's grace period (app/services/keys.py).
    Column("revoked_at", DateTime(timezone=True)),
    Column("read_only", Boolean, nullable=False, server_default=text("false")),
    Column("last_used_at", DateTime(timezone=True)),  # to the minute: written at most once a minute
)

# Quotas of a tenant: NULL is the server's default (THREADLINE_DEFAULT_*), itself unlimited when
# unset.
LIMIT_COLUMNS = (
    "requests_per_minute",
    "concurrent_runs",
    "input_tokens_per_day",
    "output_tokens_per_day",
    "max_sessions",
)
tenant_limits = Table(
    "tenant_limits",
    metadata,
    Column(
        "tenant_id",
        UUID(as_uuid=False),
        ForeignKey("tenants.id", ondelete="CASCADE"),
        nullable=False,
    ),
    *(Column(name, BigInteger) for name in LIMIT_COLUMNS),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    PrimaryKeyConstraint("tenant_id", name="tenant_limits_pkey"),
    *(CheckConstraint(f"{name} >= 0", name=f"tenant_limits_{name}") for name in LIMIT_COLUMNS),
)

# The requests of a tenant's current minute (fixed windows), counted by the API's key lookup.
tenant_request_counts = Table(
    "tenant_request_counts",
    metadata,
    Column(
        "tenant_id",
        UUID(as_uuid=False),
        ForeignKey("tenants.id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column("window_start", DateTime(timezone=True), nullable=False),
    Column("count", BigInteger, nullable=False),
    PrimaryKeyConstraint("tenant_id", name="tenant_request_counts_pkey"),
)

# A day's usage counts (summed as runs end, reported as totals): the tokens, and the runs.
USAGE_COUNTS = (
    "runs",
    "input_tokens",
    "output_tokens",
    "cached_tokens",
    "cache_write_tokens",
    "reasoning_tokens",
)


# What a tenant used, per UTC day and model: added to by each run's end, in the transaction that
# journals its usage entry. Kept when sessions (and their runs and entries) are deleted.
tenant_usage = Table(
    "tenant_usage",
    metadata,
    Column(
        "tenant_id",
        UUID(as_uuid=False),
        ForeignKey("tenants.id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column("day", Date, nullable=False),
    Column("model", Text, nullable=False),
    Column("runs", BigInteger, nullable=False, server_default=text("0")),
    Column("input_tokens", BigInteger, nullable=False, server_default=text("0")),
    Column("output_tokens", BigInteger, nullable=False, server_default=text("0")),
    Column("cached_tokens", BigInteger, nullable=False, server_default=text("0")),
    Column("cache_write_tokens", BigInteger, nullable=False, server_default=text("0")),
    # Of the output, tokens the model reasoned with (where the provider says).
    Column("reasoning_tokens", BigInteger, nullable=False, server_default=text("0")),
    Column("unpriced_runs", BigInteger, nullable=False, server_default=text("0")),  # no known price
    Column("cost_usd", Numeric(20, 10), nullable=False, server_default=text("0")),
    PrimaryKeyConstraint("tenant_id", "day", "model", name="tenant_usage_pkey"),
)

sessions = Table(
    "sessions",
    metadata,
    Column("id", UUID(as_uuid=False), primary_key=True, server_default=text("gen_random_uuid()")),
    Column(
        "tenant_id",
        UUID(as_uuid=False),
        ForeignKey("tenants.id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column("title", Text),
    Column("metadata", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("config", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("status", Text, nullable=False, server_default=text("'idle'")),
    # rev = the last seq of the session's thread (inherited seqs included).
    Column("rev", BigInteger, nullable=False, server_default=text("0")),
    Column("parent_id", UUID(as_uuid=False), ForeignKey("sessions.id", ondelete="SET NULL")),
    Column("fork_seq", BigInteger),
    # [{"session_id", "upto_seq"}...], oldest ancestor first: see app.core.lineage.
    Column("lineage", JSONB, nullable=False, server_default=text("'[]'::jsonb")),
    Column("input_tokens", BigInteger, nullable=False, server_default=text("0")),
    Column("output_tokens", BigInteger, nullable=False, server_default=text("0")),
    Column("cached_tokens", BigInteger, nullable=False, server_default=text("0")),
    Column("cache_write_tokens", BigInteger, nullable=False, server_default=text("0")),
    # Of the output, tokens the model reasoned with (where the provider says).
    Column("reasoning_tokens", BigInteger, nullable=False, server_default=text("0")),
    Column("cost_usd", Numeric(20, 10), nullable=False, server_default=text("0")),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    # Past it the session answers 404, and the retention job purges it (null: never).
    Column("expires_at", DateTime(timezone=True)),
    # Created from an agent: the version it is pinned to, and a copy of that version's config
    # (versions never change) under the session's own `config`, read with the row.
    Column("agent_id", UUID(as_uuid=False)),
    Column("agent_name", Text),
    Column("agent_version", Integer),
    Column("agent_config", JSONB),
    CheckConstraint("rev >= 0", name="sessions_rev_nonnegative"),
    Index("sessions_tenant_created", "tenant_id", text("created_at DESC"), text("id DESC")),
    Index(
        "sessions_metadata",
        "metadata",
        postgresql_using="gin",
        postgresql_ops={"metadata": "jsonb_path_ops"},
    ),
    Index(
        "sessions_lineage",
        "lineage",
        postgresql_using="gin",
        postgresql_ops={"lineage": "jsonb_path_ops"},
    ),
    Index("sessions_parent", "parent_id"),
    Index("sessions_expiring", "expires_at", postgresql_where=text("expires_at IS NOT NULL")),
)

# Agents: a name and its versions (app/services/agents.py). Versions are never changed; a
# deleted agent keeps them, for the sessions pinned to them.
agents = Table(
    "agents",
    metadata,
    Column("id", UUID(as_uuid=False), primary_key=True),
    Column(
        "tenant_id",
        UUID(as_uuid=False),
        ForeignKey("tenants.id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column("name", Text, nullable=False),
    Column("latest_version", Integer, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("deleted_at", DateTime(timezone=True)),
    Index(
        "agents_live_name",
        "tenant_id",
        "name",
        unique=True,
        postgresql_where=text("deleted_at IS NULL"),
    ),
)

agent_versions = Table(
    "agent_versions",
    metadata,
    Column(
        "agent_id", UUID(as_uuid=False), ForeignKey("agents.id", ondelete="CASCADE"), nullable=False
    ),
    Column("version", Integer, nullable=False),
    Column("description", Text),
    Column("config", JSONB, nullable=False),
    Column("metadata", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    PrimaryKeyConstraint("agent_id", "version", name="agent_versions_pkey"),
    CheckConstraint("version > 0", name="agent_versions_positive"),
)

# Every string and number in an entry's payload, for history search (generated by Postgres).
SEARCH_VECTOR = "jsonb_to_tsvector('english', payload, '[\"string\", \"numeric\"]')"

ENTRY_KINDS_SQL = (
    "'message','tool_call','tool_result','summary','run_start','run_end','usage','error',"
    "'policy_violation','rollback','agent_version'"
)

entries = Table(
    "entries",
    metadata,
    Column(
        "session_id",
        UUID(as_uuid=False),
        ForeignKey("sessions.id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column("seq", BigInteger, nullable=False),
    Column("id", Text, nullable=False),
    Column("kind", Text, nullable=False),
    Column("payload", JSONB, nullable=False),
    Column("refs", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("token_count", Integer, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    PrimaryKeyConstraint("session_id", "seq", name="entries_pkey"),
    UniqueConstraint("session_id", "id", name="entries_session_entry_id"),
    CheckConstraint("seq > 0", name="entries_seq_positive"),
    CheckConstraint(f"kind IN ({ENTRY_KINDS_SQL})", name="entries_kind_known"),
    Column(
        "search",
        TSVECTOR,
        Computed(SEARCH_VECTOR, persisted=True),
    ),
    CheckConstraint("token_count >= 0", name="entries_token_count_nonnegative"),
    Index(
        "entries_summaries",
        "session_id",
        "seq",
        postgresql_where=text("kind = 'summary'"),
    ),
)

runs = Table(
    "runs",
    metadata,
    Column("id", UUID(as_uuid=False), primary_key=True, server_default=text("gen_random_uuid()")),
    Column(
        "tenant_id",
        UUID(as_uuid=False),
        ForeignKey("tenants.id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column(
        "session_id",
        UUID(as_uuid=False),
        ForeignKey("sessions.id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column("status", Text, nullable=False, server_default=text("'queued'")),
    # ask: answers a user entry; compaction: appends a summary checkpoint (POST /compact)
    Column("kind", Text, nullable=False, server_default=text("'ask'")),
    Column("model", Text, nullable=False),
    # What the ask asked for: max_output_tokens, temperature, context_policy, metadata,
    # on_disconnect, fallback_model.
    Column("params", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("idempotency_key", Text),
    Column("user_entry_seq", BigInteger),
    Column("end_entry_seq", BigInteger),  # the run_end entry: rollbacks reach up to it
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    Column("result", Text),
    # Why the model's last turn stopped, provider-neutral (app.llm.base.FINISH_REASONS).
    Column("finish_reason", Text),
    Column("error", JSONB),
    Column("cancel_mode", Text),  # set when a cancel was requested: cancel | interrupt | rollback
    Column("job_id", BigInteger),
    # The advisory lock key of the worker running the current attempt (app/worker/lease.py).
    Column("lease", BigInteger),
    Column("workers_lost", Integer, nullable=False, server_default=text("0")),
    Column("action_expires_at", DateTime(timezone=True)),  # requires_action: give up after
    Column("input_tokens", BigInteger, nullable=False, server_default=text("0")),
    Column("output_tokens", BigInteger, nullable=False, server_default=text("0")),
    Column("cached_tokens", BigInteger, nullable=False, server_default=text("0")),
    Column("cache_write_tokens", BigInteger, nullable=False, server_default=text("0")),
    # Of the output, tokens the model reasoned with (where the provider says).
    Column("reasoning_tokens", BigInteger, nullable=False, server_default=text("0")),
    # The server reported no usage: the counts above are our tokenizer's estimate.
    Column("usage_estimated", Boolean, nullable=False, server_default=text("false")),
    Column("cost_usd", Numeric(20, 10)),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("started_at", DateTime(timezone=True)),
    Column("ended_at", DateTime(timezone=True)),
    # Retention dropped its events and finished jobs (app/services/retention.py): done once.
    Column("events_pruned", Boolean, nullable=False, server_default=text("false")),
    UniqueConstraint("session_id", "idempotency_key", name="runs_idempotency_key"),
    CheckConstraint("kind IN ('ask', 'compaction')", name="runs_kind"),
    Index("runs_unfinished", "status", postgresql_where=text("status IN ('queued', 'running')")),
    Index(
        "runs_ended_unpruned",
        "ended_at",
        postgresql_where=text("ended_at IS NOT NULL AND NOT events_pruned"),
    ),
)

# Tool calls that wait for a person's approval (app/core/approvals.py): one row per call,
# created when the run starts waiting, answered once (decision set only while it is null), and
# marked executed by the one worker that runs an approved call (executed_at set only while it
# is null): an approved call runs at most once, whatever posts or workers race.
tool_approvals = Table(
    "tool_approvals",
    metadata,
    Column(
        "run_id", UUID(as_uuid=False), ForeignKey("runs.id", ondelete="CASCADE"), nullable=False
    ),
    Column("tool_call_id", Text, nullable=False),
    Column("name", Text, nullable=False),
    Column("arguments", JSONB, nullable=False),  # as the model gave them
    Column("decision", Text),  # approved | rejected | expired; null while it waits
    Column("edited_arguments", JSONB),  # approved with these instead
    Column("reason", Text),  # a rejection's, which the model reads
    Column("requested_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("decided_at", DateTime(timezone=True)),
    Column("executed_at", DateTime(timezone=True)),
    PrimaryKeyConstraint("run_id", "tool_call_id", name="tool_approvals_pkey"),
    CheckConstraint(
        "decision IN ('approved', 'rejected', 'expired')", name="tool_approvals_decision"
    ),
    CheckConstraint(
        "executed_at IS NULL OR decision = 'approved'", name="tool_approvals_executed_approved"
    ),
)

run_events = Table(
    "run_events",
    metadata,
    Column(
        "run_id", UUID(as_uuid=False), ForeignKey("runs.id", ondelete="CASCADE"), nullable=False
    ),
    Column("seq", Integer, nullable=False),
    Column("type", Text, nullable=False),
    Column("data", JSONB, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    PrimaryKeyConstraint("run_id", "seq", name="run_events_pkey"),
)

# A user's message sent while a run works (multitask_strategy: steer): committed at once, then
# journaled at the run's next model turn (delivered), or as the next run's input if the run ended
# first (next_run), or as a message alone if the run was cancelled (journaled).
steers = Table(
    "steers",
    metadata,
    Column("id", UUID(as_uuid=False), primary_key=True),
    Column(
        "tenant_id",
        UUID(as_uuid=False),
        ForeignKey("tenants.id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column(
        "session_id",
        UUID(as_uuid=False),
        ForeignKey("sessions.id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column(
        "run_id", UUID(as_uuid=False), ForeignKey("runs.id", ondelete="CASCADE"), nullable=False
    ),
    Column("content", JSONB, nullable=False),
    # The run a steer starts if its run ends first: the steer's model and run params.
    Column("model", Text, nullable=False),
    Column("params", JSONB, nullable=False),
    Column("status", Text, nullable=False, server_default=text("'pending'")),
    Column("entry_seq", BigInteger),  # its user message in the journal, once settled
    Column("next_run_id", UUID(as_uuid=False)),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("settled_at", DateTime(timezone=True)),
    # The ask's Idempotency-Key: a repeated steer is the same steer, committed once.
    Column("idempotency_key", Text),
    CheckConstraint(
        "status IN ('pending', 'delivered', 'next_run', 'journaled')", name="steers_status"
    ),
    UniqueConstraint("session_id", "idempotency_key", name="steers_idempotency_key"),
    Index("steers_pending", "run_id", postgresql_where=text("status = 'pending'")),
)

# Persistent memory (the MEMORY.md of an agent or end user): not under a session, so it
# outlives sessions and is untouched by compaction.
memories = Table(
    "memories",
    metadata,
    Column(
        "tenant_id",
        UUID(as_uuid=False),
        ForeignKey("tenants.id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column("namespace", Text(collation="C"), nullable=False),  # byte order: list pages
    Column("content", Text, nullable=False),
    # 1 at creation, +1 per write: the ETag is derived from it and created_at (the generation).
    Column("version", BigInteger, nullable=False, server_default=text("1")),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    PrimaryKeyConstraint("tenant_id", "namespace", name="memories_pkey"),
    CheckConstraint("version > 0", name="memories_version_positive"),
)


# Completion webhooks: a URL told of every run that ends (or waits for client tools), for the
# whole tenant, or for one session (session_id set; deleted with it).
webhook_endpoints = Table(
    "webhook_endpoints",
    metadata,
    Column("id", UUID(as_uuid=False), primary_key=True, server_default=text("gen_random_uuid()")),
    Column(
        "tenant_id",
        UUID(as_uuid=False),
        ForeignKey("tenants.id", ondelete="CASCADE"),
        nullable=False,
        index=True,
    ),
    Column("session_id", UUID(as_uuid=False), ForeignKey("sessions.id", ondelete="CASCADE")),
    Column("url", Text, nullable=False),
    # The signing secret (whsec_<base64>), encrypted at rest (app/credentials.py): the row
    # alone signs nothing.
    Column("encrypted_secret", Text, nullable=False),
    Column("event_types", JSONB(none_as_null=True)),  # null: every event type
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Index(
        "webhook_endpoints_session",
        "session_id",
        postgresql_where=text("session_id IS NOT NULL"),
    ),
)

# One event sent to one endpoint: the body is fixed when the run ends, so every attempt sends
# (and signs) the same bytes; the row is the delivery log.
webhook_deliveries = Table(
    "webhook_deliveries",
    metadata,
    Column("id", UUID(as_uuid=False), primary_key=True, server_default=text("gen_random_uuid()")),
    Column(
        "endpoint_id",
        UUID(as_uuid=False),
        ForeignKey("webhook_endpoints.id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column(
        "run_id",
        UUID(as_uuid=False),
        ForeignKey("runs.id", ondelete="CASCADE"),
        nullable=False,
        index=True,
    ),
    Column("event_type", Text, nullable=False),
    Column("body", Text, nullable=False),
    Column("status", Text, nullable=False, server_default=text("'pending'")),
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    Column("last_status_code", Integer),
    Column("last_error", Text),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("last_attempt_at", DateTime(timezone=True)),
    Column("delivered_at", DateTime(timezone=True)),
    CheckConstraint(
        "status IN ('pending', 'delivered', 'failed')", name="webhook_deliveries_status"
    ),
    Index("webhook_deliveries_endpoint", "endpoint_id", text("created_at DESC"), text("id DESC")),
)

# A tenant's remote MCP tool servers, attached to sessions and asks by name. `credentials` is
# the Fernet token (app/credentials.py) of {"headers": {...}, "bearer_token": ...}: never stored
# nor returned in the clear.
mcp_servers = Table(
    "mcp_servers",
    metadata,
    Column("id", UUID(as_uuid=False), primary_key=True, server_default=text("gen_random_uuid()")),
    Column(
        "tenant_id",
        UUID(as_uuid=False),
        ForeignKey("tenants.id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column("name", Text, nullable=False),
    Column("url", Text, nullable=False),
    Column("transport", Text, nullable=False, server_default=text("'streamable_http'")),
    Column("allowed_tools", JSONB(none_as_null=True)),  # null: every tool the server lists
    Column("credentials", Text),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    UniqueConstraint("tenant_id", "name", name="mcp_servers_tenant_name"),
    CheckConstraint("transport IN ('streamable_http', 'sse')", name="mcp_servers_transport"),
)

# Schedules (app/services/schedules.py): a cron expression in a time zone, what to ask and
# where; `next_due_at` is when a tick fires it next. One firing row per due time: its unique
# (schedule_id, due_at), inserted in the transaction that commits the ask, makes a due time fire
# once however many workers tick.
schedules = Table(
    "schedules",
    metadata,
    Column("id", UUID(as_uuid=False), primary_key=True, server_default=text("gen_random_uuid()")),
    Column(
        "tenant_id",
        UUID(as_uuid=False),
        ForeignKey("tenants.id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column("name", Text, nullable=False),
    Column("cron", Text, nullable=False),
    Column("timezone", Text, nullable=False),
    Column("misfire", Text, nullable=False),
    Column("busy", Text, nullable=False),
    Column("enabled", Boolean, nullable=False),
    Column("session_id", UUID(as_uuid=False)),  # a given session, or
    Column("agent", Text),  # a new session from this agent each time
    Column("agent_version", Integer),
    Column("title_template", Text),
    Column("ask", JSONB, nullable=False),
    Column("next_due_at", DateTime(timezone=True), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    CheckConstraint("misfire IN ('run_once', 'skip')", name="schedules_misfire"),
    CheckConstraint("busy IN ('queue', 'skip')", name="schedules_busy"),
    CheckConstraint("(session_id IS NULL) <> (agent IS NULL)", name="schedules_target"),
    Index("schedules_tenant_created", "tenant_id", "created_at"),
    Index("schedules_due", "next_due_at", postgresql_where=text("enabled")),
)

schedule_firings = Table(
    "schedule_firings",
    metadata,
    Column("id", UUID(as_uuid=False), primary_key=True, server_default=text("gen_random_uuid()")),
    Column(
        "schedule_id",
        UUID(as_uuid=False),
        ForeignKey("schedules.id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column("due_at", DateTime(timezone=True), nullable=False),
    Column("status", Text, nullable=False),  # fired | skipped | failed
    Column("reason", Text),  # why skipped or failed: an error code
    Column("message", Text),
    Column("session_id", UUID(as_uuid=False)),
    Column("run_id", UUID(as_uuid=False)),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    UniqueConstraint("schedule_id", "due_at", name="schedule_firings_once"),
    CheckConstraint("status IN ('fired', 'skipped', 'failed')", name="schedule_firings_status"),
)
