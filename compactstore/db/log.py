"""Queries of the append-only log: ``messages``, ``tool_calls`` and ``read_dedup_entries``."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from sqlalchemy import (
    Connection,
    and_,
    bindparam,
    func,
    insert,
    select,
    update,
)

from compactstore.db.common import SID, DbRow, columns
from compactstore.db.schema import (
    compactions,
    message_edits,
    messages,
    read_dedup_entries,
    tool_calls,
)

__all__ = [
    "CallRow",
    "DedupRow",
    "LastMessage",
    "MessageRow",
    "dedup_entry",
    "delete_dedup_entry",
    "has_live_edit",
    "insert_calls",
    "insert_messages",
    "known_calls",
    "last_message",
    "last_turn_seq",
    "log_messages",
    "log_page",
    "mark_results",
    "message_count",
    "pinned_tokens_before",
    "set_dedup_entry",
]


@dataclass(frozen=True, slots=True)
class MessageRow:
    """A message ready to insert."""

    seq: int
    role: str
    kind: str
    payload: str
    tokens: int
    created_at: float
    pinned: str | None = None
    dedup_of_seq: int | None = None
    # An assistant message: the session's context_version it answered.
    context_version: int | None = None


# Statements that run on every step are built once, with bind parameters: building a Core

# -- messages -------------------------------------------------------------------------------


class LastMessage(NamedTuple):
    seq: int
    pinned: str | None
    kind: str


class CallRow(NamedTuple):
    """A ``tool_calls`` row: a call and the seq of the message answering it (None: open)."""

    tool_use_id: str
    name: str
    call_seq: int
    result_seq: int | None


class DedupRow(NamedTuple):
    """The registered read of a path (``read_dedup_entries``)."""

    file_path: str
    content_hash: str
    seq: int


_LAST_MESSAGE = (
    select(*columns(messages, LastMessage))
    .where(messages.c.session_id == SID)
    .order_by(messages.c.seq.desc())
    .limit(1)
)


def last_message(connection: Connection, session_id: str) -> LastMessage | None:
    row = connection.execute(_LAST_MESSAGE, {"sid": session_id}).one_or_none()
    return None if row is None else LastMessage._make(row)


_INSERT_MESSAGES = insert(messages)


def insert_messages(connection: Connection, session_id: str, rows: Sequence[MessageRow]) -> None:
    connection.execute(
        _INSERT_MESSAGES,
        [
            {
                "session_id": session_id,
                "seq": row.seq,
                "role": row.role,
                "kind": row.kind,
                "payload": row.payload,
                "tokens": row.tokens,
                "created_at": row.created_at,
                "pinned": row.pinned,
                "dedup_of_seq": row.dedup_of_seq,
                "context_version": row.context_version,
            }
            for row in rows
        ],
    )


_LAST_TURN = (
    select(messages.c.seq, messages.c.kind)
    .where(messages.c.session_id == SID, messages.c.kind != "tool")
    .order_by(messages.c.seq.desc())
    .limit(1)
)
_BEFORE_TURN = (
    select(messages.c.seq)
    .where(
        messages.c.session_id == SID,
        messages.c.seq < bindparam("before"),
        messages.c.kind != "assistant",
    )
    .order_by(messages.c.seq.desc())
    .limit(1)
)


def last_turn_seq(connection: Connection, session_id: str, *, grouped: bool = False) -> int:
    """Seq where the newest turn starts (-1 when there is none): the newest message that is
    not a tool result; with ``grouped`` (a turn is several assistant items, as in responses)
    the first of the assistant items that end there. Calls made before it were abandoned
    if still unanswered."""
    row = connection.execute(_LAST_TURN, {"sid": session_id}).one_or_none()
    if row is None:
        return -1
    seq, kind = int(row.seq), row.kind
    if not grouped or kind != "assistant":
        return seq
    before = connection.execute(
        _BEFORE_TURN, {"sid": session_id, "before": seq}
    ).scalar_one_or_none()
    return 0 if before is None else int(before) + 1


def message_count(connection: Connection, session_id: str) -> int:
    return int(
        connection.execute(
            select(func.count()).select_from(messages).where(messages.c.session_id == session_id)
        ).scalar_one()
    )


def pinned_tokens_before(connection: Connection, session_id: str, seq: int) -> int:
    """Tokens of the pinned messages before ``seq``."""
    return int(
        connection.execute(
            select(func.coalesce(func.sum(messages.c.tokens), 0)).where(
                messages.c.session_id == session_id,
                messages.c.pinned.is_not(None),
                messages.c.seq < seq,
            )
        ).scalar_one()
    )


def log_messages(
    connection: Connection, session_id: str, *, up_to_seq: int | None = None
) -> list[DbRow]:
    """The raw log, in seq order."""
    query = select(messages).where(messages.c.session_id == session_id)
    if up_to_seq is not None:
        query = query.where(messages.c.seq <= up_to_seq)
    return list(connection.execute(query.order_by(messages.c.seq)).all())


def log_page(
    connection: Connection, session_id: str, *, after_seq: int, up_to_seq: int, limit: int
) -> list[tuple[int, str]]:
    """(seq, payload) of up to ``limit`` log messages after ``after_seq``, in seq order."""
    query = (
        select(messages.c.seq, messages.c.payload)
        .where(
            messages.c.session_id == session_id,
            messages.c.seq > after_seq,
            messages.c.seq <= up_to_seq,
        )
        .order_by(messages.c.seq)
        .limit(limit)
    )
    return [(row.seq, row.payload) for row in connection.execute(query)]


# -- tool calls -----------------------------------------------------------------------------


_KNOWN_CALLS = (
    select(*columns(tool_calls, CallRow))
    .where(
        tool_calls.c.session_id == SID,
        tool_calls.c.tool_use_id.in_(bindparam("ids", expanding=True)),
    )
    .order_by(tool_calls.c.call_seq)
)


def known_calls(connection: Connection, session_id: str, ids: Iterable[str]) -> dict[str, CallRow]:
    """The newest call of each of ``ids`` in the log (an id may be used again once its
    earlier call was closed: calls are keyed by (id, call seq))."""
    wanted = sorted(set(ids))
    if not wanted:
        return {}
    rows = connection.execute(_KNOWN_CALLS, {"sid": session_id, "ids": wanted}).all()
    return {row.tool_use_id: CallRow._make(row) for row in rows}  # the newest one wins


_INSERT_CALLS = insert(tool_calls)


def insert_calls(
    connection: Connection, session_id: str, calls: Sequence[tuple[str, str, int]]
) -> None:
    """Register tool calls: (tool-use id, tool name, seq of the message that made it)."""
    if calls:
        connection.execute(
            _INSERT_CALLS,
            [
                {"session_id": session_id, "tool_use_id": call_id, "name": name, "call_seq": seq}
                for call_id, name, seq in calls
            ],
        )


_MARK_RESULT = (
    update(tool_calls)
    .where(
        tool_calls.c.session_id == SID,
        tool_calls.c.tool_use_id == bindparam("call_id"),
        tool_calls.c.call_seq == bindparam("the_call_seq"),
    )
    .values(result_seq=bindparam("new_result_seq"))
)


def mark_results(
    connection: Connection, session_id: str, results: Sequence[tuple[str, int, int]]
) -> None:
    """Record the answers: (tool-use id, call seq, seq of the message answering it)."""
    if results:
        connection.execute(
            _MARK_RESULT,
            [
                {
                    "sid": session_id,
                    "call_id": tool_use_id,
                    "the_call_seq": call_seq,
                    "new_result_seq": seq,
                }
                for tool_use_id, call_seq, seq in results
            ],
        )


# -- read dedup -----------------------------------------------------------------------------


def dedup_entry(connection: Connection, session_id: str, file_path: str) -> DedupRow | None:
    row = connection.execute(
        select(*columns(read_dedup_entries, DedupRow)).where(
            read_dedup_entries.c.session_id == session_id,
            read_dedup_entries.c.file_path == file_path,
        )
    ).one_or_none()
    return None if row is None else DedupRow._make(row)


def set_dedup_entry(
    connection: Connection, session_id: str, file_path: str, content_hash: str, seq: int, now: float
) -> None:
    delete_dedup_entry(connection, session_id, file_path)
    connection.execute(
        insert(read_dedup_entries).values(
            session_id=session_id,
            file_path=file_path,
            content_hash=content_hash,
            seq=seq,
            created_at=now,
        )
    )


def delete_dedup_entry(connection: Connection, session_id: str, file_path: str) -> int:
    result = connection.execute(
        read_dedup_entries.delete().where(
            read_dedup_entries.c.session_id == session_id,
            read_dedup_entries.c.file_path == file_path,
        )
    )
    return int(result.rowcount)


def has_live_edit(connection: Connection, session_id: str, seq: int) -> bool:
    return (
        connection.execute(
            select(message_edits.c.id)
            .join(compactions, compactions.c.id == message_edits.c.compaction_id)
            .where(
                and_(
                    message_edits.c.session_id == session_id,
                    message_edits.c.seq == seq,
                    compactions.c.rolled_back_at.is_(None),
                )
            )
            .limit(1)
        ).first()
        is not None
    )
