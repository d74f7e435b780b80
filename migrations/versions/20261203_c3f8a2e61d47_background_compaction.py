"""background compaction jobs (breaking)

the documentation: ``compaction_jobs`` (pending background compactions, each with the
snapshot it was started on, its state and its lease on the database clock) and
``compactions.started_by`` (the process_request call that started a background compaction).
Older versions ignore both.

Revision ID: c3f8a2e61d47
Revises: b7e4c1d09a52
Create Date: 2026-12-03 13:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "c3f8a2e61d47"
down_revision: str | None = "b7e4c1d09a52"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
# compaction_jobs refers to sessions and compactions without ON DELETE CASCADE: an older
# version's delete_session and prune fail on a session with background jobs.
kind: str = "breaking"


def upgrade() -> None:
    op.create_table(
        "compaction_jobs",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("session_id", sa.String(255), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("snapshot", sa.Text(), nullable=False),
        sa.Column("started_by", sa.Integer(), nullable=True),
        sa.Column("owner", sa.String(64), nullable=True),
        sa.Column("expires_at", sa.Float(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("finished_at", sa.Float(), nullable=True),
        sa.Column("compaction_id", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["session_id"], ["sessions.id"], name=op.f("fk_compaction_jobs_session_id_sessions")
        ),
        sa.ForeignKeyConstraint(
            ["started_by"],
            ["compactions.id"],
            name=op.f("fk_compaction_jobs_started_by_compactions"),
        ),
        sa.ForeignKeyConstraint(
            ["compaction_id"],
            ["compactions.id"],
            name=op.f("fk_compaction_jobs_compaction_id_compactions"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_compaction_jobs")),
    )
    op.create_index("ix_compaction_jobs_state", "compaction_jobs", ["state", "id"])
    op.create_index("ix_compaction_jobs_session", "compaction_jobs", ["session_id", "id"])
    # No foreign key (SQLite cannot add one to an existing table without a batch copy,
    # which would break the compaction_history view); like rolled_back_after, the id is
    # a hidden reference that copying renumbers (db/transfer.py).
    op.add_column("compactions", sa.Column("started_by", sa.Integer(), nullable=True))


def downgrade() -> None:
    op.drop_column("compactions", "started_by")
    op.drop_index("ix_compaction_jobs_session", table_name="compaction_jobs")
    op.drop_index("ix_compaction_jobs_state", table_name="compaction_jobs")
    op.drop_table("compaction_jobs")
