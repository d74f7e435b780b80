"""summarizers and compaction leases (breaking)

the documentation: ``compaction_leases`` (one compaction that may cut per session at a time, on
the database clock), the summarizer a session was opened with, how each compaction's
summary was written (source, summarizer, model, latency, tokens, fallback and its reason)
and the breaker's count of consecutive fallbacks. Older versions ignore all of it.

Revision ID: b7e4c1d09a52
Revises: c3a9e5f17d20
Create Date: 2026-12-03 12:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "b7e4c1d09a52"
down_revision: str | None = "c3a9e5f17d20"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
# compaction_leases refers to sessions without ON DELETE CASCADE: an older version's
# delete_session fails while a compaction holds the lease (the columns alone are additive).
kind: str = "breaking"

_COMPACTION_COLUMNS = (
    ("summary_source", sa.String(16)),
    ("summarizer", sa.String(255)),
    ("summarizer_model", sa.String(255)),
    ("summarizer_latency_ms", sa.Float()),
    ("summarizer_input_tokens", sa.Integer()),
    ("summarizer_output_tokens", sa.Integer()),
    ("summarizer_fallback", sa.Boolean()),
    ("summarizer_reason", sa.Text()),
)


def upgrade() -> None:
    op.create_table(
        "compaction_leases",
        sa.Column("session_id", sa.String(255), nullable=False),
        sa.Column("owner", sa.String(64), nullable=False),
        sa.Column("acquired_at", sa.Float(), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["sessions.id"],
            name=op.f("fk_compaction_leases_session_id_sessions"),
        ),
        sa.PrimaryKeyConstraint("session_id", name=op.f("pk_compaction_leases")),
    )
    op.add_column("sessions", sa.Column("summarizer", sa.String(255), nullable=True))
    for name, type_ in _COMPACTION_COLUMNS:
        op.add_column("compactions", sa.Column(name, type_, nullable=True))
    op.add_column(
        "breaker_state",
        sa.Column(
            "consecutive_fallbacks", sa.Integer(), nullable=False, server_default=sa.text("0")
        ),
    )


def downgrade() -> None:
    # Plain DROP COLUMN (SQLite >= 3.35): a batch copy of compactions would break the
    # compaction_history view that reads it.
    op.drop_column("breaker_state", "consecutive_fallbacks")
    for name, _ in reversed(_COMPACTION_COLUMNS):
        op.drop_column("compactions", name)
    op.drop_column("sessions", "summarizer")
    op.drop_table("compaction_leases")
