"""The prompt cache as the ledger knows it, for the engines' cost rule of in-place edits
(compactstore._context.caching): read in the compaction's read transaction."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection

from compactstore._context.caching import call_gap
from compactstore.db import model_calls
from compactstore.pricing import PriceTable

__all__ = ["RHYTHM_CALLS", "cache_inputs"]

# The newest calls the rhythm is read from.
RHYTHM_CALLS = 7
# A model without a price: the read multiplier most models have.
_DEFAULT_READ = 0.1


def cache_inputs(
    connection: Connection, session_id: str, model: str | None, prices: PriceTable | None
) -> dict[str, Any]:
    """``EngineInputs`` fields: ``last_call_at``, ``sent_seq`` (the newest call's), the
    ``call_gap`` of the recent calls and the model's ``cache_read`` multiplier."""
    calls = model_calls.recent_calls(connection, session_id, RHYTHM_CALLS)
    price = None if prices is None else prices.price(model)
    return {
        "last_call_at": calls[-1][1] if calls else None,
        "sent_seq": calls[-1][0] if calls else None,
        "call_gap": call_gap([at for _, at in calls]),
        "cache_read": _DEFAULT_READ if price is None else price.cache_read,
    }
