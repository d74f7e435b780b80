"""The breaker, memory, blobs, and writing what a compaction decided."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any, NamedTuple

from sqlalchemy import (
    Connection,
    ScalarSelect,
    bindparam,
    func,
    insert,
    select,
    update,
)

from compactstore.db.common import SID, columns
from compactstore.db.schema import (
    breaker_state,
    compact_boundaries,
    compaction_configs,
    compaction_steps,
    compactions,
    memory_entries,
    message_edits,
    messages,
    sessions,
    tool_calls,
    tool_result_blobs,
)
from compactstore.models import MemoryEntry

__all__ = [
    "BlobRow",
    "BreakerRow",
    "appended_conflicts",
    "config_hash",
    "count_fallback",
    "edited_since",
    "get_blob",
    "get_breaker",
    "insert_blobs",
    "insert_boundary",
    "insert_compaction",
    "insert_edits",
    "insert_memory",
    "memories",
    "next_blob_id",
    "next_context_version",
    "set_breaker",
    "summarizer_calls_since",
]


# -- breaker, memory, blobs -----------------------------------------------------------------


class BreakerRow(NamedTuple):
    """A session's ``breaker_state`` row."""

    consecutive_failures: int
    tripped: bool
    reactive_attempts: int
    last_microcompact_at: float
    consecutive_fallbacks: int


class BlobRow(NamedTuple):
    """A persisted tool result (``tool_result_blobs``)."""

    id: int
    seq: int
    tool_use_id: str
    tool_name: str
    sha256: str
    size: int
    content: bytes


_BREAKER = select(*columns(breaker_state, BreakerRow)).where(breaker_state.c.session_id == SID)


def get_breaker(connection: Connection, session_id: str) -> BreakerRow:
    return BreakerRow._make(connection.execute(_BREAKER, {"sid": session_id}).one())


def count_fallback(connection: Connection, session_id: str) -> None:
    """One more summary in a row that fell back to the rule-based one."""
    connection.execute(
        update(breaker_state)
        .where(breaker_state.c.session_id == session_id)
        .values(consecutive_fallbacks=breaker_state.c.consecutive_fallbacks + 1)
    )


def set_breaker(connection: Connection, session_id: str, **values: Any) -> None:
    connection.execute(
        update(breaker_state).where(breaker_state.c.session_id == session_id).values(**values)
    )


def insert_memory(
    connection: Connection,
    session_id: str,
    *,
    kind: str,
    text: str,
    tokens: int,
    created_at: float,
    scope: str,
) -> int:
    result = connection.execute(
        insert(memory_entries)
        .values(
            session_id=session_id,
            kind=kind,
            text=text,
            tokens=tokens,
            created_at=created_at,
            scope=scope,
        )
        .returning(memory_entries.c.id)
    )
    return int(result.scalar_one())


_MEMORIES = (
    select(memory_entries).where(memory_entries.c.session_id == SID).order_by(memory_entries.c.id)
)


def memories(connection: Connection, session_id: str) -> list[MemoryEntry]:
    """The session's memory entries, oldest first."""
    rows = connection.execute(_MEMORIES, {"sid": session_id}).all()
    return [
        MemoryEntry(
            id=r.id,
            kind=r.kind,
            text=r.text,
            tokens=r.tokens,
            created_at=r.created_at,
            scope=r.scope,
        )
        for r in rows
    ]


def get_blob(connection: Connection, session_id: str, blob_id: int) -> BlobRow | None:
    row = connection.execute(
        select(*columns(tool_result_blobs, BlobRow)).where(
            tool_result_blobs.c.session_id == session_id, tool_result_blobs.c.id == blob_id
        )
    ).one_or_none()
    return None if row is None else BlobRow._make(row)


# -- recording a compaction -----------------------------------------------------------------


_LAST_BLOB_ID = select(func.max(tool_result_blobs.c.id)).where(
    tool_result_blobs.c.session_id == SID
)


def next_blob_id(connection: Connection, session_id: str) -> int:
    return _after(connection.execute(_LAST_BLOB_ID, {"sid": session_id}).scalar_one())


def _after(last_blob_id: int | None) -> int:
    """The id the session's next blob gets (blob ids count per session from 1)."""
    return 1 if last_blob_id is None else int(last_blob_id) + 1


def insert_boundary(connection: Connection, session_id: str, **values: Any) -> int:
    result = connection.execute(
        insert(compact_boundaries)
        .values(session_id=session_id, **values)
        .returning(compact_boundaries.c.id)
    )
    return int(result.scalar_one())


def boundaries_holding(connection: Connection, key: str) -> list[tuple[str, int, float | None]]:
    """(session id, boundary id, rolled back at) of every boundary whose summary message
    holds ``key`` (a provider compaction object's id or signature)."""
    rows = connection.execute(
        select(
            compact_boundaries.c.session_id,
            compact_boundaries.c.id,
            compact_boundaries.c.rolled_back_at,
        ).where(compact_boundaries.c.summary_message.contains(key, autoescape=True))
    )
    return [(str(row[0]), int(row[1]), row[2]) for row in rows]


def insert_compaction(connection: Connection, session_id: str, **values: Any) -> int:
    """Insert a compactions row; one that changed messages of the context
    (``changed_after_seq``) records the context version its transaction produces. The
    ``config`` JSON is stored once per session (:func:`config_hash`), the row names it;
    each of its ``steps`` (JSON) is a compaction_steps row too."""
    values["config_hash"] = config_hash(connection, session_id, values.pop("config"))
    values["config"] = ""
    if values.get("changed_after_seq") is not None:
        values["context_version"] = next_context_version(session_id)
    result = connection.execute(
        insert(compactions).values(session_id=session_id, **values).returning(compactions.c.id)
    )
    compaction_id = int(result.scalar_one())
    steps = json.loads(values["steps"])
    if steps:
        connection.execute(
            insert(compaction_steps),
            [
                {
                    "compaction_id": compaction_id,
                    "position": position,
                    "session_id": session_id,
                    "strategy": step["strategy"],
                    "trigger": step["trigger"],
                    "success": step["success"],
                    "tokens_freed": step["tokens_freed"],
                    "results_cleared": step.get("results_cleared"),
                    "results_persisted": step.get("results_persisted"),
                    "detail": step.get("detail", ""),
                }
                for position, step in enumerate(steps)
            ],
        )
    return compaction_id


def config_hash(connection: Connection, session_id: str, config: str) -> str:
    """The SHA-256 of a config's JSON, stored in ``compaction_configs`` unless the session
    has it already (its write transaction holds the session, so no one else adds it)."""
    digest = hashlib.sha256(config.encode("utf-8")).hexdigest()
    known = connection.execute(
        select(compaction_configs.c.hash).where(
            compaction_configs.c.session_id == session_id, compaction_configs.c.hash == digest
        )
    ).first()
    if known is None:
        connection.execute(
            insert(compaction_configs).values(session_id=session_id, hash=digest, config=config)
        )
    return digest


def next_context_version(session_id: str) -> ScalarSelect[Any]:
    """The session's context_version after the structural write the caller's transaction
    makes: any value above the current one and at most the final
    one says the same, as no message is appended within that transaction."""
    return (
        select(sessions.c.context_version + 1).where(sessions.c.id == session_id).scalar_subquery()
    )


def insert_edits(connection: Connection, session_id: str, rows: Sequence[dict[str, Any]]) -> None:
    if rows:
        connection.execute(
            insert(message_edits), [{"session_id": session_id, **row} for row in rows]
        )


def insert_blobs(connection: Connection, session_id: str, rows: Sequence[dict[str, Any]]) -> None:
    if rows:
        connection.execute(
            insert(tool_result_blobs), [{"session_id": session_id, **row} for row in rows]
        )


# -- what a commit checks against its snapshot -------------------------------------

_LAST_COMPACTION_ID = select(func.max(compactions.c.id)).where(compactions.c.session_id == SID)

# What a call's plan reads besides its context, in one statement (it runs before every model
# call): the breaker, and the ids the engines number from and the commit checks against.
_PLAN_STATE = select(
    *columns(breaker_state, BreakerRow),
    _LAST_BLOB_ID.scalar_subquery(),
    _LAST_COMPACTION_ID.scalar_subquery(),
).where(breaker_state.c.session_id == SID)


def plan_state(connection: Connection, session_id: str) -> tuple[BreakerRow, int, int]:
    """The session's breaker (:func:`get_breaker`), next blob id (:func:`next_blob_id`) and
    highest compaction id (0 when none)."""
    *breaker, last_blob, last_compaction = connection.execute(
        _PLAN_STATE, {"sid": session_id}
    ).one()
    return (
        BreakerRow._make(breaker),
        _after(last_blob),
        0 if last_compaction is None else int(last_compaction),
    )


# Built once: building a statement costs more than running it (every compaction's plan
# runs this one).
_SUMMARIZER_CALLS = select(func.count()).where(
    compactions.c.session_id == SID,
    compactions.c.summarizer_latency_ms.is_not(None),
    compactions.c.created_at > bindparam("since"),
)


def summarizer_calls_since(connection: Connection, session_id: str, since: float) -> int:
    """Recorded compactions whose summarizer was called after ``since`` (calls' now)."""
    return int(
        connection.execute(_SUMMARIZER_CALLS, {"sid": session_id, "since": since}).scalar_one()
    )


def appended_conflicts(connection: Connection, session_id: str, after_seq: int) -> set[int]:
    """Seqs up to ``after_seq`` that a message appended after it depends on: the call a
    result answers, or the earlier read a dedup stub points at. A cut that removes one of
    them would leave the new message dangling."""
    answered = connection.execute(
        select(tool_calls.c.call_seq).where(
            tool_calls.c.session_id == session_id,
            tool_calls.c.result_seq > after_seq,
            tool_calls.c.call_seq <= after_seq,
        )
    ).scalars()
    pointed = connection.execute(
        select(messages.c.dedup_of_seq).where(
            messages.c.session_id == session_id,
            messages.c.seq > after_seq,
            messages.c.dedup_of_seq.is_not(None),
        )
    ).scalars()
    return {int(seq) for seq in answered} | {int(seq) for seq in pointed}


def edited_since(connection: Connection, session_id: str, after_compaction_id: int) -> set[int]:
    """Seqs given a live edit by a compaction recorded after ``after_compaction_id``."""
    rows = connection.execute(
        select(message_edits.c.seq)
        .join(compactions, compactions.c.id == message_edits.c.compaction_id)
        .where(
            message_edits.c.session_id == session_id,
            compactions.c.id > after_compaction_id,
            compactions.c.rolled_back_at.is_(None),
        )
    ).scalars()
    return {int(seq) for seq in rows}
