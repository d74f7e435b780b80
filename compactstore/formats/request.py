"""The keyword arguments of a provider call, from the active context (SPEC §9.4).

``Session.request_params()`` calls :func:`build_request_params`; pure (no database).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from compactstore.formats.base import MessageFormat

if TYPE_CHECKING:
    from compactstore.context import ContextMessage

__all__ = ["CACHE_CONTROL", "build_request_params"]

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
