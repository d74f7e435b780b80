"""Queries of the ``sessions`` table: one row per conversation, with its versions."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from sqlalchemy import (
    Connection,
    Executable,
    bindparam,
    func,
    select,
    update,
)

from compactstore.db.common import SID, DbRow, insert_ignore
from compactstore.db.schema import (
    breaker_state,
    messages,
    sessions,
)
from compactstore.models import CompactionConfig

__all__ = [
    "SessionRow",
    "create_session",
    "get_session",
    "link_subagent",
    "list_sessions",
    "session_versions",
    "subagents_of",
    "update_session",
]


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
    summarizer: str | None = None  # the name recorded by store.session(summarizer=)
    model: str | None = None  # store.session(model=) or the newest append_response's
    thinking_binding: str | None = None  # "drop_block" once set (see schema)
    parent_session_id: str | None = None  # a subagent's session: the session that started it
    parent_tool_use_id: str | None = None  # ... and the id of the tool call that did
    thinking_binding_at: float | None = None  # when it was set


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
        summarizer=row.summarizer,
        model=row.model,
        thinking_binding=row.thinking_binding,
        parent_session_id=row.parent_session_id,
        parent_tool_use_id=row.parent_tool_use_id,
        thinking_binding_at=row.thinking_binding_at,
    )


_SESSION = select(sessions).where(sessions.c.id == SID)
_SESSION_FOR_UPDATE = _SESSION.with_for_update()


def get_session(
    connection: Connection, session_id: str, *, lock: bool = False
) -> SessionRow | None:
    """The session's row; with lock=True, PostgreSQL writers queue on it (SELECT FOR UPDATE)."""
    query = _SESSION_FOR_UPDATE if lock and connection.dialect.name == "postgresql" else _SESSION
    row = connection.execute(query, {"sid": session_id}).one_or_none()
    return None if row is None else _session_row(row)


def link_subagent(
    connection: Connection, session_id: str, parent_session_id: str, tool_use_id: str | None
) -> None:
    """Record that ``session_id`` is a subagent's session, started by ``parent_session_id``'s
    tool call ``tool_use_id`` (None: the transcript does not say which call)."""
    connection.execute(
        update(sessions)
        .where(sessions.c.id == session_id)
        .values(parent_session_id=parent_session_id, parent_tool_use_id=tool_use_id)
    )


def subagents_of(connection: Connection, session_ids: list[str]) -> list[tuple[str, str | None]]:
    """The subagent sessions of these sessions, and of theirs (level by level, each in id
    order): (id, the tool call that started it)."""
    found: list[tuple[str, str | None]] = []
    seen = set(session_ids)
    frontier = list(session_ids)
    while frontier:
        rows = connection.execute(
            select(sessions.c.id, sessions.c.parent_tool_use_id)
            .where(sessions.c.parent_session_id.in_(frontier))
            .order_by(sessions.c.id)
        ).all()
        frontier = [row.id for row in rows if row.id not in seen]
        seen.update(frontier)
        found += [(row.id, row.parent_tool_use_id) for row in rows if row.id in frontier]
    return found


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
        .where(sessions.c.id == SID)
        .values(version=sessions.c.version + 1, **values)
    )


_VERSIONS = select(sessions.c.version, sessions.c.context_version).where(sessions.c.id == SID)


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
