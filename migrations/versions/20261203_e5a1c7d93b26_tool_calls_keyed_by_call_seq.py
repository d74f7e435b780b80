"""tool calls keyed by (id, call seq) (breaking)

the documentation: in ``openai`` and ``responses`` a call id may be used again once
its earlier call is answered, so a call is keyed by the seq of the message that made it:

- ``tool_calls``: the primary key becomes (session_id, tool_use_id, call_seq).
- ``compactions.cleared_tool_use_ids`` (a JSON list of ids) becomes
  ``compactions.cleared_tool_calls``, a JSON list of [tool-use id, call seq] pairs; existing
  rows are converted (ids were unique per session before this revision, so each names
  exactly one call; an id with no ``tool_calls`` row, which the store never wrote, gets
  call seq -1). The ``compaction_history`` view shows the new column.

Breaking: older versions read ``cleared_tool_use_ids`` and assume one call per id, so stop
them before upgrading (``compactstore db upgrade``), then start the new version.

Revision ID: e5a1c7d93b26
Revises: c3f8a2e61d47
Create Date: 2026-12-03 16:00:00.000000
"""

import json
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "e5a1c7d93b26"
down_revision: str | None = "c3f8a2e61d47"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
# Replaces compactions.cleared_tool_use_ids and re-keys tool_calls.
kind: str = "breaking"

_compactions = sa.table(
    "compactions",
    sa.column("id", sa.Integer()),
    sa.column("session_id", sa.String()),
    sa.column("cleared_tool_use_ids", sa.Text()),
    sa.column("cleared_tool_calls", sa.Text()),
)
_tool_calls = sa.table(
    "tool_calls",
    sa.column("session_id", sa.String()),
    sa.column("tool_use_id", sa.String()),
    sa.column("call_seq", sa.Integer()),
)


def upgrade() -> None:
    bind = op.get_bind()
    # The view reads the column that is replaced; it is created again at the end.
    op.execute("DROP VIEW IF EXISTS compaction_history")
    op.add_column(
        "compactions",
        sa.Column("cleared_tool_calls", sa.Text(), nullable=False, server_default=sa.text("'[]'")),
    )
    rows = bind.execute(
        sa.select(
            _compactions.c.id, _compactions.c.session_id, _compactions.c.cleared_tool_use_ids
        ).where(_compactions.c.cleared_tool_use_ids != "[]")
    ).all()
    call_seqs: dict[str, dict[str, int]] = {}
    for row in rows:
        if row.session_id not in call_seqs:
            call_seqs[row.session_id] = {
                call.tool_use_id: call.call_seq
                for call in bind.execute(
                    sa.select(_tool_calls.c.tool_use_id, _tool_calls.c.call_seq).where(
                        _tool_calls.c.session_id == row.session_id
                    )
                )
            }
        known = call_seqs[row.session_id]
        pairs = [[i, known.get(i, -1)] for i in json.loads(row.cleared_tool_use_ids)]
        bind.execute(
            sa.update(_compactions)
            .where(_compactions.c.id == row.id)
            .values(cleared_tool_calls=json.dumps(pairs, ensure_ascii=False, separators=(",", ":")))
        )
    # Plain DROP COLUMN (SQLite >= 3.35): a batch copy of compactions would meet the foreign
    # keys of the tables that reference it.
    op.drop_column("compactions", "cleared_tool_use_ids")
    _primary_key(["session_id", "tool_use_id", "call_seq"])
    op.execute(_history_view(op.get_bind().dialect.name))


def downgrade() -> None:
    bind = op.get_bind()
    reused = bind.execute(
        sa.select(_tool_calls.c.session_id, _tool_calls.c.tool_use_id)
        .group_by(_tool_calls.c.session_id, _tool_calls.c.tool_use_id)
        .having(sa.func.count() > 1)
        .limit(1)
    ).first()
    if reused is not None:
        raise RuntimeError(
            f"cannot downgrade: session {reused.session_id!r} uses tool call id "
            f"{reused.tool_use_id!r} more than once, which the older schema cannot hold"
        )
    op.execute("DROP VIEW IF EXISTS compaction_history")
    _primary_key(["session_id", "tool_use_id"])
    op.add_column(
        "compactions",
        sa.Column(
            "cleared_tool_use_ids", sa.Text(), nullable=False, server_default=sa.text("'[]'")
        ),
    )
    rows = bind.execute(
        sa.select(_compactions.c.id, _compactions.c.cleared_tool_calls).where(
            _compactions.c.cleared_tool_calls != "[]"
        )
    ).all()
    for row in rows:
        ids = [pair[0] for pair in json.loads(row.cleared_tool_calls)]
        bind.execute(
            sa.update(_compactions)
            .where(_compactions.c.id == row.id)
            .values(cleared_tool_use_ids=json.dumps(ids, ensure_ascii=False, separators=(",", ":")))
        )
    op.drop_column("compactions", "cleared_tool_calls")
    op.execute(_history_view(op.get_bind().dialect.name))


def _primary_key(columns: list[str]) -> None:
    """Give ``tool_calls`` this primary key (SQLite: by copying the table, which nothing
    references; PostgreSQL: in place)."""
    with op.batch_alter_table("tool_calls", recreate="auto") as batch_op:
        batch_op.drop_constraint("pk_tool_calls", type_="primary")
        batch_op.create_primary_key("pk_tool_calls", columns)


def _history_view(dialect: str) -> str:
    # What was cleared: the pairs at this revision, the ids below it (downgrade).
    columns = {column["name"] for column in sa.inspect(op.get_bind()).get_columns("compactions")}
    cleared = "cleared_tool_calls" if "cleared_tool_calls" in columns else "cleared_tool_use_ids"

    def readable(column: str) -> str:
        if dialect == "sqlite":
            return f"datetime({column}, 'unixepoch')"
        return f"to_timestamp({column})"

    # As the initial revision wrote it, with the column of what was cleared.
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
    c.{cleared},
    c.blob_ids,
    c.steps,
    c.summary_text
FROM compactions AS c
LEFT JOIN compact_boundaries AS b ON b.id = c.boundary_id
"""
