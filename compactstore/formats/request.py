"""The keyword arguments of a provider call, from the active context.

Pure (no database). :func:`build_request_params` builds them from fresh copies of every
message; ``Session.request_params()`` keeps the same result up to date step by step
(``compactstore._context.request_view``) with the helpers here (:func:`breakpoints`,
:func:`marked_block`, :func:`system_param`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from compactstore._context.caching import Ttl, place_breakpoints
from compactstore._context.incremental import CACHE_INDEX, CacheIndex, Scope
from compactstore.capabilities import (
    BINDING_BETA,
    COMPACTION_BETA,
    CONTEXT_MANAGEMENT_BETA,
    ModelCapabilities,
)
from compactstore.errors import InvalidInputError
from compactstore.formats.base import MessageFormat
from compactstore.formats.compaction import compaction_block

if TYPE_CHECKING:
    from compactstore._context.message import ContextMessage
    from compactstore.models import CompactionConfig

__all__ = [
    "CACHE_CONTROL",
    "breakpoints",
    "build_request_params",
    "cache_control_of",
    "clear_trigger",
    "marked_block",
    "session_fields",
    "system_param",
]

CACHE_CONTROL = {"type": "ephemeral"}
# Anthropic blocks that take no cache_control of their own.
_NO_CACHE_CONTROL = frozenset({"thinking", "redacted_thinking"})


def build_request_params(
    fmt: MessageFormat,
    config: Any,
    items: Sequence[ContextMessage],
    messages: list[dict[str, Any]],
    *,
    cache_control: bool,
    ttl: Ttl = "5m",
    min_tokens: int = 0,
    server_clear: int | None = None,
) -> dict[str, Any]:
    """``messages`` are fresh copies of ``items``' messages, in order; they are changed.

    Formats that take system messages as a parameter of their own get it; with
    ``cache_control`` (formats with prompt caching), the breakpoints
    :func:`compactstore._context.caching.plan_breakpoints` chooses, with ``ttl`` writes, none on
    a prefix under ``min_tokens``;
    ``server_clear``: the tool uses kept by the server-side ``clear_tool_uses`` edit that
    will clear in this request, whose moving edit point gets two."""
    key = fmt.request_key
    if key is None:
        raise InvalidInputError(f"format {fmt.name!r} messages go to no provider API as they are")
    if not fmt.system_parameter:
        return {key: fmt.wire_view(messages, config)}
    marks: list[int] = []
    if cache_control:
        marks = breakpoints(CACHE_INDEX.of(Scope(fmt, config), items), min_tokens, server_clear)
        # Text content as a block, on every message and every call: a breakpoint needs a
        # block, and a message whose bytes changed when its breakpoint moved on would make
        # the next call miss the cache from that message on.
        for index, message in enumerate(messages):
            content = message.get("content")
            if isinstance(content, str) and message.get("role") != "system":
                messages[index] = {**message, "content": [{"type": "text", "text": content}]}
    system_marked = False
    control = cache_control_of(ttl)
    for index in marks:
        if items[index].message.get("role") == "system":
            system_marked = True
        else:
            messages[index] = _with_breakpoint(messages[index], control)
    system = [m for m in messages if m.get("role") == "system"]
    rest = [m for m in messages if m.get("role") != "system"]
    params: dict[str, Any] = {}
    if system:
        params["system"] = system_param(system, control if system_marked else None)
    # A provider's compaction block goes first, in the first message (the provider's
    # placement rule), in place of everything it summarised: the pinned messages before it
    # were sent in the compaction request (the log keeps them).
    led = next((i for i, m in enumerate(rest) if compaction_block(m) is not None), None)
    if led:
        rest = rest[led:]
    params[key] = fmt.wire_view(rest, config)
    return params


def cache_control_of(ttl: Ttl) -> dict[str, str]:
    """The ``cache_control`` value of a breakpoint with ``ttl`` writes (5 minutes is the
    provider's default: no ``ttl`` key)."""
    return dict(CACHE_CONTROL) if ttl == "5m" else {**CACHE_CONTROL, "ttl": ttl}


def breakpoints(index: CacheIndex, min_tokens: int, server_clear: int | None) -> list[int]:
    """Indexes of the messages to mark (compactstore._context.caching.place_breakpoints), from the
    context's :class:`compactstore._context.incremental.CacheIndex`: the system prompt, the newest
    message, the last message of the previous request (the one before the newest assistant
    message), the last pinned message of the leading pinned run and the summary."""
    stable = [] if index.last_pinned is None else [index.last_pinned]
    stable.extend(index.summaries)
    last = index.last_assistant
    previous_tail = last - 1 if last else None
    if previous_tail is not None and previous_tail in index.system:
        previous_tail = None
    edit_marks: list[int] = []
    if server_clear:
        results = index.results
        # The edit clears all but the newest ``keep`` results: this call finds the prefix
        # before the (keep+1)-th newest as the previous call left it; the next one will
        # find the prefix before the keep-th newest as this one leaves it.
        for k in (server_clear + 1, server_clear):
            if len(results) >= k and results[-k] > 0:
                edit_marks.append(results[-k] - 1)
    return place_breakpoints(
        index.cumulative,
        edit_marks=edit_marks,
        system=index.system,
        stable=stable,
        previous_tail=previous_tail,
        min_tokens=min_tokens,
    )


def marked_block(message: Mapping[str, Any]) -> int | None:
    """The index in ``message``'s content list of the block a breakpoint goes on (the last
    one that takes ``cache_control``); None when the content is not a list or has none."""
    content = message.get("content")
    if isinstance(content, list):
        for index in range(len(content) - 1, -1, -1):
            block = content[index]
            if isinstance(block, dict) and block.get("type") not in _NO_CACHE_CONTROL:
                return index
    return None


def _with_breakpoint(message: dict[str, Any], control: dict[str, str]) -> dict[str, Any]:
    content = message.get("content")
    if isinstance(content, str):
        blocks = [{"type": "text", "text": content, "cache_control": dict(control)}]
        return {**message, "content": blocks}
    at = marked_block(message)
    if isinstance(content, list) and at is not None:
        new_content = list(content)
        new_content[at] = {**content[at], "cache_control": dict(control)}
        return {**message, "content": new_content}
    return message


def system_param(system: Sequence[Mapping[str, Any]], control: dict[str, str] | None) -> Any:
    """The ``system`` parameter: the system messages' text joined by blank lines, or their
    text blocks in order when any has blocks or a breakpoint (``control``) is wanted."""
    contents = [m.get("content") for m in system]
    if all(isinstance(c, str) for c in contents) and control is None:
        return "\n\n".join(str(c) for c in contents)
    blocks: list[dict[str, Any]] = []
    for content in contents:
        if isinstance(content, str):
            blocks.append({"type": "text", "text": content})
        elif isinstance(content, list):
            blocks.extend(b for b in content if isinstance(b, dict))
    if control is not None and blocks:
        blocks[-1] = {**blocks[-1], "cache_control": dict(control)}
    return blocks


def clear_trigger(context_window: int, config: CompactionConfig) -> int:
    """The input tokens from which the server-side ``clear_tool_uses`` edit clears."""
    return math.ceil(round(context_window * config.background_threshold, 6))


def session_fields(
    *,
    edit_policy: str,
    capabilities: ModelCapabilities,
    config: Any,
    context_window: int,
    drop_block: bool,
    thinking: Mapping[str, Any] | None,
    extra_headers: Mapping[str, str] | None,
    provider_compaction: bool = False,
) -> dict[str, Any]:
    """The Messages API fields a session needs besides its messages, merged with the
    caller's ``thinking`` and ``extra_headers``: keyword arguments ``messages.create`` and
    ``beta.messages.create`` both take (``thinking``, ``extra_headers``, ``extra_body``).

    - ``drop_block``: ``thinking.block_binding.prefix_mismatch_behavior: "drop_block"``
      with its beta header (adaptive thinking when the caller set none: the models that
      check prefixes think adaptively by default, so adding it changes nothing else).
    - ``append_only`` on a model with context editing: microcompact as the server-side
      ``clear_tool_uses_20250919`` edit (keep ``microcompact_keep_recent`` tool uses, from
      ``background_threshold`` of the window), after ``clear_thinking_20251015`` (keep the
      newest thinking turn) when ``preserved_thinking`` is off; in ``extra_body`` with its
      beta header.
    - ``provider_compaction`` (the messages start with a provider's compaction block): the
      on-demand compaction beta header.
    """
    fields: dict[str, Any] = {}
    betas: list[str] = [COMPACTION_BETA] if provider_compaction else []
    merged_thinking = None if thinking is None else dict(thinking)
    if drop_block:
        merged_thinking = merged_thinking or {"type": "adaptive"}
        binding = dict(merged_thinking.get("block_binding") or {})
        binding["prefix_mismatch_behavior"] = "drop_block"
        merged_thinking["block_binding"] = binding
        betas.append(BINDING_BETA)
    if merged_thinking is not None:
        fields["thinking"] = merged_thinking
    if edit_policy == "append_only" and capabilities.context_editing:
        edits: list[dict[str, Any]] = []
        if not config.preserved_thinking:
            edits.append(
                {"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 1}}
            )
        trigger = clear_trigger(context_window, config)
        edits.append(
            {
                "type": "clear_tool_uses_20250919",
                "trigger": {"type": "input_tokens", "value": trigger},
                "keep": {"type": "tool_uses", "value": config.microcompact_keep_recent},
            }
        )
        fields["extra_body"] = {"context_management": {"edits": edits}}
        betas.append(CONTEXT_MANAGEMENT_BETA)
    headers = dict(extra_headers or {})
    if betas:
        key = next((k for k in headers if k.lower() == "anthropic-beta"), "anthropic-beta")
        given = [b.strip() for b in str(headers.get(key, "")).split(",") if b.strip()]
        headers[key] = ",".join(given + [b for b in betas if b not in given])
    if headers:
        fields["extra_headers"] = headers
    return fields
