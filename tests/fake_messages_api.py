"""A strict fake of the Anthropic Messages API, served to the official SDK over a mocked
HTTP transport (see :mod:`tests.mock_http`): no network, the SDK's real code paths.

It follows the provider's documentation ("Preserved thinking", "Prefix checks", "Context
editing", "Prompt caching") closely enough that a request the real API would refuse for
the reasons below is refused here with the same status and error shape::

    {"type": "error", "error": {"type": "invalid_request_error", "message": ...},
     "request_id": "req_..."}

Its rules are :data:`RULES`, one list, each a named check with a short doc; tests in
``tests/test_fake_messages_api.py`` show each one refusing a violation. The model behind it
is scripted (:class:`CodingAgent`): a coding agent that thinks, calls tools for a while and
then answers. Time is a simulated clock (``FakeMessagesAPI.now``), for the cache TTLs.

Signatures are the fake's own: each thinking block it produces is signed (HMAC) over the
model, the thinking text, a hash of its prefix (``system``, ``tools`` and every earlier
message and block, thinking blocks and ``cache_control`` left out) and the ids of the
thinking blocks that prefix held. A later request passes the prefix check for a block
while that content hash is the same and the thinking blocks sent before it are the ones
it was produced after, less some from the start (removing thinking blocks from the start,
the end, or all of them is not a change; leaving one out between others is).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import itertools
import json
import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from tests.mock_http import http_module

__all__ = [
    "BINDING_BETA",
    "COMPACTION_BETA",
    "CONTEXT_MANAGEMENT_BETA",
    "PREFIX_CHECK_MODELS",
    "RULES",
    "THRESHOLD_COMPACTION_BETA",
    "ApiError",
    "CodingAgent",
    "FakeMessagesAPI",
    "Rule",
    "fake_client",
]

BINDING_BETA = "thinking-binding-controls-2026-08-01"
CONTEXT_MANAGEMENT_BETA = "context-management-2025-06-27"
COMPACTION_BETA = "compact-2026-09-04"  # on-demand compaction (top-level `compaction`)
THRESHOLD_COMPACTION_BETA = "compact-2026-01-12"  # the `compact_20260112` edit
# The models the "Prefix checks" page lists (dated ids start with these).
PREFIX_CHECK_MODELS = (
    "claude-fable-5-2",
    "claude-mythos-5-2",
    "claude-fable-5-1",
    "claude-mythos-5-1",
    "claude-opus-5-5",
    "claude-sonnet-5-5",
    "claude-haiku-5-5",
)
_THINKING = frozenset({"thinking", "redacted_thinking"})
_SECRET = b"fake-messages-api-signing-key"
_TTL = {"5m": 300.0, "1h": 3_600.0}
_MIN_CACHEABLE = 1_024
_MAX_BREAKPOINTS = 4
_CLEARED = "[cleared to save context]"


class ApiError(Exception):
    """A refusal: the HTTP status and the error body the API sends."""

    def __init__(self, status: int, kind: str, message: str):
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.message = message

    def body(self, request_id: str) -> dict[str, Any]:
        return {
            "type": "error",
            "error": {"type": self.kind, "message": self.message},
            "request_id": request_id,
        }


def _invalid(message: str) -> ApiError:
    return ApiError(400, "invalid_request_error", message)


def _typed(kind: str, message: str) -> ApiError:
    """A typed 400 of compaction (``error.type`` names the failure)."""
    return ApiError(400, kind, message)


# -- the request as the checks see it ----------------------------------------------------


def _blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def _plain(value: Any) -> Any:
    """A value with every ``cache_control`` key left out (not part of any prefix)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


# Keys whose values are no text the model reads (signatures are not counted either).
_UNCOUNTED = frozenset({"type", "id", "tool_use_id", "signature", "cache_control"})


def _tokens(value: Any) -> int:
    """The fake's tokenizer: a token per 3.5 characters of the text a value holds (strings
    and numbers, keys included, but no ids, types or signatures), plus 3 per block."""
    return math.ceil(_chars(value) / 3.5) + (3 if isinstance(value, dict) else 0)


def _chars(value: Any) -> int:
    if isinstance(value, dict):
        return sum(len(k) + _chars(v) for k, v in value.items() if k not in _UNCOUNTED)
    if isinstance(value, list):
        return sum(_chars(v) for v in value)
    return len(value) if isinstance(value, str) else len(str(value))


@dataclass
class Request:
    """One request body, with what the rules derive from it."""

    body: dict[str, Any]
    betas: frozenset[str]
    beta_endpoint: bool
    model: str = ""
    system: list[dict[str, Any]] = field(default_factory=list)
    tools: list[dict[str, Any]] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    # Filled by the rules: (message index, block index) of thinking blocks the API drops,
    # with the reason; the server-side edits applied; the usage of the cache.
    dropped: list[tuple[int, int, str]] = field(default_factory=list)
    applied_edits: list[dict[str, Any]] = field(default_factory=list)
    cleared: dict[tuple[int, int], int] = field(default_factory=dict)
    usage: dict[str, Any] = field(default_factory=dict)
    # Compaction: the message the API starts from (what came before a threshold block is
    # dropped), the threshold edit that fires on this request, if any.
    start: int = 0
    threshold: dict[str, Any] | None = None

    @property
    def compaction(self) -> dict[str, Any] | None:
        value = self.body.get("compaction")
        return value if isinstance(value, dict) else None

    @classmethod
    def parse(cls, body: dict[str, Any], betas: frozenset[str], path: str) -> Request:
        system = body.get("system")
        return cls(
            body=body,
            betas=betas,
            beta_endpoint="beta=true" in path,
            model=str(body.get("model", "")),
            system=_blocks(system) if system is not None else [],
            tools=list(body.get("tools") or []),
            messages=list(body.get("messages") or []),
        )

    @property
    def prefix_checks(self) -> bool:
        return self.model.startswith(PREFIX_CHECK_MODELS)

    @property
    def thinking(self) -> dict[str, Any]:
        thinking = self.body.get("thinking")
        return thinking if isinstance(thinking, dict) else {}

    @property
    def thinks(self) -> bool:
        """Whether the model thinks on this request: asked to, or by default (adaptive
        thinking on models with preserved thinking)."""
        kind = self.thinking.get("type")
        if kind is None:
            return self.prefix_checks
        return kind in ("enabled", "adaptive")

    @property
    def mismatch_behavior(self) -> str:
        binding = self.thinking.get("block_binding") or {}
        return str(binding.get("prefix_mismatch_behavior") or "error")

    def thinking_at(self) -> list[tuple[int, int, dict[str, Any]]]:
        return [
            (i, j, block)
            for i, message in enumerate(self.messages)
            if i >= self.start
            for j, block in enumerate(_blocks(message.get("content")))
            if block.get("type") in _THINKING
        ]

    def prefix(self, i: int, j: int) -> tuple[str, list[str]]:
        """The prefix of block (i, j): a hash chain over its content without thinking blocks
        and cache_control (system and tools, then one link per message), and the ids of the
        thinking blocks in it, in order. A valid compaction block stands for the messages it
        summarised: the chain goes on from the link it was signed over, and the thinking
        blocks before it are gone (as from the start)."""
        state = _digest([_plain(self.system), _plain(self.tools)])
        ids: list[str] = []
        for m, message in enumerate(self.messages[: i + 1]):
            blocks = _blocks(message.get("content"))
            if m == i:
                blocks = blocks[:j]
            kept: list[Any] = []
            for block in blocks:
                kind = block.get("type")
                if kind == "compaction":
                    state, ids, kept = str(_compaction_payload(block).get("s", "?")), [], []
                elif kind in _THINKING:
                    ids.append(_signed(block).get("id", "?"))
                else:
                    kept.append(_plain(block))
            if kept:
                state = _digest([state, [message.get("role"), kept]])
        return state, ids

    def compaction_blocks(self) -> list[tuple[int, int, dict[str, Any]]]:
        return [
            (i, j, block)
            for i, message in enumerate(self.messages)
            for j, block in enumerate(_blocks(message.get("content")))
            if block.get("type") == "compaction"
        ]


# -- signatures ---------------------------------------------------------------------------


def _sign(payload: dict[str, Any]) -> str:
    raw = base64.urlsafe_b64encode(json.dumps(payload, sort_keys=True).encode()).decode()
    mac = hmac.new(_SECRET, raw.encode(), hashlib.sha256).hexdigest()[:32]
    return f"{raw}.{mac}"


def _signed(block: Mapping[str, Any]) -> dict[str, Any]:
    """The payload of a block's signature (``data`` for a redacted block); {} when it is
    not one the fake issued or was altered."""
    token = block.get("signature") if block.get("type") == "thinking" else block.get("data")
    if not isinstance(token, str) or "." not in token:
        return {}
    raw, mac = token.rsplit(".", 1)
    good = hmac.new(_SECRET, raw.encode(), hashlib.sha256).hexdigest()[:32]
    if not hmac.compare_digest(mac, good):
        return {}
    try:
        payload = json.loads(base64.urlsafe_b64decode(raw.encode()))
    except ValueError:
        return {}
    return payload if isinstance(payload, dict) else {}


def _compaction_fields(block: Mapping[str, Any]) -> dict[str, Any]:
    """What a compaction block's signature covers: every field but the signature itself
    and ``cache_control`` (the block is sent back byte-identical, a breakpoint aside)."""
    return {
        k: v for k, v in block.items() if k not in ("signature", "cache_control") and v is not None
    }


def _compaction_payload(block: Mapping[str, Any]) -> dict[str, Any]:
    """The payload of a compaction block's signature; {} when the fake did not issue it or
    any signed field changed."""
    token = block.get("signature")
    if not isinstance(token, str) or "." not in token:
        return {}
    payload = _signed({"type": "thinking", "signature": token})
    if payload.get("k") not in ("summarize", "threshold"):
        return {}
    if payload.get("f") != _digest(_compaction_fields(block))[:24]:
        return {}
    return payload


# -- the rules ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """One rule of the fake: a name, what it enforces, and the check (raises ApiError, or
    records what the API does to the request: drops, edits, cache usage)."""

    name: str
    doc: str
    check: Callable[[FakeMessagesAPI, Request], None]


def _check_roles(api: FakeMessagesAPI, req: Request) -> None:
    if not req.messages:
        raise _invalid("messages: at least one message is required")
    for i, message in enumerate(req.messages):
        if message.get("role") not in ("user", "assistant"):
            raise _invalid(f"messages.{i}.role: Input should be 'user' or 'assistant'")
    first = _blocks(req.messages[0].get("content"))[:1]
    led = bool(first) and first[0].get("type") == "compaction"
    if req.messages[0].get("role") != "user" and not led:
        raise _invalid('messages: first message must use the "user" role')


def _check_beta_fields(api: FakeMessagesAPI, req: Request) -> None:
    if "block_binding" in req.thinking and BINDING_BETA not in req.betas:
        raise _invalid(
            f"thinking.block_binding: this field requires the beta header "
            f"'anthropic-beta: {BINDING_BETA}'"
        )
    clears = [
        edit
        for edit in (req.body.get("context_management") or {}).get("edits") or ()
        if isinstance(edit, dict) and edit.get("type") != "compact_20260112"
    ]
    if clears and CONTEXT_MANAGEMENT_BETA not in req.betas:
        raise _invalid(
            f"context_management: this field requires the beta header "
            f"'anthropic-beta: {CONTEXT_MANAGEMENT_BETA}'"
        )
    behavior = req.mismatch_behavior
    if behavior not in ("error", "drop_block"):
        raise _invalid(
            "thinking.block_binding.prefix_mismatch_behavior: Input should be 'error' or "
            f"'drop_block', got {behavior!r}"
        )


def _entry(message: Mapping[str, Any]) -> str:
    """A short digest of a message as the prefix chain links it (thinking left out)."""
    blocks = [_plain(b) for b in _blocks(message.get("content")) if b.get("type") not in _THINKING]
    return _digest([message.get("role"), blocks])[:16]


def _check_compaction_beta(api: FakeMessagesAPI, req: Request) -> None:
    config = req.compaction
    if "compaction" in req.body and config is None:
        raise _invalid("compaction: Input should be an object")
    blocks = req.compaction_blocks()
    if (config is not None or blocks) and not req.betas & {
        COMPACTION_BETA,
        THRESHOLD_COMPACTION_BETA,
    }:
        what = "compaction" if config is not None else "messages: a `compaction` block"
        raise _invalid(f"{what}: this requires the beta header 'anthropic-beta: {COMPACTION_BETA}'")
    if config is None:
        return
    if config.get("type") != "summarize":
        raise _invalid(f"compaction.type: Input should be 'summarize', got {config.get('type')!r}")
    if COMPACTION_BETA not in req.betas:
        raise _invalid(
            f"compaction: this field requires the beta header 'anthropic-beta: {COMPACTION_BETA}'"
        )
    if req.body.get("context_management") is not None:
        raise _invalid("compaction: cannot be combined with `context_management`")


def _check_compaction_placement(api: FakeMessagesAPI, req: Request) -> None:
    blocks = req.compaction_blocks()
    if len(blocks) > 1:
        raise _typed(
            "compaction_block_misplaced",
            f"messages: found {len(blocks)} `compaction` blocks; a request holds at most one, "
            "the newest (leave out the earlier ones with what they summarised)",
        )
    for i, j, block in blocks:
        kind = _compaction_payload(block).get("k")
        if j != 0:
            raise _typed(
                "compaction_block_misplaced",
                f"messages.{i}.content.{j}: a `compaction` block must be the first block of "
                "its message",
            )
        if kind == "threshold" and req.messages[i].get("role") != "assistant":
            raise _typed(
                "compaction_block_misplaced",
                f"messages.{i}: a `compaction` block from a response belongs at the start of "
                "that assistant message",
            )
        if kind != "threshold" and i != 0:
            raise _typed(
                "compaction_block_misplaced",
                f"messages.{i}.content.0: a `compaction` block goes first, in the first "
                "message, in place of the messages it summarises",
            )
        req.start = i


def _check_compaction_signature(api: FakeMessagesAPI, req: Request) -> None:
    for i, j, block in req.compaction_blocks():
        payload = _compaction_payload(block)
        if not payload:
            raise _typed(
                "compaction_signature_invalid",
                f"messages.{i}.content.{j}: Invalid `signature` in `compaction` block: send "
                "the block back exactly as it was returned",
            )
        if payload.get("m") != req.model:
            raise _typed(
                "compaction_signature_invalid",
                f"messages.{i}.content.{j}: this `compaction` block was produced by "
                f"{payload.get('m')} and cannot be read by {req.model}",
            )


def _check_compaction_content(api: FakeMessagesAPI, req: Request) -> None:
    for i, _, block in req.compaction_blocks():
        summarised = list(_compaction_payload(block).get("e", []))
        after = [_entry(m) for m in req.messages[i + 1 : i + 1 + len(summarised)]]
        if summarised and after == summarised:
            raise _typed(
                "compaction_content_mismatch",
                f"messages.{i + 1}: the messages a `compaction` block summarised are sent "
                "again after it; send the block in their place",
            )


def _check_compaction_request(api: FakeMessagesAPI, req: Request) -> None:
    if req.compaction is None:
        return
    rest = [
        b
        for m in req.messages[req.start :]
        for b in _blocks(m.get("content"))
        if b.get("type") != "compaction"
    ]
    if not rest:
        raise _typed(
            "compaction_nothing_to_summarize",
            "messages: nothing to summarise after the `compaction` block",
        )
    last = req.messages[-1]
    if last.get("role") == "assistant" and any(
        b.get("type") == "tool_use" for b in _blocks(last.get("content"))
    ):
        raise _invalid(
            f"messages.{len(req.messages) - 1}: a compaction request must not end with tool "
            "calls that have no results; cut where every call and its result are on one side"
        )
    if api.unavailable > 0:
        api.unavailable -= 1
        raise ApiError(529, "compaction_unavailable", "Compaction is temporarily unavailable.")


def _check_pairing(api: FakeMessagesAPI, req: Request) -> None:
    messages = req.messages
    for i, message in enumerate(messages):
        blocks = _blocks(message.get("content"))
        if message.get("role") == "assistant":
            ids = [b.get("id") for b in blocks if b.get("type") == "tool_use"]
            if not ids:
                continue
            after = _blocks(messages[i + 1].get("content")) if i + 1 < len(messages) else []
            answered = {b.get("tool_use_id") for b in after if b.get("type") == "tool_result"}
            missing = [str(x) for x in ids if x not in answered]
            if missing and i + 1 < len(messages):
                raise _invalid(
                    f"messages.{i}: `tool_use` ids were found without `tool_result` blocks "
                    f"immediately after: {', '.join(missing)}. Each `tool_use` block must "
                    "have a corresponding `tool_result` block in the next message."
                )
            continue
        previous = _blocks(messages[i - 1].get("content")) if i else []
        called = {b.get("id") for b in previous if b.get("type") == "tool_use"}
        seen_other = False
        for j, block in enumerate(blocks):
            if block.get("type") != "tool_result":
                seen_other = True
                continue
            if block.get("tool_use_id") not in called:
                raise _invalid(
                    f"messages.{i}.content.{j}: unexpected `tool_use_id` found in "
                    f"`tool_result` blocks: {block.get('tool_use_id')}. Each `tool_result` "
                    "block must have a corresponding `tool_use` block in the previous message."
                )
            if seen_other:
                raise _invalid(
                    f"messages.{i}.content.{j}: `tool_result` blocks must come first in the "
                    "user message that answers tool calls"
                )


def _check_signatures(api: FakeMessagesAPI, req: Request) -> None:
    for i, j, block in req.thinking_at():
        payload = _signed(block)
        kind = block.get("type")
        text = block.get("thinking") if kind == "thinking" else None
        if not payload or (
            kind == "thinking" and payload.get("d") != _digest(text)[:16]  # text edited
        ):
            raise _invalid(f"messages.{i}.content.{j}: Invalid `signature` in `{kind}` block")


def _check_prefix(api: FakeMessagesAPI, req: Request) -> None:
    if not req.prefix_checks:
        return
    failed = False
    for i, j, block in req.thinking_at():
        if not failed:
            payload = _signed(block)
            content, ids = req.prefix(i, j)
            then = list(payload.get("t", []))
            suffix = not ids or then[len(then) - len(ids) :] == ids
            failed = payload.get("p") != content or not suffix
        if not failed:
            continue
        if req.mismatch_behavior != "drop_block":
            raise _invalid(
                f"messages.{i}.content.{j}: Invalid `signature` in `{block.get('type')}` "
                "block. The block is bound to a different conversation. Remove the block, "
                'or set `thinking.block_binding.prefix_mismatch_behavior` to "drop_block".'
            )
        req.dropped.append((i, j, "prefix_binding_mismatch"))


def _check_continuation(api: FakeMessagesAPI, req: Request) -> None:
    if not req.thinks or len(req.messages) < 2 or req.compaction is not None:
        return  # a compaction request samples nothing: no turn is continued
    last = req.messages[-1]
    blocks = _blocks(last.get("content"))
    if last.get("role") != "user" or not any(b.get("type") == "tool_result" for b in blocks):
        return
    i = len(req.messages) - 2
    first = [b for b in _blocks(req.messages[i].get("content")) if b.get("type") != "compaction"]
    first = first[:1]
    found = first[0].get("type") if first else "nothing"
    if found not in _THINKING:
        raise _invalid(
            f"messages.{i}.content.0.type: Expected `thinking` or `redacted_thinking`, but "
            f"found `{found}`. When `thinking` is enabled, a final `assistant` message must "
            "start with a thinking block (preceeding the lastmost set of `tool_use` and "
            "`tool_result` blocks). We recommend you include thinking blocks from previous "
            "turns."
        )


def _check_context_management(api: FakeMessagesAPI, req: Request) -> None:
    config = req.body.get("context_management")
    if config is None:
        return
    edits = config.get("edits") if isinstance(config, dict) else None
    if not isinstance(edits, list):
        raise _invalid("context_management.edits: Field required")
    kinds = [e.get("type") for e in edits if isinstance(e, dict)]
    for n, kind in enumerate(kinds):
        if kind not in ("clear_tool_uses_20250919", "clear_thinking_20251015", "compact_20260112"):
            raise _invalid(f"context_management.edits.{n}.type: unknown edit type {kind!r}")
        if kind == "clear_thinking_20251015" and n != 0:
            raise _invalid(
                "context_management.edits: `clear_thinking_20251015` must be the first edit"
            )
    for edit in edits:
        if edit.get("type") == "clear_tool_uses_20250919":
            _clear_tool_uses(req, edit)
    for edit in edits:
        if edit.get("type") == "compact_20260112":
            if THRESHOLD_COMPACTION_BETA not in req.betas:
                raise _invalid(
                    "context_management.edits: `compact_20260112` requires the beta header "
                    f"'anthropic-beta: {THRESHOLD_COMPACTION_BETA}'"
                )
            trigger = int((edit.get("trigger") or {}).get("value") or 150_000)
            if _input_tokens(req) >= trigger:
                req.threshold = edit


def _clear_tool_uses(req: Request, edit: dict[str, Any]) -> None:
    """Applied server-side, on what is left after the drops: the oldest tool results are
    replaced by a placeholder, keeping the ``keep`` newest, once input passes ``trigger``."""
    trigger = int((edit.get("trigger") or {}).get("value", 100_000))
    keep = int((edit.get("keep") or {}).get("value", 3))
    exclude = set(edit.get("exclude_tools") or ())
    if _input_tokens(req) <= trigger:
        return
    names = {
        b.get("id"): b.get("name")
        for m in req.messages
        for b in _blocks(m.get("content"))
        if b.get("type") == "tool_use"
    }
    results = [
        (i, j, block)
        for i, message in enumerate(req.messages)
        for j, block in enumerate(_blocks(message.get("content")))
        if block.get("type") == "tool_result" and names.get(block.get("tool_use_id")) not in exclude
    ]
    clear = results[: max(0, len(results) - keep)]
    freed = 0
    for i, j, block in clear:
        if (i, j) in req.cleared or block.get("content") == _CLEARED:
            continue
        before = _tokens(block)
        req.cleared[(i, j)] = before - _tokens({**block, "content": _CLEARED})
        freed += req.cleared[(i, j)]
    if req.cleared:
        req.applied_edits.append(
            {
                "type": "clear_tool_uses_20250919",
                "cleared_tool_uses": len(req.cleared),
                "cleared_input_tokens": freed,
            }
        )


def _input_tokens(req: Request) -> int:
    dropped = {(i, j) for i, j, _ in req.dropped}
    total = _tokens(req.system) + _tokens(req.tools)
    for i, message in enumerate(req.messages):
        if i < req.start:
            continue  # before a threshold compaction block: dropped by the API
        for j, block in enumerate(_blocks(message.get("content"))):
            if (i, j) in dropped:
                continue
            if block.get("type") in _THINKING and not req.prefix_checks:
                continue  # older models: earlier turns' thinking is not counted
            total += _tokens(block) - req.cleared.get((i, j), 0)
    return total


def _check_window(api: FakeMessagesAPI, req: Request) -> None:
    window = api.context_window(req.model)
    size = _input_tokens(req)
    max_tokens = int(req.body.get("max_tokens") or 0)
    if size + max_tokens > window:
        raise _invalid(f"prompt is too long: {size} tokens > {window - max_tokens} maximum")


def _check_cache(api: FakeMessagesAPI, req: Request) -> None:
    """Breakpoints in order tools, system, messages; at most four; a longer TTL never
    after a shorter one. The longest prefix ending at a breakpoint that is cached (and not
    expired) is read; the rest up to the last breakpoint is written with that breakpoint's
    TTL; each read refreshes the entry's expiry."""
    units: list[tuple[Any, int, str | None]] = []  # (identity, tokens, ttl at a breakpoint)
    dropped = {(i, j) for i, j, _ in req.dropped}
    for tool in req.tools:
        units.append((_plain(tool), _tokens(tool), _ttl(tool)))
    for block in req.system:
        units.append((_plain(block), _tokens(block), _ttl(block)))
    for i, message in enumerate(req.messages):
        if i < req.start:
            continue
        for j, block in enumerate(_blocks(message.get("content"))):
            if (i, j) in dropped or (block.get("type") in _THINKING and not req.prefix_checks):
                continue
            content = _CLEARED if (i, j) in req.cleared else None
            plain = _plain(block) if content is None else {**_plain(block), "content": content}
            units.append(([message.get("role"), plain], _tokens(plain), _ttl(block)))
    marks = [n for n, unit in enumerate(units) if unit[2] is not None]
    if len(marks) > _MAX_BREAKPOINTS:
        raise _invalid(
            f"A maximum of {_MAX_BREAKPOINTS} blocks with cache_control may be provided. "
            f"Found {len(marks)}."
        )
    ttls = [units[n][2] for n in marks]
    for a, b in itertools.pairwise(ttls):
        if a == "5m" and b == "1h":
            raise _invalid(
                "cache_control: a breakpoint with ttl='1h' must not come after one with ttl='5m'"
            )
    running, hashes, total = hashlib.sha256(), [], 0
    cumulative = []
    for identity, tokens, _ in units:
        running.update(json.dumps(identity, sort_keys=True).encode())
        hashes.append(running.hexdigest())
        total += tokens
        cumulative.append(total)
    now = api.now
    read_at = -1
    for n in reversed(marks):
        expiry = api.cache.get(hashes[n])
        if expiry is not None and expiry[0] > now:
            read_at = n
            api.cache[hashes[n]] = (now + expiry[1], expiry[1])
            break
    read = cumulative[read_at] if read_at >= 0 else 0
    written = {"5m": 0, "1h": 0}
    last = read_at
    for n in marks:
        if n <= read_at or cumulative[n] < _MIN_CACHEABLE:
            continue
        ttl = str(units[n][2])
        api.cache[hashes[n]] = (now + _TTL[ttl], _TTL[ttl])
        written[ttl] += cumulative[n] - (cumulative[last] if last >= 0 else 0)
        last = n
    size = cumulative[-1] if cumulative else 0
    req.usage = {
        "input_tokens": max(0, size - read - written["5m"] - written["1h"]),
        "cache_read_input_tokens": read,
        "cache_creation_input_tokens": written["5m"] + written["1h"],
        "cache_creation": {
            "ephemeral_5m_input_tokens": written["5m"],
            "ephemeral_1h_input_tokens": written["1h"],
        },
    }


def _ttl(block: Any) -> str | None:
    control = block.get("cache_control") if isinstance(block, dict) else None
    if not isinstance(control, dict):
        return None
    ttl = control.get("ttl", "5m")
    if ttl not in _TTL:
        raise _invalid(f"cache_control.ttl: Input should be '5m' or '1h', got {ttl!r}")
    return str(ttl)


# The rules, in the order the API applies them.
RULES: tuple[Rule, ...] = (
    Rule(
        "roles",
        "Messages alternate user/assistant roles only, the first from the user.",
        _check_roles,
    ),
    Rule(
        "beta_fields",
        "thinking.block_binding needs the thinking-binding-controls beta header and "
        "context_management the context-management one; prefix_mismatch_behavior is "
        "'error' or 'drop_block'.",
        _check_beta_fields,
    ),
    Rule(
        "compaction_beta",
        "A top-level `compaction` (type 'summarize') or a `compaction` block needs the "
        "compact-2026-09-04 beta header (compact-2026-01-12 for a threshold block); "
        "`compaction` is not combined with `context_management`.",
        _check_compaction_beta,
    ),
    Rule(
        "compaction_placement",
        "At most one `compaction` block per request, the first block of its message: an "
        "on-demand block in the first message, a threshold block at the start of the "
        "assistant message that returned it (the API drops what came before it); else 400 "
        "compaction_block_misplaced.",
        _check_compaction_placement,
    ),
    Rule(
        "compaction_signature",
        "A `compaction` block is sent back byte-identical (cache_control aside), signed by the "
        "API for this model: else 400 compaction_signature_invalid.",
        _check_compaction_signature,
    ),
    Rule(
        "compaction_content",
        "The messages a `compaction` block summarised are not sent again after it: else 400 "
        "compaction_content_mismatch.",
        _check_compaction_content,
    ),
    Rule(
        "compaction_request",
        "A compaction request has something to summarise besides a block (else 400 "
        "compaction_nothing_to_summarize) and no open tool call at its end; 529 "
        "compaction_unavailable while the service is down.",
        _check_compaction_request,
    ),
    Rule(
        "tool_pairing",
        "Every tool_use is answered by a tool_result in the next (user) message, every "
        "tool_result answers a tool_use of the message before, results first.",
        _check_pairing,
    ),
    Rule(
        "signature",
        "A thinking block's signature is one the API issued, over this very text.",
        _check_signatures,
    ),
    Rule(
        "prefix_check",
        "Models with preserved thinking: a thinking block whose prefix (system, tools, "
        "earlier messages and blocks, without cache_control) changed since it was produced "
        "is invalid with every later one: 400 'bound to a different conversation', or with "
        "prefix_mismatch_behavior 'drop_block' dropped and listed in input_transformations.",
        _check_prefix,
    ),
    Rule(
        "thinking_continuation",
        "With thinking on, a tool-use continuation's final assistant message starts with "
        "its thinking block (not on a compaction request, which continues no turn).",
        _check_continuation,
    ),
    Rule(
        "context_management",
        "Server-side edits: known types, clear_thinking first; clear_tool_uses clears the "
        "oldest tool results past its trigger, keeps the newest `keep`, and is reported in "
        "context_management.applied_edits.",
        _check_context_management,
    ),
    Rule(
        "context_window",
        "The input (after drops and server-side edits) plus max_tokens fits the window: "
        "else 400 'prompt is too long'.",
        _check_window,
    ),
    Rule(
        "prompt_cache",
        "At most four cache_control breakpoints, 1h before 5m; cache reads and writes "
        "(5-minute and 1-hour TTLs, on the simulated clock) reported in usage.",
        _check_cache,
    ),
)


# -- the scripted model -------------------------------------------------------------------


class CodingAgent:
    """A coding agent: on each new task it works through a tool loop of 3-12 calls
    (reads, searches, test runs), thinking before each, then answers. Deterministic."""

    tools = ("read_file", "grep", "run_tests", "edit_file")

    def __init__(self, seed: int = 7, thinking_chars: int = 600):
        self.seed = seed
        self.thinking_chars = thinking_chars

    def reply(self, req: Request, serial: int) -> tuple[list[dict[str, Any]], str]:
        """(content without thinking, stop_reason); ``serial`` numbers the call."""
        task = sum(
            1
            for m in req.messages
            if m.get("role") == "user"
            and not any(b.get("type") == "tool_result" for b in _blocks(m.get("content")))
        )
        done = 0
        for m in reversed(req.messages):
            blocks = _blocks(m.get("content"))
            if m.get("role") == "user" and not any(b.get("type") == "tool_result" for b in blocks):
                break
            done += m.get("role") == "assistant"
        rng = random.Random(self.seed * 1_000 + task)
        length = rng.randint(3, 12)
        offered = [str(t.get("name")) for t in req.tools] or list(self.tools)
        if done >= length:
            text = f"Task {task} done: {length} steps, the failing cases are fixed."
            return [{"type": "text", "text": text}], "end_turn"
        name = offered[(task + done) % len(offered)]
        call = {
            "type": "tool_use",
            "id": f"toolu_{serial:06d}_{done:02d}",
            "name": name,
            "input": {"path": f"src/module_{(task * 7 + done) % 40}.py"},
        }
        return [call], "tool_use"

    def thought(self, req: Request) -> str:
        base = f"Step {len(req.messages)}: check what the last result says before acting. "
        return (base * (self.thinking_chars // len(base) + 1))[: self.thinking_chars]


# -- the API ------------------------------------------------------------------------------


class FakeMessagesAPI:
    """A mock transport handler for ``POST /v1/messages``: applies :data:`RULES`, answers
    from the scripted model, and counts what happened (``calls``, ``errors``, ``dropped``)."""

    def __init__(
        self,
        http: ModuleType,
        *,
        agent: CodingAgent | None = None,
        windows: Mapping[str, int] | None = None,
        default_window: int = 200_000,
        start: float = 1_790_000_000.0,
    ):
        self.http = http
        self.agent = agent or CodingAgent()
        self.windows = dict(windows or {})
        self.default_window = default_window
        self.now = start
        self.cache: dict[str, tuple[float, float]] = {}  # prefix hash -> (expiry, ttl)
        self.calls = 0
        self.errors: list[dict[str, Any]] = []
        self.dropped = 0
        self.applied_edits: list[dict[str, Any]] = []
        self.bodies: list[dict[str, Any]] = []
        self.cache_read = 0  # input tokens read from the cache, over every call
        self.input_total = 0  # input tokens (read, written and not cached), over every call
        self.unavailable = 0  # compaction requests still to answer 529 compaction_unavailable
        # Stop reasons of the next compaction requests to fail as documented: 200, no content.
        self.compaction_failures: list[str] = []
        self.compactions: list[dict[str, Any]] = []  # the compaction blocks issued
        self._next_id = 0

    def context_window(self, model: str) -> int:
        for prefix, window in self.windows.items():
            if model.startswith(prefix):
                return window
        return self.default_window

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def __call__(self, request: Any) -> Any:
        self.calls += 1
        self._next_id += 1
        request_id = f"req_fake{self._next_id:06d}"
        body = json.loads(request.content.decode("utf-8"))
        self.bodies.append(body)
        betas = frozenset(
            beta.strip()
            for value in request.headers.get_list("anthropic-beta")
            for beta in value.split(",")
            if beta.strip()
        )
        req = Request.parse(body, betas, str(request.url))
        name = ""
        try:
            for rule in RULES:
                name = rule.name
                rule.check(self, req)
        except ApiError as error:
            self.errors.append({"rule": name, **error.body(request_id)["error"]})
            return self.http.Response(error.status, json=error.body(request_id))
        return self.http.Response(200, json=self._message(req, request_id))

    def _message(self, req: Request, request_id: str) -> dict[str, Any]:
        if req.compaction is not None:
            return self._compacted(req)
        compaction: dict[str, Any] | None = None
        if req.threshold is not None:
            compaction = self._compaction_block(req, "threshold", req.threshold.get("instructions"))
            if req.threshold.get("pause_after_compaction"):
                return self._envelope(
                    req, [compaction], "compaction", self._iterations(req, [compaction])
                )
        content, stop = self.agent.reply(req, self._next_id)
        if req.thinks:
            text = self.agent.thought(req)
            content = [self._thinking(req, text, compaction), *content]
        if compaction is not None:
            content = [compaction, *content]
        self.dropped += len(req.dropped)
        self.applied_edits.extend(req.applied_edits)
        self.cache_read += int(req.usage["cache_read_input_tokens"])
        self.input_total += sum(
            int(req.usage[k])
            for k in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
        )
        iterations = None
        usage = dict(req.usage)
        if compaction is not None:
            iterations = self._iterations(req, [compaction])
            # The sampling ran on the compacted context: the block and what follows.
            after = _tokens(req.system) + _tokens(req.tools) + _tokens(compaction)
            usage = {**_no_usage(), "input_tokens": after}
            iterations.append({"type": "message", **usage, "output_tokens": 0})
        message = self._envelope(req, content, stop, iterations, usage)
        if req.dropped:
            message["input_transformations"] = [
                {"type": "thinking_dropped", "path": f"messages.{i}.content.{j}", "reason": why}
                for i, j, why in req.dropped
            ]
        if req.body.get("context_management") is not None:
            message["context_management"] = {"applied_edits": req.applied_edits}
        return message

    def _envelope(
        self,
        req: Request,
        content: list[dict[str, Any]],
        stop: str,
        iterations: list[dict[str, Any]] | None,
        usage: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        output = sum(_tokens(block) for block in content)
        body_usage: dict[str, Any] = {**(usage if usage is not None else _no_usage())}
        body_usage["output_tokens"] = output if usage is not None else 0
        if iterations is not None:
            if iterations and iterations[-1]["type"] == "message":
                iterations[-1]["output_tokens"] = output - sum(
                    _tokens(b) for b in content if b.get("type") == "compaction"
                )
            body_usage["iterations"] = iterations
        return {
            "id": f"msg_fake{self._next_id:06d}",
            "type": "message",
            "role": "assistant",
            "model": req.model,
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": body_usage,
        }

    def _compacted(self, req: Request) -> dict[str, Any]:
        """The answer to an on-demand compaction request: the block alone, or a documented
        failure (200, no content, another stop reason)."""
        if self.compaction_failures:
            return self._envelope(req, [], self.compaction_failures.pop(0), None)
        config = req.compaction or {}
        block = self._compaction_block(req, "summarize", config.get("instructions"))
        self.cache_read += int(req.usage["cache_read_input_tokens"])
        return self._envelope(req, [block], "compaction", self._iterations(req, [block]))

    def _iterations(self, req: Request, blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The compaction's own billed usage: it read the whole request, wrote the summary."""
        return [
            {
                "type": "compaction",
                **{k: req.usage[k] for k in _no_usage()},
                "output_tokens": sum(_tokens(b) for b in blocks),
            }
        ]

    def _compaction_block(self, req: Request, kind: str, instructions: Any) -> dict[str, Any]:
        """A signed compaction block over the messages the API sees on this request."""
        seen = req.messages[req.start :]
        tasks = sum(
            1
            for m in seen
            if m.get("role") == "user"
            and not any(b.get("type") == "tool_result" for b in _blocks(m.get("content")))
        )
        calls = [
            f"{b.get('name')}({json.dumps(b.get('input'), sort_keys=True)})"
            for m in seen
            for b in _blocks(m.get("content"))
            if b.get("type") == "tool_use"
        ]
        text = (
            f"<summary>Summary of {len(seen)} messages: {tasks} task(s) from the user, "
            f"{len(calls)} tool call(s)"
            + (f", the last ones {', '.join(calls[-3:])}" if calls else "")
            + "."
            + (f" Following: {str(instructions).strip()[:120]}" if instructions else "")
            + "</summary>"
        )
        state, _ = req.prefix(len(req.messages), 0)
        fields = {"type": "compaction", "content": text}
        self.compactions.append(fields)
        payload = {
            "k": kind,
            "id": f"cmp_{self._next_id:06d}",
            "m": req.model,
            "s": state,
            "e": [_entry(m) for m in seen[:2] if m.get("content")] if kind == "summarize" else [],
            "f": _digest(fields)[:24],
        }
        return {**fields, "signature": _sign(payload)}

    def _thinking(
        self, req: Request, text: str, compaction: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """A thinking block signed over its prefix: the whole request as sent, or the
        compaction block this very response starts with."""
        ids: list[str]
        if compaction is not None:
            content, ids = str(_compaction_payload(compaction).get("s")), []
        else:
            content, ids = req.prefix(len(req.messages), 0)
        block_id = f"th_{self._next_id:06d}"
        payload = {"id": block_id, "m": req.model, "p": content, "t": ids, "d": _digest(text)[:16]}
        return {"type": "thinking", "thinking": text, "signature": _sign(payload)}


def _no_usage() -> dict[str, Any]:
    return {
        "input_tokens": 0,
        "cache_read_input_tokens": 0,
        "cache_creation_input_tokens": 0,
        "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0},
    }


def fake_client(sdk: ModuleType, **options: Any) -> tuple[Any, FakeMessagesAPI]:
    """(anthropic.Anthropic over the fake, the fake)."""
    http = http_module(sdk)
    api = FakeMessagesAPI(http, **options)
    client = sdk.Anthropic(
        api_key="x",
        http_client=http.Client(transport=http.MockTransport(api)),
        max_retries=0,
    )
    return client, api
