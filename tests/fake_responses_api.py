"""A strict fake of the OpenAI Responses API, served to the official ``openai`` SDK over a
mocked HTTP transport (see :mod:`tests.mock_http`): no network, the SDK's real code paths.

It follows the provider's documentation ("Compaction" / "Context management", "Reasoning",
"Function calling", the ``responses.compact`` reference) closely enough that a request the
real API refuses for the reasons below is refused here with the same status and error
shape::

    {"error": {"message": ..., "type": "invalid_request_error", "param": ..., "code": ...}}

Its rules are :data:`RULES`, one list, each a named check with a short doc; tests in
``tests/test_fake_responses_api.py`` show each one refusing a violation. The model behind it
is scripted (:class:`CodingAgent`): it reasons (an encrypted reasoning item), calls tools for
a while and then answers. Time is a simulated clock (``FakeResponsesAPI.now``), for the
prompt cache.

Encrypted content is the fake's own: each reasoning and compaction item it produces carries
``encrypted_content`` sealed (HMAC) under the current key, over the item's id, the model
and what it stands for. Sent back, it must verify: after :meth:`FakeResponsesAPI.rotate_key`
or :meth:`FakeResponsesAPI.revoke`, or with an edited byte, the request fails with 400
``invalid_encrypted_content``. A compaction item stands for every item before it: the
model sees the newest compaction item and what follows it (items before it may be sent or
left out, as the documentation allows).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from tests.mock_http import http_module

__all__ = ["RULES", "ApiError", "CodingAgent", "FakeResponsesAPI", "Rule", "fake_client"]

_CACHE_TTL = 600.0  # in-memory prompt caching keeps a prefix 5-10 minutes
_MIN_CACHEABLE = 1_024
_ITEM_FIELDS: dict[str, frozenset[str]] = {
    "message": frozenset({"type", "id", "role", "content", "status"}),
    "function_call": frozenset({"type", "id", "call_id", "name", "arguments", "status"}),
    "function_call_output": frozenset({"type", "id", "call_id", "output", "status"}),
    "reasoning": frozenset({"type", "id", "summary", "content", "encrypted_content", "status"}),
    "compaction": frozenset({"type", "id", "encrypted_content", "created_by"}),
}


class ApiError(Exception):
    """A refusal: the HTTP status and the error body the API sends."""

    def __init__(self, status: int, message: str, *, code: str | None, param: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param

    def body(self) -> dict[str, Any]:
        kind = "server_error" if self.status >= 500 else "invalid_request_error"
        return {
            "error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}
        }


def _invalid(message: str, param: str | None = None, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, code=code, param=param)


def _tokens(value: Any) -> int:
    """The fake's tokenizer: four characters of JSON a token."""
    return max(1, len(json.dumps(value, sort_keys=True)) // 4)


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def _kind(item: Mapping[str, Any]) -> str:
    kind = item.get("type")
    if kind is None and "role" in item:
        return "message"
    return str(kind)


# -- the request as the checks see it ----------------------------------------------------


@dataclass
class Request:
    """One request: ``compact`` for ``POST /responses/compact``."""

    body: dict[str, Any]
    compact: bool
    model: str = ""
    items: list[dict[str, Any]] = field(default_factory=list)
    sealed: dict[int, dict[str, Any]] = field(default_factory=dict)  # index -> payload
    start: int = 0  # the newest compaction item (what the model sees starts there)
    rendered: int = 0  # input tokens the model sees
    cached: int = 0

    @classmethod
    def parse(cls, body: dict[str, Any], compact: bool) -> Request:
        raw = body.get("input", [])
        items = [{"role": "user", "content": raw}] if isinstance(raw, str) else raw
        return cls(body, compact, str(body.get("model") or ""), list(items or []))

    @property
    def seen(self) -> list[dict[str, Any]]:
        return self.items[self.start :]


@dataclass(frozen=True)
class Rule:
    """A named check of :data:`RULES`: ``check(api, request)`` raises ApiError."""

    name: str
    doc: str
    check: Callable[[FakeResponsesAPI, Request], None]


def _check_items(api: FakeResponsesAPI, req: Request) -> None:
    if not req.model:
        raise _invalid(
            "Missing required parameter: 'model'.", "model", "missing_required_parameter"
        )
    if not isinstance(req.items, list):
        raise _invalid("Invalid type for 'input'.", "input", "invalid_type")
    for i, item in enumerate(req.items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise _invalid(f"Invalid type for '{where}': expected an object.", where)
        kind = _kind(item)
        fields = _ITEM_FIELDS.get(kind)
        if fields is None:
            raise _invalid(f"Invalid value: '{kind}'. Supported values are: ...", f"{where}.type")
        unknown = sorted(set(item) - fields)
        if unknown:
            raise _invalid(
                f"Unknown parameter: '{where}.{unknown[0]}'.",
                f"{where}.{unknown[0]}",
                "unknown_parameter",
            )
        required = {
            "message": ("role", "content"),
            "function_call": ("call_id", "name", "arguments"),
            "function_call_output": ("call_id", "output"),
            "reasoning": ("summary",),
            "compaction": ("encrypted_content",),
        }[kind]
        for key in required:
            if item.get(key) is None:
                raise _invalid(
                    f"Missing required parameter: '{where}.{key}'.",
                    f"{where}.{key}",
                    "missing_required_parameter",
                )


def _check_reasoning_order(api: FakeResponsesAPI, req: Request) -> None:
    for i, item in enumerate(req.items):
        if _kind(item) != "reasoning":
            continue
        after = req.items[i + 1] if i + 1 < len(req.items) else None
        produced = after is not None and (
            _kind(after) == "function_call"
            or (_kind(after) == "message" and after.get("role") == "assistant")
        )
        if not produced:
            raise _invalid(
                f"Item '{item.get('id')}' of type 'reasoning' was provided without its "
                f"required following item.",
                f"input[{i}]",
            )


def _check_pairing(api: FakeResponsesAPI, req: Request) -> None:
    calls: dict[str, int] = {}
    answered: set[str] = set()
    for i, item in enumerate(req.items):
        kind = _kind(item)
        if kind == "function_call":
            call_id = str(item["call_id"])
            if call_id in calls:
                raise _invalid(f"Duplicate item found with call_id {call_id}.", f"input[{i}]")
            calls[call_id] = i
        elif kind == "function_call_output":
            call_id = str(item["call_id"])
            if call_id not in calls:
                raise _invalid(
                    f"No tool call found for function call output with call_id {call_id}.",
                    "input",
                )
            if call_id in answered:
                raise _invalid(f"Duplicate output for call_id {call_id}.", f"input[{i}]")
            answered.add(call_id)
    missing = [call_id for call_id in calls if call_id not in answered]
    if missing:
        raise _invalid(f"No tool output found for function call {missing[0]}.", "input")


def _check_encrypted(api: FakeResponsesAPI, req: Request) -> None:
    for i, item in enumerate(req.items):
        kind = _kind(item)
        if kind not in ("reasoning", "compaction") or item.get("encrypted_content") is None:
            continue
        payload = api.unseal(str(item["encrypted_content"]))
        if (
            payload is None
            or payload.get("k") != kind
            or (item.get("id") is not None and payload.get("id") != item.get("id"))
            or payload.get("id") in api.revoked
            or not req.model.startswith(str(payload.get("m")))
        ):
            raise ApiError(
                400,
                f"The encrypted content for item {item.get('id') or f'input[{i}]'} could not "
                f"be verified. Reason: Encrypted content could not be decrypted or parsed.",
                code="invalid_encrypted_content",
                param=f"input[{i}].encrypted_content",
            )
        req.sealed[i] = payload
    found = [i for i, item in enumerate(req.items) if _kind(item) == "compaction"]
    req.start = found[-1] if found else 0


def _check_context_management(api: FakeResponsesAPI, req: Request) -> None:
    entries = req.body.get("context_management")
    if entries is None:
        return
    if req.compact or not isinstance(entries, list):
        raise _invalid("Invalid 'context_management'.", "context_management")
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or entry.get("type") != "compaction":
            raise _invalid(
                "Invalid value for 'context_management[].type': only 'compaction' is supported.",
                f"context_management[{i}].type",
            )
        threshold = entry.get("compact_threshold")
        if threshold is not None and (not isinstance(threshold, int) or threshold < 1_000):
            raise _invalid(
                "'compact_threshold' must be an integer >= 1000.",
                f"context_management[{i}].compact_threshold",
            )


def _rendered(req: Request) -> int:
    """What the model sees: the instructions, and the input from the newest compaction item
    on (a compaction item counts what its summary holds)."""
    total = _tokens(req.body.get("instructions") or "") + _tokens(req.body.get("tools") or [])
    for i, item in enumerate(req.seen, start=req.start):
        payload = req.sealed.get(i)
        total += (
            int(payload["n"]) if payload and payload.get("k") == "compaction" else _tokens(item)
        )
    return total


def _check_window(api: FakeResponsesAPI, req: Request) -> None:
    req.rendered = _rendered(req)
    limit = api.context_window(req.model)
    wanted = int(req.body.get("max_output_tokens") or 0)
    threshold = api.threshold(req)
    if threshold is not None and req.rendered > threshold:
        return  # the server compacts before inference
    if req.rendered + wanted > limit:
        raise _invalid(
            f"Your input exceeds the context window of this model ({req.rendered} + "
            f"{wanted} > {limit} tokens).",
            "input",
            "context_length_exceeded",
        )


def _check_compact(api: FakeResponsesAPI, req: Request) -> None:
    if not req.compact:
        return
    if not [item for item in req.seen if _kind(item) != "compaction"]:
        raise _invalid("There is nothing to compact: the input holds no new items.", "input")
    if api.unavailable > 0:
        api.unavailable -= 1
        raise ApiError(503, "The server is overloaded. Please retry.", code=None)


def _check_cache(api: FakeResponsesAPI, req: Request) -> None:
    """Automatic prefix caching: the longest prefix of items sent before, within the TTL."""
    chain = hashlib.sha256(
        json.dumps([req.model, req.body.get("instructions"), req.body.get("tools")]).encode()
    )
    running = 0
    best = 0
    keys: list[tuple[str, int]] = []
    for item in req.seen:
        chain.update(json.dumps(item, sort_keys=True).encode())
        running += _tokens(item)
        key = chain.copy().hexdigest()
        keys.append((key, running))
        expiry = api.cache.get(key)
        if expiry is not None and expiry >= api.now and running >= _MIN_CACHEABLE:
            best = running
    req.cached = min(best, req.rendered)
    for key, _ in keys:
        api.cache[key] = api.now + _CACHE_TTL


# The rules, in the order the API applies them.
RULES: tuple[Rule, ...] = (
    Rule(
        "input_items",
        "Every input item is a known type with its required fields and no unknown ones (a "
        "compaction item: type, id, encrypted_content, created_by): else 400.",
        _check_items,
    ),
    Rule(
        "reasoning_order",
        "A reasoning item is followed by the item it produced (a function call or an "
        "assistant message): else 400 'provided without its required following item'.",
        _check_reasoning_order,
    ),
    Rule(
        "call_pairing",
        "Every function_call_output answers an earlier function_call with its call_id, "
        "once, and every function_call has its output: else 400.",
        _check_pairing,
    ),
    Rule(
        "encrypted_content",
        "Encrypted reasoning and compaction items are sent back as issued, under the current "
        "key, not revoked, to a model of the family that made them: else 400 "
        "invalid_encrypted_content. The newest compaction item starts what the model sees.",
        _check_encrypted,
    ),
    Rule(
        "context_management",
        "context_management is a list of {'type': 'compaction', 'compact_threshold': N} "
        "(N >= 1000), on responses.create only.",
        _check_context_management,
    ),
    Rule(
        "context_window",
        "The rendered input plus max_output_tokens fits the model's window, unless "
        "server-side compaction runs first (rendered input over compact_threshold): else "
        "400 context_length_exceeded.",
        _check_window,
    ),
    Rule(
        "compact_request",
        "responses.compact needs items to compact besides a compaction item (else 400); "
        "503 while the service is overloaded.",
        _check_compact,
    ),
    Rule(
        "prompt_cache",
        "Automatic prefix caching: cached_tokens is the longest item prefix sent within "
        "the TTL (from 1,024 tokens), reported in usage.input_tokens_details.",
        _check_cache,
    ),
)


# -- the scripted model -------------------------------------------------------------------


class CodingAgent:
    """A coding agent: on each new task it works through a tool loop of 3-12 function
    calls, reasoning before each, then answers. Deterministic."""

    tools = ("read_file", "grep", "run_tests", "edit_file")

    def __init__(self, seed: int = 11, reasoning_chars: int = 800):
        self.seed = seed
        self.reasoning_chars = reasoning_chars

    def reply(self, req: Request, serial: int, tasks_before: int) -> tuple[str, str]:
        """("call", tool name) or ("answer", text)."""
        seen = req.seen
        tasks = tasks_before + sum(
            1 for item in seen if _kind(item) == "message" and item.get("role") == "user"
        )
        done = 0
        for item in reversed(seen):
            if _kind(item) == "message" and item.get("role") == "user":
                break
            done += _kind(item) == "function_call"
        length = random.Random(self.seed * 1_000 + tasks).randint(3, 12)
        if done >= length:
            return "answer", f"Task {tasks} done: {length} steps, the failing cases are fixed."
        return "call", self.tools[(tasks + done) % len(self.tools)]


# -- the API ------------------------------------------------------------------------------


class FakeResponsesAPI:
    """A mock transport handler for ``POST /v1/responses`` and ``/v1/responses/compact``:
    applies :data:`RULES`, answers from the scripted model, and counts what happened."""

    def __init__(
        self,
        http: ModuleType,
        *,
        agent: CodingAgent | None = None,
        window: int = 60_000,
        start: float = 1_790_000_000.0,
    ):
        self.http = http
        self.agent = agent or CodingAgent()
        self.window = window
        self.now = start
        self.calls = 0
        self.errors: list[dict[str, Any]] = []
        self.bodies: list[dict[str, Any]] = []
        self.paths: list[str] = []
        self.compactions: list[dict[str, Any]] = []  # the compaction items issued
        self.issued_at: list[int] = []  # for each, the index in ``bodies`` that made it
        self.cache: dict[str, float] = {}
        self.cache_read = 0
        self.input_total = 0
        self.unavailable = 0  # compact requests still to answer 503
        self.revoked: set[str] = set()
        # Tests that need a malformed compact answer set this: it rewrites each one.
        self.rewrite_compact: Callable[[dict[str, Any]], dict[str, Any]] | None = None
        self._key = b"fake-responses-api-key-0"
        self._next_id = 0

    # -- controls ----------------------------------------------------------------------

    def context_window(self, model: str) -> int:
        return self.window

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def rotate_key(self) -> None:
        """The organisation's key changes: no earlier encrypted content decodes."""
        self._key = hashlib.sha256(self._key).digest()

    def revoke(self, item_id: str) -> None:
        """One item's encrypted content stops decoding (a model that cannot read it)."""
        self.revoked.add(item_id)

    @staticmethod
    def threshold(req: Request) -> int | None:
        for entry in req.body.get("context_management") or []:
            if isinstance(entry, dict) and isinstance(entry.get("compact_threshold"), int):
                return int(entry["compact_threshold"])
        return None

    # -- sealing -------------------------------------------------------------------------

    def seal(self, payload: dict[str, Any]) -> str:
        data = base64.urlsafe_b64encode(json.dumps(payload, sort_keys=True).encode()).decode()
        mac = hmac.new(self._key, data.encode(), hashlib.sha256).hexdigest()[:32]
        return f"gAAAA{data}.{mac}"

    def unseal(self, text: str) -> dict[str, Any] | None:
        if not text.startswith("gAAAA") or "." not in text:
            return None
        data, _, mac = text[5:].rpartition(".")
        good = hmac.new(self._key, data.encode(), hashlib.sha256).hexdigest()[:32]
        if not hmac.compare_digest(mac, good):
            return None
        try:
            payload = json.loads(base64.urlsafe_b64decode(data.encode()))
        except ValueError:
            return None
        return payload if isinstance(payload, dict) else None

    # -- serving -------------------------------------------------------------------------

    def __call__(self, request: Any) -> Any:
        self.calls += 1
        self._next_id += 1
        body = json.loads(request.content.decode("utf-8"))
        path = str(request.url.path)
        self.bodies.append(body)
        self.paths.append(path)
        req = Request.parse(body, path.endswith("/compact"))
        name = ""
        try:
            for rule in RULES:
                name = rule.name
                rule.check(self, req)
        except ApiError as error:
            self.errors.append({"rule": name, **error.body()["error"]})
            return self.http.Response(error.status, json=error.body())
        answer = self._compacted(req) if req.compact else self._response(req)
        if req.compact and self.rewrite_compact is not None:
            answer = self.rewrite_compact(answer)
        return self.http.Response(200, json=answer)

    def _id(self, prefix: str) -> str:
        return f"{prefix}_{self._next_id:06d}{random.Random(self._next_id).randrange(16**8):08x}"

    def _compaction_item(self, req: Request) -> dict[str, Any]:
        """A compaction item standing for everything the model sees on this request."""
        tasks = self._tasks_before(req) + sum(
            1 for item in req.seen if _kind(item) == "message" and item.get("role") == "user"
        )
        item_id = self._id("cmp")
        summary = min(2_000, max(200, req.rendered // 12))
        payload = {"k": "compaction", "id": item_id, "m": req.model, "n": summary, "t": tasks}
        item = {"id": item_id, "type": "compaction", "encrypted_content": self.seal(payload)}
        self.compactions.append(item)
        self.issued_at.append(len(self.bodies) - 1)
        return item

    def _tasks_before(self, req: Request) -> int:
        payload = req.sealed.get(req.start)
        return int(payload.get("t", 0)) if payload and payload.get("k") == "compaction" else 0

    def _usage(self, req: Request, rendered: int, output: int) -> dict[str, Any]:
        cached = min(req.cached, rendered)
        self.cache_read += cached
        self.input_total += rendered
        return {
            "input_tokens": rendered,
            "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": output,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": rendered + output,
        }

    def _compacted(self, req: Request) -> dict[str, Any]:
        """``responses.compact``: the retained user messages and one compaction item."""
        item = self._compaction_item(req)
        kept = [
            _output_message(m)
            for m in req.seen
            if _kind(m) == "message" and m.get("role") == "user"
        ]
        payload = self.unseal(item["encrypted_content"]) or {}
        return {
            "id": self._id("resp"),
            "object": "response.compaction",
            "created_at": int(self.now),
            "output": [*kept, item],
            "usage": self._usage(req, req.rendered, int(payload.get("n", 0))),
        }

    def _response(self, req: Request) -> dict[str, Any]:
        output: list[dict[str, Any]] = []
        threshold = self.threshold(req)
        if threshold is not None and req.rendered > threshold:
            item = self._compaction_item(req)
            output.append(item)
            # Inference continues on the compacted context: the item alone.
            req.items, req.start = [item], 0
            req.sealed = {0: self.unseal(item["encrypted_content"]) or {}}
            req.rendered = _rendered(req)
            req.cached = 0
        kind, value = self.agent.reply(req, self._next_id, self._tasks_before(req))
        include = req.body.get("include") or []
        reasoning_id = self._id("rs")
        reasoning: dict[str, Any] = {"id": reasoning_id, "type": "reasoning", "summary": []}
        if "reasoning.encrypted_content" in include:
            thought = ("Check what the last result says before acting. " * 40)[
                : self.agent.reasoning_chars
            ]
            reasoning["encrypted_content"] = self.seal(
                {"k": "reasoning", "id": reasoning_id, "m": req.model, "d": _digest(thought)[:16]}
            )
        output.append(reasoning)
        if kind == "call":
            output.append(
                {
                    "id": self._id("fc"),
                    "type": "function_call",
                    "call_id": self._id("call"),
                    "name": value,
                    "arguments": json.dumps({"path": f"src/module_{self._next_id % 40}.py"}),
                    "status": "completed",
                }
            )
        else:
            output.append(
                {
                    "id": self._id("msg"),
                    "type": "message",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": value, "annotations": []}],
                }
            )
        produced = sum(_tokens(item) for item in output)
        return {
            "id": self._id("resp"),
            "object": "response",
            "created_at": int(self.now),
            "status": "completed",
            "model": req.model,
            "output": output,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": req.body.get("tools") or [],
            "usage": self._usage(req, req.rendered, produced),
        }


def _output_message(item: Mapping[str, Any]) -> dict[str, Any]:
    """A retained user message as the output lists it (content as input_text parts)."""
    content = item.get("content")
    parts = [{"type": "input_text", "text": content}] if isinstance(content, str) else content
    return {"type": "message", "role": "user", "content": parts}


def fake_client(
    sdk: ModuleType, *, asynchronous: bool = False, **options: Any
) -> tuple[Any, FakeResponsesAPI]:
    """(``openai.OpenAI`` — ``AsyncOpenAI`` with ``asynchronous`` — over the fake, the fake)."""
    http = http_module(sdk)
    api = FakeResponsesAPI(http, **options)
    transport = http.MockTransport(api)
    if asynchronous:
        client = sdk.AsyncOpenAI(
            api_key="x", http_client=http.AsyncClient(transport=transport), max_retries=0
        )
    else:
        client = sdk.OpenAI(
            api_key="x", http_client=http.Client(transport=transport), max_retries=0
        )
    return client, api
