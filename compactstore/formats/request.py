"""The keyword arguments of a provider call, from the active context (SPEC §9.4).

``Session.request_params()`` calls :func:`build_request_params`; pure (no database).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from compactstore.capabilities import (
    BINDING_BETA,
    COMPACTION_BETA,
    CONTEXT_MANAGEMENT_BETA,
    ModelCapabilities,
)
from compactstore.formats.base import MessageFormat
from compactstore.providers import compaction_block

if TYPE_CHECKING:
    from compactstore.context import ContextMessage

__all__ = ["CACHE_CONTROL", "build_request_params", "session_fields"]

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
) -> dict[str, Any]:
    """``messages`` are fresh copies of ``items``' messages, in order; they are changed."""
    if fmt.name == "openai":
        return {"messages": fmt.wire_view(messages, config)}
    if fmt.name == "responses":
        return {"input": fmt.wire_view(messages, config)}
    if cache_control:
        for index in _breakpoints(items):
            messages[index] = _with_breakpoint(messages[index])
    system = [m for m in messages if m.get("role") == "system"]
    rest = [m for m in messages if m.get("role") != "system"]
    params: dict[str, Any] = {}
    if system:
        params["system"] = _system(system, cache_control=cache_control)
    # A provider's compaction block goes first, in the first message (the provider's
    # placement rule), in place of everything it summarised: the pinned messages before it
    # were sent in the compaction request (the log keeps them).
    led = next((i for i, m in enumerate(rest) if compaction_block(m) is not None), None)
    if led:
        rest = rest[led:]
    params["messages"] = fmt.wire_view(rest, config)
    return params


def _breakpoints(items: Sequence[ContextMessage]) -> list[int]:
    """Indexes of the last pinned message of the leading pinned run (system prompt left
    out: it gets its own breakpoint) and of the summary."""
    marks: list[int] = []
    last_pinned: int | None = None
    for index, item in enumerate(items):
        if item.state != "pinned":
            break
        if item.message.get("role") != "system":
            last_pinned = index
    if last_pinned is not None:
        marks.append(last_pinned)
    marks.extend(index for index, item in enumerate(items) if item.state == "summary")
    return marks


def _with_breakpoint(message: dict[str, Any]) -> dict[str, Any]:
    content = message.get("content")
    if isinstance(content, str):
        blocks = [{"type": "text", "text": content, "cache_control": dict(CACHE_CONTROL)}]
        return {**message, "content": blocks}
    if isinstance(content, list):
        for index in range(len(content) - 1, -1, -1):
            block = content[index]
            if isinstance(block, dict) and block.get("type") not in _NO_CACHE_CONTROL:
                new_content = list(content)
                new_content[index] = {**block, "cache_control": dict(CACHE_CONTROL)}
                return {**message, "content": new_content}
    return message


def _system(system: list[dict[str, Any]], *, cache_control: bool) -> Any:
    """The ``system`` parameter: the system messages' text joined by blank lines, or their
    text blocks in order when any has blocks or a breakpoint is wanted."""
    contents = [m.get("content") for m in system]
    if all(isinstance(c, str) for c in contents) and not cache_control:
        return "\n\n".join(str(c) for c in contents)
    blocks: list[dict[str, Any]] = []
    for content in contents:
        if isinstance(content, str):
            blocks.append({"type": "text", "text": content})
        elif isinstance(content, list):
            blocks.extend(b for b in content if isinstance(b, dict))
    if cache_control and blocks:
        blocks[-1] = {**blocks[-1], "cache_control": dict(CACHE_CONTROL)}
    return blocks


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
        trigger = math.ceil(round(context_window * config.background_threshold, 6))
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
