"""Store-wide counts for operators (``compactstore stats``), read in one snapshot with
SQLAlchemy Core over the tables of :mod:`compactstore.db.schema`; nothing is written."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, func, select

from compactstore.db import schema
from compactstore.db.model_calls import cost_totals

__all__ = ["stage_counts", "store_counts"]


def _count(connection: Connection, table: Any, *where: Any) -> int:
    return int(
        connection.execute(select(func.count()).select_from(table).where(*where)).scalar_one()
    )


def stage_counts(
    connection: Connection, session_id: str | None = None
) -> dict[str, tuple[int, int]]:
    """Stage -> (times it acted, tokens it freed) over every recorded compaction (rolled
    back ones included) of the store, or of one session: the successful compaction_steps
    rows by strategy. A call that ran several stages counts once for each."""
    steps = schema.compaction_steps
    query = (
        select(steps.c.strategy, func.count(), func.coalesce(func.sum(steps.c.tokens_freed), 0))
        .where(steps.c.success.is_(True))
        .group_by(steps.c.strategy)
        .order_by(steps.c.strategy)
    )
    if session_id is not None:
        query = query.where(steps.c.session_id == session_id)
    return {
        str(strategy): (int(count), int(freed))
        for strategy, count, freed in connection.execute(query)
    }


def store_counts(connection: Connection) -> dict[str, Any]:
    """Sessions, messages, compactions (by strategy, and by stage), boundaries, blobs and
    memory entries of the store, and its model calls' tokens by kind and cost (the ledger's
    sums)."""
    messages, tokens = connection.execute(
        select(func.count(), func.coalesce(func.sum(schema.messages.c.tokens), 0))
    ).one()
    by_strategy = {
        str(strategy or "none"): int(count)
        for strategy, count in connection.execute(
            select(schema.compactions.c.strategy, func.count())
            .group_by(schema.compactions.c.strategy)
            .order_by(schema.compactions.c.strategy)
        )
    }
    blobs, blob_bytes = connection.execute(
        select(func.count(), func.coalesce(func.sum(schema.tool_result_blobs.c.size), 0))
    ).one()
    boundaries = schema.compact_boundaries
    ledger = cost_totals(connection)
    return {
        "sessions": _count(connection, schema.sessions),
        "messages": int(messages),
        "message_tokens": int(tokens),
        "compactions": sum(by_strategy.values()),
        "compactions_rolled_back": _count(
            connection, schema.compactions, schema.compactions.c.rolled_back_at.is_not(None)
        ),
        "compactions_by_strategy": by_strategy,
        "stages": stage_counts(connection),
        "boundaries_live": _count(connection, boundaries, boundaries.c.rolled_back_at.is_(None)),
        "boundaries_rolled_back": _count(
            connection, boundaries, boundaries.c.rolled_back_at.is_not(None)
        ),
        "blobs": int(blobs),
        "blob_bytes": int(blob_bytes),
        "memory_entries": _count(connection, schema.memory_entries),
        "model_calls": ledger.calls,
        "model_calls_unpriced": ledger.unpriced_calls,
        "call_tokens": ledger.tokens_json(),
        "cost_usd": ledger.cost_usd,
    }
