"""Reads for recall: the logged messages that are not in the active context in full.

A message is out of the context when the live boundary cut it away (before its first kept
seq, not pinned) or when a live compaction edited it (cleared or persisted a tool result).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal, NamedTuple

from sqlalchemy import (
    ColumnElement,
    Connection,
    Select,
    Table,
    and_,
    bindparam,
    exists,
    or_,
    select,
)

from compactstore.db.common import SID
from compactstore.db.schema import (
    compactions,
    message_edits,
    messages,
    tool_calls,
    tool_result_blobs,
)

__all__ = ["OutRow", "answered_calls", "edit_states", "live_blob_ids", "out_of_context"]


class OutRow(NamedTuple):
    """A logged message out of the context: its seq, stored payload and why it is out."""

    seq: int
    payload: str
    removed: bool  # cut away by the live boundary (else edited by a live compaction)


_LIVE_EDIT = exists(
    select(message_edits.c.id)
    .join(compactions, compactions.c.id == message_edits.c.compaction_id)
    .where(
        message_edits.c.session_id == messages.c.session_id,
        message_edits.c.seq == messages.c.seq,
        compactions.c.rolled_back_at.is_(None),
    )
)


def out_of_context(
    connection: Connection,
    session_id: str,
    first_kept_seq: int,
    *,
    from_seq: int,
    to_seq: int,
    newest_first: bool = False,
    limit: int = 100,
    contains: str | None = None,
) -> list[OutRow]:
    """Up to ``limit`` messages of seqs ``from_seq``..``to_seq`` not in the context in full,
    oldest first (or newest first). ``contains`` keeps only payloads holding that text in
    any ASCII case: a coarse filter a caller checks again on the message's text."""
    removed: ColumnElement[bool] = and_(
        messages.c.seq < first_kept_seq, messages.c.pinned.is_(None)
    )
    query = select(messages.c.seq, messages.c.payload, removed.label("removed")).where(
        messages.c.session_id == SID,
        messages.c.seq >= from_seq,
        messages.c.seq <= to_seq,
        or_(removed, _LIVE_EDIT),
    )
    if contains is not None:
        escaped = contains.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        query = query.where(messages.c.payload.ilike(f"%{escaped}%", escape="\\"))
    order = messages.c.seq.desc() if newest_first else messages.c.seq
    rows = connection.execute(query.order_by(order).limit(limit), {"sid": session_id}).all()
    return [OutRow(row.seq, row.payload, bool(row.removed)) for row in rows]


EditState = Literal["cleared", "persisted"]


def _live_of_seqs(table: Table, column: Any) -> Select[Any]:
    """(seq, ``column``) of ``table``'s rows for the given seqs whose compaction is live."""
    return (
        select(table.c.seq, column)
        .join(compactions, compactions.c.id == table.c.compaction_id)
        .where(
            table.c.session_id == SID,
            table.c.seq.in_(bindparam("seqs", expanding=True)),
            compactions.c.rolled_back_at.is_(None),
        )
        .order_by(table.c.id)
    )


_EDITS = _live_of_seqs(message_edits, message_edits.c.kind)


def edit_states(
    connection: Connection, session_id: str, seqs: Iterable[int]
) -> dict[int, EditState]:
    """The latest live edit of each of ``seqs`` that has one: cleared or persisted."""
    return {
        seq: "persisted" if kind == "persisted" else "cleared"
        for seq, kind in _of_seqs(connection, _EDITS, session_id, seqs)
    }


_BLOBS = _live_of_seqs(tool_result_blobs, tool_result_blobs.c.id)


def live_blob_ids(
    connection: Connection, session_id: str, seqs: Iterable[int]
) -> dict[int, list[int]]:
    """Ids of the blobs live compactions persisted for each of ``seqs``."""
    blobs: dict[int, list[int]] = {}
    for seq, blob_id in _of_seqs(connection, _BLOBS, session_id, seqs):
        blobs.setdefault(seq, []).append(blob_id)
    return blobs


_ANSWERED = select(tool_calls.c.result_seq, tool_calls.c.tool_use_id, tool_calls.c.call_seq).where(
    tool_calls.c.session_id == SID,
    tool_calls.c.result_seq.in_(bindparam("seqs", expanding=True)),
)


def answered_calls(
    connection: Connection, session_id: str, seqs: Iterable[int]
) -> dict[int, dict[str, int]]:
    """For each of ``seqs`` that answers calls: tool-use id -> seq of the call it answers
    (calls are keyed by (id, call seq): an id may be used again)."""
    answered: dict[int, dict[str, int]] = {}
    for seq, tool_use_id, call_seq in _of_seqs(connection, _ANSWERED, session_id, seqs):
        answered.setdefault(seq, {})[tool_use_id] = call_seq
    return answered


def _of_seqs(
    connection: Connection, statement: Select[Any], session_id: str, seqs: Iterable[int]
) -> list[tuple[Any, ...]]:
    """The rows of a per-seq statement for ``seqs`` (none without a query when empty)."""
    wanted = sorted(set(seqs))
    if not wanted:
        return []
    rows = connection.execute(statement, {"sid": session_id, "seqs": wanted})
    return [tuple(row) for row in rows]
