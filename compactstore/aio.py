"""The async driver (SPEC §9.3): :class:`AsyncCompactStore` and :class:`AsyncSession`.

One core, two drivers. An async call runs the very code the sync :class:`Session` runs, in
a greenlet (SQLAlchemy's ``greenlet_spawn``, what ``AsyncConnection.run_sync`` is made of)
on a :class:`CompactStore` whose engine is an ``AsyncEngine``'s ``sync_engine``: every
read and write transaction awaits the async driver (aiosqlite, psycopg's async mode)
instead of blocking, and the store's three driver hooks are the async ones:

- ``_compute`` (the engines of a compaction, counting a new message's tokens, a replay's
  decide step) runs in a bounded thread pool, off the event loop;
- ``_sleep`` (retry back-off, waiting for another caller's lease) is ``asyncio.sleep``;
- an async summarizer is awaited on the loop; a sync one runs in the summarizer pool.

So there is no second copy of the rules: the checks, plan -> decide -> commit, the lease
and the re-plans are the sync ones. A store belongs to the event loop it was opened on.
Needs the ``async`` extra (``sqlalchemy[asyncio]``, ``aiosqlite``).
"""

from __future__ import annotations

import asyncio
import inspect
import os
import threading
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Mapping,
    Sequence,
)
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from functools import partial
from itertools import islice
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, cast

from compactstore.context import ActiveContext
from compactstore.core import compaction
from compactstore.core.checks import check_pool
from compactstore.core.summarizing import Redactor, check_summarizer
from compactstore.db.engine import create_async_engine_for, describe, normalize_url
from compactstore.db.migrate import open_engine
from compactstore.engines.base import AsyncSummarizer, Summarizer
from compactstore.engines.session_memory import MemoryProvider
from compactstore.formats.block_types import AllowBlockTypes, block_type_extension
from compactstore.models import (
    BreakerState,
    CompactBoundary,
    CompactionConfig,
    CompactionResult,
    ImportedBoundary,
    ImportedMessage,
    JobInfo,
    MemoryEntry,
    SessionInfo,
)
from compactstore.session import Session
from compactstore.store import (
    DEFAULT_CACHE_SESSIONS,
    CompactionCallback,
    CompactStore,
    check_cache_sessions,
)
from compactstore.tokens import TokenCounter

if TYPE_CHECKING:
    from pydantic import BaseModel
    from sqlalchemy.ext.asyncio import AsyncEngine

__all__ = ["COMPUTE_THREADS", "AsyncCompactStore", "AsyncSession"]

P = ParamSpec("P")
T = TypeVar("T")

# Threads that run CPU work off the event loop (engines, token counting): bounded, so 100
# sessions compacting at once queue here instead of starting 100 threads.
COMPUTE_THREADS = 4


def _await(awaitable: Awaitable[T]) -> T:
    """Await from sync code running in a greenlet the async driver spawned."""
    from sqlalchemy.util import await_only

    return await_only(awaitable)


class _BridgedStore(CompactStore):
    """The sync store on an AsyncEngine's ``sync_engine``, with the async driver's hooks.
    Its methods run only inside ``greenlet_spawn`` on the store's event loop."""

    _async_summarizers = True

    def __init__(
        self, engine: AsyncEngine, location: str, loop: asyncio.AbstractEventLoop, **kw: Any
    ) -> None:
        super().__init__(engine.sync_engine, location, **kw)
        self.async_engine = engine
        self.loop = loop
        self._compute_pool = ThreadPoolExecutor(
            COMPUTE_THREADS, thread_name_prefix="compactstore-compute"
        )
        # Background compactions this store started: tasks on its loop (close() awaits them).
        self.tasks: set[asyncio.Task[None]] = set()

    def _submit_job(self, job_id: int, plugins: compaction.Plugins) -> None:
        task = self.loop.create_task(_run(self._run_job_quietly, job_id, plugins))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    @property
    def plugins(self) -> compaction.Plugins:
        return replace(super().plugins, loop=self.loop)

    def _backoff(self, seconds: float) -> None:
        self._sleep(seconds)

    def _compute(self, fn: Callable[[], T]) -> T:
        return _await(self.loop.run_in_executor(self._compute_pool, fn))

    def _sleep(self, seconds: float) -> None:
        _await(asyncio.sleep(seconds))

    def _call_back(self, callback: CompactionCallback, result: CompactionResult) -> None:
        value = callback(result)
        if inspect.isawaitable(value):
            _await(value)  # an async on_compaction is awaited on the loop


async def _run(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Run sync core code in a greenlet: its database I/O awaits instead of blocking."""
    from sqlalchemy.util import greenlet_spawn

    return await greenlet_spawn(partial(fn, *args, **kwargs))


class AsyncCompactStore:
    """A database of agent sessions, for asyncio: every call is a coroutine that never
    blocks the event loop on the database, the engines or a summarizer.

    Open one with ``await AsyncCompactStore.open(...)`` (the URLs and options of
    :meth:`CompactStore.open`); close it with ``await store.close()`` or ``async with``.
    """

    def __init__(self, core: _BridgedStore) -> None:
        self._core = core
        self.location = core.location
        self._closed = False
        self._close_lock = threading.Lock()

    @classmethod
    async def open(
        cls,
        db: str | os.PathLike[str] | None = None,
        *,
        auto_migrate: bool = True,
        read_only: bool = False,
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
    ) -> AsyncCompactStore:
        """Open (and create or upgrade) a store; the arguments are
        :meth:`CompactStore.open`'s, except that ``summarizer`` (and ``on_compaction``)
        may also be ``async def``: it is awaited on this event loop.

        Raises:
            MissingExtraError: the ``async`` extra is not installed.
            InvalidInputError, SchemaError, DatabaseError, NotFoundError: as
                :meth:`CompactStore.open`.
        """
        url = normalize_url(
            db if db is not None else os.environ.get("COMPACTSTORE_DB") or "compactstore.db"
        )
        location = describe(url)
        check_summarizer(summarizer, allow_async=True)
        check_cache_sessions(cache_sessions)
        block_type_extension(allow_block_types)
        pool = check_pool(pool_size, max_overflow, pool_timeout)
        # The schema is checked (and created or upgraded) by the sync code, in a thread,
        # before the async engine is made.
        checked = await asyncio.to_thread(
            open_engine, url, location=location, auto_migrate=auto_migrate, read_only=read_only
        )
        checked.dispose()
        engine = create_async_engine_for(url, read_only=read_only, pool=pool)
        try:
            core = _BridgedStore(
                engine,
                location,
                asyncio.get_running_loop(),
                token_counter=token_counter,
                summarizer=summarizer,
                memory_provider=memory_provider,
                on_compaction=on_compaction,
                redactor=redactor,
                cache_sessions=cache_sessions,
                allow_block_types=allow_block_types,
            )
        except BaseException:
            await engine.dispose()
            raise
        return cls(core)

    async def close(self) -> None:
        """Wait for the background compactions this store started and for calls in flight
        to finish their CPU work, then release the pool."""
        core = self._core
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        while core.tasks:
            await asyncio.gather(*list(core.tasks), return_exceptions=True)
        await asyncio.to_thread(core._compute_pool.shutdown, wait=True)
        core.shutdown_summarizers()
        await core.async_engine.dispose()

    async def __aenter__(self) -> AsyncCompactStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"AsyncCompactStore({self.location!r})"

    @property
    def sync_engine(self) -> Any:
        """The SQLAlchemy Engine under the async one (for SQLAlchemy's own async tools)."""
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
    ) -> AsyncSession:
        """Open a session, creating it when it does not exist (see
        :meth:`CompactStore.session`); ``summarizer`` may be ``async def``."""
        sess = await _run(
            self._core.session,
            session_id,
            context_window=context_window,
            format=format,
            config=config,
            now=now,
            cwd=cwd,
            # The bridged store takes async summarizers too (its _async_summarizers).
            summarizer=cast(Summarizer | None, summarizer),
        )
        return AsyncSession(self, sess)

    async def get_session(self, session_id: str) -> AsyncSession:
        """Open an existing session; NotFoundError when there is none."""
        return AsyncSession(self, await _run(self._core.get_session, session_id))

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
        sess = await _run(
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
        await _run(self._core.delete_session, session_id)

    async def sessions(self) -> list[SessionInfo]:
        """Every session, oldest first."""
        return await _run(self._core.sessions)

    async def pending_jobs(self) -> list[JobInfo]:
        """See :meth:`CompactStore.pending_jobs`."""
        return await _run(self._core.pending_jobs)

    async def run_job(self, job_id: int) -> JobInfo | None:
        """See :meth:`CompactStore.run_job`."""
        return await _run(self._core.run_job, job_id)


class AsyncSession:
    """One agent conversation, for asyncio: every public :class:`Session` method as a
    coroutine with the same name and arguments (``iter_messages`` is an async iterator).
    The work is the sync Session's own (see the module docstring)."""

    def __init__(self, store: AsyncCompactStore, session: Session) -> None:
        self.store = store
        self._session = session
        self.id = session.id
        self.format = session.format
        self.context_window = session.context_window
        self.created_at = session.created_at

    @property
    def config(self) -> CompactionConfig:
        """The session's config as this handle last read it."""
        return self._session.config

    def __repr__(self) -> str:
        return (
            f"AsyncSession({self.id!r}, format={self.format!r}, "
            f"context_window={self.context_window})"
        )

    # -- appending ----------------------------------------------------------------------

    async def append(
        self,
        message: dict[str, Any] | BaseModel,
        timestamp: float | None = None,
        pinned: bool = False,
    ) -> int:
        """See :meth:`Session.append`."""
        return await _run(self._session.append, message, timestamp, pinned)

    async def extend(
        self,
        messages: Sequence[dict[str, Any] | BaseModel],
        timestamps: Sequence[float | None] | None = None,
    ) -> list[int]:
        """See :meth:`Session.extend`."""
        return await _run(self._session.extend, messages, timestamps)

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
        return await _run(
            self._session.append_tool_result,
            tool_use_id,
            content,
            tool_name=tool_name,
            file_path=file_path,
            is_error=is_error,
            timestamp=timestamp,
        )

    async def invalidate(self, file_path: str) -> bool:
        """See :meth:`Session.invalidate`."""
        return await _run(self._session.invalidate, file_path)

    # -- reading ------------------------------------------------------------------------

    async def context(self) -> ActiveContext:
        """See :meth:`Session.context` (the store's cached object: read it, never change it)."""
        return await _run(self._session.context)

    async def active_context(self) -> list[dict[str, Any]]:
        """See :meth:`Session.active_context`."""
        return await _run(self._session.active_context)

    async def context_view(self) -> tuple[Mapping[str, Any], ...]:
        """See :meth:`Session.context_view` (read-only and shared: never change it)."""
        return await _run(self._session.context_view)

    async def token_usage(self) -> int:
        """See :meth:`Session.token_usage`."""
        return await _run(self._session.token_usage)

    async def message_count(self) -> int:
        """See :meth:`Session.message_count`."""
        return await _run(self._session.message_count)

    async def messages(self) -> list[dict[str, Any]]:
        """See :meth:`Session.messages`."""
        return await _run(self._session.messages)

    async def iter_messages(self, *, page: int = 100) -> AsyncIterator[dict[str, Any]]:
        """See :meth:`Session.iter_messages`: the log ``page`` messages at a time."""
        pages = self._session.iter_messages(page=page)
        while True:
            chunk = await _run(lambda: list(islice(pages, max(page, 1))))
            if not chunk:
                return
            for message in chunk:
                yield message

    async def record_usage(self, input_tokens: int, *, now: float | None = None) -> bool:
        """See :meth:`Session.record_usage`."""
        return await _run(self._session.record_usage, input_tokens, now=now)

    async def append_response(
        self, response: Any, *, timestamp: float | None = None, now: float | None = None
    ) -> list[int]:
        """See :meth:`Session.append_response`."""
        return await _run(self._session.append_response, response, timestamp=timestamp, now=now)

    async def request_params(self, cache_control: bool = False) -> dict[str, Any]:
        """See :meth:`Session.request_params`."""
        return await _run(self._session.request_params, cache_control)

    # -- compaction ---------------------------------------------------------------------

    async def process_request(
        self,
        *,
        now: float | None = None,
        enable_tool_budget: bool = True,
        enable_read_dedup: bool = True,
        enable_microcompact: bool = True,
        enable_auto_compact: bool = True,
        background: bool = False,
    ) -> CompactionResult:
        """See :meth:`Session.process_request` (with ``background=True`` the summary is
        written by a task on this loop)."""
        return await _run(
            self._session.process_request,
            now=now,
            enable_tool_budget=enable_tool_budget,
            enable_read_dedup=enable_read_dedup,
            enable_microcompact=enable_microcompact,
            enable_auto_compact=enable_auto_compact,
            background=background,
        )

    async def reactive_recover(
        self, error_message: str, *, now: float | None = None
    ) -> CompactionResult | None:
        """See :meth:`Session.reactive_recover`."""
        return await _run(self._session.reactive_recover, error_message, now=now)

    async def compact(
        self,
        *,
        instructions: str | None = None,
        up_to_seq: int | None = None,
        now: float | None = None,
    ) -> CompactionResult:
        """See :meth:`Session.compact`."""
        return await _run(
            self._session.compact, instructions=instructions, up_to_seq=up_to_seq, now=now
        )

    # -- rollback and replay ------------------------------------------------------------

    async def rollback(
        self,
        boundary_id: int | None = None,
        *,
        compaction_id: int | None = None,
        now: float | None = None,
    ) -> list[CompactBoundary]:
        """See :meth:`Session.rollback`."""
        return await _run(self._session.rollback, boundary_id, compaction_id=compaction_id, now=now)

    async def clear(self, *, now: float | None = None) -> int:
        """See :meth:`Session.clear`."""
        return await _run(self._session.clear, now=now)

    async def pop(self, *, now: float | None = None) -> dict[str, Any] | None:
        """See :meth:`Session.pop`."""
        return await _run(self._session.pop, now=now)

    async def rollback_plan(
        self, boundary_id: int | None = None, *, compaction_id: int | None = None
    ) -> list[CompactBoundary]:
        """See :meth:`Session.rollback_plan`."""
        return await _run(self._session.rollback_plan, boundary_id, compaction_id=compaction_id)

    async def replay(
        self,
        boundary_id: int,
        *,
        config: CompactionConfig | None = None,
        apply: bool = False,
        now: float | None = None,
        resummarize: bool = False,
    ) -> CompactionResult:
        """See :meth:`Session.replay`."""
        return await _run(
            self._session.replay,
            boundary_id,
            config=config,
            apply=apply,
            now=now,
            resummarize=resummarize,
        )

    # -- memory, breaker, blobs ---------------------------------------------------------

    async def remember(
        self, kind: str, text: str, *, scope: str = "session", now: float | None = None
    ) -> int:
        """See :meth:`Session.remember`."""
        return await _run(self._session.remember, kind, text, scope=scope, now=now)

    async def memories(self) -> list[MemoryEntry]:
        """See :meth:`Session.memories`."""
        return await _run(self._session.memories)

    async def breaker(self) -> BreakerState:
        """See :meth:`Session.breaker`."""
        return await _run(self._session.breaker)

    async def reset_breaker(self) -> None:
        """See :meth:`Session.reset_breaker`."""
        await _run(self._session.reset_breaker)

    async def get_blob(self, blob_id: int) -> str:
        """See :meth:`Session.get_blob`."""
        return await _run(self._session.get_blob, blob_id)

    # -- recall -------------------------------------------------------------------------

    async def recall_tool(self) -> dict[str, Any]:
        """See :meth:`Session.recall_tool`."""
        return await _run(self._session.recall_tool)

    async def recall(self, arguments: dict[str, Any] | str) -> str:
        """See :meth:`Session.recall`."""
        return await _run(self._session.recall, arguments)

    # -- history ------------------------------------------------------------------------

    async def boundaries(self, include_rolled_back: bool = False) -> list[CompactBoundary]:
        """See :meth:`Session.boundaries`."""
        return await _run(self._session.boundaries, include_rolled_back)

    async def compactions(self) -> list[CompactionResult]:
        """See :meth:`Session.compactions`."""
        return await _run(self._session.compactions)
