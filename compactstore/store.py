"""CompactStore and Session: the facade that opens transactions and calls the engines.

Every public method that writes runs in exactly one transaction: it locks the session,
loads what it needs, lets pure engines decide, writes their outcome and commits — or
leaves the database exactly as it was when anything raises.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine

from compactstore.context import ActiveContext
from compactstore.core import compaction, replay
from compactstore.core.appending import append_tool_result, insert_messages
from compactstore.core.cache import CachedContext, ContextCache, read_context
from compactstore.core.checks import (
    PendingMessage,
    check_config,
    check_cwd,
    check_file_path,
    check_id,
    check_memory,
    check_session_id,
    check_tool_result,
    check_whole,
    now_or_clock,
    prepare_message,
)
from compactstore.core.recording import boundary_model, compaction_model
from compactstore.core.sessions import (
    DEFAULT_CONTEXT_WINDOW,
    DEFAULT_FORMAT,
    import_transcript,
    open_session,
    require,
    session_infos,
)
from compactstore.core.usage import calibrate
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
from compactstore.engines.base import Summarizer
from compactstore.engines.session_memory import MemoryProvider
from compactstore.errors import DatabaseError, InvalidInputError, NotFoundError
from compactstore.formats import FORMAT_NAMES, MessageFormat, get_format
from compactstore.models import (
    BreakerState,
    CompactBoundary,
    CompactionConfig,
    CompactionResult,
    ImportedBoundary,
    ImportedMessage,
    MemoryEntry,
    SessionInfo,
)
from compactstore.tokens import TokenCounter, estimate_tokens

__all__ = [
    "DEFAULT_CONTEXT_WINDOW",
    "DEFAULT_FORMAT",
    "CompactStore",
    "MemoryProvider",
    "Session",
    "Summarizer",
]

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

    @property
    def plugins(self) -> compaction.Plugins:
        """The caller's code compactions run: token counter, summarizer, memory provider."""
        return compaction.Plugins(self.token_counter, self.summarizer, self.memory_provider)

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
            check_cwd(cwd)
        if format is not None and format not in FORMAT_NAMES:
            get_format(format)  # raises, naming the valid formats
        if context_window is not None:
            check_whole(context_window, "context_window (tokens)", minimum=1_000)
        check_config(config)
        created = now_or_clock(now)

        def tx(connection: Connection) -> repo.SessionRow:
            return open_session(
                connection,
                sid,
                format=format,
                context_window=context_window,
                config=config,
                created_at=created,
                cwd=cwd,
                location=self.location,
            )

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
        items: Iterable[ImportedMessage | ImportedBoundary],
        *,
        format: str = DEFAULT_FORMAT,
        context_window: int | None = None,
        config: CompactionConfig | None = None,
    ) -> Session:
        """Create a session from a transcript in one transaction: all or nothing.

        ``items`` are the transcript's messages in order, each compaction the agent already
        did (e.g. Claude Code's compact_boundary records) coming just before the first
        message it kept (its ``first_kept_index``) or after the last: each becomes a
        boundary row whose summary stands for the messages before it. A message's ``usage``
        (the prompt size the provider reported for the call that produced it) becomes a
        ``model_calls`` row. Items are consumed as they come and stored in batches, so a
        long transcript need not be in memory; tokens are counted and the write
        transaction stays open meanwhile, which is why
        :func:`compactstore.importers.import_file` runs this on a staging database.

        Raises:
            ConflictError: the session already exists.
            InvalidMessageError: a message is invalid (the error names its ``where``, or
                its index).
        """
        sid = check_session_id(session_id)
        adapter = get_format(format)
        stored_config = config or CompactionConfig()
        started = False

        def tx(connection: Connection) -> repo.SessionRow:
            nonlocal started
            if started:  # the items were consumed by an attempt that failed
                raise DatabaseError(f"{self.location} was busy; the import was not stored")
            started = True
            return import_transcript(
                connection,
                sid,
                adapter,
                items,
                context_window=context_window or DEFAULT_CONTEXT_WINDOW,
                config=stored_config,
                count_tokens=self.token_counter,
                location=self.location,
            )

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
        return self._read(session_infos)


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

    def _locked(self, connection: Connection) -> repo.SessionRow:
        return require(connection, self.id, self.store.location, lock=True)

    def _context(self, connection: Connection, row: repo.SessionRow | None = None) -> ActiveContext:
        store = self.store
        return read_context(
            connection,
            store._cache,
            self.id,
            self.fmt,
            store.token_counter,
            location=store.location,
            row=row,
        )

    def _prepare(
        self, message: Any, timestamp: Any, *, pinned: bool = False, index: int | None = None
    ) -> PendingMessage:
        return prepare_message(
            self.fmt,
            self.config,
            self.store.token_counter,
            message,
            timestamp,
            pinned=pinned,
            index=index,
        )

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
        return self.store._write(
            lambda c: insert_messages(c, self._locked(c), self.fmt, [pending])[0]
        )

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
        return self.store._write(lambda c: insert_messages(c, self._locked(c), self.fmt, pending))

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
        result = check_tool_result(
            tool_use_id, content, tool_name=tool_name, file_path=file_path, is_error=is_error
        )
        return self.store._write(
            lambda c: append_tool_result(
                c, self._locked(c), self.fmt, self.store.token_counter, result, timestamp
            )
        )

    def invalidate(self, file_path: str) -> bool:
        """Forget the registered read of a path (after a write or edit of that file).

        Returns whether a read was registered.
        """
        path = check_file_path(file_path)

        def tx(connection: Connection) -> bool:
            self._locked(connection)
            return repo.delete_dedup_entry(connection, self.id, path) > 0

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

    def iter_messages(self, *, page: int = 100) -> Iterator[dict[str, Any]]:
        """The whole log as :meth:`messages` gives it, read ``page`` messages at a time so a
        long log is never in memory at once: the log as it stood when iteration began
        (messages appended meanwhile are left out; the log is append-only)."""
        last = self.store._read(lambda c: repo.last_message(c, self.id))
        after, end = -1, (-1 if last is None else last.seq)
        while after < end:
            rows = self.store._read(
                functools.partial(
                    repo.log_page, session_id=self.id, after_seq=after, up_to_seq=end, limit=page
                )
            )
            if not rows:
                return  # the session was deleted meanwhile
            for seq, payload in rows:
                after = seq
                yield json.loads(payload)

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
            calibrate(connection, row, self._context(connection, row), input_tokens, called)

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
        request = compaction.process_request(
            now_or_clock(now),
            enable_tool_budget=bool(enable_tool_budget),
            enable_microcompact=bool(enable_microcompact),
            enable_auto_compact=bool(enable_auto_compact),
        )
        result = self._compaction(request)
        assert result is not None, "the pipeline always decides"
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
        return self._compaction(compaction.reactive_request(now_or_clock(now), error_message))

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
        result = self._compaction(
            compaction.manual_request(now_or_clock(now), instructions, up_to_seq)
        )
        assert result is not None, "a manual compaction always decides"
        return result

    def _compaction(self, request: compaction.Request) -> CompactionResult | None:
        store = self.store

        def tx(connection: Connection) -> tuple[CompactionResult | None, CachedContext | None]:
            row = self._locked(connection)
            context = self._context(connection, row)
            return compaction.run(connection, row, context, request, store.plugins)

        result, cached = store._write(tx)
        if cached is not None:
            # Only once committed: an entry for versions that were rolled back could match
            # another writer's later, different change.
            store._cache.put(self.id, cached)
        return result

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
            return replay.rollback(connection, self.id, boundary_id, at)

        return self.store._write(tx)

    def replay(
        self,
        boundary_id: int,
        *,
        config: CompactionConfig | None = None,
        apply: bool = False,
        now: float | None = None,
    ) -> CompactionResult:
        """Run a recorded compaction again on the context as it stood just before it.

        With the recorded config (or ``config``) and the recorded time, the same inputs
        give a byte-identical boundary and summary. ``apply=True`` records the result as a
        new compaction: allowed on the latest live boundary (which it replaces) or on a
        rolled-back one whose parent is the live boundary again. The engines and the
        summary keep the recorded time; the new rows and the rollback they imply are dated
        ``now`` (epoch seconds; default: the clock).

        Raises:
            NotFoundError: no such boundary in this session.
            ConflictError: the boundary was imported from a transcript (nothing to run
                again), or apply=True where the replayed result cannot take its place.
        """
        check_id(boundary_id, "boundary", self.id)
        check_config(config)
        at = now_or_clock(now)
        store = self.store

        def run(connection: Connection) -> CompactionResult:
            row = require(connection, self.id, store.location, lock=apply)
            return replay.replay(
                connection,
                row,
                self.fmt,
                store.plugins,
                boundary_id,
                config=config,
                apply=apply,
                at=at,
            )

        return store._write(run) if apply else store._read(run)

    # -- memory, breaker, blobs ---------------------------------------------------------

    def remember(
        self, kind: str, text: str, *, scope: str = "session", now: float | None = None
    ) -> int:
        """Add a memory entry for session-memory compact; returns its id."""
        check_memory(kind, text, scope)
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
