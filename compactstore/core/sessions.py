"""Sessions: opened or created, imported whole, listed.

Functions run inside the caller's transaction; they raise before writing anything when a
request contradicts what is stored.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from sqlalchemy import Connection

from compactstore.core.appending import insert_messages
from compactstore.core.checks import PendingMessage, check_timestamp
from compactstore.core.compaction import record_imported
from compactstore.db import model_calls
from compactstore.db import repository as repo
from compactstore.errors import ConflictError, NotFoundError
from compactstore.formats import MessageFormat
from compactstore.models import CompactionConfig, ImportedBoundary, SessionInfo
from compactstore.tokens import TokenCounter

__all__ = [
    "DEFAULT_CONTEXT_WINDOW",
    "DEFAULT_FORMAT",
    "import_transcript",
    "open_session",
    "require",
    "session_infos",
]

# What a new session takes when it is not given (SPEC §2).
DEFAULT_FORMAT = "anthropic"
DEFAULT_CONTEXT_WINDOW = 200_000


def require(
    connection: Connection, session_id: str, location: str, *, lock: bool = False
) -> repo.SessionRow:
    """The session's row (locked for the transaction with ``lock``); NotFoundError if gone."""
    row = repo.get_session(connection, session_id, lock=lock)
    if row is None:
        raise NotFoundError(f"session {session_id!r} no longer exists in {location}")
    return row


def open_session(
    connection: Connection,
    session_id: str,
    *,
    format: str | None,
    context_window: int | None,
    config: CompactionConfig | None,
    created_at: float,
    cwd: str | None,
    location: str,
) -> repo.SessionRow:
    """Get or create a session; a new ``config`` replaces the stored one, a ``cwd`` fills
    a missing one.

    Raises:
        ConflictError: the session exists with another format, context window or cwd.
    """
    sid = session_id
    row = repo.get_session(connection, sid, lock=True)
    if row is None:
        repo.create_session(
            connection,
            sid,
            format=format or DEFAULT_FORMAT,
            context_window=context_window or DEFAULT_CONTEXT_WINDOW,
            config=config or CompactionConfig(),
            created_at=created_at,
            cwd=cwd,
        )
        return require(connection, sid, location)
    if cwd is not None and row.cwd is not None and cwd != row.cwd:
        raise ConflictError(
            f"session {sid!r} exists with cwd {row.cwd!r}; it cannot be reopened with {cwd!r}"
        )
    if cwd is not None and row.cwd is None:
        repo.update_session(connection, sid, cwd=cwd)
    if format is not None and format != row.format:
        raise ConflictError(
            f"session {sid!r} exists with format {row.format!r}; it cannot be "
            f"reopened as {format!r} (use another session id)"
        )
    if context_window is not None and context_window != row.context_window:
        raise ConflictError(
            f"session {sid!r} exists with context_window {row.context_window}; "
            f"it cannot be reopened with {context_window}"
        )
    if config is not None and config != row.config:
        repo.update_session(connection, sid, structural=True, config=config.model_dump_json())
    return require(connection, sid, location)


def import_transcript(
    connection: Connection,
    session_id: str,
    adapter: MessageFormat,
    pending: Sequence[PendingMessage],
    boundaries: Sequence[ImportedBoundary],
    real_tokens: dict[int, int],
    *,
    context_window: int,
    config: CompactionConfig,
    created_at: float,
    count_tokens: TokenCounter,
    location: str,
) -> repo.SessionRow:
    """Create a session holding a whole transcript and the compactions its agent did.

    ``boundaries`` are sorted by ``first_kept_index``; each cuts the context just before
    that message, as the agent continued after it. ``real_tokens`` are the prompt sizes the
    transcript reports, by the index of the message the call produced (model_calls rows).

    Raises:
        ConflictError: the session already exists.
    """
    sid = session_id
    if repo.get_session(connection, sid, lock=True) is not None:
        raise ConflictError(f"session {sid!r} already exists; import into a new session id")
    repo.create_session(
        connection,
        sid,
        format=adapter.name,
        context_window=context_window,
        config=config,
        created_at=created_at,
    )
    start = 0
    for boundary in [*boundaries, None]:
        end = len(pending) if boundary is None else boundary.first_kept_index
        if end > start:
            insert_messages(
                connection, require(connection, sid, location), adapter, pending[start:end]
            )
            start = end
        if boundary is not None:
            row = require(connection, sid, location)
            context = repo.load_context(connection, row, adapter, count_tokens)
            stamp = boundary.timestamp
            at = check_timestamp(stamp) if stamp is not None else time.time()
            record_imported(connection, sid, context, boundary, at)
    # Messages are numbered from 0 in transcript order, so an index is a seq.
    called = {i: p.created_at for i, p in enumerate(pending) if i in real_tokens}
    calls = model_calls.imported_calls(
        connection,
        sid,
        real_tokens,
        called,
        overhead=config.fixed_overhead_tokens,
        factor=config.token_factor,
    )
    model_calls.insert_calls(connection, sid, calls)
    return require(connection, sid, location)


def session_infos(connection: Connection) -> list[SessionInfo]:
    """Every session, oldest first, with its message count."""
    return [
        SessionInfo(
            id=row.id,
            format=row.format,
            context_window=row.context_window,
            created_at=row.created_at,
            message_count=count,
            config=row.config,
        )
        for row, count in repo.list_sessions(connection)
    ]
