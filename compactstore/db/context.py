"""Reading the rows the active context is made of, and the boundaries and compactions that
cut it.

This module only reads rows (:func:`context_rows`); :mod:`compactstore._core.assembling`
puts them together into an :class:`~compactstore._context.active.ActiveContext`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from sqlalchemy import (
    ColumnElement,
    Connection,
    and_,
    bindparam,
    func,
    or_,
    select,
    update,
)

from compactstore.db.common import SID, columns
from compactstore.db.history import next_context_version
from compactstore.db.schema import (
    compact_boundaries,
    compaction_configs,
    compactions,
    message_edits,
    messages,
)
from compactstore.db.sessions import SessionRow
from compactstore.models import CompactionConfig, CompactStrategy

__all__ = [
    "CLEAR",
    "AsOf",
    "BoundaryRow",
    "CompactionRow",
    "ContextRows",
    "EditRow",
    "LoggedMessage",
    "appended_rows",
    "boundary_rows",
    "cleared_before",
    "compaction_of_boundary",
    "compaction_rows",
    "context_changes",
    "context_rows",
    "edit_rows",
    "get_boundary",
    "get_compaction",
    "live_boundary",
    "roll_back",
    "roll_back_from",
]


class LoggedMessage(NamedTuple):
    """A message of the log as the context needs it."""

    seq: int
    payload: str
    tokens: int
    created_at: float
    pinned: str | None  # why it is pinned (system, request, user), None when it is not
    dedup_of_seq: int | None
    context_version: int | None  # an assistant message: the context version it answered


class EditRow(NamedTuple):
    """One live edit of a message (the newest of a seq wins; see core.assembling)."""

    seq: int
    kind: str  # persisted, removed or cleared
    payload: str
    tokens: int
    tool_use_ids: str  # JSON list of the tool-use ids it edited


class BoundaryRow(NamedTuple):
    """A ``compact_boundaries`` row."""

    id: int
    trigger: str
    strategy: str
    created_at: float
    tokens_before: int
    tokens_after: int
    messages_removed: int
    first_kept_seq: int
    last_kept_seq: int | None
    summary_text: str
    summary_message: str
    summary_tokens: int
    summary_state: str
    parent_id: int | None
    rolled_back_at: float | None


class CompactionRow(NamedTuple):
    """A ``compactions`` row."""

    id: int
    trigger: str | None
    strategy: str | None
    success: bool
    tokens_before: int
    tokens_after: int
    tokens_freed: int
    summary_text: str
    boundary_id: int | None
    created_at: float
    steps: str
    config: str
    removed_seqs: str
    cleared_tool_calls: str  # JSON [[tool-use id, call seq], ...]
    blob_ids: str
    instructions: str | None
    error: str | None
    replay_of: int | None
    inputs: str
    rolled_back_at: float | None
    rolled_back_after: int | None
    started_by: int | None
    summary_source: str | None
    summarizer: str | None
    summarizer_model: str | None
    summarizer_latency_ms: float | None
    summarizer_input_tokens: int | None
    summarizer_output_tokens: int | None
    summarizer_fallback: bool | None
    summarizer_reason: str | None
    edit_policy: str | None = None


# The strategy of a re-read stored as a stub (at append time): never rolled back.
READ_DEDUP = CompactStrategy.READ_DEDUP.value

_BOUNDARY = columns(compact_boundaries, BoundaryRow)
# A row's config is the compaction_configs row it names, or (rows written before that
# table, or by an older version) its own copy.
_COMPACTION = [
    func.coalesce(compaction_configs.c.config, compactions.c.config).label("config")
    if column.name == "config"
    else column
    for column in columns(compactions, CompactionRow)
]
_WITH_CONFIG = compactions.outerjoin(
    compaction_configs,
    and_(
        compaction_configs.c.session_id == compactions.c.session_id,
        compaction_configs.c.hash == compactions.c.config_hash,
    ),
)


@dataclass(frozen=True, slots=True)
class AsOf:
    """The moment just before a recorded compaction, for rebuilding its input."""

    compaction_id: int
    boundary_id: int | None
    last_seq: int
    usage_offset: int
    token_factor: float | None
    config: CompactionConfig


# -- boundaries and the active context ------------------------------------------------------


_LIVE_BOUNDARY = (
    select(*_BOUNDARY)
    .where(
        compact_boundaries.c.session_id == SID,
        compact_boundaries.c.rolled_back_at.is_(None),
    )
    .order_by(compact_boundaries.c.id.desc())
    .limit(1)
)


CLEAR = "clear"  # the strategy of a clear_session boundary: no pins, no summary


def cleared_before(connection: Connection, session_id: str, boundary: BoundaryRow | None) -> int:
    """The first seq after the latest live clear boundary up to ``boundary`` (0: none)."""
    if boundary is None:
        return 0
    if boundary.strategy == CLEAR:
        return boundary.first_kept_seq
    found = connection.execute(
        select(func.max(compact_boundaries.c.first_kept_seq)).where(
            compact_boundaries.c.session_id == session_id,
            compact_boundaries.c.strategy == CLEAR,
            compact_boundaries.c.rolled_back_at.is_(None),
            compact_boundaries.c.id <= boundary.id,
        )
    ).scalar_one_or_none()
    return 0 if found is None else int(found)


def live_boundary(connection: Connection, session_id: str) -> BoundaryRow | None:
    row = connection.execute(_LIVE_BOUNDARY, {"sid": session_id}).one_or_none()
    return None if row is None else BoundaryRow._make(row)


_MESSAGE_COLUMNS = columns(messages, LoggedMessage)


@dataclass(frozen=True, slots=True)
class ContextRows:
    """What the active context is assembled from, read in the caller's transaction."""

    boundary: BoundaryRow | None  # the live boundary (as of a compaction: the one before it)
    messages: list[LoggedMessage]  # the pinned messages and every one from its first kept seq
    edits: list[EditRow]  # their live edits, oldest first
    last_seq: int
    changes: tuple[tuple[int, int], ...]  # see context_changes


def context_rows(
    connection: Connection, session: SessionRow, *, as_of: AsOf | None = None
) -> ContextRows:
    """Read what the active context is assembled from: the live boundary, the pinned
    messages and every message from its first kept seq on, and their live edits. With
    ``as_of`` as the context stood just before a recorded compaction (for replay)."""
    sid = session.id
    if as_of is None:
        boundary_row = live_boundary(connection, sid)
    else:
        boundary_row = (
            get_boundary(connection, sid, as_of.boundary_id) if as_of.boundary_id else None
        )
    first_kept = boundary_row.first_kept_seq if boundary_row is not None else 0
    last_seq = session.last_seq if as_of is None else as_of.last_seq
    # clear_session keeps nothing: no pin from before the latest clear comes back.
    pins_from = cleared_before(connection, sid, boundary_row)
    rows = connection.execute(
        select(*_MESSAGE_COLUMNS)
        .where(
            messages.c.session_id == sid,
            or_(
                messages.c.seq >= first_kept,
                and_(messages.c.pinned.is_not(None), messages.c.seq >= pins_from),
            ),
            messages.c.seq <= last_seq,
        )
        .order_by(messages.c.seq)
    ).all()
    logged = [LoggedMessage._make(row) for row in rows]
    return ContextRows(
        boundary_row,
        logged,
        edit_rows(connection, sid, first_kept, as_of),
        last_seq,
        context_changes(connection, sid, logged, as_of),
    )


def context_changes(
    connection: Connection,
    session_id: str,
    rows: Sequence[LoggedMessage],
    as_of: AsOf | None = None,
) -> tuple[tuple[int, int], ...]:
    """The changes to the context newer than what its oldest assistant message answered:
    (context version, seq after which prefixes changed) of every
    compaction that changed messages, and again of its rollback. With ``as_of``, those
    recorded before that compaction. Empty when no message records a version."""
    answered = [row.context_version for row in rows if row.context_version is not None]
    if not answered:
        return ()
    oldest = min(answered)
    c = compactions.c
    query = select(
        c.changed_after_seq, c.context_version, c.rolled_back_version, c.rolled_back_after
    ).where(
        c.session_id == session_id,
        c.changed_after_seq.is_not(None),
        or_(c.context_version > oldest, c.rolled_back_version > oldest),
    )
    if as_of is not None:
        query = query.where(c.id < as_of.compaction_id)
    found: list[tuple[int, int]] = []
    for row in connection.execute(query):
        if row.context_version is not None and row.context_version > oldest:
            found.append((row.context_version, row.changed_after_seq))
        undone = row.rolled_back_version
        # As of a compaction: only a rollback made before that compaction was recorded.
        if (
            undone is not None
            and undone > oldest
            and (as_of is None or row.rolled_back_after < as_of.compaction_id)
        ):
            found.append((undone, row.changed_after_seq))
    return tuple(found)


_APPENDED = (
    select(*_MESSAGE_COLUMNS)
    .where(
        messages.c.session_id == SID,
        messages.c.seq > bindparam("after_seq"),
        messages.c.seq <= bindparam("last_seq"),
    )
    .order_by(messages.c.seq)
)


def appended_rows(
    connection: Connection, session_id: str, after_seq: int, last_seq: int
) -> list[LoggedMessage]:
    """The messages of the log after ``after_seq`` up to ``last_seq``."""
    rows = connection.execute(
        _APPENDED, {"sid": session_id, "after_seq": after_seq, "last_seq": last_seq}
    ).all()
    return [LoggedMessage._make(row) for row in rows]


def edit_rows(
    connection: Connection, session_id: str, from_seq: int, as_of: AsOf | None = None
) -> list[EditRow]:
    """The live edits of the messages from ``from_seq`` on (as of a compaction: those live
    just before it), oldest first."""
    live: ColumnElement[bool]
    if as_of is None:
        live = compactions.c.rolled_back_at.is_(None)
    else:
        # Live just before compaction C: made before C, and not rolled back before C existed.
        live = and_(
            compactions.c.id < as_of.compaction_id,
            or_(
                compactions.c.rolled_back_at.is_(None),
                compactions.c.rolled_back_after >= as_of.compaction_id,
            ),
        )
    rows = connection.execute(
        select(
            message_edits.c.seq,
            message_edits.c.kind,
            message_edits.c.payload,
            message_edits.c.tokens,
            message_edits.c.tool_use_ids,
        )
        .join(compactions, compactions.c.id == message_edits.c.compaction_id)
        .where(
            message_edits.c.session_id == session_id,
            message_edits.c.seq >= from_seq,
            live,
        )
        .order_by(message_edits.c.id)
    ).all()
    return [EditRow._make(row) for row in rows]


def get_boundary(connection: Connection, session_id: str, boundary_id: int) -> BoundaryRow | None:
    row = connection.execute(
        select(*_BOUNDARY).where(
            compact_boundaries.c.session_id == session_id, compact_boundaries.c.id == boundary_id
        )
    ).one_or_none()
    return None if row is None else BoundaryRow._make(row)


def compaction_of_boundary(
    connection: Connection, session_id: str, boundary_id: int
) -> CompactionRow | None:
    return _one_compaction(connection, session_id, compactions.c.boundary_id == boundary_id)


def roll_back(
    connection: Connection, session_id: str, boundary_id: int, compaction_id: int, now: float
) -> None:
    """Mark a boundary, its compaction and everything recorded after them as rolled back."""
    _roll_back_compactions(connection, session_id, compaction_id, now)
    _roll_back_boundaries(connection, session_id, boundary_id, now)


def boundaries_from(
    connection: Connection, session_id: str, compaction_id: int
) -> list[BoundaryRow]:
    """The live boundaries that rolling back compaction ``compaction_id`` and every
    compaction after it undoes (oldest first)."""
    boundary_ids = [
        int(b)
        for b in connection.execute(
            select(compactions.c.boundary_id).where(
                compactions.c.session_id == session_id,
                compactions.c.id >= compaction_id,
                compactions.c.rolled_back_at.is_(None),
                compactions.c.boundary_id.is_not(None),
            )
        ).scalars()
    ]
    return [
        row
        for row in boundary_rows(connection, session_id, include_rolled_back=False)
        if boundary_ids and row.id >= min(boundary_ids)
    ]


def roll_back_from(
    connection: Connection, session_id: str, compaction_id: int, now: float
) -> list[BoundaryRow]:
    """Mark compaction ``compaction_id`` and every compaction recorded after it rolled back,
    with their boundaries; returns the boundaries so marked (oldest first)."""
    live = boundaries_from(connection, session_id, compaction_id)
    _roll_back_compactions(connection, session_id, compaction_id, now)
    if live:
        _roll_back_boundaries(connection, session_id, live[0].id, now)
    return live


def _roll_back_compactions(
    connection: Connection, session_id: str, compaction_id: int, now: float
) -> None:
    """Compaction ``compaction_id`` and every live one after it, noting the newest id then.
    Read dedups stay live: their stub is the logged message, which no rollback changes."""
    latest = connection.execute(
        select(func.max(compactions.c.id)).where(compactions.c.session_id == session_id)
    ).scalar_one()
    connection.execute(
        update(compactions)
        .where(
            compactions.c.session_id == session_id,
            compactions.c.id >= compaction_id,
            compactions.c.rolled_back_at.is_(None),
            or_(compactions.c.strategy.is_(None), compactions.c.strategy != READ_DEDUP),
        )
        .values(
            rolled_back_at=now,
            rolled_back_after=latest,
            # The rollback changes the context back: a change too.
            rolled_back_version=next_context_version(session_id),
        )
    )


def _roll_back_boundaries(
    connection: Connection, session_id: str, boundary_id: int, now: float
) -> None:
    """Boundary ``boundary_id`` and every live one after it."""
    connection.execute(
        update(compact_boundaries)
        .where(
            compact_boundaries.c.session_id == session_id,
            compact_boundaries.c.id >= boundary_id,
            compact_boundaries.c.rolled_back_at.is_(None),
        )
        .values(rolled_back_at=now)
    )


def get_compaction(
    connection: Connection, session_id: str, compaction_id: int
) -> CompactionRow | None:
    return _one_compaction(connection, session_id, compactions.c.id == compaction_id)


def _one_compaction(
    connection: Connection, session_id: str, condition: ColumnElement[bool]
) -> CompactionRow | None:
    row = connection.execute(
        select(*_COMPACTION)
        .select_from(_WITH_CONFIG)
        .where(compactions.c.session_id == session_id, condition)
    ).one_or_none()
    return None if row is None else CompactionRow._make(row)


def boundary_rows(
    connection: Connection, session_id: str, *, include_rolled_back: bool
) -> list[BoundaryRow]:
    query = select(*_BOUNDARY).where(compact_boundaries.c.session_id == session_id)
    if not include_rolled_back:
        query = query.where(compact_boundaries.c.rolled_back_at.is_(None))
    return [
        BoundaryRow._make(row)
        for row in connection.execute(query.order_by(compact_boundaries.c.id))
    ]


def compaction_rows(connection: Connection, session_id: str) -> list[CompactionRow]:
    query = (
        select(*_COMPACTION).select_from(_WITH_CONFIG).where(compactions.c.session_id == session_id)
    )
    return [
        CompactionRow._make(row) for row in connection.execute(query.order_by(compactions.c.id))
    ]
