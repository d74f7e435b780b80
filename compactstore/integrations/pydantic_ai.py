"""pydantic-ai agents: ``CompactHistory``, a capability (extra ``pydantic-ai``).

::

    from compactstore.integrations.pydantic_ai import CompactHistory
    history = CompactHistory(store, "task-42", context_window=200_000)
    agent = Agent(model, capabilities=[history])

``CompactHistory`` is a pydantic-ai capability whose ``before_model_request`` hook (the hook
pydantic-ai's own history processors run in) stores the messages of the run it has not
stored yet, runs ``process_request()``, and hands the model the active context; the run's
history is replaced by that context too, so ``result.all_messages()`` stays as bounded as
the context.

- **Persistence**: the conversation lives in the session. A run continues it, whether it is
  given ``message_history`` or not: messages already stored are recognised and not stored
  twice, and a system prompt the session holds already is not stored again, so a second
  ``agent.run(...)`` (in this process or another) sees the whole conversation, compacted.
  :meth:`CompactHistory.messages` gives the active context as pydantic-ai messages.
- **Lossless**: each message is stored in the ``anthropic`` session format (what compaction
  reads and counts: images by their pixel size) and as pydantic-ai's own JSON
  (``ModelMessagesTypeAdapter``) beside it in ``message_origins``; the model gets its own
  ``ModelRequest``/``ModelResponse`` objects back, parts, ids, thinking signatures and
  images included, except where a compaction changed them (a tool return persisted or
  cleared keeps its call id with the preview as its content). A request holding system
  prompts and a user prompt is stored as two messages (the system one is pinned).
- **The summary is a user prompt** (a ``ModelRequest`` whose ``metadata`` has
  ``{"compactstore": "summary"}``), never a system prompt.
- **Usage**: the input tokens a model reports are recorded (``record_usage``) after every
  call, except those of pydantic-ai's ``FunctionModel`` and ``TestModel``, which estimate
  them rather than count them.
- **Recovery**: a ``ModelContextWindowExceededError`` (the provider said the prompt is too
  long) runs ``reactive_recover`` and the request is attempted once more with the recovered
  context.
- **Recall**: with ``recall=True`` (or ``config.recall_enabled``) the agent gets the
  ``recall`` tool, answering from the session's log.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import hashlib
import json
import os
import threading
from collections.abc import Iterable, Sequence
from typing import Any

from compactstore._context.active import ActiveContext
from compactstore._core.origins import Given, extend_with_origins, known_ids, read_origins
from compactstore._recall import DESCRIPTION as RECALL_DESCRIPTION
from compactstore._recall import RECALL_TOOL_NAME
from compactstore._recall import SCHEMA as RECALL_SCHEMA
from compactstore._store.session import Session
from compactstore._store.store import CompactStore
from compactstore.errors import InvalidInputError, MissingExtraError, NotFoundError
from compactstore.formats import ToolResult
from compactstore.integrations._store import checked_store
from compactstore.models import CompactionConfig

try:
    from pydantic_ai import ModelMessagesTypeAdapter, RunContext, Tool
    from pydantic_ai.capabilities import AbstractCapability
    from pydantic_ai.exceptions import ModelContextWindowExceededError, RetryModelRequest
    from pydantic_ai.messages import (
        ModelMessage,
        ModelRequest,
        ModelRequestPart,
        ModelResponse,
        ToolCallPart,
        ToolReturnPart,
        UserPromptPart,
    )
    from pydantic_ai.models import ModelRequestContext
    from pydantic_ai.toolsets import FunctionToolset
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise MissingExtraError(
        "compactstore.integrations.pydantic_ai needs pydantic-ai, the 'pydantic-ai' extra: "
        f"pip install 'compactstore[pydantic-ai]' ({exc})"
    ) from None

from compactstore.integrations._pydantic_ai_messages import (
    from_format,
    pieces,
    to_anthropic,
    with_results,
    without_thinking,
)

__all__ = ["MARK", "SOURCE", "CompactHistory", "to_anthropic"]

# The value of message_origins.source for messages stored by this capability.
SOURCE = "pydantic_ai"
# The metadata key of the messages the capability makes (summary, synthetic tool returns):
# never stored as new messages.
MARK = "compactstore"
# The session format: one pydantic-ai message (or its system half) is one message of it.
FORMAT = "anthropic"
# Models whose reported usage is an estimate of pydantic-ai's, not a provider's count.
_ESTIMATING_SYSTEMS = frozenset({"function", "test"})


def _dump(message: ModelMessage) -> str:
    return ModelMessagesTypeAdapter.dump_json([message]).decode()


def _load(payload: str) -> ModelMessage:
    [message] = ModelMessagesTypeAdapter.validate_json(payload)
    return message


# Stamps pydantic-ai sets or resets on messages as they pass through runs (a history given
# to a run loses them): not part of what identifies a message.
_STAMPS = ("run_id", "conversation_id", "model_id")


def _hash(fields: Any) -> str:
    text = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def _key(payload: str) -> str:
    """What identifies a stored message: its JSON without the run stamps."""
    [fields] = json.loads(payload)
    for stamp in _STAMPS:
        fields.pop(stamp, None)
    return _hash(fields)


def _part_keys(payload: str) -> list[str]:
    """What identifies each part of a message (pydantic-ai merges consecutive requests of
    a history into one, so the parts of a request are what is recognised)."""
    [fields] = json.loads(payload)
    return [_hash(part) for part in fields.get("parts", [])]


def _summary_of(part: UserPromptPart, summaries: set[str]) -> bool:
    return isinstance(part.content, str) and part.content in summaries


class CompactHistory(AbstractCapability[Any]):
    """Keeps a pydantic-ai agent's conversation in a compactstore session and hands the
    model the compacted active context before every request.

    Args:
        store: an open :class:`~compactstore.CompactStore`, or a path or URL to open one.
        session_id: the session (created on the first model request when it does not exist).
        context_window: the model's window in tokens (a new session); default: the model's
            own ``context_window`` (from its profile), else 200,000.
        config: the session's :class:`~compactstore.CompactionConfig` (replaces the stored
            one of an existing session).
        recall: offer the ``recall`` tool and write the summary's recall line (default:
            ``config.recall_enabled``).
        cwd: the agent's working directory, for the summary's file list.

    Raises:
        InvalidInputError: a store that is not a CompactStore, path or URL, or no session id.
    """

    def __init__(
        self,
        store: CompactStore | str | os.PathLike[str],
        session_id: str,
        *,
        context_window: int | None = None,
        config: CompactionConfig | None = None,
        recall: bool | None = None,
        cwd: str | None = None,
    ) -> None:
        store = checked_store(store, session_id, "CompactHistory")
        self.store = store
        self.session_id = session_id
        self.context_window = context_window
        self.config = config
        self.cwd = cwd
        self.recall = bool(config.recall_enabled if recall is None and config else recall)
        self._session: Session | None = None
        self._lock = threading.RLock()
        self._known: set[str] = set()  # keys stored already (a cache of message_origins)
        # seq -> the stored pydantic-ai message and its key
        self._parsed: dict[int, tuple[ModelMessage, str]] = {}
        # Keys of the request parts stored already, and of the parts this capability made
        # (summaries, synthetic returns); summary texts it handed out.
        self._known_parts: set[str] = set()
        self._made_parts: set[str] = set()
        self._summaries: set[str] = set()
        self._loaded = False  # the context's parts are known (once per instance)
        self._recovering = False  # a recovery ran; the retried attempt gets the new view

    def __repr__(self) -> str:
        return f"CompactHistory({self.session_id!r})"

    # -- the session ----------------------------------------------------------------------

    @property
    def session(self) -> Session | None:
        """The session, once it exists (it is created on the first model request)."""
        with self._lock:
            if self._session is None:
                try:
                    self.store.get_session(self.session_id)
                except NotFoundError:
                    return None
                self._open(None)
            return self._session

    def _open(self, model_window: int | None) -> Session:
        window = self.context_window or model_window
        session = self.store.session(
            self.session_id,
            context_window=window,
            format=FORMAT,
            config=self.config,
            cwd=self.cwd,
        )
        if session.format != FORMAT:
            raise InvalidInputError(
                f"session {session.id!r} is in the {session.format!r} format; "
                f"CompactHistory stores pydantic-ai messages as {FORMAT!r}"
            )
        if self.recall and not session.config.recall_enabled:
            session.recall_tool()  # turns on the summary's recall line
        self._session = session
        return session

    def _session_for(self, model: Any) -> Session:
        with self._lock:
            existing = self.session
            if existing is not None:
                return existing
            window = getattr(model, "context_window", None)
            return self._open(window if isinstance(window, int) and window > 0 else None)

    # -- the capability -------------------------------------------------------------------

    def get_toolset(self) -> FunctionToolset[Any] | None:
        """The ``recall`` tool when recall is on."""
        if not self.recall:
            return None

        def recall(**arguments: Any) -> str:
            session = self.session
            if session is None:
                return "Nothing to recall yet: the conversation has not been stored."
            return session.recall(arguments)

        tool = Tool[Any].from_schema(
            recall,
            name=RECALL_TOOL_NAME,
            description=RECALL_DESCRIPTION,
            json_schema=json.loads(json.dumps(RECALL_SCHEMA)),
        )
        return FunctionToolset([tool])

    async def before_model_request(
        self, ctx: RunContext[Any], request_context: ModelRequestContext
    ) -> ModelRequestContext:
        """Store what is new, compact, and send the active context (which becomes the run's
        history)."""
        view = await asyncio.to_thread(
            self._prepare, request_context.model, list(request_context.messages)
        )
        request_context.messages = list(view)
        ctx.messages[:] = view
        return request_context

    async def prepare_model_request(
        self, ctx: RunContext[Any], request_context: ModelRequestContext
    ) -> ModelRequestContext:
        """After a recovery, the attempt sends the recovered context."""
        if self._recovering:
            view = await asyncio.to_thread(self._current_view)
            request_context.messages = list(view)
            ctx.messages[:] = view
        return request_context

    async def after_model_request(
        self,
        ctx: RunContext[Any],
        *,
        request_context: ModelRequestContext,
        response: ModelResponse,
    ) -> ModelResponse:
        """Record the input tokens the model reports and store the response."""
        self._recovering = False
        tokens = response.usage.input_tokens
        system = getattr(request_context.model, "system", None)
        await asyncio.to_thread(
            self._answer, response, tokens if system not in _ESTIMATING_SYSTEMS else 0
        )
        return response

    async def on_model_request_error(
        self,
        ctx: RunContext[Any],
        *,
        request_context: ModelRequestContext,
        error: Exception,
    ) -> ModelResponse:
        """A prompt too long for the model: recover (``reactive_recover``) and attempt the
        request once more; any other error, or a second overflow, propagates."""
        session = self._session
        if (
            not isinstance(error, ModelContextWindowExceededError)
            or self._recovering
            or session is None
        ):
            raise error
        result = await asyncio.to_thread(session.reactive_recover, str(error))
        if result is None or not result.success:
            raise error
        self._recovering = True
        raise RetryModelRequest()

    # -- storing and the view -------------------------------------------------------------

    def _prepare(self, model: Any, messages: Sequence[ModelMessage]) -> list[ModelMessage]:
        with self._lock:
            session = self._session_for(model)
            self._store(session, messages)
            session.process_request()
            return self._current_view()

    def _answer(self, response: ModelResponse, tokens: int) -> None:
        with self._lock:
            session = self._session
            if session is None:
                return
            if tokens > 0:
                session.record_usage(tokens)
            self._store(session, [response])

    def _current_view(self) -> list[ModelMessage]:
        with self._lock:
            session = self._session
            return [] if session is None else self._build_view(session)

    def _unstored(self, message: ModelMessage) -> ModelMessage | None:
        """``message`` without the request parts stored already or made here; None when
        nothing is left."""
        if not isinstance(message, ModelRequest):
            return message
        payload = _dump(message)
        parts = [
            part
            for part, key in zip(message.parts, _part_keys(payload), strict=True)
            if key not in self._known_parts
            and key not in self._made_parts
            and not (isinstance(part, UserPromptPart) and _summary_of(part, self._summaries))
        ]
        if not parts:
            return None
        if len(parts) == len(message.parts):
            return message
        return dataclasses.replace(message, parts=parts)

    def _store(self, session: Session, messages: Iterable[ModelMessage]) -> None:
        """Store the pieces of ``messages`` not stored yet, in one transaction."""
        if not self._loaded:
            self._build_view(session)  # learns the parts of the stored context
            self._loaded = True
        fresh: list[tuple[str, ModelMessage, str]] = []
        for message in messages:
            left = self._unstored(message)
            if left is None:
                continue
            for piece in pieces(left):
                payload = _dump(piece)
                key = _key(payload)
                if key not in self._known:
                    fresh.append((key, piece, payload))
        if not fresh:
            return
        stored = known_ids(session, SOURCE, (key for key, _, _ in fresh))
        self._known |= stored
        systems: set[str] | None = None
        given: list[Given] = []
        for key, piece, payload in fresh:
            if key in stored:
                continue
            [converted] = to_anthropic(piece)
            if converted["role"] == "system":
                if systems is None:
                    adapter = session.adapter
                    systems = {
                        adapter.text(item.message)
                        for item in session.context().items
                        if item.kind == "system"
                    }
                if converted["content"] in systems:
                    continue  # a later run's system prompt: the session has it already
                systems.add(converted["content"])
            given.append(Given(converted, key, payload))
        extend_with_origins(session, SOURCE, given)
        for item in given:
            self._known.add(item.source_id)
            self._known_parts.update(_part_keys(item.payload))

    def _build_view(self, session: Session) -> list[ModelMessage]:
        """The active context as pydantic-ai messages: the stored originals, the summary as
        a user prompt, compaction's edits applied to tool returns."""
        context = session.context()
        seqs = [item.seq for item in context.items if item.seq is not None]
        missing = [seq for seq in seqs if seq not in self._parsed]
        if missing:
            for seq, origin in read_origins(session, SOURCE, missing).items():
                self._parsed[seq] = (_load(origin.payload), origin.source_id)
                self._known.add(origin.source_id)
                self._known_parts.update(_part_keys(origin.payload))
        names: dict[str, str] = {}  # tool call id -> tool name, for synthetic returns
        view: list[ModelMessage] = []
        for index, item in enumerate(context.items):
            if item.state == "summary":
                text = session.adapter.text(item.message)
                self._summaries.add(text)
                view.append(ModelRequest(parts=[UserPromptPart(text)], metadata={MARK: "summary"}))
                continue
            if item.state == "synthetic" or item.seq is None:
                view.append(self._synthetic(item.results, names))
                continue
            message = self._item_message(session, context, index, names)
            if isinstance(message, ModelResponse):
                names.update(
                    (p.tool_call_id, p.tool_name)
                    for p in message.parts
                    if isinstance(p, ToolCallPart)
                )
                if not message.parts:
                    continue  # only thinking the context leaves out
            view.append(message)
        return view

    def _synthetic(self, results: Sequence[ToolResult], names: dict[str, str]) -> ModelRequest:
        """The failed tool returns standing for a crash-orphaned call's missing results."""
        parts: list[ModelRequestPart] = [
            ToolReturnPart(
                tool_name=names.get(result.tool_use_id, "unknown"),
                content=result.text,
                tool_call_id=result.tool_use_id,
                outcome="failed",
            )
            for result in results
        ]
        synthetic = ModelRequest(parts=parts, metadata={MARK: "synthetic"})
        self._made_parts.update(_part_keys(_dump(synthetic)))
        return synthetic

    def _item_message(
        self, session: Session, context: ActiveContext, index: int, names: dict[str, str]
    ) -> ModelMessage:
        """A stored message of the context as pydantic-ai's, compaction's edits applied."""
        item = context.items[index]
        assert item.seq is not None
        stored = self._parsed.get(item.seq)
        if stored is None:  # appended through the Session API, not this capability
            return from_format(session, item.message, names)
        original, _ = stored
        message = original
        if item.state in ("persisted", "cleared", "deduplicated") and item.results:
            message = with_results(message, {r.tool_use_id: r.text for r in item.results})
        if item.thinking_tokens is not None and not context.sends_thinking(index):
            message = without_thinking(message)
        if message is original:
            return copy.deepcopy(original)
        payload = _dump(message)  # an edited copy: recognised as stored when it comes back
        self._known.add(_key(payload))
        self._known_parts.update(_part_keys(payload))
        return message

    def messages(self) -> list[ModelMessage]:
        """The active context as the model gets it (empty before the first model request);
        usable as a run's ``message_history``."""
        return self._current_view()
