"""The async driver: :class:`AsyncCompactStore` and :class:`AsyncSession`.

One core, two drivers. An async call runs the very code the sync :class:`Session` runs, on
a :class:`CompactStore` over the ordinary (sync) engine, and keeps the event loop free by
running each *step* of it in a worker thread:

- Every transaction (a whole ``Read`` or ``Write`` step: the SQL, SQLAlchemy's row handling,
  building the context) runs in the store's few step threads (:data:`STEP_THREADS`).
  A call that is nothing but checks, CPU work and transactions (``append``, ``extend``,
  ``active_context``, ``rollback``, ...) runs whole in one such thread: one hop.
- A call that compacts (``process_request``, ``compact``, ``reactive_recover``,
  ``replay``, a background job) may wait: for another caller's lease, for a summary. Its
  driver code (:func:`compactstore._core.steps.drive` over ``compaction_steps``) runs on
  the loop, in a greenlet (SQLAlchemy's ``greenlet_spawn``), where the store's driver hooks
  hop: ``Read``/``Write`` go to the step pool, ``Compute`` (the engines and the summarizer
  behind them) to a pool of :data:`DECIDE_THREADS` threads of its own, so a decide step
  waiting for a slow summary never holds a thread the other sessions' transactions need,
  and ``Wait`` (and a retry's back-off) is ``asyncio.sleep``.
- ``process_request()`` without ``background`` (most calls: nothing to summarise) starts
  whole in a step thread, one hop like a simple call; the driver pauses there before a
  step that waits (a summary, another caller's lease: :class:`~compactstore._core.steps.Paused`)
  and the loop goes on with the rest as above.
- An async summarizer is awaited on the loop (``Plugins.loop``); a sync one runs in the
  summarizer pool.

So there is no second copy of the rules: the checks, plan -> decide -> commit, the lease
and the re-plans are the sync ones. A store belongs to the event loop it was opened on.
Needs the ``async`` extra for greenlet (``sqlalchemy[asyncio]``).
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Mapping
from functools import partial, update_wrapper
from itertools import islice
from typing import Any, Concatenate, ParamSpec, TypeVar, cast

from sqlalchemy import Engine

from compactstore._context.tokens import TokenCounter
from compactstore._core.checks import check_cache_sessions, check_capabilities, check_pool
from compactstore._core.driver import committed
from compactstore._core.steps import Paused
from compactstore._core.summarizing import Redactor, check_summarizer
from compactstore._engines.base import AsyncSummarizer, Summarizer
from compactstore._engines.session_memory import MemoryProvider
from compactstore._store.session import Session
from compactstore._store.store import DEFAULT_CACHE_SESSIONS, CompactionCallback
from compactstore._store.threads import DECIDE_THREADS, STEP_THREADS, ThreadedStore, glue
from compactstore.capabilities import ModelCapabilities
from compactstore.db.engine import describe, normalize_url, release_engine
from compactstore.db.migrate import open_engine
from compactstore.errors import MissingExtraError
from compactstore.formats.block_types import AllowBlockTypes, block_type_extension
from compactstore.models import (
    CompactionConfig,
    CompactionResult,
    ImportedBoundary,
    ImportedMessage,
    JobInfo,
    SessionInfo,
)
from compactstore.pricing import Prices, price_table

__all__ = ["DECIDE_THREADS", "STEP_THREADS", "AsyncCompactStore", "AsyncSession"]

P = ParamSpec("P")
T = TypeVar("T")


class AsyncCompactStore:
    """A database of agent sessions, for asyncio: every call is a coroutine that never
    blocks the event loop on the database, the engines or a summarizer.

    Open one with ``await AsyncCompactStore.open(...)`` (the URLs and options of
    :meth:`CompactStore.open`); close it with ``await store.close()`` or ``async with``.
    """

    def __init__(self, core: ThreadedStore) -> None:
        self._core = core
        self.location = core.location
        self._closed = False
        self._close_lock = threading.Lock()

    async def _step(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run a whole call that only checks, computes and runs transactions in a step
        thread (one hop)."""
        return await self._core.steps.run(partial(fn, *args, **kwargs))

    @classmethod
    async def open(
        cls,
        db: str | os.PathLike[str] | None = None,
        *,
        auto_migrate: bool | None = None,
        read_only: bool = False,
        create: bool = True,
        allow_other_tables: bool = False,
        token_counter: TokenCounter | None = None,
        summarizer: Summarizer | AsyncSummarizer | None = None,
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
    ) -> AsyncCompactStore:
        """Open (and create or upgrade) a store; the arguments are
        :meth:`CompactStore.open`'s, except that ``summarizer`` (and ``on_compaction``)
        may also be ``async def``: it is awaited on this event loop.

        Raises:
            MissingExtraError: the ``async`` extra is not installed.
            InvalidInputError, SchemaError, DatabaseError, NotFoundError: as
                :meth:`CompactStore.open`.
        """
        if importlib.util.find_spec("greenlet") is None:  # SQLAlchemy's greenlet bridge
            raise MissingExtraError(
                "AsyncCompactStore needs the async extra (greenlet is missing): "
                "pip install 'compactstore[async]'"
            )
        url = normalize_url(
            db if db is not None else os.environ.get("COMPACTSTORE_DB") or "compactstore.db"
        )
        location = describe(url)
        check_summarizer(summarizer, allow_async=True)
        check_cache_sessions(cache_sessions)
        block_type_extension(allow_block_types)
        table = price_table(prices)
        check_capabilities(model_capabilities)
        pool = check_pool(pool_size, max_overflow, pool_timeout)
        # Opening (checking, creating or upgrading the schema) is sync code: in a thread.
        engine = await asyncio.to_thread(
            open_engine,
            url,
            location=location,
            auto_migrate=auto_migrate,
            read_only=read_only,
            pool=pool,
            create=create,
            allow_other_tables=allow_other_tables,
        )
        try:
            core = ThreadedStore(
                engine,
                location,
                asyncio.get_running_loop(),
                token_counter=token_counter,
                # The threaded store takes async summarizers too (its _async_summarizers).
                summarizer=cast(Summarizer | None, summarizer),
                memory_provider=memory_provider,
                on_compaction=on_compaction,
                redactor=redactor,
                cache_sessions=cache_sessions,
                allow_block_types=allow_block_types,
                prices=table,
                model_capabilities=model_capabilities,
                compactor=compactor,
            )
            await asyncio.to_thread(core.start_threads)
        except BaseException:
            engine.dispose()
            raise
        return cls(core)

    async def close(self) -> None:
        """Wait for the background compactions this store started and for calls in flight
        to finish their steps, then stop the threads and release the pool."""
        core = self._core
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        while core.tasks:
            await asyncio.gather(*list(core.tasks), return_exceptions=True)

        def stop() -> None:
            core.decides.stop()
            core.steps.stop()
            core.shutdown_summarizers()
            release_engine(core.engine)

        await asyncio.to_thread(stop)

    async def __aenter__(self) -> AsyncCompactStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"AsyncCompactStore({self.location!r})"

    @property
    def sync_engine(self) -> Engine:
        """The SQLAlchemy Engine the store's threads use."""
        return self._core.engine

    async def session(
        self,
        session_id: str,
        *,
        context_window: int | None = None,
        format: str | None = None,
        config: CompactionConfig | None = None,
        now: float | None = None,
        cwd: str | None = None,
        summarizer: Summarizer | AsyncSummarizer | None = None,
        model: str | None = None,
        compactor: Any = None,
    ) -> AsyncSession:
        """Open a session, creating it when it does not exist (see
        :meth:`CompactStore.session`); ``summarizer`` may be ``async def``."""
        sess = await self._step(
            self._core.session,
            session_id,
            context_window=context_window,
            format=format,
            config=config,
            now=now,
            cwd=cwd,
            # The threaded store takes async summarizers too (its _async_summarizers).
            summarizer=cast(Summarizer | None, summarizer),
            model=model,
            compactor=compactor,
        )
        return AsyncSession(self, sess)

    async def get_session(self, session_id: str) -> AsyncSession:
        """Open an existing session; NotFoundError when there is none."""
        return AsyncSession(self, await self._step(self._core.get_session, session_id))

    async def import_session(
        self,
        session_id: str,
        items: Iterable[ImportedMessage | ImportedBoundary],
        *,
        format: str = "anthropic",
        context_window: int | None = None,
        config: CompactionConfig | None = None,
    ) -> AsyncSession:
        """Create a session from a transcript in one transaction (see
        :meth:`CompactStore.import_session`)."""
        sess = await self._step(
            self._core.import_session,
            session_id,
            items,
            format=format,
            context_window=context_window,
            config=config,
        )
        return AsyncSession(self, sess)

    async def delete_session(self, session_id: str) -> None:
        """Delete a session and every row it owns, in one transaction."""
        await self._step(self._core.delete_session, session_id)

    async def sessions(self) -> list[SessionInfo]:
        """Every session, oldest first."""
        return await self._step(self._core.sessions)

    async def pending_jobs(self) -> list[JobInfo]:
        """See :meth:`CompactStore.pending_jobs`."""
        return await self._step(self._core.pending_jobs)

    async def run_job(self, job_id: int) -> JobInfo | None:
        """See :meth:`CompactStore.run_job`."""
        return await glue(self._core.run_job, job_id)


# -- AsyncSession: a Session's methods as coroutines
#
# A method is the sync Session's own, run one of three ways: whole in a step thread (one
# hop: _in_step_thread), as a compaction call's driver code on the loop (it may wait for a
# summary or a lease: _on_loop), or, for the few that may pause or call an async
# on_compaction, by hand. The wrappers take their signatures and docstrings from Session,
# so a new Session method is one line here.

_Async = Callable[Concatenate["AsyncSession", P], Coroutine[Any, Any, T]]


def _in_step_thread(method: Callable[Concatenate[Session, P], T]) -> _Async[P, T]:
    """``method`` as a coroutine that runs it whole in one of the store's step threads: a
    call that is nothing but checks, CPU work and transactions."""

    async def call(self: AsyncSession, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await self._step(method, self._session, *args, **kwargs)

    update_wrapper(call, method)
    return call


def _on_loop(method: Callable[Concatenate[Session, P], T]) -> _Async[P, T]:
    """``method`` as a coroutine whose driver code runs on the loop, in a greenlet: a
    compaction call, whose steps each hop to a thread and whose waits do not block."""

    async def call(self: AsyncSession, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await glue(method, self._session, *args, **kwargs)

    update_wrapper(call, method)
    return call


class AsyncSession:
    """One agent conversation, for asyncio: every public :class:`Session` method as a
    coroutine with the same name and arguments (``iter_messages`` is an async iterator).
    The work is the sync Session's own, in the store's threads (see the module
    docstring)."""

    def __init__(self, store: AsyncCompactStore, session: Session) -> None:
        self.store = store
        self._session = session
        core = session.store
        assert isinstance(core, ThreadedStore), "an async session runs on the threaded store"
        # The sync store the work runs on (its hooks hop off the event loop).
        self._core = core
        self.id = session.id
        self.format = session.format
        self.context_window = session.context_window
        self.created_at = session.created_at
        # A subagent's session: the session and tool call that started it (else None).
        self.parent_session_id = session.parent_session_id
        self.parent_tool_use_id = session.parent_tool_use_id

    async def _step(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run a whole call that only checks, computes and runs transactions in a step
        thread (one hop)."""
        return await self._core.steps.run(partial(fn, *args, **kwargs))

    @property
    def config(self) -> CompactionConfig:
        """The session's config as this handle last read it."""
        return self._session.config

    def __repr__(self) -> str:
        return (
            f"AsyncSession({self.id!r}, format={self.format!r}, "
            f"context_window={self.context_window})"
        )

    # -- run whole in a step thread -----------------------------------------------------

    append = _in_step_thread(Session.append)
    extend = _in_step_thread(Session.extend)
    invalidate = _in_step_thread(Session.invalidate)
    context = _in_step_thread(Session.context)
    active_context = _in_step_thread(Session.active_context)
    context_view = _in_step_thread(Session.context_view)
    token_usage = _in_step_thread(Session.token_usage)
    message_count = _in_step_thread(Session.message_count)
    messages = _in_step_thread(Session.messages)
    record_usage = _in_step_thread(Session.record_usage)
    cost = _in_step_thread(Session.cost)
    append_response = _in_step_thread(Session.append_response)
    request_params = _in_step_thread(Session.request_params)
    edit_policy = _in_step_thread(Session.edit_policy)
    edit_state = _in_step_thread(Session.edit_state)
    rollback = _in_step_thread(Session.rollback)
    clear = _in_step_thread(Session.clear)
    pop = _in_step_thread(Session.pop)
    rollback_plan = _in_step_thread(Session.rollback_plan)
    remember = _in_step_thread(Session.remember)
    memories = _in_step_thread(Session.memories)
    breaker = _in_step_thread(Session.breaker)
    reset_breaker = _in_step_thread(Session.reset_breaker)
    get_blob = _in_step_thread(Session.get_blob)
    recall_tool = _in_step_thread(Session.recall_tool)
    recall = _in_step_thread(Session.recall)
    boundaries = _in_step_thread(Session.boundaries)
    subagents = _in_step_thread(Session.subagents)
    compactions = _in_step_thread(Session.compactions)

    # -- compaction calls: driver code on the loop ------------------------------------

    reactive_recover = _on_loop(Session.reactive_recover)
    compact = _on_loop(Session.compact)
    replay = _on_loop(Session.replay)

    # -- by hand ------------------------------------------------------------------------

    async def append_tool_result(
        self,
        tool_use_id: str,
        content: str | list[dict[str, Any]],
        *,
        tool_name: str,
        file_path: str | None = None,
        is_error: bool = False,
        timestamp: float | None = None,
    ) -> int:
        """See :meth:`Session.append_tool_result`."""
        call = partial(
            self._session.append_tool_result,
            tool_use_id,
            content,
            tool_name=tool_name,
            file_path=file_path,
            is_error=is_error,
            timestamp=timestamp,
        )
        # A read dedup is a recorded compaction: an async on_compaction is awaited here, on
        # the loop, once the step thread is done (it may use the store).
        core = self._core
        seq, callbacks = await self._step(core.pausing, call)
        await core.called_back(callbacks)
        return seq

    async def iter_messages(self, *, page: int = 100) -> AsyncIterator[dict[str, Any]]:
        """See :meth:`Session.iter_messages`: the log ``page`` messages at a time."""
        pages = self._session.iter_messages(page=page)
        while True:
            chunk = await self._step(lambda: list(islice(pages, max(page, 1))))
            if not chunk:
                return
            for message in chunk:
                yield message

    async def process_request(
        self,
        *,
        now: float | None = None,
        enable_tool_budget: bool = True,
        enable_read_dedup: bool = True,
        enable_microcompact: bool = True,
        enable_auto_compact: bool = True,
        background: bool = False,
        **switches: bool,
    ) -> CompactionResult:
        """See :meth:`Session.process_request` (with ``background=True`` the summary is
        written by a task on this loop)."""
        call = partial(
            self._session.process_request,
            now=now,
            enable_tool_budget=enable_tool_budget,
            enable_read_dedup=enable_read_dedup,
            enable_microcompact=enable_microcompact,
            enable_auto_compact=enable_auto_compact,
            background=background,
            **switches,
        )
        if background:
            return await glue(call)
        # Whole in a step thread, unless it comes to a step that waits: then on the loop.
        core = self._core
        try:
            result, callbacks = await self._step(core.pausing, call)
        except Paused as paused:
            # Goes on with the paused call's steps on the loop (see compactstore.aio).
            resumed = await glue(committed, core, core.cache, self.id, paused.steps, paused.op)
            assert resumed is not None, "the pipeline always decides"
            return resumed
        await core.called_back(callbacks)
        return result
