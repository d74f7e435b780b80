"""The OpenAI Agents SDK: ``CompactSession`` (extra ``openai-agents``).

::

    from compactstore.integrations.openai_agents import CompactSession
    result = await Runner.run(agent, "...", session=CompactSession("task-42", store))

``CompactSession`` implements the SDK's ``Session`` protocol over a session of format
``responses``, over either store: a sync :class:`~compactstore.CompactStore`, whose calls run
off the event loop (``asyncio.to_thread``), or an :class:`~compactstore.AsyncCompactStore`,
whose coroutines it awaits (its session is opened on the first call, as opening is a
coroutine; :meth:`CompactSession.async_session` gives it).

- **Compaction with ``session=`` alone**: the Runner reads a session once per ``Runner.run``,
  before the run's first model call; ``get_items`` runs ``process_request()`` there and hands
  out the compacted active context.
- **Compaction before every model call**: inside one run the SDK sends the model its own
  in-memory items (each tool round adds to them) without asking the session. The model-input
  filter of :meth:`CompactSession.run_config` runs before *every* model call: it stores the
  tail of the input not stored yet, runs ``process_request()`` and hands the model the wire
  view. Without it, a run whose stored context crosses the auto-compact threshold between
  two model calls emits a :class:`~compactstore.CompactStoreWarning` (once per session
  object): the next call goes out uncompacted.
- **Chained, never replaced**: ``run_config(call_model_input_filter=mine)`` runs ``mine`` on
  the compacted view; ``hooks(mine)`` calls every hook of ``mine`` after its own.
- **Recovery**: :meth:`CompactSession.run` is ``Runner.run`` with this session, the filter and
  the hooks; when the provider says the prompt is too long it runs ``reactive_recover`` and
  continues the run once.
- **Verbatim**: the SDK's items are stored as the SDK gives them, its own keys included
  (``provider_data``; ``call_id`` on ``local_shell_call_output``). What goes to the model is
  the wire view without those keys, so it passes the strict SDK check
  (:func:`compactstore.formats.sdk_types.check_sdk_types`).
- **Nothing twice**: an item stored by the filter is skipped once by ``add_items`` and the other
  way round (items are compared by their JSON), so the SDK saving a turn after the filter
  stored it appends nothing.
- :meth:`hooks` records the usage the model reports (``input_tokens``) after every call.
- ``clear_session`` and ``pop_item`` are recorded edits (strategies ``clear`` and ``pop``),
  undone by :meth:`rollback` (``Session.rollback(compaction_id=...)``; over an async store
  :meth:`rollback_async`).
- :meth:`recall_tool` is the ``recall`` tool as a ``FunctionTool`` answering from the log.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from compactstore._recall import DESCRIPTION as RECALL_DESCRIPTION
from compactstore._recall import RECALL_TOOL_NAME
from compactstore._recall import SCHEMA as RECALL_SCHEMA
from compactstore._store.session import Session
from compactstore._store.store import CompactStore
from compactstore.aio import AsyncCompactStore, AsyncSession
from compactstore.errors import CompactStoreWarning, InvalidInputError, MissingExtraError
from compactstore.integrations._overflow import is_context_overflow
from compactstore.models import CompactionConfig

try:
    from agents import Agent, FunctionTool, RunConfig, RunContextWrapper, RunHooks, Runner
    from agents.items import ModelResponse, TResponseInputItem
    from agents.result import RunResult
    from agents.run_config import CallModelData, ModelInputData
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise MissingExtraError(
        "compactstore.integrations.openai_agents needs the OpenAI Agents SDK, the "
        f"'openai-agents' extra: pip install 'compactstore[openai-agents]' ({exc})"
    ) from None

__all__ = ["SDK_ONLY_KEYS", "CompactSession", "is_context_overflow", "wire_item"]

# Keys the SDK adds to its items that the Responses API does not declare: stored, never sent.
SDK_ONLY_KEYS = ("provider_data",)


def wire_item(item: dict[str, Any]) -> dict[str, Any]:
    """A stored SDK item as the Responses API takes it: without the SDK's own keys."""
    sent = {k: v for k, v in item.items() if k not in SDK_ONLY_KEYS}
    if sent.get("type") == "local_shell_call_output" and "call_id" in sent:
        # The API's LocalShellCallOutput names its call by ``id``; the SDK adds call_id.
        sent["id"] = sent.pop("call_id")
    return sent


def _key(item: Any) -> str:
    return json.dumps(item, sort_keys=True, separators=(",", ":"), default=str)


def _plain(item: Any) -> dict[str, Any]:
    if isinstance(item, dict):
        return item
    dump = getattr(item, "model_dump", None)
    if callable(dump):
        value = dump(mode="json", by_alias=True, exclude_unset=True)
        if isinstance(value, dict):
            return value
    raise InvalidInputError(f"an Agents SDK item must be a dict, got {type(item).__name__}")


class _Hooks(RunHooks[Any]):
    """Records usage after every model call, then calls the user's own hooks (if any)."""

    def __init__(self, owner: CompactSession, inner: RunHooks[Any] | None) -> None:
        self._owner = owner
        self._inner = inner

    async def on_llm_end(
        self, context: RunContextWrapper[Any], agent: Any, response: ModelResponse
    ) -> None:
        tokens = response.usage.input_tokens
        if tokens > 0:
            await self._owner.call("record_usage", tokens)
        if self._inner is not None:
            await self._inner.on_llm_end(context, agent, response)


def _forward(name: str) -> Callable[..., Any]:
    async def hook(self: _Hooks, *args: Any, **kwargs: Any) -> None:
        if self._inner is not None:
            await getattr(self._inner, name)(*args, **kwargs)

    hook.__name__ = name
    return hook


for _name in dir(RunHooks):
    if _name.startswith("on_") and _name != "on_llm_end":
        setattr(_Hooks, _name, _forward(_name))


class CompactSession:
    """An Agents SDK ``Session`` kept in a compactstore session of format ``responses``.

    Args:
        session_id: the compactstore session id (created when new).
        store: an open :class:`~compactstore.CompactStore` or
            :class:`~compactstore.AsyncCompactStore`.
        context_window, config: as :meth:`CompactStore.session` takes them (over an async
            store they are checked when the session is first used).

    Raises:
        InvalidInputError: ``store`` is neither store.
    """

    session_settings: Any = None

    def __init__(
        self,
        session_id: str,
        store: CompactStore | AsyncCompactStore,
        *,
        context_window: int | None = None,
        config: CompactionConfig | None = None,
    ) -> None:
        self.session_id = session_id
        self.store = store
        self._sync: Session | None = None
        self._async: AsyncSession | None = None
        self._context_window, self._config = context_window, config
        # recall_tool() was called: turn the recall line on when the async session opens.
        self._recall_pending = False
        if isinstance(store, CompactStore):
            self._sync = store.session(
                session_id, context_window=context_window, format="responses", config=config
            )
        elif not isinstance(store, AsyncCompactStore):
            raise InvalidInputError(
                f"CompactSession takes a CompactStore or an AsyncCompactStore, got "
                f"{type(store).__name__}"
            )
        # Items one path (the filter or add_items) stored that the other has not seen yet.
        self._unclaimed: Counter[str] = Counter()
        # The input items the filter knows are stored (keys), in input order: the history
        # get_items handed out plus every tail stored since.
        self._known: list[str] = []
        self._lock = asyncio.Lock()
        # Whether the model-input filter has run (it is consulted before every model call)
        # and whether the uncompacted-call warning was given.
        self._filtered = False
        self._warned = False

    def __repr__(self) -> str:
        return f"CompactSession({self.session_id!r})"

    @property
    def session(self) -> Session:
        """The compactstore :class:`~compactstore.Session` (over a sync store).

        Raises:
            InvalidInputError: over an AsyncCompactStore (use :meth:`async_session`).
        """
        return self._over_sync("await session.async_session()")

    def _over_sync(self, instead: str) -> Session:
        """The sync session; over an AsyncCompactStore, an error naming ``instead``."""
        if self._sync is None:
            raise InvalidInputError(
                f"this CompactSession is over an AsyncCompactStore: use `{instead}`"
            )
        return self._sync

    async def async_session(self) -> AsyncSession:
        """The compactstore :class:`~compactstore.AsyncSession` (over an async store),
        opened (created when new) on the first call.

        Raises:
            InvalidInputError: over a sync store (use :attr:`session`).
        """
        if not isinstance(self.store, AsyncCompactStore):
            raise InvalidInputError("this CompactSession is over a CompactStore: use .session")
        if self._async is None:
            self._async = await self.store.session(
                self.session_id,
                context_window=self._context_window,
                format="responses",
                config=self._config,
            )
        if self._recall_pending:
            self._recall_pending = False
            await self._async.recall_tool()
        return self._async

    async def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Call ``name`` of the compactstore session: off the loop (sync store) or awaited."""
        if self._sync is not None:
            return await asyncio.to_thread(getattr(self._sync, name), *args, **kwargs)
        session = await self.async_session()
        return await getattr(session, name)(*args, **kwargs)

    # -- the Session protocol -----------------------------------------------------------

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The active context, compacted first (``process_request()``): the Runner reads it
        before a run's first model call. Newest ``limit`` items when given."""
        async with self._lock:
            await self.call("process_request")
            items: list[Any] = await self.call("active_context")
            if limit is not None:
                items = items[-limit:] if limit > 0 else []
            self._known = [_key(item) for item in items]
            return items

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Store the items the filter has not stored already."""
        async with self._lock:
            given = [_plain(item) for item in items]
            await self._store_new(given)
            if not self._filtered and not self._warned:
                await self._check_consulted(given)

    async def _check_consulted(self, items: Sequence[dict[str, Any]]) -> None:
        """Warn when the Runner is about to make a model call this session cannot compact:
        a tool output is stored mid-run (so a model call follows without a read) and the
        context is past the auto-compact threshold, with no model-input filter to compact
        it."""
        if not any(str(item.get("type", "")).endswith("_output") for item in items):
            return  # no tool output: no model call follows in this run
        usage: int = await self.call("token_usage")
        if self._sync is not None:
            config, window = self._sync.config, self._sync.context_window
        else:
            opened = await self.async_session()
            config, window = opened.config, opened.context_window
        if usage < config.auto_compact_threshold * window:
            return
        self._warned = True
        warnings.warn(
            f"CompactSession {self.session_id!r}: the context is at {usage:,} of "
            f"{window:,} tokens in the middle of a run, and the Runner sends the next "
            "model call without asking the session (it reads it once per run). Pass "
            "run_config=session.run_config() to compact before every model call.",
            CompactStoreWarning,
            stacklevel=2,
        )

    async def pop_item(self) -> TResponseInputItem | None:
        """Remove the newest item from the context and return it (verbatim); None when
        there is none. A recorded edit (strategy ``pop``): ``rollback(compaction_id=...)``
        undoes it; the log keeps the item."""
        async with self._lock:
            item: TResponseInputItem | None = await self.call("pop")
            self._known = []
            return item

    async def clear_session(self) -> None:
        """Empty the context: a boundary with strategy ``clear`` that keeps nothing (no
        pins, no summary), so ``get_items()`` returns ``[]``. ``rollback(compaction_id=...)``
        undoes it; the log keeps everything."""
        async with self._lock:
            await self.call("clear")
            self._known = []
            self._unclaimed.clear()

    def rollback(self, compaction_id: int) -> None:
        """Undo compaction ``compaction_id`` (a clear, a pop or any other) and every
        compaction recorded after it (``Session.rollback(compaction_id=...)``).

        Raises:
            InvalidInputError: over an AsyncCompactStore (use :meth:`rollback_async`).
        """
        sync = self._over_sync("await session.rollback_async(compaction_id)")
        sync.rollback(compaction_id=compaction_id)
        self._known = []

    async def rollback_async(self, compaction_id: int) -> None:
        """:meth:`rollback` as a coroutine, over either store."""
        async with self._lock:
            await self.call("rollback", compaction_id=compaction_id)
            self._known = []

    # -- run configuration --------------------------------------------------------------

    def run_config(self, **kwargs: Any) -> RunConfig:
        """A ``RunConfig`` (``kwargs`` passed on) whose model-input filter stores the
        unstored tail of the input, compacts and hands the model the wire view; a
        ``call_model_input_filter`` among ``kwargs`` then runs on that view."""
        mine = kwargs.pop("call_model_input_filter", None)
        return RunConfig(call_model_input_filter=self._chain(mine), **kwargs)

    def _chain(self, mine: Any) -> Callable[[CallModelData[Any]], Any]:
        """The session's model-input filter followed by ``mine`` (when given)."""
        if mine is not None and not callable(mine):
            raise InvalidInputError(
                f"call_model_input_filter must be callable, got {type(mine).__name__}"
            )

        async def chained(data: CallModelData[Any]) -> ModelInputData:
            compacted = await self._filter(data)
            if mine is None:
                return compacted
            result = mine(
                CallModelData(model_data=compacted, agent=data.agent, context=data.context)
            )
            final: ModelInputData = await result if inspect.isawaitable(result) else result
            return final

        return chained

    def hooks(self, hooks: RunHooks[Any] | None = None) -> RunHooks[Any]:
        """``RunHooks`` that record the input tokens of every model call (``record_usage``)
        and then call ``hooks``' own methods, every one of them."""
        return _Hooks(self, hooks)

    async def run(
        self,
        agent: Agent[Any],
        input: str | list[TResponseInputItem],
        *,
        run_config: RunConfig | None = None,
        hooks: RunHooks[Any] | None = None,
        **kwargs: Any,
    ) -> RunResult:
        """``Runner.run(agent, input, session=self, ...)`` with compaction before every model
        call (the filter of :meth:`run_config`, chained with ``run_config``'s own) and usage
        recorded (:meth:`hooks`, chained with ``hooks``). When the provider says the prompt
        is over the window, runs ``reactive_recover`` and continues the run once, from the
        stored (recovered) context.

        Raises:
            Exception: the provider's own error when it is not an overflow, on a second
                overflow, or when recovery had nothing left to remove.
        """
        if run_config is None:
            config = self.run_config()
        else:
            config = dataclasses.replace(
                run_config,
                call_model_input_filter=self._chain(run_config.call_model_input_filter),
            )
        chained = self.hooks(hooks)
        try:
            return await Runner.run(
                agent, input, session=self, run_config=config, hooks=chained, **kwargs
            )
        except Exception as error:
            if not is_context_overflow(error):
                raise
            recovered = await self.call("reactive_recover", str(error))
            if recovered is None:
                raise
            async with self._lock:
                self._known = []
            # The input is stored already: continue from the session alone.
            return await Runner.run(
                agent, [], session=self, run_config=config, hooks=chained, **kwargs
            )

    def recall_tool(self) -> FunctionTool:
        """The ``recall`` tool; turns on the summary's recall line (over an async store,
        when the session is next used)."""
        if self._sync is not None:
            self._sync.recall_tool()
        else:
            self._recall_pending = True

        async def invoke(context: RunContextWrapper[Any], arguments: str) -> str:
            answer: str = await self.call("recall", arguments)
            return answer

        return FunctionTool(
            name=RECALL_TOOL_NAME,
            description=RECALL_DESCRIPTION,
            params_json_schema=RECALL_SCHEMA,
            on_invoke_tool=invoke,
            strict_json_schema=False,
        )

    async def _filter(self, data: CallModelData[Any]) -> ModelInputData:
        self._filtered = True
        given = [_plain(item) for item in data.model_data.input]
        keys = [_key(item) for item in given]
        async with self._lock:
            known = self._known
            if keys[: len(known)] == known:
                tail = given[len(known) :]
            else:
                # Not the history get_items handed out (a caller's own input): the items after
                # the last one this session stored or handed out are new.
                stored = set(known) | set(self._unclaimed)
                start = len(given)
                while start > 0 and keys[start - 1] not in stored:
                    start -= 1
                tail = given[start:]
            await self._store_new(tail)
            self._known = keys
            await self.call("process_request")
            view: list[dict[str, Any]] = await self.call("active_context")
        sent = [wire_item(item) for item in view]
        return ModelInputData(
            input=sent,  # type: ignore[arg-type]
            instructions=data.model_data.instructions,
        )

    async def _store_new(self, items: Sequence[dict[str, Any]]) -> None:
        new: list[dict[str, Any]] = []
        for item in items:
            key = _key(item)
            if self._unclaimed[key] > 0:
                self._unclaimed[key] -= 1
                continue
            new.append(item)
        if new:
            await self.call("extend", new)
            self._unclaimed.update(_key(item) for item in new)
