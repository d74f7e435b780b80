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
  driver code (:func:`compactstore.core.steps.drive` over ``compaction_steps``) runs on
  the loop, in a greenlet (SQLAlchemy's ``greenlet_spawn``), where the store's driver hooks
  hop: ``Read``/``Write`` go to the step pool, ``Compute`` (the engines and the summarizer
  behind them) to a pool of :data:`DECIDE_THREADS` threads of its own, so a decide step
  waiting for a slow summary never holds a thread the other sessions' transactions need,
  and ``Wait`` (and a retry's back-off) is ``asyncio.sleep``.
- ``process_request()`` without ``background`` (most calls: nothing to summarise) starts
  whole in a step thread, one hop like a simple call; the driver pauses there before a
  step that waits (a summary, another caller's lease: :class:`~compactstore.core.steps.Paused`)
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
from collections.abc import (
    Callable,
    Iterable,
    Mapping,
)
from functools import partial
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, cast

from sqlalchemy import Engine

from compactstore.aio_session import AsyncSession
from compactstore.aio_threads import DECIDE_THREADS, STEP_THREADS, ThreadedStore, glue
from compactstore.capabilities import ModelCapabilities
from compactstore.core.checks import check_cache_sessions, check_capabilities, check_pool
from compactstore.core.summarizing import Redactor, check_summarizer
from compactstore.db.engine import describe, normalize_url
from compactstore.db.migrate import open_engine
from compactstore.engines.base import AsyncSummarizer, Summarizer
from compactstore.engines.session_memory import MemoryProvider
from compactstore.errors import MissingExtraError
from compactstore.formats.block_types import AllowBlockTypes, block_type_extension
from compactstore.models import (
    CompactionConfig,
    ImportedBoundary,
    ImportedMessage,
    JobInfo,
    SessionInfo,
)
from compactstore.pricing import Prices, price_table
from compactstore.store import DEFAULT_CACHE_SESSIONS, CompactionCallback
from compactstore.tokens import TokenCounter

if TYPE_CHECKING:
    pass

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
            core.engine.dispose()

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
