"""Content blocks as the Anthropic Messages API spells tool calls and results.

Shared by the ``anthropic`` format and the ``minicode`` format, whose assistant messages
carry ``tool_use`` blocks exactly as Anthropic's do.
"""

from __future__ import annotations

from typing import Any

from compactstore._context.media import MEDIA_BLOCK_TYPES
from compactstore._context.media_checks import check_media_block
from compactstore.formats.base import (
    MessageFormat,
    ToolCall,
    check_blocks,
    check_nonempty_str,
    content_blocks,
    type_name,
)

__all__ = ["check_tool_use", "check_tool_use_content", "tool_use_calls"]


def check_tool_use(block: dict[str, Any], at: str) -> str:
    """Check a ``tool_use`` block and return its id."""
    tool_id = check_nonempty_str(block, "id", "tool_use block", at)
    check_nonempty_str(block, "name", "tool_use block", at)
    tool_input = block.get("input")
    if not isinstance(tool_input, dict):
        raise MessageFormat.fail(
            f"{at}tool_use block needs a dict 'input', got {type_name(tool_input)}"
        )
    return tool_id


def check_tool_use_content(content: Any, role: str, *, results_allowed: bool) -> None:
    """Check the content of a message that may carry ``tool_use`` (and ``tool_result``) blocks.

    ``results_allowed`` is true for the Anthropic format, where results are blocks of user
    messages; minicode carries results as messages of their own.
    """
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise MessageFormat.fail(
            "message 'content' must be a string or a list of content blocks, "
            f"got {type_name(content)}"
        )
    call_ids: set[str] = set()
    result_ids: set[str] = set()
    for i, block in enumerate(check_blocks(content, "content")):
        at = f"content[{i}]: "
        if block["type"] == "tool_use":
            if role != "assistant":
                raise MessageFormat.fail(
                    f"{at}tool_use blocks are only allowed in assistant messages "
                    f"(this message's role is {role!r})"
                )
            tool_id = check_tool_use(block, at)
            if tool_id in call_ids:
                raise MessageFormat.fail(f"{at}duplicate tool_use id {tool_id!r} in one message")
            call_ids.add(tool_id)
        elif block["type"] == "tool_result":
            if not results_allowed:
                raise MessageFormat.fail(
                    f"{at}tool_result blocks are not used by this format; "
                    "send the result as a message with role 'tool_result'"
                )
            if role != "user":
                raise MessageFormat.fail(
                    f"{at}tool_result blocks are only allowed in user messages "
                    f"(this message's role is {role!r})"
                )
            tool_id = _check_tool_result(block, at)
            if tool_id in result_ids:
                raise MessageFormat.fail(
                    f"{at}duplicate tool_result for tool_use_id {tool_id!r} in one message"
                )
            result_ids.add(tool_id)


def _check_tool_result(block: dict[str, Any], at: str) -> str:
    tool_id = check_nonempty_str(block, "tool_use_id", "tool_result block", at)
    if "content" in block:
        content = block["content"]
        if isinstance(content, list):
            for inner in check_blocks(content, f"{at}tool_result content"):
                # The API nests only leaf blocks (text, image, document...) in a result.
                if inner["type"] in ("tool_use", "tool_result"):
                    raise MessageFormat.fail(
                        f"{at}tool_result content may not contain {inner['type']} blocks"
                    )
                if inner["type"] in MEDIA_BLOCK_TYPES:
                    check_media_block(inner, f"{at}tool_result content: ")
        elif not isinstance(content, str):
            raise MessageFormat.fail(
                f"{at}tool_result 'content' must be a string or a list of content blocks, "
                f"got {type_name(content)}"
            )
    if "is_error" in block and not isinstance(block["is_error"], bool):
        raise MessageFormat.fail(
            f"{at}tool_result 'is_error' must be a bool, got {type_name(block['is_error'])}"
        )
    return tool_id


def tool_use_calls(message: dict[str, Any]) -> list[ToolCall]:
    """The ``tool_use`` blocks of an assistant message, in order."""
    if message.get("role") != "assistant":
        return []
    return [
        ToolCall(id=block["id"], name=block["name"], input=block["input"])
        for block in content_blocks(message)
        if block.get("type") == "tool_use"
    ]
