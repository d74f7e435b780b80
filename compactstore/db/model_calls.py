"""Queries of the ``model_calls`` table: one row per model call of a session.

A row says how full the store thought the context was when it was sent (``usage``), and,
when the caller or the transcript reported it, what the provider counted (``real_tokens``).
The report draws its usage curve from these rows. Functions take the connection of a
transaction the store opened; none of them commits.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

from sqlalchemy import Connection, insert, select

from compactstore.db.schema import compact_boundaries, messages, model_calls

__all__ = ["ModelCall", "calls_of", "imported_calls", "insert_calls"]


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


def imported_calls(
    connection: Connection,
    session_id: str,
    real_tokens: dict[int, int],
    created_at: dict[int, float],
    *,
    overhead: int,
    factor: float,
) -> list[ModelCall]:
    """The model calls of a just-imported transcript, from the stored log.

    ``real_tokens`` maps the seq of an assistant message to the prompt size the transcript
    reported for the call that produced it; the context of that call ended one seq
    before. Its ``usage`` is the store's estimate of that context (pinned messages before the
    imported boundary then in force, its summary, the messages after it), as ``usage`` would
    have said with no real count known yet.
    """
    log = connection.execute(
        select(messages.c.seq, messages.c.tokens, messages.c.pinned)
        .where(messages.c.session_id == session_id)
        .order_by(messages.c.seq)
    ).all()
    tokens = [row.tokens for row in log]
    pinned = [row.tokens if row.pinned is not None else 0 for row in log]
    total = [0, *accumulate(tokens)]  # total[s] = tokens of seqs before s
    pinned_total = [0, *accumulate(pinned)]
    cuts = connection.execute(
        select(compact_boundaries.c.first_kept_seq, compact_boundaries.c.summary_tokens)
        .where(compact_boundaries.c.session_id == session_id)
        .order_by(compact_boundaries.c.first_kept_seq)
    ).all()
    firsts = [cut.first_kept_seq for cut in cuts]
    calls: list[ModelCall] = []
    for seq in sorted(real_tokens):
        last = seq - 1
        if last < 0:
            continue
        index = bisect_right(firsts, last) - 1  # the boundary in force at that call
        if index < 0:
            raw = total[last + 1]
        else:
            first = firsts[index]
            raw = pinned_total[first] + cuts[index].summary_tokens + total[last + 1] - total[first]
        calls.append(
            ModelCall(last, overhead + round(factor * raw), real_tokens[seq], created_at[seq])
        )
    return calls
