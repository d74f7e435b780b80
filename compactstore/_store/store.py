"""CompactStore: the sync driver. It opens the database and the transactions; the work
inside them is :mod:`compactstore._core`'s (checks, rules, plan -> decide -> commit).

Every public method that writes runs in exactly one transaction, and leaves the database
exactly as it was when anything raises. :class:`Session` (one conversation) is in
:mod:`compactstore._store.session`.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine

from compactstore._context.tokens import TokenCounter
from compactstore._core import checks, compaction
from compactstore._core.cache import ContextCache
from compactstore._core.plugins import (
    checked_counter,
    checked_memory_provider,
    warn_callback_failed,
)
from compactstore._core.sessions import (
    DEFAULT_CONTEXT_WINDOW,
    DEFAULT_FORMAT,
    import_staged,
    import_transcript,
    named,
    once,
    open_session,
    release_space,
    session_infos,
    stored_id,
)
from compactstore._core.steps import Op, drive
from compactstore._core.summarizing import (
    Redactor,
    check_compactor,
    check_summarizer,
    summarizer_name,
)
from compactstore._engines.base import Summarizer
from compactstore._engines.session_memory import MemoryProvider
from compactstore._store.jobs import run_background_job
from compactstore._store.session import Session
from compactstore.capabilities import ModelCapabilities, merged_capabilities
from compactstore.db import jobs
from compactstore.db import repository as repo
from compactstore.db.engine import (
    database_errors,
    describe,
    normalize_url,
    read_tx,
    release_engine,
    with_retry,
    write_tx,
)
from compactstore.db.migrate import open_engine
from compactstore.db.transfer import delete_sessions
from compactstore.errors import (
    ConflictError,
    InvalidInputError,
    NotFoundError,
)
from compactstore.formats import get_format
from compactstore.formats.block_types import AllowBlockTypes, block_type_extension
from compactstore.models import (
    CompactionConfig,
    CompactionResult,
    ImportedBoundary,
    ImportedMessage,
    JobInfo,
    SessionInfo,
)
from compactstore.pricing import Prices, PriceTable, price_table

__all__ = [
    "DEFAULT_CONTEXT_WINDOW",
    "DEFAULT_FORMAT",
    "CompactStore",
    "MemoryProvider",
    "Session",
    "Summarizer",
]

T = TypeVar("T")

# Threads that run sync summarizers (the documentation: a bounded executor). A summarizer past its
# timeout is abandoned, not killed: it keeps its thread until it returns, so at most this
# many stuck calls exist per store; later ones queue, time out and fall back.
SUMMARIZER_THREADS = 32
# Threads that run background compactions this process started; more jobs
# queue (their rows wait in compaction_jobs, so a `compactstore worker` may take them too).
BACKGROUND_THREADS = 2

CompactionCallback = Callable[[CompactionResult], object]

# Sessions whose active context a store keeps in memory (open(cache_sessions=)).
DEFAULT_CACHE_SESSIONS = 64


class CompactStore:
    """A database of agent sessions and their compactions.

    Open one with :meth:`open`; it is safe to share between threads of one process and to
    open from many processes at once.
    """

    # Whether summarizers may be coroutine functions (the async store awaits them).
    _async_summarizers = False

    def __init__(
        self,
        engine: Engine,
        location: str,
        *,
        token_counter: TokenCounter | None = None,
        summarizer: Summarizer | None = None,
        memory_provider: MemoryProvider | None = None,
        on_compaction: CompactionCallback | None = None,
        redactor: Redactor | None = None,
        cache_sessions: int = DEFAULT_CACHE_SESSIONS,
        compactor: Any = None,
        allow_block_types: AllowBlockTypes = None,
        prices: Prices | None = None,
        model_capabilities: Mapping[str, ModelCapabilities] | None = None,
    ) -> None:
        self.engine = engine
        # What model calls cost (compactstore.pricing): the shipped table and the caller's.
        self.prices: PriceTable = price_table(prices)
        # The dated model capability table with the caller's entries (compactstore.capabilities).
        self.model_capabilities = merged_capabilities(checks.check_capabilities(model_capabilities))
        self.allow_block_types = block_type_extension(allow_block_types)
        self.location = location
        self.token_counter: TokenCounter = checked_counter(token_counter)
        self.summarizer = check_summarizer(summarizer, allow_async=self._async_summarizers)
        self.compactor = check_compactor(compactor, allow_async=self._async_summarizers)
        self.memory_provider = checked_memory_provider(memory_provider)
        for name, value in (("on_compaction", on_compaction), ("redactor", redactor)):
            if value is not None and not callable(value):
                raise InvalidInputError(f"{name} must be a callable, got {value!r}")
        self.on_compaction = on_compaction
        self.redactor = redactor
        self.cache = ContextCache(
            checks.check_cache_sessions(cache_sessions), self.model_capabilities
        )
        # A staging store (compactstore.transfer.staging) builds its imports in place.
        self.imports_in_place = False
        self._warned: set[tuple[str, str]] = set()
        self._warned_lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._executor_lock = threading.Lock()
        self._jobs: ThreadPoolExecutor | None = None

    @classmethod
    def open(
        cls,
        db: str | os.PathLike[str] | None = None,
        *,
        auto_migrate: bool | None = None,
        read_only: bool = False,
        create: bool = True,
        allow_other_tables: bool = False,
        token_counter: TokenCounter | None = None,
        summarizer: Summarizer | None = None,
        memory_provider: MemoryProvider | None = None,
        on_compaction: CompactionCallback | None = None,
        redactor: Redactor | None = None,
        pool_size: int | None = None,
        max_overflow: int | None = None,
        pool_timeout: float | None = None,
        cache_sessions: int = DEFAULT_CACHE_SESSIONS,
        allow_block_types: AllowBlockTypes = None,
        prices: Prices | None = None,
        model_capabilities: Mapping[str, ModelCapabilities] | None = None,
        compactor: Any = None,
    ) -> CompactStore:
        """Open (and create or upgrade) a store.

        Args:
            db: a file path or SQLAlchemy URL; default ``$COMPACTSTORE_DB`` or
                ``./compactstore.db``.
            auto_migrate: upgrade an older schema; when False, refuse it instead. Default:
                True for a SQLite file, False for a PostgreSQL URL (a fleet upgrades its
                shared database with ``compactstore db upgrade`` before a new version rolls
                out). An empty database is created at head either way.
            read_only: only read: never create, migrate or write the database (writes
                raise DatabaseError); works on a read-only file, directory or mount.
            create: set up a new database: create a missing SQLite file (and its
                directory) and compactstore's tables in an empty database. False: only
                open a database that already is a compactstore one (NotFoundError
                otherwise), so a mistyped path creates nothing.
            allow_other_tables: with ``create``, also add compactstore's tables to a
                database that holds other tables or views (another program's). Without
                it such a database is refused (SchemaError) and left untouched.
            token_counter: replaces :func:`estimate_tokens` for new messages.
            summarizer: writes full-compact summaries instead of the rule-based one: a
                plain callable (an async one needs AsyncCompactStore); see
                :class:`~compactstore._engines.base.Summarizer`.
            memory_provider: supplies the memory text of session-memory compact.
            on_compaction: called with each recorded CompactionResult, after its
                transaction committed (never inside one); an exception it raises is a
                warning, the compaction stays recorded.
            pool_size, max_overflow, pool_timeout: the connection pool (SQLAlchemy's
                defaults: 5 kept open, 10 more on demand, 30 s waiting for a free one);
                a caller that waits longer gets a DatabaseError saying the database is
                busy. A compaction holds a connection only while it reads its snapshot
                and while it commits, never while its summarizer runs.
            cache_sessions: how many sessions' active contexts are kept in memory
                (default 64; least recently used first out).
            redactor: a text -> text function applied to every text that leaves the
                process: what a summarizer is sent, the messages of
                :func:`compactstore._store.export.export_lines` and the summaries of
                :mod:`compactstore.report`'s pages (the stored messages are unchanged);
                also to a summarizer's failure before it is stored as the reason of the
                fallback, after credentials (API key headers, Bearer tokens, ``sk-...``
                keys) are taken out of it.
            allow_block_types: content block types to accept beyond the format's per-role
                lists (:data:`compactstore.formats.block_types.BLOCK_TYPES`): a list of
                type names (every role) or a mapping of role -> type names.
            prices: model name -> :class:`~compactstore.pricing.ModelPrice` (or a dict of
                its fields), added to or replacing the shipped, dated table of
                :mod:`compactstore.pricing`; the cost of each model call recorded from then
                on is figured with it (a model with no price: cost None).
            model_capabilities: model id -> :class:`~compactstore.capabilities.ModelCapabilities`,
                added to (or replacing entries of) the table shipped with the package; a
                session's model decides its "auto" edit policy through it.

        Raises:
            InvalidInputError: the summarizer is a coroutine function (use
                AsyncCompactStore), or a plug-in is not callable.
            SchemaError: the schema is newer than this code, or older and not migrated
                (read_only, auto_migrate False, or auto_migrate left out on PostgreSQL).
            SchemaError: the database holds another program's tables (see
                ``allow_other_tables``).
            DatabaseError: the file is not a usable database, or the path is a directory.
            NotFoundError: read_only or not create, and there is no compactstore database
                there.
        """
        url = normalize_url(
            db if db is not None else os.environ.get("COMPACTSTORE_DB") or "compactstore.db"
        )
        location = describe(url)
        # Checked before the database is touched.
        check_summarizer(summarizer)
        check_compactor(compactor)
        checks.check_cache_sessions(cache_sessions)
        block_type_extension(allow_block_types)
        table = price_table(prices)
        checks.check_capabilities(model_capabilities)
        pool = checks.check_pool(pool_size, max_overflow, pool_timeout)
        engine = open_engine(
            url,
            location=location,
            auto_migrate=auto_migrate,
            read_only=read_only,
            pool=pool,
            create=create,
            allow_other_tables=allow_other_tables,
        )
        return cls(
            engine,
            location,
            token_counter=token_counter,
            summarizer=summarizer,
            memory_provider=memory_provider,
            on_compaction=on_compaction,
            redactor=redactor,
            cache_sessions=cache_sessions,
            compactor=compactor,
            allow_block_types=allow_block_types,
            prices=table,
            model_capabilities=model_capabilities,
        )

    def close(self) -> None:
        """Wait for this store's background compactions, then close the pool's connections
        (summaries still running are abandoned; the engine is kept for reopening the database)."""
        with self._executor_lock:
            jobs, self._jobs = self._jobs, None
        if jobs is not None:
            jobs.shutdown(wait=True)
        self.shutdown_summarizers()
        release_engine(self.engine)

    def shutdown_summarizers(self) -> None:
        """Stop the summarizer pool (summaries still running are abandoned)."""
        with self._executor_lock:
            if self._executor is not None:
                self._executor.shutdown(wait=False, cancel_futures=True)
                self._executor = None

    def __enter__(self) -> CompactStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"CompactStore({self.location!r})"

    @property
    def plugins(self) -> compaction.Plugins:
        """The caller's code compactions run: token counter, summarizer, memory provider,
        redactor."""
        summarizer = self.summarizer
        return compaction.Plugins(
            self.token_counter,
            summarizer,
            self.memory_provider,
            summarizer_name=None if summarizer is None else summarizer_name(summarizer),
            redactor=self.redactor,
            compactor=self.compactor,
        )

    def summarizer_executor(self) -> ThreadPoolExecutor:
        """The bounded pool sync summarizers run in (made on first use)."""
        with self._executor_lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(
                    SUMMARIZER_THREADS, thread_name_prefix="compactstore-summarizer"
                )
            return self._executor

    def submit_job(
        self, job_id: int, plugins: compaction.Plugins, owner: str | None = None
    ) -> None:
        """Run a job this process started (or, as ``owner``, took over) in a background
        thread."""
        with self._executor_lock:
            if self._jobs is None:
                self._jobs = ThreadPoolExecutor(
                    BACKGROUND_THREADS, thread_name_prefix="compactstore-background"
                )
            self._jobs.submit(self._run_job_quietly, job_id, plugins, owner)

    def _run_job_quietly(
        self, job_id: int, plugins: compaction.Plugins, owner: str | None = None
    ) -> None:
        # An error is recorded on the job row (state failed); a thread has no caller.
        with contextlib.suppress(Exception):
            run_background_job(self, job_id, plugins, owner)

    def pending_jobs(self) -> list[JobInfo]:
        """The background compactions waiting for a worker (pending, or running with a
        lapsed lease: its worker died), oldest first."""
        return [jobs.info(job) for job in self.read(repo.pending_jobs)]

    def run_job(self, job_id: int, *, plugins: compaction.Plugins | None = None) -> JobInfo | None:
        """Run one background compaction: claim the job, plan -> decide -> commit with the
        summarizer, record how it ended, and return the job as it ended. None when another
        worker holds the job or it is finished. ``compactstore worker`` calls this.

        The job's state becomes ``applied`` (a compaction that cut was recorded),
        ``failed`` (recorded, but it freed nothing or an error was raised: the error is
        stored) or ``superseded`` (another compaction made it moot; nothing recorded).
        """
        return run_background_job(self, job_id, plugins or self.plugins)

    def notify(self, result: CompactionResult) -> None:
        """Hand a recorded compaction to ``on_compaction`` (no transaction is open)."""
        callback = self.on_compaction
        if callback is None:
            return
        try:
            self._call_back(callback, result)
        except Exception as exc:  # the compaction is recorded; the callback cannot undo it
            warn_callback_failed(exc, result.id, stacklevel=3)

    def _call_back(self, callback: CompactionCallback, result: CompactionResult) -> None:
        callback(result)

    def warn_once(self, session_id: str, what: str) -> bool:
        """True the first time ``what`` happens to a session in this store."""
        with self._warned_lock:
            if (session_id, what) in self._warned:
                return False
            self._warned.add((session_id, what))
            return True

    # -- the driver: compactstore._core.driver.Driver

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Connection]:
        """One write transaction, as the store's own writes run (like sqlite-utils'
        ``atomic()``): committed when the block ends, rolled back when it raises. On SQLite
        the block starts once it holds the write lock (the writers of every process take
        turns for it; a busy database is tried again before the block starts, the block
        itself runs once). For writes of the caller's own that must commit together (use
        the store's methods for compactstore's tables, outside the block: each opens a
        transaction of its own)::

            with store.transaction() as connection:
                connection.exec_driver_sql("INSERT INTO my_table VALUES (1)")

        Raises:
            DatabaseError: the database is busy past its timeout or read-only, or refused
                a statement of the block (the error names the database).
        """

        def begin() -> tuple[contextlib.AbstractContextManager[Connection], Connection]:
            opened = write_tx(self.engine)
            return opened, opened.__enter__()

        opened, connection = database_errors(
            self.location, lambda: with_retry(begin, sleep=self._backoff)
        )
        try:
            yield connection
        except BaseException as exc:
            database_errors(self.location, functools.partial(opened.__exit__, type(exc), exc, None))
            database_errors(self.location, functools.partial(_raise, exc))
            raise
        database_errors(self.location, lambda: opened.__exit__(None, None, None))

    def write(self, fn: Callable[[Connection], T]) -> T:
        """Run ``fn`` in one write transaction and return its value; ``fn`` runs again
        from the start while the database is busy (DatabaseError: as :meth:`transaction`)."""
        return self._transaction(write_tx, fn)

    def read(self, fn: Callable[[Connection], T]) -> T:
        """Run ``fn`` in one read transaction (one consistent snapshot) and return its
        value."""
        return self._transaction(read_tx, fn)

    def _transaction(self, begin: Callable[[Engine], Any], fn: Callable[[Connection], T]) -> T:
        def attempt() -> T:
            with begin(self.engine) as connection:
                return fn(connection)

        return database_errors(self.location, lambda: with_retry(attempt, sleep=self._backoff))

    # How a busy retry waits (None: time.sleep). The work and waits below run in the calling
    # thread; the async store (compactstore._store.threads) runs them off its event loop.
    _backoff: Callable[[float], object] | None = None

    def compute(self, fn: Callable[[], T]) -> T:
        """Run CPU work or the caller's code with no transaction open."""
        return fn()

    def _sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def drive(self, steps: Generator[Op, Any, T], first: Op | None = None) -> T:
        """Run a compaction call's steps with this store's hooks (``first``: see
        :class:`compactstore._core.steps.Paused`)."""
        return drive(steps, self.read, self.write, self._sleep, self.compute, first=first)

    def session(
        self,
        session_id: str,
        *,
        context_window: int | None = None,
        format: str | None = None,
        config: CompactionConfig | None = None,
        now: float | None = None,
        cwd: str | None = None,
        summarizer: Summarizer | None = None,
        model: str | None = None,
        compactor: Any = None,
    ) -> Session:
        """Open a session, creating it when it does not exist.

        A new session takes the defaults (anthropic, 200,000 tokens, CompactionConfig())
        for what is not given. For an existing one, a different format or context window is
        an error; a new ``config`` replaces the stored one (each compaction records the
        config it ran with). ``now`` is the creation time (epoch seconds): the microcompact
        clock starts there. ``cwd`` is the agent's working directory: summaries name files
        relative to it (without it, the directory an environment block names is used).
        ``summarizer`` writes this session's summaries instead of the store's; its name is
        recorded with the session, and a later process that opens it without that
        summarizer configured writes rule-based summaries and counts each as a fallback.
        ``model`` is the model the session talks to (recorded; ``append_response`` records
        each response's model too): with ``edit_policy="auto"`` it decides whether
        compactions edit sent messages in place or append only (compactstore.capabilities).
        ``compactor`` (compactstore.providers, e.g. ``AnthropicCompactor``) has the provider
        summarise what this session's auto-compact and ``compact()`` cut, instead of the
        store's; the summarizer (or the rule-based summary) is its fallback.

        Raises:
            ConflictError: the session exists with another format, context window or cwd.
            InvalidInputError: a bad id, format, window, config or cwd.
        """
        sid = checks.check_session_id(session_id)
        checks.check_session_options(cwd, format, context_window, config, model)
        created = checks.now_or_clock(now)
        own = check_summarizer(summarizer, allow_async=self._async_summarizers)
        name = None if own is None else summarizer_name(own)
        own_compactor = check_compactor(compactor, allow_async=self._async_summarizers)

        opening = functools.partial(
            open_session,
            format=format,
            context_window=context_window,
            config=config,
            created_at=created,
            cwd=cwd,
            location=self.location,
            model=model,
        )
        row = self.write(lambda c: named(c, opening, session_id, sid, summarizer=name))
        return Session(self, row, summarizer=own, compactor=own_compactor)

    def get_session(self, session_id: str) -> Session:
        """Open an existing session; NotFoundError when there is none."""
        sid = checks.check_session_id(session_id)
        row = self.read(lambda c: repo.get_session(c, stored_id(c, session_id, sid)))
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
        """Create a session from a transcript: all or nothing.

        ``items`` are the transcript's messages in order, each compaction the agent already
        did (e.g. Claude Code's compact_boundary records) coming just before the first
        message it kept (its ``first_kept_index``) or after the last: each becomes a
        boundary row whose summary stands for the messages before it. A message's ``usage``
        (the prompt size the provider reported for the call that produced it) becomes a
        ``model_calls`` row. Items are consumed as they come and stored in batches, so a
        long transcript need not be in memory. The session is built (and its tokens
        counted) in a staging database, a temporary SQLite file, and copied into this store
        in one short write transaction: the token counter never runs while this store is
        locked.

        Raises:
            ConflictError: the session already exists.
            InvalidMessageError: a message is invalid (the error names its ``where``, or
                its index).
        """
        sid = checks.check_session_id(session_id)
        if not self.imports_in_place and self.read(lambda c: repo.get_session(c, sid)):
            raise ConflictError(f"session {sid!r} already exists; import into a new session id")
        build = once(
            functools.partial(
                import_transcript,
                session_id=sid,
                adapter=get_format(format),
                items=items,
                context_window=context_window or DEFAULT_CONTEXT_WINDOW,
                config=config or CompactionConfig(),
                count_tokens=self.token_counter,
                location=self.location,
                allow_block_types=self.allow_block_types,
                prices=self.prices,
            ),
            self.location,
        )
        if self.imports_in_place:
            return Session(self, self.write(build))
        import_staged(build, self.write, self.location)
        return self.get_session(sid)

    def delete_session(self, session_id: str) -> None:
        """Delete a session and every row it owns (log, compactions, blobs, memory, ...) in
        one transaction, with its subagents' sessions (:meth:`Session.subagents`). Handles
        open on them fail afterwards. A SQLite file compactstore created gives the space back
        to the disk afterwards (an older one keeps it free for new rows until
        :func:`compactstore._store.admin.vacuum`).

        Raises:
            NotFoundError: no such session.
        """
        sid = checks.check_session_id(session_id)

        def tx(connection: Connection) -> tuple[str, list[str]] | None:
            stored = stored_id(connection, session_id, sid)
            children = [child for child, _ in repo.subagents_of(connection, [stored])]
            return (stored, children) if delete_sessions(connection, [stored, *children]) else None

        deleted = self.write(tx)
        if deleted is None:
            raise NotFoundError(f"no session {sid!r} in {self.location}")
        stored, children = deleted
        for gone in (stored, *children):
            self.cache.drop(gone)
        release_space(self.engine, self.location)

    def sessions(self) -> list[SessionInfo]:
        """Every session, oldest first."""
        return self.read(session_infos)


def _raise(exc: BaseException) -> None:
    raise exc
