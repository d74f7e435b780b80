"""model_calls: one row per model call, for the usage curve of the report (breaking)

Revision ID: 5006b8f23c00
Revises: 99c54f1405bd
Create Date: 2026-12-03 08:20:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "5006b8f23c00"
down_revision: str | None = "99c54f1405bd"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
# A new table whose foreign key to sessions has no ON DELETE CASCADE: an older
# version's delete_session and prune fail on a session with model calls.
kind: str = "breaking"


def upgrade() -> None:
    op.create_table(
        "model_calls",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("session_id", sa.String(length=255), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("usage", sa.Integer(), nullable=False),
        sa.Column("real_tokens", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["session_id"], ["sessions.id"], name=op.f("fk_model_calls_session_id_sessions")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_model_calls")),
    )
    with op.batch_alter_table("model_calls", schema=None) as batch_op:
        batch_op.create_index("ix_model_calls_session", ["session_id", "id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("model_calls", schema=None) as batch_op:
        batch_op.drop_index("ix_model_calls_session")
    op.drop_table("model_calls")
