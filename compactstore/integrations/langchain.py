"""LangChain v1 agents: ``CompactStoreMiddleware`` (extra ``langchain``).

::

    from compactstore.integrations.langchain import CompactStoreMiddleware
    agent = create_agent(model, tools, middleware=[CompactStoreMiddleware(store, "task-42")])

Before every model call the middleware stores the graph's messages it has not stored yet,
runs ``process_request()``, and hands the model the active context; the graph state is then
replaced by that context (``RemoveMessage(REMOVE_ALL_MESSAGES)`` followed by the context), so
it stays as bounded as the context. After the call it records the model's reported input
tokens and stores the reply.

- **Format**: the session's format follows the model: ``anthropic`` for ``ChatAnthropic``,
  ``openai`` for any other (``format=`` chooses; an existing session keeps its own). Messages
  are converted by LangChain's own converters (langchain-anthropic's formatter,
  ``convert_to_openai_messages``), so LangChain's standard content blocks (text, image, file,
  reasoning, tool calls) are stored as the provider takes them, and images and documents
  count by their size (a 1000x800 image: 1,067 tokens), so ``max_media_in_context`` applies.
- **Window**: ``context_window=`` or, when not given, the model's profile
  (``model.profile["max_input_tokens"]``).
- **Recovery**: when the provider says the prompt is over the window (LangChain's
  ``ContextOverflowError``, or a 400 "prompt is too long"/"exceeds the context window"), the
  middleware runs ``reactive_recover`` (recorded like any recovery) and calls the model again
  once with the recovered context.
- **Lossless**: each LangChain message is stored twice in one transaction: in the session's
  format (what compaction reads) and as LangChain's own dict (``message_to_dict``) beside it in
  ``message_origins``. The model gets the stored LangChain message back exactly — ids,
  metadata, thinking blocks with their signatures — except where a compaction changed it (a
  tool result persisted or cleared keeps its id with the preview as its content).
- **Tracked by id**: a message whose id is stored already is never stored again, so hooks
  that run twice, a resumed thread or a second middleware instance append nothing twice.
  Messages the middleware itself makes have ids starting ``compactstore-``.
- **The summary is a human message** (``HumanMessage``, id ``compactstore-summary-<boundary>``),
  never a second system message; the agent's system prompt stays the model call's own.
- ``tools`` holds the ``recall`` tool when recall is on (``recall=True`` or
  ``config.recall_enabled``); its answers read the session's log (``Session.recall``).
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import uuid
import warnings
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from compactstore._core.origins import Given, extend_with_origins, known_ids, read_origins
from compactstore._recall import DESCRIPTION as RECALL_DESCRIPTION
from compactstore._recall import RECALL_TOOL_NAME
from compactstore._recall import SCHEMA as RECALL_SCHEMA
from compactstore._store.session import Session
from compactstore._store.store import CompactStore
from compactstore.errors import InvalidInputError, MissingExtraError, NotFoundError
from compactstore.integrations._overflow import is_context_overflow
from compactstore.integrations._store import checked_store
from compactstore.models import CompactionConfig

try:
    from langchain.agents.middleware import AgentMiddleware, AgentState, ModelRequest
    from langchain.agents.middleware.types import ModelCallResult, ModelResponse
    from langchain_core.messages import (
        AIMessage,
        BaseMessage,
        HumanMessage,
        RemoveMessage,
        SystemMessage,
        ToolMessage,
        convert_to_openai_messages,
        message_to_dict,
        messages_from_dict,
    )
    from langchain_core.tools import BaseTool, StructuredTool
    from langgraph.graph.message import REMOVE_ALL_MESSAGES
    from langgraph.runtime import Runtime
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise MissingExtraError(
        "compactstore.integrations.langchain needs LangChain v1, the 'langchain' extra: "
        f"pip install 'compactstore[langchain]' ({exc})"
    ) from None

__all__ = ["ID_PREFIX", "SOURCE", "CompactStoreMiddleware", "format_for_model", "window_of"]

# Anthropic's signed thinking blocks, as ChatAnthropic keeps them in an AIMessage's content.
_THINKING_BLOCKS = frozenset({"thinking", "redacted_thinking"})

# The value of message_origins.source for messages stored by this middleware.
SOURCE = "langchain"
# Ids of the messages the middleware makes (summary, synthetic results, messages stored
# without a LangChain form): never stored as new messages.
ID_PREFIX = "compactstore-"

# The session formats one LangChain message maps onto one stored message of. (Responses
# spells one assistant turn as several items, so it would break the one-seq-per-message
# mapping the lossless store and the id tracking rest on.)
_FORMATS = ("anthropic", "openai")


def format_for_model(model: Any) -> str:
    """The session format for a chat model: ``anthropic`` for ``ChatAnthropic`` (or a
    subclass), ``openai`` for any other."""
    names = {cls.__name__ for cls in type(model).__mro__}
    return "anthropic" if "ChatAnthropic" in names else "openai"


def window_of(model: Any) -> int | None:
    """The model's input window as LangChain's model profile states it
    (``model.profile["max_input_tokens"]``); None when it does not."""
    profile = getattr(model, "profile", None)
    value = profile.get("max_input_tokens") if isinstance(profile, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _text(message: BaseMessage) -> str:
    return message.text if isinstance(message.text, str) else str(message.text)


def _anthropic_message(message: BaseMessage) -> dict[str, Any]:
    """A LangChain message in the ``anthropic`` session format, by langchain-anthropic's own
    formatter (what ChatAnthropic sends): LangChain's standard blocks (text, image, file,
    reasoning, tool calls) and Anthropic's own alike."""
    try:
        from langchain_anthropic.chat_models import _format_messages
    except ImportError:
        raise MissingExtraError(
            "CompactStoreMiddleware stores messages in the 'anthropic' format with "
            "langchain-anthropic's formatter: pip install langchain-anthropic"
        ) from None
    if isinstance(message, SystemMessage):
        return {"role": "system", "content": _text(message)}
    _system, formatted = _format_messages([message], model=None)
    if len(formatted) == 1:
        converted: dict[str, Any] = formatted[0]
        return converted
    role = "assistant" if isinstance(message, AIMessage) else "user"
    return {"role": role, "content": _text(message)}


def _openai_message(message: BaseMessage) -> dict[str, Any]:
    """A LangChain message in the ``openai`` (Chat Completions) session format, by
    ``langchain_core.messages.convert_to_openai_messages`` (LangChain's standard blocks:
    text, image, file, tool calls). An assistant's content keeps its text only (Chat
    Completions takes no reasoning blocks back)."""
    with warnings.catch_warnings():
        # A file block without a filename gets a placeholder name; nothing to warn about.
        warnings.filterwarnings("ignore", message="OpenAI may require a filename")
        converted: dict[str, Any] = convert_to_openai_messages(message)
    if converted.get("role") == "assistant" and isinstance(converted.get("content"), list):
        converted["content"] = "".join(
            part.get("text", "")
            for part in converted["content"]
            if isinstance(part, dict) and part.get("type") == "text"
        )
    if converted.get("role") == "tool":
        converted.pop("name", None)  # the tool's name: Chat Completions does not take it
    if converted.get("role") == "tool" and isinstance(converted.get("content"), list):
        # Chat Completions tool messages take text parts only: media goes as its note.
        converted["content"] = [
            part if part.get("type") == "text" else {"type": "text", "text": _note(part)}
            for part in converted["content"]
            if isinstance(part, dict)
        ]
    return converted


def _note(part: dict[str, Any]) -> str:
    return f"[{part.get('type', 'block')} block]"


# How a LangChain message becomes a stored message, by session format (minicode speaks
# Anthropic's block dialect for everything but tool results).
_CONVERTERS: dict[str, Callable[[BaseMessage], dict[str, Any]]] = {
    "anthropic": _anthropic_message,
    "minicode": _anthropic_message,
    "openai": _openai_message,
}


def _payload(message: BaseMessage) -> str:
    return json.dumps(message_to_dict(message), ensure_ascii=False, separators=(",", ":"))


class CompactStoreMiddleware(AgentMiddleware[AgentState[Any], Any, Any]):
    """Keeps a LangChain agent's conversation in a compactstore session and hands the model
    the compacted active context.

    Args:
        store: an open :class:`~compactstore.CompactStore`, or a path or URL to open one.
        session_id: the session (created on the first model call when it does not exist).
        context_window: the model's window in tokens (a new session); default: the model's
            profile (``profile["max_input_tokens"]``), else the store's default (200,000).
        format: the session format of a new session, ``anthropic`` or ``openai``; default:
            from the model (:func:`format_for_model`).
        config: the session's :class:`~compactstore.CompactionConfig` (replaces the stored
            one of an existing session).
        recall: offer the ``recall`` tool and write the summary's recall line (default:
            ``config.recall_enabled``).
        cwd: the agent's working directory, for the summary's file list.

    Raises:
        InvalidInputError: a store that is not a CompactStore, path or URL, no session id,
            or a format other than anthropic and openai.
    """

    def __init__(
        self,
        store: CompactStore | str | os.PathLike[str],
        session_id: str,
        *,
        context_window: int | None = None,
        format: str | None = None,
        config: CompactionConfig | None = None,
        recall: bool | None = None,
        cwd: str | None = None,
    ) -> None:
        store = checked_store(store, session_id, "CompactStoreMiddleware")
        if format is not None and format not in _FORMATS:
            raise InvalidInputError(
                f"CompactStoreMiddleware stores LangChain messages as 'anthropic' or 'openai', "
                f"not {format!r}: one LangChain message is one message of those formats"
            )
        self.store = store
        self.session_id = session_id
        self.context_window = context_window
        self.format = format
        self.config = config
        self.cwd = cwd
        self.recall = bool(config.recall_enabled if recall is None and config else recall)
        self.tools: Sequence[BaseTool] = [self._recall_tool()] if self.recall else []
        self._session: Session | None = None
        self._lock = threading.RLock()
        self._known: set[str] = set()  # ids stored already (a cache of message_origins)
        self._parsed: dict[int, BaseMessage] = {}  # seq -> the stored LangChain message
        self._ready: tuple[str | None, ...] | None = None  # ids of the view before_model set

    @property
    def name(self) -> str:
        return f"CompactStoreMiddleware[{self.session_id}]"

    # -- the session ----------------------------------------------------------------------

    @property
    def session(self) -> Session | None:
        """The session, once it exists (it is created on the first model call)."""
        with self._lock:
            if self._session is None:
                try:
                    self._open(self.store.get_session(self.session_id))
                except NotFoundError:
                    return None
            return self._session

    def _open(self, session: Session) -> Session:
        if self.config is not None or self.recall:
            # Through store.session so a new config is stored (and checked) as usual.
            session = self.store.session(
                self.session_id,
                context_window=self.context_window,
                format=self.format,
                config=self.config,
                cwd=self.cwd,
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
            if self.context_window is None:
                self.context_window = window_of(model)
            created = self.store.session(
                self.session_id,
                context_window=self.context_window,
                format=self.format or format_for_model(model),
                config=self.config,
                cwd=self.cwd,
            )
            return self._open(created)

    def _recall_tool(self) -> BaseTool:
        def recall(**arguments: Any) -> str:
            session = self.session
            if session is None:
                return "Nothing to recall yet: the conversation has not been stored."
            return session.recall(arguments)

        return StructuredTool.from_function(
            func=recall,
            name=RECALL_TOOL_NAME,
            description=RECALL_DESCRIPTION,
            args_schema=json.loads(json.dumps(RECALL_SCHEMA)),
        )

    # -- storing --------------------------------------------------------------------------

    def _convert(self, session: Session, message: BaseMessage) -> dict[str, Any]:
        convert = _CONVERTERS.get(session.format)
        if convert is not None:
            return convert(message)
        raise InvalidInputError(
            f"session {session.id!r} is in the {session.format!r} format; "
            "CompactStoreMiddleware stores LangChain messages as 'anthropic' or 'openai'"
        )

    def _store(self, session: Session, messages: Sequence[BaseMessage]) -> None:
        """Store the messages whose ids are not stored yet, in one transaction."""
        for message in messages:
            if message.id is None:
                message.id = str(uuid.uuid4())
        fresh = [
            m
            for m in messages
            if m.id is not None and not m.id.startswith(ID_PREFIX) and m.id not in self._known
        ]
        if not fresh:
            return
        stored = known_ids(session, SOURCE, (m.id for m in fresh if m.id is not None))
        self._known |= stored
        given = [
            Given(self._convert(session, m), m.id, _payload(m))
            for m in fresh
            if m.id is not None and m.id not in stored
        ]
        extend_with_origins(session, SOURCE, given)
        self._known.update(g.source_id for g in given)

    # -- the view -------------------------------------------------------------------------

    def _view(self, session: Session) -> list[BaseMessage]:
        """The active context as LangChain messages: the stored originals, the summary as a
        human message, compaction's edits applied to tool results."""
        context = session.context()
        seqs = [item.seq for item in context.items if item.seq is not None]
        missing = [seq for seq in seqs if seq not in self._parsed]
        if missing:
            for seq, origin in read_origins(session, SOURCE, missing).items():
                [message] = messages_from_dict([json.loads(origin.payload)])
                self._parsed[seq] = message
        boundary = context.boundary.id if context.boundary is not None else 0
        view: list[BaseMessage] = []
        for index, item in enumerate(context.items):
            if item.state == "summary":
                view.append(
                    HumanMessage(
                        content=session.adapter.text(item.message),
                        id=f"{ID_PREFIX}summary-{boundary}",
                    )
                )
                continue
            if item.state == "synthetic" or item.seq is None:
                view.extend(
                    ToolMessage(
                        content=result.text,
                        tool_call_id=result.tool_use_id,
                        status="error",
                        id=f"{ID_PREFIX}synthetic-{result.tool_use_id}",
                    )
                    for result in item.results
                )
                continue
            original = self._parsed.get(item.seq)
            if original is None:  # appended through the Session API, not this middleware
                view.extend(self._from_format(session, item.message, item.seq))
            elif item.state in ("persisted", "cleared", "deduplicated") and item.results:
                view.append(
                    original.model_copy(update={"content": item.results[0].text}, deep=True)
                )
            elif item.state in ("persisted", "cleared", "deduplicated"):
                # A user message whose media compaction persisted: its content as the
                # session holds it (the model's own format: text and the note).
                view.append(
                    original.model_copy(update={"content": item.message["content"]}, deep=True)
                )
            elif item.thinking_tokens is not None and not context.sends_thinking(index):
                view.extend(_without_thinking(original))
            else:
                view.append(original.model_copy(deep=True))
        return view

    def _from_format(
        self, session: Session, message: dict[str, Any], seq: int
    ) -> list[BaseMessage]:
        """LangChain messages for a stored message that has no LangChain form."""
        adapter = session.adapter
        kind = adapter.kind(message)
        key = f"{ID_PREFIX}seq-{seq}"
        if kind == "tool":
            return [
                ToolMessage(
                    content=r.text,
                    tool_call_id=r.tool_use_id,
                    status="error" if r.is_error else "success",
                    id=f"{key}-{i}",
                )
                for i, r in enumerate(adapter.tool_results(message))
            ]
        if kind == "assistant":
            calls = [
                {
                    "id": c.id,
                    "name": c.name,
                    "args": json.loads(c.input) if isinstance(c.input, str) else c.input,
                }
                for c in adapter.tool_calls(message)
            ]
            return [AIMessage(content=adapter.text(message), tool_calls=calls, id=key)]
        if kind == "system":
            return [SystemMessage(content=adapter.text(message), id=key)]
        return [HumanMessage(content=adapter.text(message), id=key)]

    # -- the hooks ------------------------------------------------------------------------

    def _prepare(self, session: Session, messages: Sequence[BaseMessage]) -> list[BaseMessage]:
        self._store(session, messages)
        session.process_request()
        view = self._view(session)
        self._ready = tuple(m.id for m in view)
        return view

    def before_model(self, state: AgentState[Any], runtime: Runtime[Any]) -> dict[str, Any] | None:
        """Store what is new, compact, and replace the graph's messages by the active
        context when they differ (the state stays as small as the context)."""
        with self._lock:
            session = self.session
            if session is None:
                return None  # created by the first model call, which knows the model
            messages = state["messages"]
            view = self._prepare(session, messages)
            if view == list(messages):
                return None
            return {"messages": [RemoveMessage(id=REMOVE_ALL_MESSAGES), *view]}

    def _request(self, request: ModelRequest[Any]) -> ModelRequest[Any]:
        with self._lock:
            session = self._session_for(request.model)
            if self._ready is not None and self._ready == tuple(m.id for m in request.messages):
                return request  # before_model has just stored, compacted and set the state
            view: list[Any] = self._prepare(session, request.messages)
            return request.override(messages=view)

    def _answer(self, response: ModelCallResult[Any]) -> None:
        """Record the call's reported prompt size and store the reply."""
        result = getattr(response, "model_response", response)
        messages = result.result if isinstance(result, ModelResponse) else [result]
        with self._lock:
            session = self._session
            assert session is not None, "the request created the session"
            self._ready = None
            for message in messages:
                usage = getattr(message, "usage_metadata", None)
                if isinstance(message, AIMessage) and usage and usage.get("input_tokens"):
                    # LangChain's input_tokens already counts cached prompt tokens.
                    session.record_usage(usage["input_tokens"])
            self._store(session, [m for m in messages if isinstance(m, BaseMessage)])

    def _recover(self, request: ModelRequest[Any], error: Exception) -> ModelRequest[Any]:
        """After the provider said the prompt is over the window: ``reactive_recover`` and
        the request again with the recovered context; the error again when recovery had
        nothing to give or the error is another one."""
        if not is_context_overflow(error):
            raise error
        with self._lock:
            session = self._session
            if session is None or session.reactive_recover(str(error)) is None:
                raise error
            view = self._view(session)
            self._ready = tuple(m.id for m in view)
            return request.override(messages=view)  # type: ignore[arg-type]

    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]],
    ) -> ModelCallResult[Any]:
        """Send the active context; afterwards record usage and store the reply. When the
        provider says the prompt is too long, recover (``reactive_recover``) and retry once."""
        sent = self._request(request)
        try:
            response = handler(sent)
        except Exception as error:
            response = handler(self._recover(sent, error))
        self._answer(response)
        return response

    async def abefore_model(
        self, state: AgentState[Any], runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        return await asyncio.to_thread(self.before_model, state, runtime)

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelCallResult[Any]:
        sent = await asyncio.to_thread(self._request, request)
        try:
            response = await handler(sent)
        except Exception as error:
            response = await handler(await asyncio.to_thread(self._recover, sent, error))
        await asyncio.to_thread(self._answer, response)
        return response

    # -- reading --------------------------------------------------------------------------

    def messages(self) -> list[BaseMessage]:
        """The active context as the model gets it (empty before the first model call)."""
        with self._lock:
            session = self.session
            return [] if session is None else self._view(session)


def _without_thinking(message: BaseMessage) -> list[BaseMessage]:
    """``message`` without its thinking blocks, which the context leaves out (as
    the wire view does); nothing when that leaves it empty."""
    content = message.content
    if not isinstance(content, list):
        return [message.model_copy(deep=True)]
    kept = [
        block
        for block in content
        if not (isinstance(block, dict) and block.get("type") in _THINKING_BLOCKS)
    ]
    if not kept and not getattr(message, "tool_calls", None):
        return []
    return [message.model_copy(update={"content": kept}, deep=True)]
