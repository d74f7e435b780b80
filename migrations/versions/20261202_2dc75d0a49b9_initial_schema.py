"""initial schema: every table of the documentation and the compaction_history view

Revision ID: 2dc75d0a49b9
Revises:
Create Date: 2026-12-02 12:04:29.026901
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "2dc75d0a49b9"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
# The first revision: no older version has a schema to read.
kind: str = "breaking"


def upgrade() -> None:
    op.create_table(
        "sessions",
        sa.Column("id", sa.String(length=255), nullable=False),
        sa.Column("format", sa.String(length=32), nullable=False),
        sa.Column("context_window", sa.Integer(), nullable=False),
        sa.Column("config", sa.Text(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("request_seq", sa.Integer(), nullable=True),
        sa.Column("version", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("context_version", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("last_seq", sa.Integer(), server_default=sa.text("-1"), nullable=False),
        sa.Column("token_factor", sa.Float(), nullable=True),
        sa.Column("token_factor_weight", sa.Float(), nullable=True),
        sa.Column("usage_offset", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("real_tokens", sa.Integer(), nullable=True),
        sa.Column("real_estimate", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sessions")),
    )
    op.create_table(
        "breaker_state",
        sa.Column("session_id", sa.String(length=255), nullable=False),
        sa.Column(
            "consecutive_failures", sa.Integer(), server_default=sa.text("0"), nullable=False
        ),
        sa.Column("tripped", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column("reactive_attempts", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("last_microcompact_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["session_id"], ["sessions.id"], name=op.f("fk_breaker_state_session_id_sessions")
        ),
        sa.PrimaryKeyConstraint("session_id", name=op.f("pk_breaker_state")),
    )
    op.create_table(
        "compact_boundaries",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("session_id", sa.String(length=255), nullable=False),
        sa.Column("trigger", sa.String(length=32), nullable=False),
        sa.Column("strategy", sa.String(length=32), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("tokens_before", sa.Integer(), nullable=False),
        sa.Column("tokens_after", sa.Integer(), nullable=False),
        sa.Column("messages_removed", sa.Integer(), nullable=False),
        sa.Column("first_kept_seq", sa.Integer(), nullable=False),
        sa.Column("last_kept_seq", sa.Integer(), nullable=True),
        sa.Column("summary_text", sa.Text(), nullable=False),
        sa.Column("summary_message", sa.Text(), nullable=False),
        sa.Column("summary_tokens", sa.Integer(), nullable=False),
        sa.Column("summary_state", sa.Text(), nullable=False),
        sa.Column("parent_id", sa.Integer(), nullable=True),
        sa.Column("rolled_back_at", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(
            ["parent_id"],
            ["compact_boundaries.id"],
            name=op.f("fk_compact_boundaries_parent_id_compact_boundaries"),
        ),
        sa.ForeignKeyConstraint(
            ["session_id"], ["sessions.id"], name=op.f("fk_compact_boundaries_session_id_sessions")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_compact_boundaries")),
    )
    with op.batch_alter_table("compact_boundaries", schema=None) as batch_op:
        batch_op.create_index(
            "ix_compact_boundaries_live", ["session_id", "rolled_back_at", "id"], unique=False
        )

    op.create_table(
        "memory_entries",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("session_id", sa.String(length=255), nullable=False),
        sa.Column(
            "scope", sa.String(length=32), server_default=sa.text("'session'"), nullable=False
        ),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("tokens", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["session_id"], ["sessions.id"], name=op.f("fk_memory_entries_session_id_sessions")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_memory_entries")),
    )
    with op.batch_alter_table("memory_entries", schema=None) as batch_op:
        batch_op.create_index("ix_memory_entries_session", ["session_id", "id"], unique=False)

    op.create_table(
        "messages",
        sa.Column("session_id", sa.String(length=255), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("role", sa.String(length=32), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.Column("tokens", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("pinned", sa.String(length=16), nullable=True),
        sa.Column("dedup_of_seq", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(
            ["session_id"], ["sessions.id"], name=op.f("fk_messages_session_id_sessions")
        ),
        sa.PrimaryKeyConstraint("session_id", "seq", name=op.f("pk_messages")),
    )
    with op.batch_alter_table("messages", schema=None) as batch_op:
        batch_op.create_index("ix_messages_pinned", ["session_id", "pinned", "seq"], unique=False)

    op.create_table(
        "read_dedup_entries",
        sa.Column("session_id", sa.String(length=255), nullable=False),
        sa.Column("file_path", sa.Text(), nullable=False),
        sa.Column("content_hash", sa.String(length=32), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["session_id"], ["sessions.id"], name=op.f("fk_read_dedup_entries_session_id_sessions")
        ),
        sa.PrimaryKeyConstraint("session_id", "file_path", name=op.f("pk_read_dedup_entries")),
    )
    op.create_table(
        "tool_calls",
        sa.Column("session_id", sa.String(length=255), nullable=False),
        sa.Column("tool_use_id", sa.String(length=255), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("call_seq", sa.Integer(), nullable=False),
        sa.Column("result_seq", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(
            ["session_id"], ["sessions.id"], name=op.f("fk_tool_calls_session_id_sessions")
        ),
        sa.PrimaryKeyConstraint("session_id", "tool_use_id", name=op.f("pk_tool_calls")),
    )
    op.create_table(
        "compactions",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("session_id", sa.String(length=255), nullable=False),
        sa.Column("trigger", sa.String(length=32), nullable=True),
        sa.Column("strategy", sa.String(length=32), nullable=True),
        sa.Column("success", sa.Boolean(), nullable=False),
        sa.Column("tokens_before", sa.Integer(), nullable=False),
        sa.Column("tokens_after", sa.Integer(), nullable=False),
        sa.Column("tokens_freed", sa.Integer(), nullable=False),
        sa.Column("summary_text", sa.Text(), nullable=False),
        sa.Column("boundary_id", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("steps", sa.Text(), nullable=False),
        sa.Column("config", sa.Text(), nullable=False),
        sa.Column("removed_seqs", sa.Text(), nullable=False),
        sa.Column("cleared_tool_use_ids", sa.Text(), nullable=False),
        sa.Column("blob_ids", sa.Text(), nullable=False),
        sa.Column("instructions", sa.Text(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("replay_of", sa.Integer(), nullable=True),
        sa.Column("inputs", sa.Text(), nullable=False),
        sa.Column("rolled_back_at", sa.Float(), nullable=True),
        sa.Column("rolled_back_after", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(
            ["boundary_id"],
            ["compact_boundaries.id"],
            name=op.f("fk_compactions_boundary_id_compact_boundaries"),
        ),
        sa.ForeignKeyConstraint(
            ["replay_of"], ["compactions.id"], name=op.f("fk_compactions_replay_of_compactions")
        ),
        sa.ForeignKeyConstraint(
            ["session_id"], ["sessions.id"], name=op.f("fk_compactions_session_id_sessions")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_compactions")),
    )
    with op.batch_alter_table("compactions", schema=None) as batch_op:
        batch_op.create_index("ix_compactions_session", ["session_id", "id"], unique=False)

    op.create_table(
        "message_edits",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("session_id", sa.String(length=255), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("compaction_id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("tool_use_ids", sa.Text(), nullable=False),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.Column("tokens", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["compaction_id"],
            ["compactions.id"],
            name=op.f("fk_message_edits_compaction_id_compactions"),
        ),
        sa.ForeignKeyConstraint(
            ["session_id", "seq"],
            ["messages.session_id", "messages.seq"],
            name="fk_message_edits_msg",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_message_edits")),
    )
    with op.batch_alter_table("message_edits", schema=None) as batch_op:
        batch_op.create_index("ix_message_edits_session_seq", ["session_id", "seq"], unique=False)

    op.create_table(
        "tool_result_blobs",
        sa.Column("session_id", sa.String(length=255), nullable=False),
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("tool_use_id", sa.String(length=255), nullable=False),
        sa.Column("tool_name", sa.String(length=255), nullable=False),
        sa.Column("compaction_id", sa.Integer(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("content", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["compaction_id"],
            ["compactions.id"],
            name=op.f("fk_tool_result_blobs_compaction_id_compactions"),
        ),
        sa.ForeignKeyConstraint(
            ["session_id", "seq"], ["messages.session_id", "messages.seq"], name="fk_blobs_msg"
        ),
        sa.ForeignKeyConstraint(
            ["session_id"], ["sessions.id"], name=op.f("fk_tool_result_blobs_session_id_sessions")
        ),
        sa.PrimaryKeyConstraint("session_id", "id", name=op.f("pk_tool_result_blobs")),
    )
    op.execute(_history_view(op.get_bind().dialect.name))


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS compaction_history")
    op.drop_table("tool_result_blobs")
    with op.batch_alter_table("message_edits", schema=None) as batch_op:
        batch_op.drop_index("ix_message_edits_session_seq")

    op.drop_table("message_edits")
    with op.batch_alter_table("compactions", schema=None) as batch_op:
        batch_op.drop_index("ix_compactions_session")

    op.drop_table("compactions")
    op.drop_table("tool_calls")
    op.drop_table("read_dedup_entries")
    with op.batch_alter_table("messages", schema=None) as batch_op:
        batch_op.drop_index("ix_messages_pinned")

    op.drop_table("messages")
    with op.batch_alter_table("memory_entries", schema=None) as batch_op:
        batch_op.drop_index("ix_memory_entries_session")

    op.drop_table("memory_entries")
    with op.batch_alter_table("compact_boundaries", schema=None) as batch_op:
        batch_op.drop_index("ix_compact_boundaries_live")

    op.drop_table("compact_boundaries")
    op.drop_table("breaker_state")
    op.drop_table("sessions")


def _history_view(dialect: str) -> str:
    def readable(column: str) -> str:
        if dialect == "sqlite":
            return f"datetime({column}, 'unixepoch')"
        return f"to_timestamp({column})"

    # Plain SQL over the recorded rows: one line per compaction, with its boundary if it cut.
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
    c.cleared_tool_use_ids,
    c.blob_ids,
    c.steps,
    c.summary_text
FROM compactions AS c
LEFT JOIN compact_boundaries AS b ON b.id = c.boundary_id
"""
