"""Table shapes. The history of these shapes lives in migrations/; a test keeps both in step.

A new database is created from these shapes (compactstore.db.migrate), one that is upgraded
by the migrations: tests/test_schema.py checks that both are the same schema, to the order of
the columns (a column a revision added comes after the older ones, here too).

Timestamps are epoch seconds (float) so a replay sees exactly the `now` it was given;
the `compaction_history` view shows them readable. JSON columns hold text written once
by the store (messages verbatim, lists of seqs and ids), so SQL users can read them with
json_each / ::jsonb.
"""

from __future__ import annotations

from sqlalchemy import (
    Boolean,
    Column,
    Float,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    Numeric,
    String,
    Table,
    Text,
    text,
)

__all__ = [
    "breaker_state",
    "compact_boundaries",
    "compaction_configs",
    "compaction_jobs",
    "compaction_leases",
    "compaction_steps",
    "compactions",
    "history_view",
    "memory_entries",
    "message_edits",
    "message_origins",
    "messages",
    "metadata",
    "model_calls",
    "read_dedup_entries",
    "schema_revisions",
    "sessions",
    "tool_calls",
    "tool_result_blobs",
]

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

SESSION_ID = String(255)

sessions = Table(
    "sessions",
    metadata,
    Column("id", SESSION_ID, primary_key=True),
    Column("format", String(32), nullable=False),
    Column("context_window", Integer, nullable=False),
    Column("config", Text, nullable=False),
    Column("created_at", Float, nullable=False),
    # Seq of the original request (the first user message), pinned for ever.
    Column("request_seq", Integer),
    # Bumped by every write, so readers can tell whether what they hold is current.
    Column("version", Integer, nullable=False, server_default=text("0")),
    # Bumped by every write that changes the active context other than by appending
    # (compaction, rollback, config): a cached context survives appends only.
    Column("context_version", Integer, nullable=False, server_default=text("0")),
    Column("last_seq", Integer, nullable=False, server_default=text("-1")),
    # Calibration against real counts: usage = estimate x factor + offset.
    Column("token_factor", Float),
    Column("token_factor_weight", Float),
    Column("usage_offset", Integer, nullable=False, server_default=text("0")),
    Column("real_tokens", Integer),
    Column("real_estimate", Integer),
    # Seq of the first user message that is not client boilerplate (the user's real request),
    # pinned for ever; the same as request_seq when the first user message is the request.
    Column("real_request_seq", Integer),
    # The agent's working directory: summaries show file paths relative to it.
    Column("cwd", Text),
    # Name of the summarizer the session was opened with (store.session(summarizer=)): a
    # process that has not configured it counts a fallback instead of changing behaviour.
    Column("summarizer", String(255)),
    # The model the session talks to (store.session(model=) or the newest append_response's):
    # it decides the "auto" edit policy (compactstore.capabilities).
    Column("model", String(255)),
    # "drop_block" once a cut inside a tool loop changed the prefix of thinking a later
    # request must send: every later request carries that block binding. And since when.
    Column("thinking_binding", String(16)),
    Column("thinking_binding_at", Float),
    # A subagent's session (an imported Claude Code sidechain): the session whose tool call
    # started it, and that call's id. NULL for a top-level session. Not a foreign key: a
    # child restored without its parent keeps naming it.
    Column("parent_session_id", SESSION_ID),
    Column("parent_tool_use_id", String(255)),
)

messages = Table(
    "messages",
    metadata,
    Column("session_id", SESSION_ID, ForeignKey("sessions.id"), primary_key=True),
    Column("seq", Integer, primary_key=True),
    Column("role", String(32), nullable=False),
    # system / user / assistant / tool (a message carrying only tool results), whatever the
    # format calls it: pairing checks and SQL audits need it without parsing payloads.
    Column("kind", String(16), nullable=False),
    Column("payload", Text, nullable=False),
    Column("tokens", Integer, nullable=False),
    Column("created_at", Float, nullable=False),
    # 'system' (leading system message), 'request' (first user message), 'user' (pinned=True).
    Column("pinned", String(16)),
    # Seq of the message whose content a read-dedup stub in this one points at.
    Column("dedup_of_seq", Integer),
    # An assistant message: the session's context_version when it was stored, the context
    # it answered; null for other messages and rows stored before.
    Column("context_version", Integer),
)
# Pinned messages before a boundary are fetched on their own at every rebuild.
Index("ix_messages_pinned", messages.c.session_id, messages.c.pinned, messages.c.seq)

# Calls are keyed by (id, call seq): in openai and responses an id may be used
# again once its earlier call is answered. A message never carries one id twice.
tool_calls = Table(
    "tool_calls",
    metadata,
    Column("session_id", SESSION_ID, ForeignKey("sessions.id"), primary_key=True),
    Column("tool_use_id", String(255), primary_key=True),
    Column("name", String(255), nullable=False),
    Column("call_seq", Integer, primary_key=True),
    Column("result_seq", Integer),
)

compact_boundaries = Table(
    "compact_boundaries",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("session_id", SESSION_ID, ForeignKey("sessions.id"), nullable=False),
    Column("trigger", String(32), nullable=False),
    Column("strategy", String(32), nullable=False),
    Column("created_at", Float, nullable=False),
    Column("tokens_before", Integer, nullable=False),
    Column("tokens_after", Integer, nullable=False),
    Column("messages_removed", Integer, nullable=False),
    Column("first_kept_seq", Integer, nullable=False),
    Column("last_kept_seq", Integer),
    Column("summary_text", Text, nullable=False),
    Column("summary_message", Text, nullable=False),
    Column("summary_tokens", Integer, nullable=False),
    # What the rule-based summary carries forward (request, topics, tools, files, errors),
    # so the next compaction folds it in exactly instead of re-reading prose.
    Column("summary_state", Text, nullable=False),
    Column("parent_id", Integer, ForeignKey("compact_boundaries.id")),
    Column("rolled_back_at", Float),
)
Index(
    "ix_compact_boundaries_live",
    compact_boundaries.c.session_id,
    compact_boundaries.c.rolled_back_at,
    compact_boundaries.c.id,
)

# Each distinct config a session's compactions ran under, stored once: a session compacts
# under the same config hundreds of times, and a copy in every compactions row was most of
# its bytes. Keyed by the SHA-256 of the config's JSON (compactions.config_hash).
compaction_configs = Table(
    "compaction_configs",
    metadata,
    Column(
        "session_id",
        SESSION_ID,
        ForeignKey("sessions.id", ondelete="CASCADE"),
        primary_key=True,
    ),
    Column("hash", String(64), primary_key=True),
    Column("config", Text, nullable=False),
)

compactions = Table(
    "compactions",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("session_id", SESSION_ID, ForeignKey("sessions.id"), nullable=False),
    Column("trigger", String(32)),
    Column("strategy", String(32)),
    Column("success", Boolean, nullable=False),
    Column("tokens_before", Integer, nullable=False),
    Column("tokens_after", Integer, nullable=False),
    Column("tokens_freed", Integer, nullable=False),
    Column("summary_text", Text, nullable=False),
    Column("boundary_id", Integer, ForeignKey("compact_boundaries.id")),
    Column("created_at", Float, nullable=False),
    Column("steps", Text, nullable=False),
    # The config the compaction ran under (replay runs it again): the compaction_configs
    # row named by config_hash (below). Rows written before that table existed (and rows an older
    # version writes) hold the JSON here and no hash; rows with a hash hold ''.
    Column("config", Text, nullable=False),
    # What was lost: seqs that left the active context, results cleared or persisted
    # (cleared_tool_calls, below: [tool-use id, call seq] pairs, as an id may be used
    # again), blobs.
    Column("removed_seqs", Text, nullable=False),
    Column("blob_ids", Text, nullable=False),
    Column("instructions", Text),
    Column("error", Text),
    # The compaction this one replays (sess.replay(..., apply=True)).
    Column("replay_of", Integer, ForeignKey("compactions.id")),
    # Everything besides the log and `config` that the engines saw (last seq, memory,
    # counters, next blob id), so replay can rebuild the same input.
    Column("inputs", Text, nullable=False),
    Column("rolled_back_at", Float),
    # The newest compaction id of the session when this one was rolled back: replay uses it
    # to tell which edits were live when a later compaction ran.
    Column("rolled_back_after", Integer),
    # How the cut's summary was written: 'summarizer', 'rule' or 'recorded'; the
    # summarizer's name and model, its latency and token counts, whether it fell back to
    # the rule-based summary and why. Null when the call made no cut.
    Column("summary_source", String(16)),
    Column("summarizer", String(255)),
    Column("summarizer_model", String(255)),
    Column("summarizer_latency_ms", Float),
    Column("summarizer_input_tokens", Integer),
    Column("summarizer_output_tokens", Integer),
    Column("summarizer_fallback", Boolean),
    Column("summarizer_reason", Text),
    # A background compaction: the compaction row of the process_request call
    # that started it (no foreign key: added to an existing table; see db/transfer.py).
    Column("started_by", Integer),
    Column("cleared_tool_calls", Text, nullable=False, server_default=text("'[]'")),
    # What the compaction changed in the active context: the seq
    # after which every message's prefix changed (its lowest edited seq, or the seq before
    # the first one a cut removed; null: it changed no message), the session
    # context_version its write produced, and that of the rollback that undid it. A
    # thinking block is sent only while no change after a seq before its message is newer
    # than the version its message answered.
    Column("changed_after_seq", Integer),
    Column("context_version", Integer),
    Column("rolled_back_version", Integer),
    # The compaction_configs row this one ran under (see config, above).
    Column("config_hash", String(64)),
    # The edit policy it ran under: 'rewrite' or 'append_only' (null: recorded before the
    # policy existed, which was rewrite).
    Column("edit_policy", String(16)),
)
Index("ix_compactions_session", compactions.c.session_id, compactions.c.id)

# What each stage of a recorded compaction did, one row per stage (a call that ran the tool
# budget and then a full compact is one compactions row, named by its heaviest stage, with
# two rows here): SQL over this table says what every stage did and freed. A read dedup is
# a compaction of its own (strategy read_dedup, one step). Mirrors compactions.steps.
compaction_steps = Table(
    "compaction_steps",
    metadata,
    Column(
        "compaction_id",
        Integer,
        ForeignKey("compactions.id", ondelete="CASCADE"),
        primary_key=True,
    ),
    # The stage's place in the call, from 0.
    Column("position", Integer, primary_key=True, autoincrement=False),
    Column("session_id", SESSION_ID, ForeignKey("sessions.id", ondelete="CASCADE"), nullable=False),
    Column("strategy", String(32), nullable=False),
    Column("trigger", String(32), nullable=False),
    # The stage changed the context and freed tokens (a read dedup: it stored the stub).
    Column("success", Boolean, nullable=False),
    Column("tokens_freed", Integer, nullable=False),
    # Tool results it cleared (placeholder) and persisted (preview or note naming a blob);
    # NULL for steps recorded before they were counted.
    Column("results_cleared", Integer),
    Column("results_persisted", Integer),
    Column("detail", Text, nullable=False, server_default=text("''")),
)
Index("ix_compaction_steps_session", compaction_steps.c.session_id, compaction_steps.c.strategy)

message_edits = Table(
    "message_edits",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("session_id", SESSION_ID, nullable=False),
    Column("seq", Integer, nullable=False),
    Column("compaction_id", Integer, ForeignKey("compactions.id"), nullable=False),
    # 'persisted' (preview stub of a blob) or 'cleared' (microcompact placeholder).
    Column("kind", String(16), nullable=False),
    Column("tool_use_ids", Text, nullable=False),
    Column("payload", Text, nullable=False),
    Column("tokens", Integer, nullable=False),
    ForeignKeyConstraint(
        ["session_id", "seq"], ["messages.session_id", "messages.seq"], name="fk_message_edits_msg"
    ),
)
Index("ix_message_edits_session_seq", message_edits.c.session_id, message_edits.c.seq)

tool_result_blobs = Table(
    "tool_result_blobs",
    metadata,
    # Blob ids count per session, so the id a preview names is known before the insert and
    # a blob can only ever be addressed through its own session.
    Column("session_id", SESSION_ID, ForeignKey("sessions.id"), primary_key=True),
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("seq", Integer, nullable=False),
    Column("tool_use_id", String(255), nullable=False),
    Column("tool_name", String(255), nullable=False),
    Column("compaction_id", Integer, ForeignKey("compactions.id"), nullable=False),
    Column("sha256", String(64), nullable=False),
    Column("size", Integer, nullable=False),
    Column("content", LargeBinary, nullable=False),
    Column("created_at", Float, nullable=False),
    ForeignKeyConstraint(
        ["session_id", "seq"], ["messages.session_id", "messages.seq"], name="fk_blobs_msg"
    ),
)

read_dedup_entries = Table(
    "read_dedup_entries",
    metadata,
    Column("session_id", SESSION_ID, ForeignKey("sessions.id"), primary_key=True),
    Column("file_path", Text, primary_key=True),
    Column("content_hash", String(32), nullable=False),
    Column("seq", Integer, nullable=False),
    Column("created_at", Float, nullable=False),
)

breaker_state = Table(
    "breaker_state",
    metadata,
    Column("session_id", SESSION_ID, ForeignKey("sessions.id"), primary_key=True),
    Column("consecutive_failures", Integer, nullable=False, server_default=text("0")),
    Column("tripped", Boolean, nullable=False, server_default=text("false")),
    Column("reactive_attempts", Integer, nullable=False, server_default=text("0")),
    Column("last_microcompact_at", Float, nullable=False),
    # Summaries in a row that fell back to the rule-based one.
    Column("consecutive_fallbacks", Integer, nullable=False, server_default=text("0")),
)

# One compaction that may cut at a time per session: the owner's token and when
# the lease lapses, on the database's clock (never a caller's now=), so a crashed owner's
# lease expires and another process can compact.
compaction_leases = Table(
    "compaction_leases",
    metadata,
    Column("session_id", SESSION_ID, ForeignKey("sessions.id"), primary_key=True),
    Column("owner", String(64), nullable=False),
    Column("acquired_at", Float, nullable=False),
    Column("expires_at", Float, nullable=False),
)

# Pending background compactions: one row per compaction a process_request(
# background=True) started, so any process (or `compactstore worker`) can run it. state:
# pending -> running -> applied | superseded | failed. owner/expires_at are the job's lease
# on the database clock: a crashed worker's job is picked up again once it lapses.
compaction_jobs = Table(
    "compaction_jobs",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("session_id", SESSION_ID, ForeignKey("sessions.id"), nullable=False),
    Column("state", String(16), nullable=False),
    # The session as the starting call saw it (context_version, version, last_seq, usage).
    Column("snapshot", Text, nullable=False),
    Column("started_by", Integer, ForeignKey("compactions.id")),
    Column("owner", String(64)),
    Column("expires_at", Float),
    Column("created_at", Float, nullable=False),
    Column("finished_at", Float),
    # The background compaction's own row, once recorded.
    Column("compaction_id", Integer, ForeignKey("compactions.id")),
    Column("error", Text),
)
Index("ix_compaction_jobs_state", compaction_jobs.c.state, compaction_jobs.c.id)
Index("ix_compaction_jobs_session", compaction_jobs.c.session_id, compaction_jobs.c.id)

memory_entries = Table(
    "memory_entries",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("session_id", SESSION_ID, ForeignKey("sessions.id"), nullable=False),
    Column("scope", String(32), nullable=False, server_default=text("'session'")),
    Column("kind", String(32), nullable=False),
    Column("text", Text, nullable=False),
    Column("tokens", Integer, nullable=False),
    Column("created_at", Float, nullable=False),
)
Index("ix_memory_entries_session", memory_entries.c.session_id, memory_entries.c.id)

model_calls = Table(
    "model_calls",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("session_id", SESSION_ID, ForeignKey("sessions.id"), nullable=False),
    # The newest seq of the log when the call was made: the context sent ended there.
    Column("seq", Integer, nullable=False),
    # The store's usage of the context sent, before the call's real count was known.
    Column("usage", Integer, nullable=False),
    # The prompt size the provider counted, when the caller or the transcript reported it.
    Column("real_tokens", Integer),
    Column("created_at", Float, nullable=False),
    # The cost and cache ledger (compactstore._ledger), when the call's usage was reported
    # (null on rows recorded before it): the prompt split as billed -- uncached input, cache
    # reads, cache writes for the provider's short (5 m) and long (1 h) lifetime -- and the
    # output; the provider's iterations, cache-miss reason and input transformations as
    # reported (JSON); the model; the cost in US dollars at the store's prices when the
    # call was recorded (null: a model without a price).
    Column("input_tokens", Integer),
    Column("cache_read_tokens", Integer),
    Column("cache_write_5m_tokens", Integer),
    Column("cache_write_1h_tokens", Integer),
    Column("output_tokens", Integer),
    Column("iterations", Text),
    Column("cache_miss_reason", Text),
    Column("input_transformations", Text),
    Column("model", String(255)),
    Column("cost_usd", Numeric(20, 10, asdecimal=False)),
    # The session's context_version the call sent: the first call at or after a
    # compaction's version is the one that wrote the cache again after it.
    Column("context_version", Integer),
)
Index("ix_model_calls_session", model_calls.c.session_id, model_calls.c.id)

message_origins = Table(
    "message_origins",
    metadata,
    # A message given through an integration (``source``, e.g. "langchain") in that
    # framework's own form, kept losslessly beside the session-format payload in ``messages``
    # so the framework gets it back exactly (ids, metadata, thinking signatures).
    Column("session_id", SESSION_ID, primary_key=True),
    Column("seq", Integer, primary_key=True),
    Column("source", String(32), nullable=False),
    # The framework's id of the message: how an integration knows it is stored already.
    Column("source_id", String(255), nullable=False),
    Column("payload", Text, nullable=False),
    ForeignKeyConstraint(
        ["session_id", "seq"],
        ["messages.session_id", "messages.seq"],
        name="fk_message_origins_message",
    ),
)
Index(
    "ix_message_origins_source_id",
    message_origins.c.session_id,
    message_origins.c.source,
    message_origins.c.source_id,
)

schema_revisions = Table(
    "schema_revisions",
    metadata,
    # One row per Alembic revision applied to this database (written by migrations/env.py
    # as each revision is applied, removed as it is undone), so that a version of
    # compactstore older than the database can tell whether the revision it does not know
    # is one additive step past its own head, which it can read and write (the documentation
    # "Fleets upgrade in order"; compactstore.db.migrate). Not a session's data: copies,
    # deletes and prunes leave it alone.
    Column("revision", String(32), primary_key=True),
    Column("down_revision", String(32)),
    # "additive" or "breaking" (the revision file's ``kind``).
    Column("kind", String(16), nullable=False),
)


def history_view(dialect: str) -> str:
    """The ``compaction_history`` view's definition on a backend (SQLAlchemy's dialect name):
    a compaction with its boundary, timestamps readable. Each revision that changed it holds
    its own copy in migrations/."""

    def readable(column: str) -> str:
        if dialect == "sqlite":
            return f"datetime({column}, 'unixepoch')"
        return f"to_timestamp({column})"

    return f"""
CREATE VIEW compaction_history AS
SELECT
    c.session_id,
    c.id AS compaction_id,
    c.trigger,
    c.strategy,
    c.success,
    c.tokens_before,
    c.tokens_after,
    c.tokens_freed,
    {readable("c.created_at")} AS created,
    c.created_at AS created_epoch,
    CASE WHEN c.rolled_back_at IS NULL THEN NULL ELSE {readable("c.rolled_back_at")} END
        AS rolled_back,
    c.boundary_id,
    b.parent_id AS parent_boundary_id,
    b.messages_removed,
    b.first_kept_seq,
    b.last_kept_seq,
    c.removed_seqs,
    c.cleared_tool_calls,
    c.blob_ids,
    c.steps,
    c.summary_text
FROM compactions AS c
LEFT JOIN compact_boundaries AS b ON b.id = c.boundary_id
"""
