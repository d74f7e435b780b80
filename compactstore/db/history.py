"""The breaker, memory, blobs, and writing what a compaction decided."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from sqlalchemy import (
    Connection,
    func,
    insert,
    select,
    update,
)

from compactstore.db.common import SID, columns
from compactstore.db.schema import (
    breaker_state,
    compact_boundaries,
    compactions,
    memory_entries,
    message_edits,
    tool_result_blobs,
)
from compactstore.models import MemoryEntry

__all__ = [
    "BlobRow",
    "BreakerRow",
    "get_blob",
    "get_breaker",
    "insert_blobs",
    "insert_boundary",
    "insert_compaction",
    "insert_edits",
    "insert_memory",
    "memories",
    "next_blob_id",
    "set_breaker",
]


# -- breaker, memory, blobs -----------------------------------------------------------------


class BreakerRow(NamedTuple):
    """A session's ``breaker_state`` row."""

    consecutive_failures: int
    tripped: bool
    reactive_attempts: int
    last_microcompact_at: float


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
    current = connection.execute(_LAST_BLOB_ID, {"sid": session_id}).scalar_one()
    return 1 if current is None else int(current) + 1


def insert_boundary(connection: Connection, session_id: str, **values: Any) -> int:
    result = connection.execute(
        insert(compact_boundaries)
        .values(session_id=session_id, **values)
        .returning(compact_boundaries.c.id)
    )
    return int(result.scalar_one())


def insert_compaction(connection: Connection, session_id: str, **values: Any) -> int:
    result = connection.execute(
        insert(compactions).values(session_id=session_id, **values).returning(compactions.c.id)
    )
    return int(result.scalar_one())


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
