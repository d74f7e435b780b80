"""message_origins: an integration's own form of each message it stored (breaking)

Revision ID: c3a9e5f17d20
Revises: 5006b8f23c00
Create Date: 2026-12-03 12:50:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "c3a9e5f17d20"
down_revision: str | None = "5006b8f23c00"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
# message_origins refers to messages without ON DELETE CASCADE: an older version's
# delete_session and prune fail on a session an integration wrote.
kind: str = "breaking"


def upgrade() -> None:
    op.create_table(
        "message_origins",
        sa.Column("session_id", sa.String(length=255), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("source", sa.String(length=32), nullable=False),
        sa.Column("source_id", sa.String(length=255), nullable=False),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["session_id", "seq"],
            ["messages.session_id", "messages.seq"],
            name="fk_message_origins_message",
        ),
        sa.PrimaryKeyConstraint("session_id", "seq", name=op.f("pk_message_origins")),
    )
    with op.batch_alter_table("message_origins", schema=None) as batch_op:
        batch_op.create_index(
            "ix_message_origins_source_id", ["session_id", "source", "source_id"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("message_origins", schema=None) as batch_op:
        batch_op.drop_index("ix_message_origins_source_id")
    op.drop_table("message_origins")
