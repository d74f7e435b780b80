"""A session's cost, read from its ledger (``model_calls``): sums in SQL, prices from the
store's table (:mod:`compactstore.pricing`)."""

from __future__ import annotations

from sqlalchemy import Connection

from compactstore._core.sessions import require
from compactstore._ledger import CacheRewrite, SessionCost
from compactstore.db import model_calls
from compactstore.pricing import PriceTable, cache_write_cost

__all__ = ["session_cost"]


def session_cost(
    connection: Connection, session_id: str, location: str, prices: PriceTable
) -> SessionCost:
    """Sum the session's model calls, and price what each compaction made the cache write
    again (the cache writes of the first call after it).

    Raises:
        NotFoundError: the session does not exist.
    """
    require(connection, session_id, location)
    rewrites = [
        CacheRewrite(
            compaction_id=row.compaction_id,
            call_seq=row.call_seq,
            cache_write_5m_tokens=row.cache_write_5m_tokens,
            cache_write_1h_tokens=row.cache_write_1h_tokens,
            tokens=row.cache_write_5m_tokens + row.cache_write_1h_tokens,
            cost_usd=cache_write_cost(
                prices.price(row.model),
                prompt_tokens=row.prompt_tokens,
                cache_write_5m_tokens=row.cache_write_5m_tokens,
                cache_write_1h_tokens=row.cache_write_1h_tokens,
            ),
        )
        for row in model_calls.rewrite_rows(connection, session_id)
    ]
    return SessionCost(
        session_id=session_id,
        cache_rewrites=rewrites,
        **model_calls.cost_totals(connection, session_id).model_dump(),
    )
