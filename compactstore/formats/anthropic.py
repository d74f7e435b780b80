"""The Anthropic Messages API format.

Tool calls are ``tool_use`` content blocks of assistant messages; tool results are
``tool_result`` content blocks of user messages. A leading ``system`` message is accepted, as
the SDK's ``MessageParam`` type and most agent loops keep the system prompt with the
conversation; it is pinned, and an application sending to the Messages API passes it as the
separate ``system`` parameter.

The block helpers here are shared with the minicode format, whose assistant messages carry
``tool_use`` blocks exactly as Anthropic's do.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

from compactstore.formats.base import Kind, MessageFormat, ToolCall, ToolResult, json_text

__all__ = ["AnthropicFormat"]

_ROLES = ("assistant", "system", "user")


def type_name(value: Any) -> str:
    """The Python type name of a value, as error messages spell it."""
    return "None" if value is None else type(value).__name__


def check_role(message: Any, roles: Iterable[str], format_name: str) -> str:
    """Check that ``message`` is a dict with a known role, and return the role."""
    if not isinstance(message, dict):
        raise MessageFormat.fail(f"a message must be a dict, got {type_name(message)}")
    if "role" not in message:
        raise MessageFormat.fail("message has no 'role'")
    role = message["role"]
    if not isinstance(role, str):
        raise MessageFormat.fail(f"message 'role' must be a string, got {type_name(role)}")
    allowed = sorted(roles)
    if role not in allowed:
        raise MessageFormat.fail(
            f"unknown role {role!r} for format {format_name} "
            f"(expected one of: {', '.join(allowed)})"
        )
    return role


def check_nonempty_str(block: dict[str, Any], key: str, what: str, where: str) -> str:
    """Return ``block[key]``, which must be a non-empty string (ids and names)."""
    value = block.get(key)
    if not isinstance(value, str):
        raise MessageFormat.fail(f"{where}{what} needs a string {key!r}, got {type_name(value)}")
    if not value:
        raise MessageFormat.fail(f"{where}{what} {key!r} must not be empty")
    return value


def check_blocks(content: Any, where: str) -> list[dict[str, Any]]:
    """Check that every item of a content list is a dict with a string ``type``."""
    blocks: list[dict[str, Any]] = []
    for i, block in enumerate(content):
        at = f"{where}[{i}]: "
        if not isinstance(block, dict):
            raise MessageFormat.fail(f"{at}content block must be a dict, got {type_name(block)}")
        block_type = block.get("type")
        if not isinstance(block_type, str):
            raise MessageFormat.fail(
                f"{at}content block needs a string 'type', got {type_name(block_type)}"
            )
        if block_type == "text" and not isinstance(block.get("text"), str):
            raise MessageFormat.fail(
                f"{at}text block needs a string 'text', got {type_name(block.get('text'))}"
            )
        blocks.append(block)
    return blocks


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


def content_blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The content as a list of blocks (empty for string content)."""
    content = message.get("content")
    if isinstance(content, list):
        return [block for block in content if isinstance(block, dict)]
    return []


def content_text(content: Any) -> str:
    """The prose of a content value: the string itself, or its text blocks joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            block["text"]
            for block in content
            if isinstance(block, dict) and block.get("type") == "text"
        )
    return ""


def flatten_result(content: Any) -> str:
    """A tool result's content as text; non-text blocks count as their JSON."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            block["text"]
            if isinstance(block, dict) and block.get("type") == "text"
            else json_text(block)
            for block in content
        )
    return ""


def tool_use_calls(message: dict[str, Any]) -> list[ToolCall]:
    """The ``tool_use`` blocks of an assistant message, in order."""
    if message.get("role") != "assistant":
        return []
    return [
        ToolCall(id=block["id"], name=block["name"], input=block["input"])
        for block in content_blocks(message)
        if block.get("type") == "tool_use"
    ]


class AnthropicFormat(MessageFormat):
    """Messages as the Anthropic Messages API takes them (roles ``user`` and ``assistant``)."""

    name = "anthropic"

    def validate(self, message: Any) -> None:
        role = check_role(message, _ROLES, self.name)
        if "content" not in message:
            raise self.fail("message has no 'content'")
        check_tool_use_content(message["content"], role, results_allowed=True)

    def kind(self, message: dict[str, Any]) -> Kind:
        if message.get("role") == "assistant":
            return "assistant"
        if message.get("role") == "system":
            return "system"
        blocks = content_blocks(message)
        content = message.get("content")
        # An empty list must not count as "all results": it carries none.
        if (
            isinstance(content, list)
            and blocks
            and len(blocks) == len(content)
            and all(block.get("type") == "tool_result" for block in blocks)
        ):
            return "tool"
        return "user"

    def tool_calls(self, message: dict[str, Any]) -> list[ToolCall]:
        return tool_use_calls(message)

    def tool_results(self, message: dict[str, Any]) -> list[ToolResult]:
        if message.get("role") != "user":
            return []
        return [
            ToolResult(
                tool_use_id=block["tool_use_id"],
                text=flatten_result(block.get("content", "")),
                is_error=block.get("is_error") is True,
            )
            for block in content_blocks(message)
            if block.get("type") == "tool_result"
        ]

    def text(self, message: dict[str, Any]) -> str:
        return content_text(message.get("content"))

    def replace_tool_results(
        self, message: dict[str, Any], replacements: dict[str, str]
    ) -> dict[str, Any]:
        new = copy.deepcopy(message)
        if new.get("role") != "user":
            return new
        for block in content_blocks(new):
            if block.get("type") == "tool_result" and block.get("tool_use_id") in replacements:
                block["content"] = replacements[block["tool_use_id"]]
        return new

    def tool_result_message(
        self, tool_use_id: str, content: str, *, tool_name: str, is_error: bool
    ) -> dict[str, Any]:
        """A user message with one ``tool_result`` block (the API has no tool name there)."""
        return {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": tool_use_id,
                    "content": content,
                    "is_error": is_error,
                }
            ],
        }

    def summary_message(self, text: str) -> dict[str, Any]:
        """A user message: the API has no system role inside ``messages``."""
        return {"role": "user", "content": [{"type": "text", "text": text}]}

    def synthetic_results(self, calls: list[ToolCall], text: str) -> list[dict[str, Any]]:
        """One user message answering every call with an error (none when there are no calls).

        The API wants all results for one assistant turn in the single next user message.
        """
        if not calls:
            return []
        return [
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": call.id,
                        "content": text,
                        "is_error": True,
                    }
                    for call in calls
                ],
            }
        ]
