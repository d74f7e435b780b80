"""The async driver's :class:`AsyncSession` (see :mod:`compactstore.aio`): every public
:class:`~compactstore.session.Session` method as a coroutine."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from functools import partial
from itertools import islice
from typing import TYPE_CHECKING, Any, Literal, ParamSpec, TypeVar

from compactstore.aio_threads import ThreadedStore, glue
from compactstore.context import ActiveContext
from compactstore.core.driver import committed
from compactstore.core.steps import Paused
from compactstore.ledger import SessionCost
from compactstore.models import (
    BreakerState,
    CompactBoundary,
    CompactionConfig,
    CompactionResult,
    EditState,
    MemoryEntry,
)
from compactstore.session import Session

if TYPE_CHECKING:
    from pydantic import BaseModel

    from compactstore.aio import AsyncCompactStore

__all__ = ["AsyncSession", "glue"]

P = ParamSpec("P")
T = TypeVar("T")


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

    # -- appending ----------------------------------------------------------------------

    async def append(
        self,
        message: dict[str, Any] | BaseModel,
        timestamp: float | None = None,
        pinned: bool = False,
    ) -> int:
        """See :meth:`Session.append`."""
        return await self._step(self._session.append, message, timestamp, pinned)

    async def extend(
        self,
        messages: Sequence[dict[str, Any] | BaseModel],
        timestamps: Sequence[float | None] | None = None,
    ) -> list[int]:
        """See :meth:`Session.extend`."""
        return await self._step(self._session.extend, messages, timestamps)

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

    async def invalidate(self, file_path: str) -> bool:
        """See :meth:`Session.invalidate`."""
        return await self._step(self._session.invalidate, file_path)

    # -- reading ------------------------------------------------------------------------

    async def context(self) -> ActiveContext:
        """See :meth:`Session.context` (the store's cached object: read it, never change it)."""
        return await self._step(self._session.context)

    async def active_context(self) -> list[dict[str, Any]]:
        """See :meth:`Session.active_context`."""
        return await self._step(self._session.active_context)

    async def context_view(self) -> tuple[Mapping[str, Any], ...]:
        """See :meth:`Session.context_view` (read-only and shared: never change it)."""
        return await self._step(self._session.context_view)

    async def token_usage(self) -> int:
        """See :meth:`Session.token_usage`."""
        return await self._step(self._session.token_usage)

    async def message_count(self) -> int:
        """See :meth:`Session.message_count`."""
        return await self._step(self._session.message_count)

    async def messages(self) -> list[dict[str, Any]]:
        """See :meth:`Session.messages`."""
        return await self._step(self._session.messages)

    async def iter_messages(self, *, page: int = 100) -> AsyncIterator[dict[str, Any]]:
        """See :meth:`Session.iter_messages`: the log ``page`` messages at a time."""
        pages = self._session.iter_messages(page=page)
        while True:
            chunk = await self._step(lambda: list(islice(pages, max(page, 1))))
            if not chunk:
                return
            for message in chunk:
                yield message

    async def record_usage(
        self,
        input_tokens: int,
        *,
        cache_read_tokens: int = 0,
        cache_write_5m_tokens: int = 0,
        cache_write_1h_tokens: int = 0,
        output_tokens: int = 0,
        model: str | None = None,
        iterations: list[dict[str, Any]] | None = None,
        cache_miss_reason: dict[str, Any] | None = None,
        input_transformations: list[dict[str, Any]] | None = None,
        now: float | None = None,
    ) -> bool:
        """See :meth:`Session.record_usage`."""
        return await self._step(
            self._session.record_usage,
            input_tokens,
            cache_read_tokens=cache_read_tokens,
            cache_write_5m_tokens=cache_write_5m_tokens,
            cache_write_1h_tokens=cache_write_1h_tokens,
            output_tokens=output_tokens,
            model=model,
            iterations=iterations,
            cache_miss_reason=cache_miss_reason,
            input_transformations=input_transformations,
            now=now,
        )

    async def cost(self) -> SessionCost:
        """See :meth:`Session.cost`."""
        return await self._step(self._session.cost)

    async def append_response(
        self, response: Any, *, timestamp: float | None = None, now: float | None = None
    ) -> list[int]:
        """See :meth:`Session.append_response`."""
        return await self._step(
            self._session.append_response, response, timestamp=timestamp, now=now
        )

    async def request_params(
        self,
        cache_control: bool = False,
        *,
        thinking: Mapping[str, Any] | None = None,
        extra_headers: Mapping[str, str] | None = None,
        now: float | None = None,
    ) -> dict[str, Any]:
        """See :meth:`Session.request_params`."""
        return await self._step(
            self._session.request_params,
            cache_control,
            thinking=thinking,
            extra_headers=extra_headers,
            now=now,
        )

    async def edit_policy(self) -> tuple[Literal["rewrite", "append_only"], bool]:
        """See :meth:`Session.edit_policy`."""
        return await self._step(self._session.edit_policy)

    async def edit_state(self) -> EditState:
        """See :meth:`Session.edit_state`."""
        return await self._step(self._session.edit_state)

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

    async def reactive_recover(
        self, error_message: str, *, now: float | None = None
    ) -> CompactionResult | None:
        """See :meth:`Session.reactive_recover`."""
        return await glue(self._session.reactive_recover, error_message, now=now)

    async def compact(
        self,
        *,
        instructions: str | None = None,
        up_to_seq: int | None = None,
        now: float | None = None,
    ) -> CompactionResult:
        """See :meth:`Session.compact`."""
        return await glue(
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
        return await self._step(
            self._session.rollback, boundary_id, compaction_id=compaction_id, now=now
        )

    async def clear(self, *, now: float | None = None) -> int:
        """See :meth:`Session.clear`."""
        return await self._step(self._session.clear, now=now)

    async def pop(self, *, now: float | None = None) -> dict[str, Any] | None:
        """See :meth:`Session.pop`."""
        return await self._step(self._session.pop, now=now)

    async def rollback_plan(
        self, boundary_id: int | None = None, *, compaction_id: int | None = None
    ) -> list[CompactBoundary]:
        """See :meth:`Session.rollback_plan`."""
        return await self._step(
            self._session.rollback_plan, boundary_id, compaction_id=compaction_id
        )

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
        return await glue(
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
        return await self._step(self._session.remember, kind, text, scope=scope, now=now)

    async def memories(self) -> list[MemoryEntry]:
        """See :meth:`Session.memories`."""
        return await self._step(self._session.memories)

    async def breaker(self) -> BreakerState:
        """See :meth:`Session.breaker`."""
        return await self._step(self._session.breaker)

    async def reset_breaker(self) -> None:
        """See :meth:`Session.reset_breaker`."""
        await self._step(self._session.reset_breaker)

    async def get_blob(self, blob_id: int) -> str:
        """See :meth:`Session.get_blob`."""
        return await self._step(self._session.get_blob, blob_id)

    # -- recall -------------------------------------------------------------------------

    async def recall_tool(self) -> dict[str, Any]:
        """See :meth:`Session.recall_tool`."""
        return await self._step(self._session.recall_tool)

    async def recall(self, arguments: dict[str, Any] | str) -> str:
        """See :meth:`Session.recall`."""
        return await self._step(self._session.recall, arguments)

    # -- history ------------------------------------------------------------------------

    async def boundaries(self, include_rolled_back: bool = False) -> list[CompactBoundary]:
        """See :meth:`Session.boundaries`."""
        return await self._step(self._session.boundaries, include_rolled_back)

    async def subagents(self) -> list[tuple[str, str | None]]:
        """See :meth:`Session.subagents`."""
        return await self._step(self._session.subagents)

    async def compactions(self) -> list[CompactionResult]:
        """See :meth:`Session.compactions`."""
        return await self._step(self._session.compactions)
