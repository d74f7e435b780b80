"""sessions: the real request's seq and the working directory (additive)

The first user message that is not client boilerplate is pinned with the first user message;
its seq is kept on the session so the decision is made once, at
insert. Sessions stored before this revision pinned only the first user message, and pins
never change: their real request is that message. ``cwd`` is the directory file paths in
summaries are shown relative to.

Revision ID: 99c54f1405bd
Revises: 2dc75d0a49b9
Create Date: 2026-12-03 08:40:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "99c54f1405bd"
down_revision: str | None = "2dc75d0a49b9"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
# Nullable columns; NULL is what a session stored before this revision has.
kind: str = "additive"


def upgrade() -> None:
    op.add_column("sessions", sa.Column("real_request_seq", sa.Integer(), nullable=True))
    op.add_column("sessions", sa.Column("cwd", sa.Text(), nullable=True))
    sessions = sa.table(
        "sessions", sa.column("request_seq", sa.Integer), sa.column("real_request_seq", sa.Integer)
    )
    op.execute(sessions.update().values(real_request_seq=sessions.c.request_seq))


def downgrade() -> None:
    op.drop_column("sessions", "cwd")
    op.drop_column("sessions", "real_request_seq")
