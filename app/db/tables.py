"""The schema as SQLAlchemy Core tables; migrations/ creates it, queries are built from it."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
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
from sqlalchemy.dialects.postgresql import JSONB, UUID

metadata = MetaData()

tenants = Table(
    "tenants",
    metadata,
    Column("id", UUID(as_uuid=False), primary_key=True, server_default=text("gen_random_uuid()")),
    Column("name", Text, nullable=False, unique=True),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
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
    Column("revoked_at", DateTime(timezone=True)),
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
    # Running sum of the thread's token counts: the coordinate of chunked windowing.
    Column("token_total", BigInteger, nullable=False, server_default=text("0")),
    Column("input_tokens", BigInteger, nullable=False, server_default=text("0")),
    Column("output_tokens", BigInteger, nullable=False, server_default=text("0")),
    Column("cached_tokens", BigInteger, nullable=False, server_default=text("0")),
    Column("cost_usd", Numeric(20, 10), nullable=False, server_default=text("0")),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
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
)

ENTRY_KINDS_SQL = (
    "'message','tool_call','tool_result','summary','run_start','run_end','usage','error',"
    "'policy_violation','rollback'"
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
    CheckConstraint("token_count >= 0", name="entries_token_count_nonnegative"),
    Index(
        "entries_summaries",
        "session_id",
        "seq",
        postgresql_where=text("kind = 'summary'"),
    ),
)

RUN_ACTIVE = ("queued", "running", "requires_action")
RUN_TERMINAL = ("completed", "failed", "cancelled", "interrupted")

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
    Column("model", Text, nullable=False),
    # What the ask asked for: max_output_tokens, temperature, context_policy, metadata,
    # on_disconnect, fallback_model.
    Column("params", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("idempotency_key", Text),
    Column("user_entry_seq", BigInteger),
    Column("end_entry_seq", BigInteger),  # the run_end entry: rollbacks reach up to it
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    Column("result", Text),
    Column("error", JSONB),
    Column("cancel_mode", Text),  # set when a cancel was requested: cancel | interrupt | rollback
    Column("job_id", BigInteger),
    Column("action_expires_at", DateTime(timezone=True)),  # requires_action: give up after
    Column("input_tokens", BigInteger, nullable=False, server_default=text("0")),
    Column("output_tokens", BigInteger, nullable=False, server_default=text("0")),
    Column("cached_tokens", BigInteger, nullable=False, server_default=text("0")),
    Column("cost_usd", Numeric(20, 10)),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("started_at", DateTime(timezone=True)),
    Column("ended_at", DateTime(timezone=True)),
    UniqueConstraint("session_id", "idempotency_key", name="runs_idempotency_key"),
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
