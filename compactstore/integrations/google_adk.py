"""Google ADK agents: ``CompactPlugin``, a runner plug-in (extra ``google-adk``).

::

    from compactstore.integrations.google_adk import CompactPlugin
    plugin = CompactPlugin(store, context_window=200_000)
    runner = Runner(app=App(name="app", root_agent=agent, plugins=[plugin]),
                    session_service=service)

ADK builds every model request from its session's events. Before each model call the
plug-in's ``before_model_callback`` stores the request's contents it has not stored yet in
a compactstore session named like the ADK session (``prefix`` + ADK session id), runs
``process_request()``, and replaces the request's contents by the active context; ADK's own
session (its events) is left as the session service keeps it. After the call it records the
prompt tokens the model reports (``usage_metadata.prompt_token_count``).

- **Lossless**: each ``types.Content`` is stored in the ``anthropic`` session format (what
  compaction reads and counts: images by their pixel size) and as the Content's own JSON beside
  it in ``message_origins``; the model gets the stored Content objects back (thought parts
  with their signatures, inline images), except where a compaction changed them (a function
  response persisted or cleared carries the preview as ``{"result": ...}``).
- **Tracked by content**: ADK sends the whole history each time, without call ids, so a
  Content is recognised by its JSON and its occurrence (the second identical ``"yes"`` is a
  message of its own); nothing is stored twice, also across runs and processes.
- **Calls and responses**: ADK strips call ids before the model call; the stored messages get
  ids derived from the Content, a response matched to the call of the same name in order.
- **The summary is a user Content** (role ``user``), never a system instruction.
- **Recovery**: a model error saying the prompt is too long (Gemini's 400 "input token count
  exceeds the maximum number of tokens", or another provider's wording through LiteLLM) runs
  ``reactive_recover`` and the agent's model is called once more with the recovered context;
  its answer stands for the failed call. Any other error, or a second overflow, propagates.
- :meth:`CompactPlugin.recall_tool` is the ``recall`` tool as an ADK ``FunctionTool``.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import hashlib
import json
import os
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from compactstore._context.active import ActiveContext
from compactstore._core.origins import Given, extend_with_origins, known_ids, read_origins
from compactstore._recall import RECALL_TOOL_NAME
from compactstore._store.session import Session
from compactstore._store.store import CompactStore
from compactstore.errors import InvalidInputError, MissingExtraError
from compactstore.integrations._overflow import is_context_overflow
from compactstore.models import CompactionConfig

try:
    from google.adk.agents.callback_context import CallbackContext
    from google.adk.models.base_llm import BaseLlm
    from google.adk.models.llm_request import LlmRequest
    from google.adk.models.llm_response import LlmResponse
    from google.adk.plugins.base_plugin import BasePlugin
    from google.adk.tools.function_tool import FunctionTool
    from google.genai import types
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise MissingExtraError(
        "compactstore.integrations.google_adk needs Google ADK, the 'google-adk' extra: "
        f"pip install 'compactstore[google-adk]' ({exc})"
    ) from None

__all__ = ["FORMAT", "SOURCE", "CompactPlugin", "is_context_overflow", "to_anthropic"]

# The value of message_origins.source for Contents stored by this plug-in.
SOURCE = "google_adk"
FORMAT = "anthropic"


def _dump(content: types.Content) -> str:
    return content.model_dump_json(exclude_none=True)


def _keys(payloads: Sequence[str]) -> list[str]:
    """One key per Content: its JSON's hash and how many identical ones came before it."""
    seen: Counter[str] = Counter()
    keys = []
    for payload in payloads:
        digest = hashlib.sha256(payload.encode()).hexdigest()
        keys.append(f"{digest}#{seen[digest]}")
        seen[digest] += 1
    return keys


def _call_id(key: str, index: int) -> str:
    return f"adk-{key[:16]}-{index}"


def _blob(blob: types.Blob) -> dict[str, Any]:
    data = base64.b64encode(blob.data or b"").decode()
    mime = blob.mime_type or "application/octet-stream"
    source = {"type": "base64", "media_type": mime, "data": data}
    if mime.startswith("image/"):
        return {"type": "image", "source": source}
    if mime == "application/pdf":
        return {"type": "document", "source": source}
    return {"type": "text", "text": f"[{mime} data]"}


def _response_text(response: types.FunctionResponse) -> str:
    value = response.response or {}
    if set(value) == {"result"} and isinstance(value["result"], str):
        return value["result"]
    return json.dumps(value, ensure_ascii=False, default=str)


def to_anthropic(
    content: types.Content, key: str, calls: Sequence[tuple[str, str]] = ()
) -> dict[str, Any]:
    """A Content in the ``anthropic`` session format. ``key`` names the Content (its call ids
    derive from it); ``calls`` are the (id, name) of the previous model Content's calls, which
    this Content's function responses answer, in order by name."""
    open_calls = list(calls)
    blocks = [
        block
        for index, part in enumerate(content.parts or [])
        if (block := _block(part, key, index, open_calls)) is not None
    ]
    role = "assistant" if content.role == "model" else "user"
    if role == "user":
        # The API wants a user message's tool results first.
        blocks.sort(key=lambda b: b["type"] != "tool_result")
    return {"role": role, "content": blocks or ""}


def _block(
    part: types.Part, key: str, index: int, open_calls: list[tuple[str, str]]
) -> dict[str, Any] | None:
    """One Part as an anthropic content block (None: an empty text part). A function
    response answers the first open call of its name, which leaves ``open_calls``."""
    if part.function_call is not None:
        call = part.function_call
        return {
            "type": "tool_use",
            "id": call.id or _call_id(key, index),
            "name": call.name or "",
            "input": dict(call.args or {}),
        }
    if part.function_response is not None:
        return _tool_result(part.function_response, key, index, open_calls)
    if part.thought and part.text is not None:
        signature = base64.b64encode(part.thought_signature or b"").decode()
        return {"type": "thinking", "thinking": part.text, "signature": signature}
    if part.text is not None:
        return {"type": "text", "text": part.text} if part.text else None
    if part.inline_data is not None:
        return _blob(part.inline_data)
    if part.file_data is not None and part.file_data.file_uri:
        mime = part.file_data.mime_type or ""
        uri = part.file_data.file_uri
        if mime.startswith("image/") and uri.startswith(("http://", "https://")):
            return {"type": "image", "source": {"type": "url", "url": uri}}
        return {"type": "text", "text": f"[file {uri}]"}
    kinds = [k for k, v in part.model_dump(exclude_none=True).items() if v]
    return {"type": "text", "text": f"[{', '.join(kinds) or 'empty'} part]"}


def _tool_result(
    response: types.FunctionResponse, key: str, index: int, open_calls: list[tuple[str, str]]
) -> dict[str, Any]:
    match = next((c for c in open_calls if c[1] == response.name), None)
    if response.id:
        tool_use_id = response.id
    elif match is not None:
        tool_use_id = match[0]
    else:
        tool_use_id = _call_id(key, index)
    if match is not None:
        open_calls.remove(match)
    value = response.response or {}
    result: dict[str, Any] = {
        "type": "tool_result",
        "tool_use_id": tool_use_id,
        "content": _response_text(response),
    }
    if "error" in value and "result" not in value:
        result["is_error"] = True
    return result


def _calls_of(message: dict[str, Any]) -> list[tuple[str, str]]:
    if message.get("role") != "assistant" or not isinstance(message.get("content"), list):
        return []
    return [(b["id"], b["name"]) for b in message["content"] if b.get("type") == "tool_use"]


@dataclass
class _Track:
    """What the plug-in knows of one compactstore session."""

    session: Session
    known: set[str] = field(default_factory=set)  # keys stored already
    parsed: dict[int, types.Content] = field(default_factory=dict)  # seq -> stored Content
    # The contents of the last request as ADK built it (the reply continues that list).
    sent: list[types.Content] = field(default_factory=list)
    lock: threading.RLock = field(default_factory=threading.RLock)


class CompactPlugin(BasePlugin):
    """Compacts what an ADK agent sends, keeping its conversation in compactstore.

    Args:
        store: an open :class:`~compactstore.CompactStore`, or a path or URL to open one.
        context_window: the model's window in tokens (new sessions; default 200,000).
        config: the sessions' :class:`~compactstore.CompactionConfig`.
        prefix: put before the ADK session id to name the compactstore session.
        name: the plug-in's name (ADK's plug-in names are unique per runner).

    Raises:
        InvalidInputError: a store that is not a CompactStore, path or URL.
    """

    def __init__(
        self,
        store: CompactStore | str | os.PathLike[str],
        *,
        context_window: int | None = None,
        config: CompactionConfig | None = None,
        prefix: str = "",
        name: str = "compactstore",
    ) -> None:
        super().__init__(name=name)
        if isinstance(store, str | os.PathLike):
            store = CompactStore.open(store)
        if not isinstance(store, CompactStore):
            raise InvalidInputError(
                "CompactPlugin needs a CompactStore or a database path or URL, "
                f"got {type(store).__name__}"
            )
        self.store = store
        self.context_window = context_window
        self.config = config
        self.prefix = prefix
        self._tracks: dict[str, _Track] = {}
        self._lock = threading.Lock()

    def session_for(self, adk_session_id: str) -> Session:
        """The compactstore session of an ADK session (created when new)."""
        return self._track(adk_session_id).session

    def _track(self, adk_session_id: str) -> _Track:
        with self._lock:
            track = self._tracks.get(adk_session_id)
            if track is None:
                session = self.store.session(
                    self.prefix + adk_session_id,
                    context_window=self.context_window,
                    format=FORMAT,
                    config=self.config,
                )
                track = self._tracks[adk_session_id] = _Track(session)
            return track

    # -- the callbacks --------------------------------------------------------------------

    async def before_model_callback(
        self, *, callback_context: CallbackContext, llm_request: LlmRequest
    ) -> LlmResponse | None:
        """Store what is new, compact, and send the active context."""
        track = self._track(callback_context.session.id)
        view = await asyncio.to_thread(self._prepare, track, list(llm_request.contents))
        llm_request.contents = view
        return None

    async def after_model_callback(
        self, *, callback_context: CallbackContext, llm_response: LlmResponse
    ) -> LlmResponse | None:
        """Record the prompt tokens the model reports and store the reply."""
        usage = llm_response.usage_metadata
        tokens = usage.prompt_token_count if usage is not None else None
        track = self._track(callback_context.session.id)
        await asyncio.to_thread(self._answer, track, llm_response, tokens or 0)
        return None

    def _answer(self, track: _Track, response: LlmResponse, tokens: int) -> None:
        with track.lock:
            if tokens > 0:
                track.session.record_usage(tokens)
            content = response.content
            if content is not None and content.parts and not response.partial:
                reply = content.model_copy(update={"role": content.role or "model"})
                self._store(track, [*track.sent, reply])

    async def on_model_error_callback(
        self, *, callback_context: CallbackContext, llm_request: LlmRequest, error: Exception
    ) -> LlmResponse | None:
        """A prompt too long for the model: recover and call the model once more."""
        if not is_context_overflow(error):
            return None
        agent = callback_context.get_invocation_context().agent
        model = getattr(agent, "canonical_model", None)
        if not isinstance(model, BaseLlm):
            return None
        track = self._track(callback_context.session.id)
        view = await asyncio.to_thread(self._recover, track, str(error))
        if view is None:
            return None
        llm_request.contents = view
        answer: LlmResponse | None = None
        try:
            async for response in model.generate_content_async(llm_request, stream=False):
                answer = response
        except Exception:  # the retry failed too: the original error stands
            return None
        return answer

    def _recover(self, track: _Track, error: str) -> list[types.Content] | None:
        with track.lock:
            result = track.session.reactive_recover(error)
            if result is None or not result.success:
                return None
            return self._view(track)

    def recall_tool(self) -> FunctionTool:
        """The ``recall`` tool (it answers from the log of the calling ADK session); turns on
        the summary's recall line of every session, open or opened later."""
        self.config = (self.config or CompactionConfig()).model_copy(
            update={"recall_enabled": True}
        )
        with self._lock:
            for track in self._tracks.values():
                if not track.session.config.recall_enabled:
                    track.session.recall_tool()

        def recall(
            tool_context: Any,
            from_seq: int | None = None,
            to_seq: int | None = None,
            query: str | None = None,
            blob_id: int | None = None,
            cursor: str | None = None,
        ) -> str:
            """Read back the original of messages the conversation summary replaced: a seq
            range (from_seq, to_seq), a search (query), a stored blob (blob_id) or the rest
            of an answer (cursor)."""
            arguments = {
                k: v
                for k, v in {
                    "from_seq": from_seq,
                    "to_seq": to_seq,
                    "query": query,
                    "blob_id": blob_id,
                    "cursor": cursor,
                }.items()
                if v is not None
            }
            session = self.session_for(tool_context.session.id)
            return session.recall(arguments)

        recall.__name__ = RECALL_TOOL_NAME
        return FunctionTool(recall)

    # -- storing and the view -------------------------------------------------------------

    def _prepare(self, track: _Track, contents: list[types.Content]) -> list[types.Content]:
        with track.lock:
            session = track.session
            if not track.parsed:
                self._view(track)  # learns the keys of the stored context
            self._store(track, contents)
            track.sent = contents
            session.process_request()
            return self._view(track)

    def _store(self, track: _Track, contents: list[types.Content]) -> None:
        """Store the contents not stored yet, in one transaction."""
        session = track.session
        payloads = [_dump(c) for c in contents]
        keys = _keys(payloads)
        fresh = [i for i, key in enumerate(keys) if key not in track.known]
        if not fresh:
            return
        track.known |= known_ids(session, SOURCE, (keys[i] for i in fresh))
        given: list[Given] = []
        calls: list[tuple[str, str]] = []
        for content, key, payload in zip(contents, keys, payloads, strict=True):
            message = to_anthropic(content, key, calls)
            calls = _calls_of(message)
            if key not in track.known:
                given.append(Given(message, key, payload))
        extend_with_origins(session, SOURCE, given)
        track.known.update(g.source_id for g in given)

    def _view(self, track: _Track) -> list[types.Content]:
        """The active context as Contents: the stored originals, the summary as a user
        Content, compaction's edits applied to function responses."""
        session = track.session
        context = session.context()
        seqs = [item.seq for item in context.items if item.seq is not None]
        missing = [seq for seq in seqs if seq not in track.parsed]
        if missing:
            for seq, origin in read_origins(session, SOURCE, missing).items():
                track.parsed[seq] = types.Content.model_validate_json(origin.payload)
                track.known.add(origin.source_id)
        view: list[types.Content] = []
        names: dict[str, str] = {}  # stored call id -> function name
        for index, item in enumerate(context.items):
            for call in item.calls:
                names[call.id] = call.name
            content = self._content(track, context, index, names)
            if content is not None:
                view.append(content)
        return view

    @staticmethod
    def _content(
        track: _Track, context: ActiveContext, index: int, names: dict[str, str]
    ) -> types.Content | None:
        """The Content standing for one item of the context (None: nothing is sent)."""
        session = track.session
        item = context.items[index]
        if item.state == "summary":
            text = session.adapter.text(item.message)
            return types.Content(role="user", parts=[types.Part(text=text)])
        if item.state == "synthetic" or item.seq is None:
            return types.Content(
                role="user",
                parts=[
                    types.Part(
                        function_response=types.FunctionResponse(
                            name=names.get(r.tool_use_id, "unknown"),
                            response={"error": r.text},
                        )
                    )
                    for r in item.results
                ],
            )
        original = track.parsed.get(item.seq)
        if original is None:  # appended through the Session API, not this plug-in
            return _from_format(session, item.message)
        content = copy.deepcopy(original)
        if item.state in ("persisted", "cleared", "deduplicated") and item.results:
            _edit_responses(content, [r.text for r in item.results])
        if item.thinking_tokens is not None and not context.sends_thinking(index):
            content.parts = [p for p in content.parts or [] if not p.thought]
            if not content.parts:
                return None
        return content

    def messages(self, adk_session_id: str) -> list[types.Content]:
        """The active context of an ADK session as the model gets it."""
        track = self._track(adk_session_id)
        with track.lock:
            return self._view(track)


def _edit_responses(content: types.Content, texts: list[str]) -> None:
    """Replace the function responses of ``content``, in order, by compaction's texts."""
    responses = [p.function_response for p in content.parts or [] if p.function_response]
    for response, text in zip(responses, texts, strict=False):
        response.response = {"result": text}


def _from_format(session: Session, message: dict[str, Any]) -> types.Content:
    """A Content for a stored message that has no ADK form."""
    adapter = session.adapter
    if adapter.kind(message) == "assistant":
        parts = [types.Part(text=adapter.text(message))] if adapter.text(message) else []
        parts.extend(
            types.Part(
                function_call=types.FunctionCall(
                    name=c.name, args=json.loads(c.input) if isinstance(c.input, str) else c.input
                )
            )
            for c in adapter.tool_calls(message)
        )
        return types.Content(role="model", parts=parts)
    results = adapter.tool_results(message)
    if results:
        return types.Content(
            role="user",
            parts=[
                types.Part(
                    function_response=types.FunctionResponse(
                        name="unknown", response={"result": r.text}
                    )
                )
                for r in results
            ],
        )
    return types.Content(role="user", parts=[types.Part(text=adapter.text(message))])
