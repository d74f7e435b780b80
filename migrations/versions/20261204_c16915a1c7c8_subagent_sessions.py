"""subagent sessions: the session and tool call that started a session (additive)

An imported Claude Code transcript's subagents (sidechain records, or the subagents' own
files) become sessions of their own. ``sessions.parent_session_id`` names the session whose
tool call (``Task`` or ``Agent``) started one, ``sessions.parent_tool_use_id`` that call's
id. Both nullable: NULL for every session stored before this revision and every top-level
session; an older version neither reads nor writes them.

Revision ID: c16915a1c7c8
Revises: 9c1e4b7d2a58
Create Date: 2026-12-04 20:40:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "c16915a1c7c8"
down_revision: str | None = "9c1e4b7d2a58"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
# Nullable columns an older version neither reads nor writes.
kind: str = "additive"


def upgrade() -> None:
    op.add_column("sessions", sa.Column("parent_session_id", sa.String(length=255), nullable=True))
    op.add_column("sessions", sa.Column("parent_tool_use_id", sa.String(length=255), nullable=True))


def downgrade() -> None:
    op.drop_column("sessions", "parent_tool_use_id")
    op.drop_column("sessions", "parent_session_id")
