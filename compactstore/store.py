"""CompactStore and Session: the facade that opens transactions and calls the engines.

Every public method that writes runs in exactly one transaction: it locks the session,
loads what it needs, lets pure engines decide, writes their outcome and commits — or
leaves the database exactly as it was when anything raises.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine

from compactstore.boilerplate import is_boilerplate
from compactstore.context import ActiveContext
from compactstore.core.cache import CachedContext, ContextCache
from compactstore.core.checks import (
    MAX_NAME,
    PendingMessage,
    check_column_text,
    check_id,
    check_session_id,
    check_timestamp,
    check_utf8,
    check_whole,
    now_or_clock,
    prepare_message,
)
from compactstore.core.recording import (
    boundary_model,
    cache_entry_after,
    compaction_model,
    record_outcome,
    rolled_back_model,
    unrecorded_result,
)
from compactstore.db import model_calls
from compactstore.db import repository as repo
from compactstore.db.engine import (
    create_engine_for,
    database_errors,
    describe,
    normalize_url,
    read_tx,
    with_retry,
    write_tx,
)
from compactstore.db.migrate import ensure_schema
from compactstore.db.transfer import delete_sessions
from compactstore.engines import full_compact, pipeline, read_dedup
from compactstore.engines.base import Cut, EngineInputs, StageResult, Summarizer
from compactstore.engines.pipeline import Outcome
from compactstore.engines.session_memory import MemoryProvider, select_memory
from compactstore.errors import (
    ConflictError,
    InvalidInputError,
    InvalidMessageError,
    NotFoundError,
)
from compactstore.formats import FORMAT_NAMES, MessageFormat, get_format
from compactstore.models import (
    MEMORY_KINDS,
    BreakerState,
    CompactBoundary,
    CompactionConfig,
    CompactionResult,
    CompactStrategy,
    ImportedBoundary,
    MemoryEntry,
    SessionInfo,
)
from compactstore.tokens import PRIOR_WEIGHT, TokenCounter, estimate_tokens, learn_factor

__all__ = [
    "DEFAULT_CONTEXT_WINDOW",
    "DEFAULT_FORMAT",
    "CompactStore",
    "MemoryProvider",
    "Session",
    "Summarizer",
]

DEFAULT_FORMAT = "anthropic"
DEFAULT_CONTEXT_WINDOW = 200_000
T = TypeVar("T")


class CompactStore:
    """A database of agent sessions and their compactions.

    Open one with :meth:`open`; it is safe to share between threads of one process and to
    open from many processes at once.
    """

    def __init__(
        self,
        engine: Engine,
        location: str,
        *,
        token_counter: TokenCounter | None = None,
        summarizer: Summarizer | None = None,
        memory_provider: MemoryProvider | None = None,
    ) -> None:
        self.engine = engine
        self.location = location
        self.token_counter: TokenCounter = token_counter or estimate_tokens
        self.summarizer = summarizer
        self.memory_provider = memory_provider
        self._cache = ContextCache()

    @classmethod
    def open(
        cls,
        db: str | os.PathLike[str] | None = None,
        *,
        auto_migrate: bool = True,
        token_counter: TokenCounter | None = None,
        summarizer: Summarizer | None = None,
        memory_provider: MemoryProvider | None = None,
    ) -> CompactStore:
        """Open (and create or upgrade) a store.

        Args:
            db: a file path or SQLAlchemy URL; default ``$COMPACTSTORE_DB`` or
                ``./compactstore.db``.
            auto_migrate: upgrade an older schema; when False, refuse it instead.
            token_counter: replaces :func:`estimate_tokens` for new messages.
            summarizer: writes full-compact summaries instead of the rule-based one.
            memory_provider: supplies the memory text of session-memory compact.

        Raises:
            SchemaError: the schema is newer than this code, or older and auto_migrate=False.
            DatabaseError: the file is not a usable database.
        """
        url = normalize_url(
            db if db is not None else os.environ.get("COMPACTSTORE_DB") or "compactstore.db"
        )
        location = describe(url)
        engine = create_engine_for(url)
        try:
            database_errors(
                location,
                lambda: ensure_schema(engine, auto_migrate=auto_migrate, location=location),
            )
        except BaseException:
            engine.dispose()
            raise
        return cls(
            engine,
            location,
            token_counter=token_counter,
            summarizer=summarizer,
            memory_provider=memory_provider,
        )

    def close(self) -> None:
        """Release the connection pool."""
        self.engine.dispose()

    def __enter__(self) -> CompactStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"CompactStore({self.location!r})"

    def _write(self, fn: Callable[[Connection], T]) -> T:
        def attempt() -> T:
            with write_tx(self.engine) as connection:
                return fn(connection)

        return database_errors(self.location, lambda: with_retry(attempt))

    def _read(self, fn: Callable[[Connection], T]) -> T:
        def attempt() -> T:
            with read_tx(self.engine) as connection:
                return fn(connection)

        return database_errors(self.location, lambda: with_retry(attempt))

    def session(
        self,
        session_id: str,
        *,
        context_window: int | None = None,
        format: str | None = None,
        config: CompactionConfig | None = None,
        now: float | None = None,
        cwd: str | None = None,
    ) -> Session:
        """Open a session, creating it when it does not exist.

        A new session takes the defaults (anthropic, 200,000 tokens, CompactionConfig())
        for what is not given. For an existing one, a different format or context window is
        an error; a new ``config`` replaces the stored one (each compaction records the
        config it ran with). ``now`` is the creation time (epoch seconds): the microcompact
        clock starts there. ``cwd`` is the agent's working directory: summaries name files
        relative to it (without it, the directory an environment block names is used).

        Raises:
            ConflictError: the session exists with another format, context window or cwd.
            InvalidInputError: a bad id, format, window, config or cwd.
        """
        sid = check_session_id(session_id)
        if cwd is not None:
            if not isinstance(cwd, str) or not cwd.strip():
                raise InvalidInputError(f"cwd must be a directory path, got {cwd!r}")
            check_column_text(cwd, "cwd", 4_096)
        if format is not None and format not in FORMAT_NAMES:
            get_format(format)  # raises, naming the valid formats
        if context_window is not None:
            check_whole(context_window, "context_window (tokens)", minimum=1_000)
        if config is not None and not isinstance(config, CompactionConfig):
            raise InvalidInputError("config must be a CompactionConfig")
        created = now_or_clock(now)

        def tx(connection: Connection) -> repo.SessionRow:
            row = repo.get_session(connection, sid, lock=True)
            if row is None:
                repo.create_session(
                    connection,
                    sid,
                    format=format or DEFAULT_FORMAT,
                    context_window=context_window or DEFAULT_CONTEXT_WINDOW,
                    config=config or CompactionConfig(),
                    created_at=created,
                    cwd=cwd,
                )
            else:
                if cwd is not None and row.cwd is not None and cwd != row.cwd:
                    raise ConflictError(
                        f"session {sid!r} exists with cwd {row.cwd!r}; it cannot be reopened "
                        f"with {cwd!r}"
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
                    repo.update_session(
                        connection, sid, structural=True, config=config.model_dump_json()
                    )
            found = repo.get_session(connection, sid)
            assert found is not None
            return found

        return Session(self, self._write(tx))

    def get_session(self, session_id: str) -> Session:
        """Open an existing session; NotFoundError when there is none."""
        sid = check_session_id(session_id)
        row = self._read(lambda c: repo.get_session(c, sid))
        if row is None:
            raise NotFoundError(f"no session {sid!r} in {self.location}")
        return Session(self, row)

    def import_session(
        self,
        session_id: str,
        messages: Sequence[dict[str, Any]],
        *,
        format: str = DEFAULT_FORMAT,
        context_window: int | None = None,
        config: CompactionConfig | None = None,
        timestamps: Sequence[float | None] | None = None,
        boundaries: Sequence[ImportedBoundary] = (),
        usage: Sequence[int | None] | None = None,
    ) -> Session:
        """Create a session from a whole transcript in one transaction: all or nothing.

        ``boundaries`` are compactions the agent already did (e.g. Claude Code's
        compact_boundary records): each becomes a boundary row whose summary stands for
        the messages before ``first_kept_index``, as the agent continued after it.
        ``usage`` gives, per message, the prompt size the provider reported for the model
        call that produced it (None where unknown); each becomes a ``model_calls`` row.

        Raises:
            ConflictError: the session already exists.
            InvalidMessageError: a message is invalid (the error names its index).
        """
        sid = check_session_id(session_id)
        get_format(format)
        if timestamps is not None and len(timestamps) != len(messages):
            raise InvalidInputError("timestamps must be a list as long as messages")
        if usage is not None and len(usage) != len(messages):
            raise InvalidInputError("usage must be a list as long as messages")
        real = {i: check_whole(n, "usage") for i, n in enumerate(usage or ()) if n is not None}
        stamps = list(timestamps) if timestamps is not None else [None] * len(messages)
        order = sorted(boundaries, key=lambda b: b.first_kept_index)
        for boundary in order:
            if not 0 < boundary.first_kept_index <= len(messages):
                raise InvalidInputError(
                    f"imported boundary at message {boundary.first_kept_index} is outside the "
                    f"transcript's {len(messages)} messages"
                )
        created = next((float(t) for t in stamps if t is not None), None)

        def tx(connection: Connection) -> repo.SessionRow:
            if repo.get_session(connection, sid, lock=True) is not None:
                raise ConflictError(f"session {sid!r} already exists; import into a new session id")
            repo.create_session(
                connection,
                sid,
                format=format,
                context_window=context_window or DEFAULT_CONTEXT_WINDOW,
                config=config or CompactionConfig(),
                created_at=now_or_clock(created),
            )
            row = repo.get_session(connection, sid)
            assert row is not None
            session = Session(self, row)
            pending = [
                session._prepare(m, t, index=i)
                for i, (m, t) in enumerate(zip(messages, stamps, strict=True))
            ]
            start = 0
            for boundary in [*order, None]:
                end = len(pending) if boundary is None else boundary.first_kept_index
                if end > start:
                    session._insert(connection, session._locked(connection), pending[start:end])
                    start = end
                if boundary is not None:
                    session._import_boundary(connection, boundary)
            # Messages are numbered from 0 in transcript order, so an index is a seq.
            called = {i: p.created_at for i, p in enumerate(pending) if i in real}
            model_calls.insert_calls(
                connection,
                sid,
                model_calls.imported_calls(
                    connection,
                    sid,
                    real,
                    called,
                    overhead=session.config.fixed_overhead_tokens,
                    factor=session.config.token_factor,
                ),
            )
            found = repo.get_session(connection, sid)
            assert found is not None
            return found

        return Session(self, self._write(tx))

    def delete_session(self, session_id: str) -> None:
        """Delete a session and every row it owns (log, compactions, blobs, memory, ...) in
        one transaction. Handles open on it fail afterwards.

        Raises:
            NotFoundError: no such session.
        """
        sid = check_session_id(session_id)
        if not self._write(lambda connection: delete_sessions(connection, [sid])):
            raise NotFoundError(f"no session {sid!r} in {self.location}")
        self._cache.drop(sid)

    def sessions(self) -> list[SessionInfo]:
        """Every session, oldest first."""
        rows = self._read(repo.list_sessions)
        return [
            SessionInfo(
                id=row.id,
                format=row.format,
                context_window=row.context_window,
                created_at=row.created_at,
                message_count=count,
                config=row.config,
            )
            for row, count in rows
        ]


class Session:
    """One agent conversation: its log, its active context and its compactions."""

    def __init__(self, store: CompactStore, row: repo.SessionRow) -> None:
        self.store = store
        self.id = row.id
        self.format = row.format
        self.context_window = row.context_window
        self.config = row.config
        self.created_at = row.created_at
        self.fmt: MessageFormat = get_format(row.format)

    def __repr__(self) -> str:
        return f"Session({self.id!r}, format={self.format!r}, context_window={self.context_window})"

    # -- helpers ------------------------------------------------------------------------

    def _locked(self, connection: Connection) -> repo.SessionRow:
        row = repo.get_session(connection, self.id, lock=True)
        if row is None:
            raise NotFoundError(f"session {self.id!r} no longer exists in {self.store.location}")
        return row

    def _context(self, connection: Connection, row: repo.SessionRow | None = None) -> ActiveContext:
        """The active context, from the store's cache when only appends happened since."""
        cached = self.store._cache.get(self.id)
        if row is None and cached is not None:
            # A read: when nothing changed since, the versions alone say so.
            versions = repo.session_versions(connection, self.id)
            if versions == (cached.version, cached.context_version):
                return cached.answered
        row = row or repo.get_session(connection, self.id)
        if row is None:
            raise NotFoundError(f"session {self.id!r} no longer exists in {self.store.location}")
        if cached is not None and cached.context_version == row.context_version:
            if cached.version == row.version:
                return cached.answered
            base = repo.extend_context(connection, cached.base, row)
        else:
            base = repo.load_context(connection, row, self.fmt, self.store.token_counter)
        entry = CachedContext(row.context_version, row.version, base, base.answered())
        self.store._cache.put(self.id, entry)
        return entry.answered

    def _prepare(
        self, message: Any, timestamp: Any, *, pinned: bool = False, index: int | None = None
    ) -> PendingMessage:
        return prepare_message(
            self.fmt, self.config, message, timestamp, pinned=pinned, index=index
        )

    def _insert(
        self, connection: Connection, row: repo.SessionRow, pending: Sequence[PendingMessage]
    ) -> list[int]:
        """Number, pin, pair-check and store messages. Raises before writing anything."""
        fmt = self.fmt
        last = repo.last_message(connection, self.id)
        next_seq = 0 if last is None else last.seq + 1
        leading_system = last is None or last.pinned == "system"
        request_seq, real_request_seq = row.request_seq, row.real_request_seq
        patterns = row.config.boilerplate_patterns

        all_calls = [c for p in pending for c in fmt.tool_calls(p.message)]
        all_results = [r for p in pending for r in fmt.tool_results(p.message)]
        # Ids are checked before they are used in a query: PostgreSQL refuses a NUL in text.
        for offset, item in enumerate(pending):
            where = f"message {offset}: " if len(pending) > 1 else ""
            try:
                for result in fmt.tool_results(item.message):
                    check_column_text(result.tool_use_id, "tool result id", MAX_NAME)
                for call in fmt.tool_calls(item.message):
                    check_column_text(call.id, "tool call id", MAX_NAME)
                    check_column_text(call.name, "tool name", MAX_NAME)
            except InvalidInputError as exc:
                raise InvalidMessageError(f"{where}{exc}") from None
        stored = repo.known_calls(
            connection, self.id, [c.id for c in all_calls] + [r.tool_use_id for r in all_results]
        )
        boundary = repo.live_boundary(connection, self.id) if all_results else None
        first_kept = boundary.first_kept_seq if boundary is not None else 0

        rows: list[repo.MessageRow] = []
        new_calls: list[tuple[Any, int]] = []
        results: list[tuple[str, int]] = []
        batch_calls: dict[str, int] = {}
        batch_moves: list[int] = []  # seqs of the batch's messages that are not tool results
        answered: set[str] = set()
        for offset, item in enumerate(pending):
            seq = next_seq + offset
            where = f"message {offset}: " if len(pending) > 1 else ""
            for result in fmt.tool_results(item.message):
                call_id = result.tool_use_id
                known = stored.get(call_id)
                if call_id in answered or (known is not None and known.result_seq is not None):
                    raise InvalidMessageError(f"{where}tool call {call_id!r} already has a result")
                if known is None and call_id not in batch_calls:
                    raise InvalidMessageError(
                        f"{where}tool result for {call_id!r}, but no tool call with that id was "
                        f"made in session {self.id!r}"
                    )
                call_seq = known.call_seq if known is not None else batch_calls[call_id]
                if (
                    known is not None and repo.moved_on_after(connection, self.id, call_seq)
                ) or any(call_seq < other < seq for other in batch_moves):
                    raise InvalidMessageError(
                        f"{where}tool result for {call_id!r} arrives after the conversation "
                        f"moved on past its call (seq {call_seq}); the call was already "
                        f"answered as interrupted, so this result can no longer be paired"
                    )
                if known is not None and known.call_seq < first_kept:
                    raise InvalidMessageError(
                        f"{where}tool call {call_id!r} (seq {known.call_seq}) was compacted out "
                        f"of the active context; its result can no longer be paired with it"
                    )
                answered.add(call_id)
                results.append((call_id, seq))
            for call in fmt.tool_calls(item.message):
                if call.id in stored or call.id in batch_calls:
                    raise InvalidMessageError(
                        f"{where}duplicate tool call id {call.id!r} in session {self.id!r}"
                    )
                batch_calls[call.id] = seq
                new_calls.append((call, seq))
            kind = fmt.kind(item.message)
            if kind != "tool":
                batch_moves.append(seq)
            pin: str | None = None
            if kind == "system" and leading_system:
                pin = "system"
            else:
                leading_system = False
                # The first user message and the first that is not client boilerplate
                # (SPEC §9.0): decided here, once.
                request = fmt.is_request(item.message)
                if request and request_seq is None:
                    pin, request_seq = "request", seq
                if (
                    request
                    and real_request_seq is None
                    and not is_boilerplate(fmt.text(item.message), patterns)
                ):
                    pin, real_request_seq = "request", seq
                if pin is None and item.pinned:
                    pin = "user"
            rows.append(
                repo.MessageRow(
                    seq=seq,
                    role=str(item.message.get("role")),
                    kind=kind,
                    payload=item.payload,
                    tokens=self.store.token_counter(fmt.token_text(item.message)),
                    created_at=item.created_at,
                    pinned=pin,
                    dedup_of_seq=item.dedup_of_seq,
                )
            )
        repo.insert_messages(connection, self.id, rows)
        repo.insert_calls(connection, self.id, new_calls)
        repo.mark_results(connection, self.id, results)
        repo.update_session(
            connection,
            self.id,
            request_seq=request_seq,
            real_request_seq=real_request_seq,
            last_seq=rows[-1].seq,
        )
        return [r.seq for r in rows]

    # -- appending ----------------------------------------------------------------------

    def append(
        self, message: dict[str, Any], timestamp: float | None = None, pinned: bool = False
    ) -> int:
        """Append one message; returns its seq (0-based, per session).

        Raises:
            InvalidMessageError: the message does not fit the session's format, its tool
                result has no call, a call id repeats, or it is over max_message_bytes.
        """
        pending = self._prepare(message, timestamp, pinned=pinned)
        return self.store._write(lambda c: self._insert(c, self._locked(c), [pending])[0])

    def extend(
        self,
        messages: Sequence[dict[str, Any]],
        timestamps: Sequence[float | None] | None = None,
    ) -> list[int]:
        """Append several messages atomically: all are stored, or none."""
        if isinstance(messages, dict | str | bytes) or not isinstance(messages, Sequence):
            raise InvalidInputError("extend() takes a list of messages")
        if timestamps is not None and (
            not isinstance(timestamps, Sequence) or len(timestamps) != len(messages)
        ):
            raise InvalidInputError("timestamps must be a list as long as messages")
        stamps = list(timestamps) if timestamps is not None else [None] * len(messages)
        pending = [
            self._prepare(m, stamp, index=i)
            for i, (m, stamp) in enumerate(zip(messages, stamps, strict=True))
        ]
        if not pending:
            return []
        return self.store._write(lambda c: self._insert(c, self._locked(c), pending))

    def append_tool_result(
        self,
        tool_use_id: str,
        content: str,
        *,
        tool_name: str,
        file_path: str | None = None,
        is_error: bool = False,
        timestamp: float | None = None,
    ) -> int:
        """Append the result of a tool call, built in the session's format.

        When ``file_path`` is given the result is a read of that file: an unchanged re-read
        whose earlier content is still in the active context in full is stored as a short
        stub pointing at it (read dedup). Returns the new message's seq.
        """
        for name, value in (("tool_use_id", tool_use_id), ("tool_name", tool_name)):
            if not isinstance(value, str) or not value:
                raise InvalidInputError(f"{name} must be a non-empty string, got {value!r}")
        if not isinstance(content, str):
            raise InvalidInputError(
                f"tool result content must be a string, got {type(content).__name__}"
            )
        if file_path is not None and (not isinstance(file_path, str) or not file_path):
            raise InvalidInputError(f"file_path must be a non-empty string, got {file_path!r}")
        if not isinstance(is_error, bool):
            raise InvalidInputError("is_error must be True or False")
        check_utf8(content, "tool result content")
        check_column_text(tool_name, "tool_name", MAX_NAME)
        if file_path is not None:
            check_column_text(file_path, "file_path")
        digest = read_dedup.content_hash(content)
        dedup = file_path is not None and not is_error and self.config.read_dedup_enabled

        def tx(connection: Connection) -> int:
            row = self._locked(connection)
            earlier = (
                repo.dedup_entry(connection, self.id, file_path) if dedup and file_path else None
            )
            text, dedup_of = content, None
            if earlier is not None and read_dedup.should_deduplicate(
                earlier.content_hash,
                digest,
                previous_in_context_in_full=self._in_context_in_full(connection, earlier.seq),
            ):
                text, dedup_of = read_dedup.dedup_stub(earlier.file_path, earlier.seq), earlier.seq
            message = self.fmt.tool_result_message(
                tool_use_id, text, tool_name=tool_name, is_error=is_error
            )
            pending = self._prepare(message, timestamp)
            pending = PendingMessage(
                pending.message, pending.payload, pending.created_at, False, dedup_of
            )
            seq = self._insert(connection, row, [pending])[0]
            if dedup and file_path and dedup_of is None:
                repo.set_dedup_entry(
                    connection, self.id, file_path, digest, seq, pending.created_at
                )
            return seq

        return self.store._write(tx)

    def _in_context_in_full(self, connection: Connection, seq: int) -> bool:
        boundary = repo.live_boundary(connection, self.id)
        if boundary is not None and seq < boundary.first_kept_seq:
            return False
        return not repo.has_live_edit(connection, self.id, seq)

    def invalidate(self, file_path: str) -> bool:
        """Forget the registered read of a path (after a write or edit of that file).

        Returns whether a read was registered.
        """
        if not isinstance(file_path, str) or not file_path:
            raise InvalidInputError(f"file_path must be a non-empty string, got {file_path!r}")
        check_column_text(file_path, "file_path")

        def tx(connection: Connection) -> bool:
            self._locked(connection)
            return repo.delete_dedup_entry(connection, self.id, file_path) > 0

        return self.store._write(tx)

    # -- reading ------------------------------------------------------------------------

    def context(self) -> ActiveContext:
        """The active context with per-message detail (seq, tokens, state).

        This is the store's own cached object, shared by later calls: read it, never change
        its messages. ``active_context()`` returns copies that are the caller's to change.
        """
        return self.store._read(self._context)

    def active_context(self) -> list[dict[str, Any]]:
        """What to send to the model, in the session's format."""
        return self.context().messages()

    def token_usage(self) -> int:
        """Estimated tokens of the active context (calibrated by record_usage)."""
        return self.context().usage

    def messages(self) -> list[dict[str, Any]]:
        """The whole log, verbatim, including what compaction removed from the context."""
        return self.store._read(
            lambda c: [json.loads(row.payload) for row in repo.log_messages(c, self.id)]
        )

    # -- calibration --------------------------------------------------------------------

    def record_usage(self, input_tokens: int, *, now: float | None = None) -> None:
        """Report the real prompt size the API counted for the current active context.

        Usage then follows the real count: the offset to the estimate is stored and the
        correction factor is learnt from consecutive real counts. A model call that went
        through also resets the reactive-recovery counter. The call is recorded in
        ``model_calls`` at time ``now`` (epoch seconds; default: the clock).
        """
        check_whole(input_tokens, "input_tokens")
        called = now_or_clock(now)

        def tx(connection: Connection) -> None:
            row = self._locked(connection)
            context = self._context(connection, row)
            raw = context.raw_tokens
            factor, weight = row.config.token_factor, PRIOR_WEIGHT
            if row.token_factor is not None and row.token_factor_weight is not None:
                factor, weight = row.token_factor, row.token_factor_weight
            if row.real_tokens is not None and row.real_estimate is not None:
                learnt = learn_factor(
                    factor, weight, input_tokens - row.real_tokens, raw - row.real_estimate
                )
                if learnt is not None:
                    factor, weight = learnt
                    repo.update_session(
                        connection, self.id, token_factor=factor, token_factor_weight=weight
                    )
            offset = input_tokens - row.config.fixed_overhead_tokens - round(factor * raw)
            repo.update_session(
                connection,
                self.id,
                usage_offset=offset,
                real_tokens=input_tokens,
                real_estimate=raw,
            )
            repo.set_breaker(connection, self.id, reactive_attempts=0)
            model_calls.insert_calls(
                connection,
                self.id,
                [model_calls.ModelCall(row.last_seq, context.usage, input_tokens, called)],
            )

        self.store._write(tx)

    # -- compaction ---------------------------------------------------------------------

    def process_request(
        self,
        *,
        now: float | None = None,
        enable_tool_budget: bool = True,
        enable_read_dedup: bool = True,
        enable_microcompact: bool = True,
        enable_auto_compact: bool = True,
    ) -> CompactionResult:
        """Run the pipeline before a model call, in one transaction.

        Tool-result budget, microcompact, then the auto-compact check (session memory,
        then full compact). Read dedup happens when a tool result is appended, so
        ``enable_read_dedup`` only exists for symmetry (turn dedup off with
        ``CompactionConfig(read_dedup_enabled=False)``). Always returns a result; when
        nothing happened, success is False and strategy None.
        """
        del enable_read_dedup  # dedup runs in append_tool_result
        at = now_or_clock(now)
        flags = {
            "enable_tool_budget": bool(enable_tool_budget),
            "enable_microcompact": bool(enable_microcompact),
            "enable_auto_compact": bool(enable_auto_compact),
        }

        def run(context: ActiveContext, inputs: EngineInputs) -> Outcome:
            return pipeline.process(context, inputs, **flags)

        result = self._compaction(at, run, kind="process", extra=flags)
        assert result is not None
        return result

    def reactive_recover(
        self, error_message: str, *, now: float | None = None
    ) -> CompactionResult | None:
        """Recover after the API said the prompt is too long; None once attempts run out.

        Attempt 1 forces a full compact; if usage is still not below 87.3% of the window,
        and on attempts 2 and 3, the kept messages are truncated to the newest 40/30/20%.
        The attempt counter resets on success and when record_usage() reports a call.
        """
        if not isinstance(error_message, str):
            raise InvalidInputError("error_message must be the API's error text (a string)")
        at = now_or_clock(now)
        return self._compaction(at, pipeline.recover, kind="reactive", error=error_message)

    def compact(
        self,
        *,
        instructions: str | None = None,
        up_to_seq: int | None = None,
        now: float | None = None,
    ) -> CompactionResult:
        """Compact now (trigger manual): a full compact, or with ``up_to_seq`` a partial one
        that summarises only the messages up to that seq and keeps the rest verbatim.
        ``instructions`` go to the summarizer and are recorded.
        """
        if instructions is not None and not isinstance(instructions, str):
            raise InvalidInputError("instructions must be a string")
        if up_to_seq is not None:
            check_whole(up_to_seq, "up_to_seq (a message seq)")
        at = now_or_clock(now)

        def run(context: ActiveContext, inputs: EngineInputs) -> Outcome:
            if up_to_seq is not None and up_to_seq > context.last_seq:
                raise InvalidInputError(
                    f"up_to_seq {up_to_seq} is past the last message (seq {context.last_seq})"
                )
            if up_to_seq is not None and up_to_seq < context.first_kept_seq:
                raise InvalidInputError(
                    f"up_to_seq {up_to_seq} is already summarised: the active context starts "
                    f"at seq {context.first_kept_seq}"
                )
            return pipeline.manual(context, inputs, up_to_seq=up_to_seq)

        result = self._compaction(
            at, run, kind="manual", instructions=instructions, extra={"up_to_seq": up_to_seq}
        )
        assert result is not None
        return result

    def _inputs(
        self, connection: Connection, context: ActiveContext, now: float, instructions: str | None
    ) -> EngineInputs:
        breaker = repo.get_breaker(connection, self.id)
        entries = repo.memories(connection, self.id)
        budget = context.config.session_memory_max_tokens
        provider = self.store.memory_provider
        memory_text = (
            provider(self.id, entries, budget)
            if provider is not None
            else select_memory(entries, budget, self.store.token_counter)
        )
        return EngineInputs(
            now=now,
            next_blob_id=repo.next_blob_id(connection, self.id),
            memory_text=memory_text,
            memory_count=len(entries),
            last_microcompact_at=breaker.last_microcompact_at,
            consecutive_failures=breaker.consecutive_failures,
            tripped=bool(breaker.tripped),
            reactive_attempts=breaker.reactive_attempts,
            summary_state=context.boundary.summary_state if context.boundary is not None else {},
            summarizer=self.store.summarizer,
            instructions=instructions,
        )

    def _compaction(
        self,
        now: float,
        run: Callable[[ActiveContext, EngineInputs], Outcome | None],
        *,
        kind: str,
        instructions: str | None = None,
        error: str | None = None,
        extra: dict[str, Any] | None = None,
    ) -> CompactionResult | None:
        def tx(connection: Connection) -> tuple[CompactionResult | None, CachedContext | None]:
            row = self._locked(connection)
            context = self._context(connection, row)
            inputs = self._inputs(connection, context, now, instructions)
            outcome = run(context, inputs)
            if outcome is None:
                return None, None
            recorded = {
                "kind": kind,
                "now": now,
                "last_seq": context.last_seq,
                "next_blob_id": inputs.next_blob_id,
                "memory_text": inputs.memory_text,
                "memory_count": inputs.memory_count,
                "last_microcompact_at": inputs.last_microcompact_at,
                "consecutive_failures": inputs.consecutive_failures,
                "tripped": inputs.tripped,
                "reactive_attempts": inputs.reactive_attempts,
                "usage_offset": context.usage_offset,
                "token_factor": context.token_factor,
                **(extra or {}),
            }
            result = record_outcome(
                connection,
                self.id,
                outcome,
                recorded,
                at=now,
                instructions=instructions,
                error=error,
            )
            if not outcome.recorded:
                return result, None
            return result, cache_entry_after(connection, self.id, outcome, result)

        result, cached = self.store._write(tx)
        if cached is not None:
            # Only once committed: an entry for versions that were rolled back could match
            # another writer's later, different change.
            self.store._cache.put(self.id, cached)
        return result

    def _import_boundary(self, connection: Connection, boundary: ImportedBoundary) -> None:
        """Record a compaction the agent did itself, cutting just before the next message."""
        row = self._locked(connection)
        context = self._context(connection, row)
        at = check_timestamp(boundary.timestamp) if boundary.timestamp is not None else time.time()
        index = len(context.kept)
        removed = [item for item in context.kept if not item.pinned]
        state = full_compact.fold_state(
            context.boundary.summary_state if context.boundary is not None else {}, removed, context
        )
        after = context.cut(index, boundary.summary_text)
        stage = StageResult(
            strategy=CompactStrategy.FULL,
            trigger=boundary.trigger,
            success=True,
            context=after,
            tokens_before=context.usage,
            tokens_after=after.usage,
            cut=Cut.of(after, removed, boundary.summary_text, state),
            detail="imported from the transcript",
        )
        outcome = Outcome(start=context, context=after, stages=[stage])
        recorded = {
            "kind": "import",
            "now": at,
            "last_seq": context.last_seq,
            "pre_tokens": boundary.tokens_before,
        }
        record_outcome(connection, self.id, outcome, recorded, at=at)

    # -- rollback and replay ------------------------------------------------------------

    def rollback(
        self, boundary_id: int | None = None, *, now: float | None = None
    ) -> list[CompactBoundary]:
        """Undo the latest live boundary, or the given one and every compaction after it.

        Rows are marked rolled back, never deleted. Afterwards active_context() is exactly
        what it was before that compaction plus whatever was appended since. Returns the
        boundaries rolled back.

        Raises:
            NotFoundError: no such boundary in this session, or nothing to roll back.
            ConflictError: the boundary is already rolled back.
        """
        if boundary_id is not None:
            check_id(boundary_id, "boundary", self.id)
        at = now_or_clock(now)

        def tx(connection: Connection) -> list[CompactBoundary]:
            self._locked(connection)
            target = self._target_boundary(connection, boundary_id)
            if target.rolled_back_at is not None:
                raise ConflictError(
                    f"boundary {target.id} of session {self.id!r} is already rolled back"
                )
            return self._roll_back(connection, target, at)

        return self.store._write(tx)

    def _target_boundary(self, connection: Connection, boundary_id: int | None) -> Any:
        if boundary_id is None:
            row = repo.live_boundary(connection, self.id)
            if row is None:
                raise NotFoundError(f"session {self.id!r} has no live boundary to roll back")
            return row
        row = repo.get_boundary(connection, self.id, boundary_id)
        if row is None:
            raise NotFoundError(f"no boundary {boundary_id} in session {self.id!r}")
        return row

    def _roll_back(self, connection: Connection, target: Any, at: float) -> list[CompactBoundary]:
        compaction = repo.compaction_of_boundary(connection, self.id, target.id)
        assert compaction is not None, "every boundary is written with its compaction"
        live = [
            row
            for row in repo.boundary_rows(connection, self.id, include_rolled_back=False)
            if row.id >= target.id
        ]
        repo.roll_back(connection, self.id, target.id, compaction.id, at)
        # The context changed, so the last real count no longer describes it.
        repo.update_session(
            connection, self.id, structural=True, real_tokens=None, real_estimate=None
        )
        return [rolled_back_model(row, at) for row in live]

    def replay(
        self,
        boundary_id: int,
        *,
        config: CompactionConfig | None = None,
        apply: bool = False,
    ) -> CompactionResult:
        """Run a recorded compaction again on the context as it stood just before it.

        With the recorded config (or ``config``) and the recorded ``now``, the same inputs
        give a byte-identical boundary and summary. ``apply=True`` records the result as a
        new compaction: allowed on the latest live boundary (which it replaces) or on a
        rolled-back one whose parent is the live boundary again.

        Raises:
            NotFoundError: no such boundary in this session.
            ConflictError: apply=True where the replayed result cannot take its place.
        """
        check_id(boundary_id, "boundary", self.id)
        if config is not None and not isinstance(config, CompactionConfig):
            raise InvalidInputError("config must be a CompactionConfig")

        def run(connection: Connection) -> CompactionResult:
            row = self._locked(connection) if apply else repo.get_session(connection, self.id)
            assert row is not None
            target = self._target_boundary(connection, boundary_id)
            compaction = repo.compaction_of_boundary(connection, self.id, target.id)
            assert compaction is not None
            recorded = json.loads(compaction.inputs)
            used_config = config or CompactionConfig.model_validate_json(compaction.config)
            as_of = repo.AsOf(
                compaction_id=compaction.id,
                boundary_id=target.parent_id,
                last_seq=int(recorded["last_seq"]),
                usage_offset=int(recorded["usage_offset"]),
                token_factor=recorded["token_factor"],
                config=used_config,
            )
            context = repo.load_context(
                connection, row, self.fmt, self.store.token_counter, as_of=as_of
            ).answered()
            inputs = self._recorded_inputs(context, recorded, compaction.instructions)
            if apply:
                live = repo.live_boundary(connection, self.id)
                if target.rolled_back_at is None:
                    if live is None or live.id != target.id:
                        raise ConflictError(
                            f"boundary {target.id} is not the latest live boundary; roll back "
                            f"the later ones first or replay without apply"
                        )
                    self._roll_back(connection, target, inputs.now)
                elif (live.id if live is not None else None) != target.parent_id:
                    raise ConflictError(
                        f"boundary {target.id} was rolled back, but the live boundary is no "
                        f"longer its parent ({target.parent_id}); replay without apply"
                    )
                inputs = replace(inputs, next_blob_id=repo.next_blob_id(connection, self.id))
            outcome = self._rerun(recorded, context, inputs)
            if not apply:
                return unrecorded_result(outcome, inputs.now, compaction.instructions)
            recorded = {**recorded, "replay_of": compaction.id}
            return record_outcome(
                connection,
                self.id,
                outcome,
                recorded,
                at=inputs.now,
                instructions=compaction.instructions,
                error=compaction.error,
                replay_of=compaction.id,
            )

        return self.store._write(run) if apply else self.store._read(run)

    def _recorded_inputs(
        self, context: ActiveContext, recorded: dict[str, Any], instructions: str | None
    ) -> EngineInputs:
        return EngineInputs(
            now=float(recorded["now"]),
            next_blob_id=int(recorded["next_blob_id"]),
            memory_text=str(recorded["memory_text"]),
            memory_count=int(recorded["memory_count"]),
            last_microcompact_at=float(recorded["last_microcompact_at"]),
            consecutive_failures=int(recorded["consecutive_failures"]),
            tripped=bool(recorded["tripped"]),
            reactive_attempts=int(recorded["reactive_attempts"]),
            summary_state=context.boundary.summary_state if context.boundary is not None else {},
            summarizer=self.store.summarizer,
            instructions=instructions,
        )

    @staticmethod
    def _rerun(recorded: dict[str, Any], context: ActiveContext, inputs: EngineInputs) -> Outcome:
        kind = recorded["kind"]
        if kind == "import":
            raise ConflictError(
                "this boundary was imported from a transcript: the agent that wrote it did the "
                "compaction, so there is nothing recorded to replay"
            )
        if kind == "process":
            return pipeline.process(
                context,
                inputs,
                enable_tool_budget=bool(recorded["enable_tool_budget"]),
                enable_microcompact=bool(recorded["enable_microcompact"]),
                enable_auto_compact=bool(recorded["enable_auto_compact"]),
            )
        if kind == "manual":
            return pipeline.manual(context, inputs, up_to_seq=recorded["up_to_seq"])
        outcome = pipeline.recover(context, inputs)
        if outcome is None:
            raise ConflictError(
                "the recorded reactive attempt would now give up; nothing to replay"
            )
        return outcome

    # -- memory, breaker, blobs ---------------------------------------------------------

    def remember(
        self, kind: str, text: str, *, scope: str = "session", now: float | None = None
    ) -> int:
        """Add a memory entry for session-memory compact; returns its id."""
        if kind not in MEMORY_KINDS:
            raise InvalidInputError(
                f"unknown memory kind {kind!r}; expected one of: {', '.join(MEMORY_KINDS)}"
            )
        if not isinstance(text, str) or not text.strip():
            raise InvalidInputError("memory text must be a non-empty string")
        if not isinstance(scope, str) or not scope:
            raise InvalidInputError("scope must be a non-empty string of at most 32 characters")
        check_column_text(scope, "scope", 32)
        check_column_text(text, "memory text")
        created = now_or_clock(now)
        tokens = self.store.token_counter(text)

        def tx(connection: Connection) -> int:
            self._locked(connection)
            entry_id = repo.insert_memory(
                connection,
                self.id,
                kind=kind,
                text=text,
                tokens=tokens,
                created_at=created,
                scope=scope,
            )
            repo.update_session(connection, self.id)
            return entry_id

        return self.store._write(tx)

    def memories(self) -> list[MemoryEntry]:
        """The stored memory entries, oldest first."""
        return self.store._read(lambda c: repo.memories(c, self.id))

    def breaker(self) -> BreakerState:
        """The circuit-breaker and reactive-recovery counters."""
        row = self.store._read(lambda c: repo.get_breaker(c, self.id))
        return BreakerState(
            consecutive_failures=row.consecutive_failures,
            tripped=bool(row.tripped),
            reactive_attempts=row.reactive_attempts,
            last_microcompact_at=row.last_microcompact_at,
        )

    def reset_breaker(self) -> None:
        """Clear the breaker's failure count and the reactive-attempt counter."""

        def tx(connection: Connection) -> None:
            self._locked(connection)
            repo.set_breaker(
                connection, self.id, consecutive_failures=0, tripped=False, reactive_attempts=0
            )
            repo.update_session(connection, self.id)

        self.store._write(tx)

    def get_blob(self, blob_id: int) -> str:
        """The full content of a persisted tool result, byte-exact.

        Raises:
            NotFoundError: no blob with that id belongs to this session.
        """
        check_id(blob_id, "blob", self.id)

        def read(connection: Connection) -> str | None:
            row = repo.get_blob(connection, self.id, blob_id)
            # Decoded inside the read, so a damaged blob is a DatabaseError naming the file.
            return None if row is None else bytes(row.content).decode("utf-8")

        content = self.store._read(read)
        if content is None:
            raise NotFoundError(f"no blob {blob_id} in session {self.id!r}")
        return content

    # -- history ------------------------------------------------------------------------

    def boundaries(self, include_rolled_back: bool = False) -> list[CompactBoundary]:
        """The recorded boundaries, oldest first."""
        rows = self.store._read(
            lambda c: repo.boundary_rows(c, self.id, include_rolled_back=include_rolled_back)
        )
        return [boundary_model(row) for row in rows]

    def compactions(self) -> list[CompactionResult]:
        """The recorded compactions, oldest first (rolled-back ones included, marked)."""

        def read(connection: Connection) -> list[CompactionResult]:
            boundaries = {
                row.id: boundary_model(row)
                for row in repo.boundary_rows(connection, self.id, include_rolled_back=True)
            }
            return [
                compaction_model(row, boundaries)
                for row in repo.compaction_rows(connection, self.id)
            ]

        return self.store._read(read)
