"""compaction_steps: one row per stage of each recorded compaction (additive)

A compactions row is named by its heaviest stage; what each stage did and freed was only
in its ``steps`` JSON. ``compaction_steps`` holds the same as rows (strategy, trigger,
success, tokens freed, tool results cleared and persisted, detail), so plain SQL answers
what every stage did. Upgrading fills it from the ``steps`` of existing rows; their counts
of cleared and persisted results were never recorded and stay NULL.

Additive: a new table whose foreign keys cascade; an older version neither reads nor
writes it (the rows it records have no steps here, which the new code reads from
``compactions.steps`` as before).

Revision ID: f3a5b3eeb8e4
Revises: f99d9de77ba8
Create Date: 2026-12-04 19:30:00.000000
"""

import json
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "f3a5b3eeb8e4"
down_revision: str | None = "f99d9de77ba8"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
kind: str = "additive"

_compactions = sa.table(
    "compactions",
    sa.column("id", sa.Integer),
    sa.column("session_id", sa.String),
    sa.column("steps", sa.Text),
)
_BATCH = 500


def upgrade() -> None:
    steps = op.create_table(
        "compaction_steps",
        sa.Column("compaction_id", sa.Integer(), nullable=False),
        sa.Column("position", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("session_id", sa.String(length=255), nullable=False),
        sa.Column("strategy", sa.String(length=32), nullable=False),
        sa.Column("trigger", sa.String(length=32), nullable=False),
        sa.Column("success", sa.Boolean(), nullable=False),
        sa.Column("tokens_freed", sa.Integer(), nullable=False),
        sa.Column("results_cleared", sa.Integer(), nullable=True),
        sa.Column("results_persisted", sa.Integer(), nullable=True),
        sa.Column("detail", sa.Text(), server_default=sa.text("''"), nullable=False),
        sa.ForeignKeyConstraint(
            ["compaction_id"],
            ["compactions.id"],
            name=op.f("fk_compaction_steps_compaction_id_compactions"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["sessions.id"],
            name=op.f("fk_compaction_steps_session_id_sessions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("compaction_id", "position", name=op.f("pk_compaction_steps")),
    )
    with op.batch_alter_table("compaction_steps", schema=None) as batch_op:
        batch_op.create_index(
            "ix_compaction_steps_session", ["session_id", "strategy"], unique=False
        )
    bind = op.get_bind()
    rows: list[dict[str, object]] = []
    for compaction_id, session_id, recorded in bind.execute(
        sa.select(_compactions.c.id, _compactions.c.session_id, _compactions.c.steps)
        .where(_compactions.c.steps != "[]")
        .order_by(_compactions.c.id)
    ).all():
        for position, step in enumerate(json.loads(recorded)):
            rows.append(
                {
                    "compaction_id": compaction_id,
                    "position": position,
                    "session_id": session_id,
                    "strategy": step["strategy"],
                    "trigger": step["trigger"],
                    "success": bool(step.get("success", True)),
                    "tokens_freed": int(step["tokens_freed"]),
                    "results_cleared": step.get("results_cleared"),
                    "results_persisted": step.get("results_persisted"),
                    "detail": step.get("detail", ""),
                }
            )
            if len(rows) >= _BATCH:
                bind.execute(sa.insert(steps), rows)
                rows = []
    if rows:
        bind.execute(sa.insert(steps), rows)


def downgrade() -> None:
    with op.batch_alter_table("compaction_steps", schema=None) as batch_op:
        batch_op.drop_index("ix_compaction_steps_session")
    op.drop_table("compaction_steps")
