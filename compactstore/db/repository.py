"""Every query compactstore runs. SQLAlchemy Core only; no SQL is built from strings.

Functions take the connection of a transaction the store opened; none of them commits.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from sqlalchemy import (
    BindParameter,
    ColumnElement,
    Connection,
    Executable,
    and_,
    bindparam,
    func,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite

from compactstore.context import (
    ActiveContext,
    BoundaryInfo,
    ContextMessage,
    MessageState,
)
from compactstore.db.schema import (
    breaker_state,
    compact_boundaries,
    compactions,
    memory_entries,
    message_edits,
    messages,
    read_dedup_entries,
    sessions,
    tool_calls,
    tool_result_blobs,
)
from compactstore.formats import MessageFormat
from compactstore.formats.base import storage_json
from compactstore.models import CompactionConfig, MemoryEntry, SummaryState
from compactstore.tokens import TokenCounter

__all__ = [
    "MessageRow",
    "SessionRow",
    "dumps",
    "insert_ignore",
]


# A result row. Typed loosely: Row's type parameters differ between SQLAlchemy 2.0 and 2.1.
DbRow = Any


dumps = storage_json


def insert_ignore(connection: Connection, table: Any, values: dict[str, Any]) -> None:
    """INSERT that does nothing when the primary key exists (both backends)."""
    dialect = postgresql if connection.dialect.name == "postgresql" else sqlite
    connection.execute(dialect.insert(table).values(**values).on_conflict_do_nothing())


@dataclass(frozen=True, slots=True)
class SessionRow:
    id: str
    format: str
    context_window: int
    config: CompactionConfig
    created_at: float
    request_seq: int | None
    real_request_seq: int | None
    cwd: str | None
    usage_offset: int
    token_factor: float | None
    token_factor_weight: float | None
    real_tokens: int | None
    real_estimate: int | None
    version: int
    context_version: int
    last_seq: int


@dataclass(frozen=True, slots=True)
class AsOf:
    """The moment just before a recorded compaction, for rebuilding its input."""

    compaction_id: int
    boundary_id: int | None
    last_seq: int
    usage_offset: int
    token_factor: float | None
    config: CompactionConfig


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


# Statements that run on every step are built once, with bind parameters: building a Core
# statement and its cache key costs more than SQLite takes to run it.
_SID: BindParameter[str] = bindparam("sid")

# -- sessions -------------------------------------------------------------------------------


@lru_cache(maxsize=64)
def _config(text: str) -> CompactionConfig:
    """A stored config, parsed once per text (the model is frozen, so it can be shared)."""
    return CompactionConfig.model_validate_json(text)


def _session_row(row: DbRow) -> SessionRow:
    return SessionRow(
        id=row.id,
        format=row.format,
        context_window=row.context_window,
        config=_config(row.config),
        created_at=row.created_at,
        request_seq=row.request_seq,
        real_request_seq=row.real_request_seq,
        cwd=row.cwd,
        usage_offset=row.usage_offset,
        token_factor=row.token_factor,
        token_factor_weight=row.token_factor_weight,
        real_tokens=row.real_tokens,
        real_estimate=row.real_estimate,
        version=row.version,
        context_version=row.context_version,
        last_seq=row.last_seq,
    )


_SESSION = select(sessions).where(sessions.c.id == _SID)
_SESSION_FOR_UPDATE = _SESSION.with_for_update()


def get_session(
    connection: Connection, session_id: str, *, lock: bool = False
) -> SessionRow | None:
    """The session's row; with lock=True, PostgreSQL writers queue on it (SELECT FOR UPDATE)."""
    query = _SESSION_FOR_UPDATE if lock and connection.dialect.name == "postgresql" else _SESSION
    row = connection.execute(query, {"sid": session_id}).one_or_none()
    return None if row is None else _session_row(row)


def create_session(
    connection: Connection,
    session_id: str,
    *,
    format: str,
    context_window: int,
    config: CompactionConfig,
    created_at: float,
    cwd: str | None = None,
) -> None:
    insert_ignore(
        connection,
        sessions,
        {
            "id": session_id,
            "format": format,
            "context_window": context_window,
            "config": config.model_dump_json(),
            "created_at": created_at,
            "cwd": cwd,
        },
    )
    insert_ignore(
        connection,
        breaker_state,
        {"session_id": session_id, "last_microcompact_at": created_at},
    )


def update_session(
    connection: Connection, session_id: str, *, structural: bool = False, **values: Any
) -> None:
    """Change session columns and bump its version; ``structural`` for any change to the
    active context other than appending (so cached contexts know they must be rebuilt)."""
    statement = _update_session(frozenset(values), structural)
    connection.execute(
        statement, {"sid": session_id, **{f"new_{name}": value for name, value in values.items()}}
    )


@lru_cache(maxsize=32)
def _update_session(columns: frozenset[str], structural: bool) -> Executable:
    values: dict[str, Any] = {name: bindparam(f"new_{name}") for name in columns}
    if structural:
        values["context_version"] = sessions.c.context_version + 1
    return (
        update(sessions)
        .where(sessions.c.id == _SID)
        .values(version=sessions.c.version + 1, **values)
    )


_VERSIONS = select(sessions.c.version, sessions.c.context_version).where(sessions.c.id == _SID)


def session_versions(connection: Connection, session_id: str) -> tuple[int, int] | None:
    """The session's (version, context_version), as a cached context is keyed."""
    row = connection.execute(_VERSIONS, {"sid": session_id}).one_or_none()
    return None if row is None else (row.version, row.context_version)


def list_sessions(connection: Connection) -> list[tuple[SessionRow, int]]:
    counts = (
        select(messages.c.session_id, func.count().label("n"))
        .group_by(messages.c.session_id)
        .subquery()
    )
    rows = connection.execute(
        select(sessions, func.coalesce(counts.c.n, 0).label("message_count"))
        .outerjoin(counts, counts.c.session_id == sessions.c.id)
        .order_by(sessions.c.created_at, sessions.c.id)
    ).all()
    return [(_session_row(row), row.message_count) for row in rows]


# -- messages -------------------------------------------------------------------------------


_LAST_MESSAGE = (
    select(messages.c.seq, messages.c.role, messages.c.pinned)
    .where(messages.c.session_id == _SID)
    .order_by(messages.c.seq.desc())
    .limit(1)
)


def last_message(connection: Connection, session_id: str) -> DbRow | None:
    return connection.execute(_LAST_MESSAGE, {"sid": session_id}).one_or_none()


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
            }
            for row in rows
        ],
    )


_LAST_TURN = (
    select(messages.c.seq)
    .where(messages.c.session_id == _SID, messages.c.kind != "tool")
    .order_by(messages.c.seq.desc())
    .limit(1)
)


def last_turn_seq(connection: Connection, session_id: str) -> int:
    """Seq of the newest message that is not a tool result (-1 when there is none): the
    calls made before it were abandoned if still unanswered."""
    seq = connection.execute(_LAST_TURN, {"sid": session_id}).scalar_one_or_none()
    return -1 if seq is None else int(seq)


def message_count(connection: Connection, session_id: str) -> int:
    return int(
        connection.execute(
            select(func.count()).select_from(messages).where(messages.c.session_id == session_id)
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


_KNOWN_CALLS = select(tool_calls).where(
    tool_calls.c.session_id == _SID,
    tool_calls.c.tool_use_id.in_(bindparam("ids", expanding=True)),
)


def known_calls(connection: Connection, session_id: str, ids: Iterable[str]) -> dict[str, DbRow]:
    wanted = sorted(set(ids))
    if not wanted:
        return {}
    rows = connection.execute(_KNOWN_CALLS, {"sid": session_id, "ids": wanted}).all()
    return {row.tool_use_id: row for row in rows}


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
    .where(tool_calls.c.session_id == _SID, tool_calls.c.tool_use_id == bindparam("call_id"))
    .values(result_seq=bindparam("new_result_seq"))
)


def mark_results(
    connection: Connection, session_id: str, results: Sequence[tuple[str, int]]
) -> None:
    if results:
        connection.execute(
            _MARK_RESULT,
            [
                {"sid": session_id, "call_id": tool_use_id, "new_result_seq": seq}
                for tool_use_id, seq in results
            ],
        )


# -- boundaries and the active context ------------------------------------------------------


_LIVE_BOUNDARY = (
    select(compact_boundaries)
    .where(
        compact_boundaries.c.session_id == _SID,
        compact_boundaries.c.rolled_back_at.is_(None),
    )
    .order_by(compact_boundaries.c.id.desc())
    .limit(1)
)


def live_boundary(connection: Connection, session_id: str) -> DbRow | None:
    return connection.execute(_LIVE_BOUNDARY, {"sid": session_id}).one_or_none()


_MESSAGE_COLUMNS = (
    messages.c.seq,
    messages.c.payload,
    messages.c.tokens,
    messages.c.created_at,
    messages.c.pinned,
    messages.c.dedup_of_seq,
)


def _kept_item(
    fmt: MessageFormat, row: DbRow, edit: tuple[str, int, MessageState, frozenset[str]] | None
) -> ContextMessage:
    state: MessageState
    if edit is not None:
        payload, tokens, state, edited = edit
    else:
        payload, tokens, edited = row.payload, row.tokens, frozenset[str]()
        state = (
            "pinned"
            if row.pinned is not None
            else "deduplicated"
            if row.dedup_of_seq is not None
            else "original"
        )
    return ContextMessage.build(
        fmt,
        json.loads(payload),
        payload=payload,
        tokens=tokens,
        seq=row.seq,
        state=state,
        created_at=row.created_at,
        edited_ids=edited,
    )


def load_context(
    connection: Connection,
    session: SessionRow,
    fmt: MessageFormat,
    count_tokens: TokenCounter,
    *,
    as_of: AsOf | None = None,
) -> ActiveContext:
    """Rebuild the active context from the latest live boundary (SPEC §4).

    Pinned messages before the kept part, the boundary's summary, then every message from
    the first kept seq on with its latest live edit. Crash-orphaned calls are not answered
    here (see ActiveContext.answered). With ``as_of`` the context is rebuilt as it stood
    just before a recorded compaction (for replay).
    """
    sid = session.id
    if as_of is None:
        boundary_row = live_boundary(connection, sid)
    else:
        boundary_row = (
            get_boundary(connection, sid, as_of.boundary_id) if as_of.boundary_id else None
        )
    first_kept = boundary_row.first_kept_seq if boundary_row is not None else 0
    last_seq = session.last_seq if as_of is None else as_of.last_seq
    rows = connection.execute(
        select(*_MESSAGE_COLUMNS)
        .where(
            messages.c.session_id == sid,
            or_(messages.c.seq >= first_kept, messages.c.pinned.is_not(None)),
            messages.c.seq <= last_seq,
        )
        .order_by(messages.c.seq)
    ).all()
    edits = live_edits(connection, sid, first_kept, as_of)
    head: list[ContextMessage] = []
    kept: list[ContextMessage] = []
    for row in rows:
        if row.seq < first_kept:
            head.append(
                ContextMessage.build(
                    fmt,
                    json.loads(row.payload),
                    payload=row.payload,
                    tokens=row.tokens,
                    seq=row.seq,
                    state="pinned",
                    created_at=row.created_at,
                )
            )
        else:
            kept.append(_kept_item(fmt, row, edits.get(row.seq)))
    boundary = None
    if boundary_row is not None:
        head.append(
            ContextMessage.build(
                fmt,
                json.loads(boundary_row.summary_message),
                payload=boundary_row.summary_message,
                tokens=boundary_row.summary_tokens,
                seq=None,
                state="summary",
            )
        )
        boundary = BoundaryInfo(
            boundary_row.id,
            boundary_row.first_kept_seq,
            boundary_row.summary_text,
            SummaryState.model_validate_json(boundary_row.summary_state),
        )
    return ActiveContext(
        session_id=sid,
        fmt=fmt,
        context_window=session.context_window,
        count_tokens=count_tokens,
        head=tuple(head),
        kept=tuple(kept),
        boundary=boundary,
        last_seq=last_seq,
        usage_offset=session.usage_offset if as_of is None else as_of.usage_offset,
        token_factor=session.token_factor if as_of is None else as_of.token_factor,
        config=session.config if as_of is None else as_of.config,
        real_request_seq=session.real_request_seq,
        cwd=session.cwd,
    )


_APPENDED = (
    select(*_MESSAGE_COLUMNS)
    .where(
        messages.c.session_id == _SID,
        messages.c.seq > bindparam("after_seq"),
        messages.c.seq <= bindparam("last_seq"),
    )
    .order_by(messages.c.seq)
)


def extend_context(
    connection: Connection, context: ActiveContext, session: SessionRow
) -> ActiveContext:
    """A cached context brought up to date with the messages appended since it was read.

    Only valid while no compaction, rollback or config change happened in between (the
    session's context_version is unchanged); appends never carry edits.
    """
    rows = connection.execute(
        _APPENDED,
        {"sid": session.id, "after_seq": context.last_seq, "last_seq": session.last_seq},
    ).all()
    return context.extended(
        [_kept_item(context.fmt, row, None) for row in rows],
        last_seq=session.last_seq,
        usage_offset=session.usage_offset,
        token_factor=session.token_factor,
        config=session.config,
        real_request_seq=session.real_request_seq,
        cwd=session.cwd,
    )


def live_edits(
    connection: Connection, session_id: str, from_seq: int, as_of: AsOf | None = None
) -> dict[int, tuple[str, int, MessageState, frozenset[str]]]:
    """Latest live edit per seq: (payload, tokens, state, tool-use ids edited so far)."""
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
    out: dict[int, tuple[str, int, MessageState, frozenset[str]]] = {}
    for row in rows:
        earlier = out[row.seq][3] if row.seq in out else frozenset()
        state: MessageState = "persisted" if row.kind == "persisted" else "cleared"
        out[row.seq] = (row.payload, row.tokens, state, earlier | set(json.loads(row.tool_use_ids)))
    return out


def get_boundary(connection: Connection, session_id: str, boundary_id: int) -> DbRow | None:
    return connection.execute(
        select(compact_boundaries).where(
            compact_boundaries.c.session_id == session_id, compact_boundaries.c.id == boundary_id
        )
    ).one_or_none()


def compaction_of_boundary(
    connection: Connection, session_id: str, boundary_id: int
) -> DbRow | None:
    return connection.execute(
        select(compactions).where(
            compactions.c.session_id == session_id, compactions.c.boundary_id == boundary_id
        )
    ).one_or_none()


def roll_back(
    connection: Connection, session_id: str, boundary_id: int, compaction_id: int, now: float
) -> None:
    """Mark a boundary, its compaction and everything recorded after them as rolled back."""
    latest = connection.execute(
        select(func.max(compactions.c.id)).where(compactions.c.session_id == session_id)
    ).scalar_one()
    connection.execute(
        update(compactions)
        .where(
            compactions.c.session_id == session_id,
            compactions.c.id >= compaction_id,
            compactions.c.rolled_back_at.is_(None),
        )
        .values(rolled_back_at=now, rolled_back_after=latest)
    )
    connection.execute(
        update(compact_boundaries)
        .where(
            compact_boundaries.c.session_id == session_id,
            compact_boundaries.c.id >= boundary_id,
            compact_boundaries.c.rolled_back_at.is_(None),
        )
        .values(rolled_back_at=now)
    )


def boundary_rows(
    connection: Connection, session_id: str, *, include_rolled_back: bool
) -> list[DbRow]:
    query = select(compact_boundaries).where(compact_boundaries.c.session_id == session_id)
    if not include_rolled_back:
        query = query.where(compact_boundaries.c.rolled_back_at.is_(None))
    return list(connection.execute(query.order_by(compact_boundaries.c.id)).all())


def compaction_rows(connection: Connection, session_id: str) -> list[DbRow]:
    return list(
        connection.execute(
            select(compactions)
            .where(compactions.c.session_id == session_id)
            .order_by(compactions.c.id)
        ).all()
    )


# -- read dedup -----------------------------------------------------------------------------


def dedup_entry(connection: Connection, session_id: str, file_path: str) -> DbRow | None:
    return connection.execute(
        select(read_dedup_entries).where(
            read_dedup_entries.c.session_id == session_id,
            read_dedup_entries.c.file_path == file_path,
        )
    ).one_or_none()


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


# -- breaker, memory, blobs -----------------------------------------------------------------


_BREAKER = select(breaker_state).where(breaker_state.c.session_id == _SID)


def get_breaker(connection: Connection, session_id: str) -> DbRow:
    return connection.execute(_BREAKER, {"sid": session_id}).one()


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
    select(memory_entries).where(memory_entries.c.session_id == _SID).order_by(memory_entries.c.id)
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


def get_blob(connection: Connection, session_id: str, blob_id: int) -> DbRow | None:
    return connection.execute(
        select(tool_result_blobs).where(
            tool_result_blobs.c.session_id == session_id, tool_result_blobs.c.id == blob_id
        )
    ).one_or_none()


# -- recording a compaction -----------------------------------------------------------------


_LAST_BLOB_ID = select(func.max(tool_result_blobs.c.id)).where(
    tool_result_blobs.c.session_id == _SID
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
