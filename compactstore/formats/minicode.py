"""The MiniCode format: the message shape of the MiniCode context-compaction article.

Assistant messages carry ``tool_use`` blocks exactly as in the Anthropic format; each tool
result is a message of its own::

    {"role": "tool_result", "content": str, "toolName": str, "toolUseId": str, "isError": bool}
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, ClassVar

from compactstore.formats.anthropic import ANTHROPIC_ASSISTANT, ANTHROPIC_USER
from compactstore.formats.base import (
    Kind,
    ResultContent,
    ToolCall,
    ToolResult,
    check_nonempty_str,
    check_role,
    type_name,
)
from compactstore.formats.blocks import check_tool_use_content, tool_use_calls
from compactstore.formats.result_messages import ResultMessageFormat

__all__ = ["MiniCodeFormat"]

_ROLES = ("assistant", "system", "tool_result", "user")


class MiniCodeFormat(ResultMessageFormat):
    """Messages with roles ``system``, ``user``, ``assistant`` and ``tool_result``."""

    name = "minicode"
    thinking_block_types = frozenset({"thinking", "redacted_thinking"})
    result_role = "tool_result"
    result_id_key = "toolUseId"
    read_block_types = frozenset({"text", "tool_use"})
    # Anthropic's block dialect; its tool results are messages of their own (text only:
    # the article's shape has no content blocks there). No provider API takes its messages.
    block_types: ClassVar[Mapping[str, frozenset[str]]] = {
        "system": frozenset({"text"}),
        "user": ANTHROPIC_USER - {"tool_result"},
        "assistant": ANTHROPIC_ASSISTANT,
    }

    def examples(self) -> list[dict[str, Any]]:
        return copy.deepcopy(_EXAMPLES)

    def validate(self, message: Any) -> None:
        role = check_role(message, _ROLES, self.name)
        if "content" not in message:
            raise self.fail("message has no 'content'")
        if role != "tool_result":
            check_tool_use_content(message["content"], role, results_allowed=False)
            return
        content = message["content"]
        if not isinstance(content, str):
            raise self.fail(
                f"tool_result message 'content' must be a string, got {type_name(content)}"
            )
        check_nonempty_str(message, "toolUseId", "tool_result message", "")
        check_nonempty_str(message, "toolName", "tool_result message", "")
        # isError may be left out (the article's messages omit it on success).
        if "isError" in message and not isinstance(message["isError"], bool):
            raise self.fail(
                f"tool_result message 'isError' must be a bool, got {type_name(message['isError'])}"
            )

    def kind(self, message: dict[str, Any]) -> Kind:
        role = message.get("role")
        if role == "tool_result":
            return "tool"
        if role == "system":
            return "system"
        if role == "assistant":
            return "assistant"
        return "user"

    def tool_calls(self, message: dict[str, Any]) -> list[ToolCall]:
        return tool_use_calls(message)

    def tool_results(self, message: dict[str, Any]) -> list[ToolResult]:
        if message.get("role") != "tool_result":
            return []
        content = message.get("content")
        return [
            ToolResult(
                tool_use_id=message["toolUseId"],
                text=content if isinstance(content, str) else "",
                is_error=message.get("isError") is True,
            )
        ]

    def tool_result_message(
        self, tool_use_id: str, content: ResultContent, *, tool_name: str, is_error: bool
    ) -> dict[str, Any]:
        return {
            "role": "tool_result",
            "content": content,
            "toolName": tool_name,
            "toolUseId": tool_use_id,
            "isError": is_error,
        }

    def synthetic_results(self, calls: list[ToolCall], text: str) -> list[dict[str, Any]]:
        return [
            self.tool_result_message(call.id, text, tool_name=call.name, is_error=True)
            for call in calls
        ]


# A conversation with every block type each role may carry (MiniCodeFormat.examples).
_EXAMPLES: list[dict[str, Any]] = [
    {"role": "system", "content": [{"type": "text", "text": "You are a careful coding agent."}]},
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "Why does the build fail?"},
            {"type": "image", "source": {"type": "url", "url": "https://example.com/plot.png"}},
            {
                "type": "document",
                "source": {"type": "text", "media_type": "text/plain", "data": "build log"},
            },
            {
                "type": "search_result",
                "source": "https://example.com/linker",
                "title": "Linker errors",
                "content": [{"type": "text", "text": "Undefined symbols: a missing library."}],
            },
            {"type": "container_upload", "file_id": "file_build_log"},
        ],
    },
    {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "Check the log first.", "signature": "c2ln"},
            {"type": "redacted_thinking", "data": "cmVkYWN0ZWQ="},
            {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}},
            {
                "type": "web_search_tool_result",
                "tool_use_id": "srvtoolu_1",
                "content": {"type": "web_search_tool_result_error", "error_code": "unavailable"},
            },
            *(
                {
                    "type": kind,
                    "tool_use_id": "srvtoolu_1",
                    "content": {"type": f"{kind}_error", "error_code": "unavailable"},
                }
                for kind in (
                    "web_fetch_tool_result",
                    "code_execution_tool_result",
                    "bash_code_execution_tool_result",
                    "text_editor_code_execution_tool_result",
                    "tool_search_tool_result",
                )
            ),
            {"type": "text", "text": "Reading the log."},
            {"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {"path": "log"}},
        ],
    },
    {
        "role": "tool_result",
        "content": "ld: undefined symbol: sqrt",
        "toolName": "read_file",
        "toolUseId": "toolu_1",
        "isError": False,
    },
    {"role": "assistant", "content": "The linker needs -lm."},
]
