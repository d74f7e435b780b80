"""The async driver's :class:`AsyncSession` (see :mod:`compactstore.aio`): every public
:class:`~compactstore.session.Session` method as a coroutine.

A method is the sync Session's own, run one of three ways: whole in a step thread (one
hop: :func:`_in_step_thread`), as a compaction call's driver code on the loop (it may wait
for a summary or a lease: :func:`_on_loop`), or, for the few that may pause or call an
async ``on_compaction``, by hand below. The wrappers take their signatures and docstrings
from :class:`Session`, so a new Session method is one line here.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable, Coroutine
from functools import partial
from itertools import islice
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

from compactstore.aio_threads import ThreadedStore, glue
from compactstore.core.driver import committed
from compactstore.core.steps import Paused
from compactstore.models import CompactionConfig, CompactionResult
from compactstore.session import Session

if TYPE_CHECKING:
    from compactstore.aio import AsyncCompactStore

__all__ = ["AsyncSession", "glue"]

P = ParamSpec("P")
T = TypeVar("T")

_Async = Callable[Concatenate["AsyncSession", P], Coroutine[Any, Any, T]]


def _in_step_thread(method: Callable[Concatenate[Session, P], T]) -> _Async[P, T]:
    """``method`` as a coroutine that runs it whole in one of the store's step threads: a
    call that is nothing but checks, CPU work and transactions."""

    async def call(self: AsyncSession, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await self._step(method, self._session, *args, **kwargs)

    functools.update_wrapper(call, method)
    return call


def _on_loop(method: Callable[Concatenate[Session, P], T]) -> _Async[P, T]:
    """``method`` as a coroutine whose driver code runs on the loop, in a greenlet: a
    compaction call, whose steps each hop to a thread and whose waits do not block."""

    async def call(self: AsyncSession, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await glue(method, self._session, *args, **kwargs)

    functools.update_wrapper(call, method)
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
