"""context versions for thinking blocks (additive)

the documentation: ``messages.context_version`` (the context version an assistant message
answered) and, on ``compactions``, ``changed_after_seq`` (the seq after which a compaction
changed every message's prefix: its lowest edited seq, or the seq before the first one it cut
away), ``context_version`` (the version its write produced) and
``rolled_back_version`` (the version of the rollback that undid it). All nullable: rows from
before this revision have none, and an older version ignores the columns (so their thinking
blocks are sent as before).

Revision ID: f4b2d8a6c1e9
Revises: e5a1c7d93b26
Create Date: 2026-12-03 18:15:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "f4b2d8a6c1e9"
down_revision: str | None = "e5a1c7d93b26"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
# Nullable columns; NULL is what an older version writes, and this one reads it as "no
# version recorded" (thinking sent as before).
kind: str = "additive"

_COMPACTION_COLUMNS = ("changed_after_seq", "context_version", "rolled_back_version")


def upgrade() -> None:
    op.add_column("messages", sa.Column("context_version", sa.Integer(), nullable=True))
    for name in _COMPACTION_COLUMNS:
        op.add_column("compactions", sa.Column(name, sa.Integer(), nullable=True))


def downgrade() -> None:
    for name in reversed(_COMPACTION_COLUMNS):
        op.drop_column("compactions", name)
    op.drop_column("messages", "context_version")
