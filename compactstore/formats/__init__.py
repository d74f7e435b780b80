"""Message formats: one adapter per API that a session's messages can be spelled in."""

from __future__ import annotations

from compactstore.errors import InvalidInputError
from compactstore.formats.anthropic import AnthropicFormat
from compactstore.formats.base import Kind, MessageFormat, ToolCall, ToolResult, json_text
from compactstore.formats.minicode import MiniCodeFormat
from compactstore.formats.openai import OpenAIFormat
from compactstore.formats.responses import ResponsesFormat

__all__ = [
    "FORMAT_NAMES",
    "PROVIDER_FORMATS",
    "AnthropicFormat",
    "Kind",
    "MessageFormat",
    "MiniCodeFormat",
    "OpenAIFormat",
    "ResponsesFormat",
    "ToolCall",
    "ToolResult",
    "get_format",
    "json_text",
]

# The registered formats. Adapters hold no state, so one instance of each serves every
# session. Adding a format: its module, and its adapter here.
_FORMATS: dict[str, MessageFormat] = {
    fmt.name: fmt
    for fmt in (AnthropicFormat(), MiniCodeFormat(), OpenAIFormat(), ResponsesFormat())
}

FORMAT_NAMES: tuple[str, ...] = tuple(sorted(_FORMATS))
# The formats whose messages a provider API takes (request_params()).
PROVIDER_FORMATS: tuple[str, ...] = tuple(
    name for name in FORMAT_NAMES if _FORMATS[name].request_key is not None
)


def get_format(name: str) -> MessageFormat:
    """The adapter for a format name.

    Raises:
        InvalidInputError: the name is not one of ``FORMAT_NAMES``.
    """
    fmt = _FORMATS.get(name) if isinstance(name, str) else None
    if fmt is None:
        raise InvalidInputError(
            f"unknown message format {name!r} (expected one of: {', '.join(FORMAT_NAMES)})"
        )
    return fmt
