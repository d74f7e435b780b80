"""Queries of the ``model_calls`` table: one row per model call of a session.

A row says how full the store thought the context was when it was sent (``usage``), and,
when the caller or the transcript reported it, what the provider counted (``real_tokens``)
and billed (the ledger columns: tokens by kind, model, cost; see :mod:`compactstore._ledger`).
The report draws its usage curve from these rows; :func:`session_cost` sums them in SQL.
Functions take the connection of a transaction the store opened; none of them commits.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, Connection, and_, func, insert, select

from compactstore._ledger import CallUsage, LedgerTotals
from compactstore.db.schema import compactions, model_calls

__all__ = [
    "ModelCall",
    "RewriteRow",
    "calls_of",
    "cost_totals",
    "insert_calls",
    "recent_calls",
    "rewrite_rows",
    "transformations_of",
]


@dataclass(frozen=True, slots=True)
class ModelCall:
    """One model call: the context sent ended at ``seq``."""

    seq: int
    usage: int
    real_tokens: int | None
    created_at: float
    ledger: CallUsage | None = None  # what the provider billed, when reported
    cost_usd: float | None = None
    context_version: int | None = None  # the session's context version the call sent


def _dumped(value: object) -> str | None:
    return None if value is None else json.dumps(value, separators=(",", ":"))


def _row(session_id: str, call: ModelCall) -> dict[str, object]:
    ledger = call.ledger
    row: dict[str, object] = {
        "session_id": session_id,
        "seq": call.seq,
        "usage": call.usage,
        "real_tokens": call.real_tokens,
        "created_at": call.created_at,
        "cost_usd": call.cost_usd,
        "context_version": call.context_version,
        "input_tokens": None,
        "cache_read_tokens": None,
        "cache_write_5m_tokens": None,
        "cache_write_1h_tokens": None,
        "output_tokens": None,
        "iterations": None,
        "cache_miss_reason": None,
        "input_transformations": None,
        "model": None,
    }
    if ledger is not None:
        row.update(
            input_tokens=ledger.input_tokens,
            cache_read_tokens=ledger.cache_read_tokens,
            cache_write_5m_tokens=ledger.cache_write_5m_tokens,
            cache_write_1h_tokens=ledger.cache_write_1h_tokens,
            output_tokens=ledger.output_tokens,
            iterations=_dumped(ledger.iterations),
            cache_miss_reason=_dumped(ledger.cache_miss_reason),
            input_transformations=_dumped(ledger.input_transformations),
            model=ledger.model,
        )
    return row


def insert_calls(connection: Connection, session_id: str, calls: Sequence[ModelCall]) -> None:
    if calls:
        connection.execute(insert(model_calls), [_row(session_id, call) for call in calls])


def calls_of(connection: Connection, session_id: str) -> list[ModelCall]:
    """The session's model calls, oldest first, with what each was billed for (``ledger``
    None for a call recorded with a prompt size only) and its cost."""
    c = model_calls.c
    rows = connection.execute(
        select(
            c.seq,
            c.usage,
            c.real_tokens,
            c.created_at,
            c.input_tokens,
            c.cache_read_tokens,
            c.cache_write_5m_tokens,
            c.cache_write_1h_tokens,
            c.output_tokens,
            c.model,
            c.cost_usd,
        )
        .where(c.session_id == session_id)
        .order_by(c.id)
    )
    found = []
    for seq, usage, real, at, uncached, read, five, hour, output, model, cost in rows:
        ledger = None
        if uncached is not None:
            # Stored by insert_calls from a validated CallUsage: not validated again.
            ledger = CallUsage.model_construct(
                input_tokens=uncached,
                cache_read_tokens=read or 0,
                cache_write_5m_tokens=five or 0,
                cache_write_1h_tokens=hour or 0,
                output_tokens=output or 0,
                model=model,
            )
        found.append(ModelCall(seq, usage, real, at, ledger, cost))
    return found


def transformations_of(
    connection: Connection, session_id: str
) -> list[tuple[int, float, list[dict[str, Any]]]]:
    """(seq, created_at, input_transformations) of each of the session's model calls whose
    response listed what the API changed in its input (the thinking blocks it dropped),
    oldest first."""
    rows = connection.execute(
        select(model_calls.c.seq, model_calls.c.created_at, model_calls.c.input_transformations)
        .where(
            model_calls.c.session_id == session_id,
            model_calls.c.input_transformations.is_not(None),
        )
        .order_by(model_calls.c.id)
    )
    found = []
    for seq, at, raw in rows:
        listed = json.loads(raw)
        if isinstance(listed, list) and listed:
            found.append((int(seq), float(at), listed))
    return found


def recent_calls(connection: Connection, session_id: str, limit: int) -> list[tuple[int, float]]:
    """(seq, created_at) of the session's newest ``limit`` model calls, oldest first: the
    call rhythm and what the newest call sent, for the prompt cache decisions."""
    rows = connection.execute(
        select(model_calls.c.seq, model_calls.c.created_at)
        .where(model_calls.c.session_id == session_id)
        .order_by(model_calls.c.id.desc())
        .limit(limit)
    ).all()
    return [(int(seq), float(at)) for seq, at in reversed(rows)]


def cost_totals(connection: Connection, session_id: str | None = None) -> LedgerTotals:
    """Sum the ledger in one statement: a session's calls, or every call of the store."""
    c = model_calls.c

    def total(column: ColumnElement[Any]) -> ColumnElement[Any]:
        return func.coalesce(func.sum(column), 0)

    statement = select(
        func.count(),
        func.count(c.input_tokens),
        func.count(c.cost_usd),
        total(c.input_tokens),
        total(c.cache_read_tokens),
        total(c.cache_write_5m_tokens),
        total(c.cache_write_1h_tokens),
        total(c.output_tokens),
        func.sum(c.cost_usd),
    ).select_from(model_calls)
    if session_id is not None:
        statement = statement.where(c.session_id == session_id)
    row = connection.execute(statement).one()
    calls, with_usage, priced, uncached, read, five, hour, output = (int(v) for v in row[:8])
    return LedgerTotals(
        calls=calls,
        calls_without_usage=calls - with_usage,
        unpriced_calls=calls - priced,
        input_tokens=uncached,
        cache_read_tokens=read,
        cache_write_5m_tokens=five,
        cache_write_1h_tokens=hour,
        output_tokens=output,
        cost_usd=None if row[8] is None else float(row[8]),
    )


@dataclass(frozen=True, slots=True)
class RewriteRow:
    """The first model call after a compaction that changed the context."""

    compaction_id: int
    call_seq: int
    cache_write_5m_tokens: int
    cache_write_1h_tokens: int
    prompt_tokens: int
    model: str | None


def rewrite_rows(connection: Connection, session_id: str) -> list[RewriteRow]:
    """Per compaction that changed the context (it has a context version), the first
    model call whose context is at least that version, with its cache writes. When several
    compactions come before the same call, the call is attributed to the newest of them."""
    c = model_calls.c
    first_call = (
        select(func.min(c.id))
        .where(
            c.session_id == compactions.c.session_id,
            c.context_version >= compactions.c.context_version,
        )
        .scalar_subquery()
    )
    firsts = (
        select(
            compactions.c.id.label("compaction_id"),
            compactions.c.context_version.label("version"),
            first_call.label("call_id"),
        )
        .where(
            compactions.c.session_id == session_id,
            compactions.c.success.is_(True),
            compactions.c.context_version.is_not(None),
        )
        .subquery()
    )
    rows = connection.execute(
        select(
            firsts.c.compaction_id,
            firsts.c.version,
            c.id,
            c.seq,
            c.cache_write_5m_tokens,
            c.cache_write_1h_tokens,
            c.input_tokens,
            c.cache_read_tokens,
            c.model,
        )
        .join(model_calls, and_(c.id == firsts.c.call_id, c.input_tokens.is_not(None)))
        .order_by(c.id, firsts.c.version.desc())
    )
    found: list[RewriteRow] = []
    seen: set[int] = set()
    for compaction_id, _, call_id, seq, five, hour, uncached, read, model in rows:
        if call_id in seen:
            continue  # an older compaction before the same call: the newest one has it
        seen.add(call_id)
        found.append(
            RewriteRow(
                compaction_id=compaction_id,
                call_seq=seq,
                cache_write_5m_tokens=five or 0,
                cache_write_1h_tokens=hour or 0,
                prompt_tokens=(uncached or 0) + (read or 0) + (five or 0) + (hour or 0),
                model=model,
            )
        )
    found.sort(key=lambda r: r.compaction_id)
    return found
