"""Queries of the ``model_calls`` table: one row per model call of a session.

A row says how full the store thought the context was when it was sent (``usage``), and,
when the caller or the transcript reported it, what the provider counted (``real_tokens``).
The report draws its usage curve from these rows. Functions take the connection of a
transaction the store opened; none of them commits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import Connection, insert, select

from compactstore.db.schema import model_calls

__all__ = ["ModelCall", "calls_of", "insert_calls"]


@dataclass(frozen=True, slots=True)
class ModelCall:
    """One model call: the context sent ended at ``seq``."""

    seq: int
    usage: int
    real_tokens: int | None
    created_at: float


def insert_calls(connection: Connection, session_id: str, calls: Sequence[ModelCall]) -> None:
    if calls:
        connection.execute(
            insert(model_calls),
            [
                {
                    "session_id": session_id,
                    "seq": call.seq,
                    "usage": call.usage,
                    "real_tokens": call.real_tokens,
                    "created_at": call.created_at,
                }
                for call in calls
            ],
        )


def calls_of(connection: Connection, session_id: str) -> list[ModelCall]:
    """The session's model calls, oldest first."""
    rows = connection.execute(
        select(
            model_calls.c.seq,
            model_calls.c.usage,
            model_calls.c.real_tokens,
            model_calls.c.created_at,
        )
        .where(model_calls.c.session_id == session_id)
        .order_by(model_calls.c.id)
    )
    return [ModelCall(*row) for row in rows]
