"""The Anthropic Messages API format.

Tool calls are ``tool_use`` content blocks of assistant messages; tool results are
``tool_result`` content blocks of user messages. A leading ``system`` message is accepted, as
the SDK's ``MessageParam`` type and most agent loops keep the system prompt with the
conversation; it is pinned, and an application sending to the Messages API passes it as the
separate ``system`` parameter.

The block helpers are in :mod:`compactstore.formats.blocks`, shared with the minicode format.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar

from compactstore._context.frozen import FrozenDict, freeze
from compactstore._context.media_checks import check_user_media
from compactstore.formats._typed import to_request
from compactstore.formats.base import (
    Kind,
    MessageFormat,
    ResultContent,
    ToolCall,
    ToolResult,
    check_role,
    content_blocks,
    content_parts,
    content_text,
    flatten_result,
    result_blocks,
    usage_count,
)
from compactstore.formats.blocks import check_tool_use_content, tool_use_calls

__all__ = ["ANTHROPIC_ASSISTANT", "ANTHROPIC_USER", "SERVER_TOOL_BLOCKS", "AnthropicFormat"]

_ROLES = ("assistant", "system", "user")

# Blocks of tools the provider runs itself: a call and its result both stand in the
# assistant message (no client tool_result answers them, none gets a synthetic result).
SERVER_TOOL_BLOCKS = frozenset(
    {
        "server_tool_use",
        "web_search_tool_result",
        "web_fetch_tool_result",
        "code_execution_tool_result",
        "bash_code_execution_tool_result",
        "text_editor_code_execution_tool_result",
        "tool_search_tool_result",
    }
)
# The SDK's user and assistant unions are identical; the API takes these from each.
ANTHROPIC_USER = frozenset(
    {"text", "image", "document", "search_result", "tool_result", "container_upload"}
)
ANTHROPIC_ASSISTANT = frozenset(
    {"text", "thinking", "redacted_thinking", "tool_use"} | SERVER_TOOL_BLOCKS
)


class AnthropicFormat(MessageFormat):
    """Messages as the Anthropic Messages API takes them (roles ``user`` and ``assistant``)."""

    name = "anthropic"
    thinking_block_types = frozenset({"thinking", "redacted_thinking"})
    block_types: ClassVar[Mapping[str, frozenset[str]]] = {
        "system": frozenset({"text"}),
        "user": ANTHROPIC_USER,
        "assistant": ANTHROPIC_ASSISTANT,
        # Inside a tool_result block (the API nests leaf blocks only).
        "tool_result": frozenset(
            {"text", "image", "document", "search_result", "tool_reference", "browser_state"}
        ),
    }
    read_block_types = frozenset({"text", "tool_use", "tool_result"})
    result_block_types = ("text", "image", "document")
    sdk_extra = "anthropic"
    request_key = "messages"
    system_parameter = True
    prompt_caching = True
    response_name = "an Anthropic Message"

    def examples(self) -> list[dict[str, Any]]:
        return copy.deepcopy(EXAMPLES)

    def block_lists(self, message: dict[str, Any]) -> Iterator[tuple[str, str, list[Any]]]:
        """The content list, and the content list of each ``tool_result`` block in it."""
        for role, where, content in super().block_lists(message):
            yield role, where, content
            for index, block in enumerate(content):
                if isinstance(block, dict) and block.get("type") == "tool_result":
                    inner = block.get("content")
                    if isinstance(inner, list):
                        yield "tool_result", f"content[{index}].content", inner

    def request_type(self) -> Any:
        """``anthropic.types.MessageParam``."""
        try:
            import anthropic.types
        except ImportError:
            raise self.sdk_missing() from None
        return anthropic.types.MessageParam

    def system_type(self) -> Any:
        import anthropic.types

        return str | list[anthropic.types.TextBlockParam]

    def is_response(self, response: Any) -> bool:
        return getattr(response, "type", None) == "message" and (
            getattr(response, "role", None) == "assistant"
        )

    def response_turn(self, response: Any) -> tuple[list[dict[str, Any]], int | None]:
        """One assistant message; the prompt is ``input_tokens +
        cache_creation_input_tokens + cache_read_input_tokens``."""
        message = to_request(self.request_type(), response)
        count = usage_count(
            getattr(response, "usage", None),
            "input_tokens",
            "cache_creation_input_tokens",
            "cache_read_input_tokens",
        )
        return [{"role": "assistant", "content": message.get("content", [])}], count

    def validate(self, message: Any) -> None:
        role = check_role(message, _ROLES, self.name)
        if "content" not in message:
            raise self.fail("message has no 'content'")
        check_tool_use_content(message["content"], role, results_allowed=True)
        check_user_media(message, ("image", "document"))

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
                blocks=result_blocks(block.get("content")),
            )
            for block in content_blocks(message)
            if block.get("type") == "tool_result"
        ]

    def text(self, message: dict[str, Any]) -> str:
        return content_text(message.get("content"))

    def text_parts(self, message: dict[str, Any]) -> list[str]:
        return content_parts(message.get("content"))

    def token_text(self, message: dict[str, Any]) -> str:
        """The base count plus a provider compaction block's summary (its readable
        ``content``, else its opaque ``encrypted_content``): what it sends costs tokens."""
        parts = [super().token_text(message)]
        for block in content_blocks(message):
            if block.get("type") == "compaction":
                value = block.get("content") or block.get("encrypted_content")
                if isinstance(value, str):
                    parts.append(value)
        return "\n".join(p for p in parts if p)

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
        self, tool_use_id: str, content: ResultContent, *, tool_name: str, is_error: bool
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

    def wire_view(self, messages: list[dict[str, Any]], config: Any) -> list[dict[str, Any]]:
        """Tool results merged as the API wants them: after an assistant message
        with ``tool_use`` blocks, the user messages up to the last one holding a result
        become one user message — every ``tool_result`` block first, in the order of the
        calls, then the other content that stood between them, in order. A user message
        after the last result stays a message of its own. An assistant message left with
        no content (it held only thinking the context leaves out) is not sent.
        The log and ``context().items`` keep one message per seq."""
        return merge_tool_results(messages)

    def wire_restart(self, messages: Sequence[Mapping[str, Any]]) -> int:
        """The last assistant message: the user messages after it may merge with more."""
        for index in range(len(messages) - 1, -1, -1):
            if messages[index].get("role") == "assistant":
                return index
        return 0

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


# The server tool result blocks: the server tool that writes each, and its error block type.
_SERVER_RESULTS = {
    "web_search_tool_result": "web_search",
    "web_fetch_tool_result": "web_fetch",
    "code_execution_tool_result": "code_execution",
    "bash_code_execution_tool_result": "bash_code_execution",
    "text_editor_code_execution_tool_result": "text_editor_code_execution",
    "tool_search_tool_result": "tool_search_tool_regex",
}
_TEXT = {"type": "text", "text": "The build log says the linker failed."}
_IMAGE = {"type": "image", "source": {"type": "url", "url": "https://example.com/plot.png"}}
_DOCUMENT = {
    "type": "document",
    "source": {"type": "text", "media_type": "text/plain", "data": "CHANGELOG: 1.2 fixes it"},
}
_SEARCH_RESULT = {
    "type": "search_result",
    "source": "https://example.com/linker",
    "title": "Linker errors",
    "content": [{"type": "text", "text": "Undefined symbols mean a missing library."}],
}
# A conversation with every block type each role may carry (AnthropicFormat.examples).
EXAMPLES: list[dict[str, Any]] = [
    {"role": "system", "content": [{"type": "text", "text": "You are a careful coding agent."}]},
    {
        "role": "user",
        "content": [
            _TEXT,
            _IMAGE,
            _DOCUMENT,
            _SEARCH_RESULT,
            {"type": "container_upload", "file_id": "file_build_log"},
        ],
    },
    {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "Check the log first.", "signature": "c2ln"},
            {"type": "redacted_thinking", "data": "cmVkYWN0ZWQ="},
            *(
                block
                for n, (result, tool) in enumerate(_SERVER_RESULTS.items())
                for block in (
                    {"type": "server_tool_use", "id": f"srvtoolu_{n}", "name": tool, "input": {}},
                    {
                        "type": result,
                        "tool_use_id": f"srvtoolu_{n}",
                        "content": {"type": f"{result}_error", "error_code": "unavailable"},
                    },
                )
            ),
            {"type": "text", "text": "Reading the log."},
            {"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {"path": "log"}},
        ],
    },
    {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": "toolu_1",
                "content": [
                    _TEXT,
                    _IMAGE,
                    _DOCUMENT,
                    _SEARCH_RESULT,
                    {"type": "tool_reference", "tool_name": "read_file"},
                    {
                        "type": "browser_state",
                        "tabs": [{"tab_id": "1", "title": "Docs", "url": "https://example.com"}],
                    },
                ],
                "is_error": False,
            }
        ],
    },
    {"role": "assistant", "content": "The linker needs -lm."},
]


def merge_tool_results(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The wire view of anthropic messages (see :meth:`AnthropicFormat.wire_view`).

    A message that needs no change is passed on as it is (the caller's copy)."""
    merged: list[dict[str, Any]] = []
    index = 0
    while index < len(messages):
        message = messages[index]
        index += 1
        if message.get("role") == "assistant" and message.get("content") == []:
            continue  # it held only thinking the wire view leaves out: nothing to send
        merged.append(message)
        calls = tool_use_calls(message)
        # The user messages up to the last one holding a result of these calls; what
        # follows that one (a new instruction) stays a message of its own.
        end = scan = index
        while calls and scan < len(messages) and messages[scan].get("role") == "user":
            scan += 1
            if _has_result(messages[scan - 1]):
                end = scan
        if end == index:
            continue
        group = messages[index:end]
        index = end
        order = {call.id: n for n, call in enumerate(calls)}
        results: list[dict[str, Any]] = []
        others: list[dict[str, Any]] = []
        for user in group:
            content = user.get("content")
            blocks = content if isinstance(content, list) else [{"type": "text", "text": content}]
            for block in blocks:
                is_result = isinstance(block, dict) and block.get("type") == "tool_result"
                (results if is_result else others).append(block)
        results.sort(key=lambda block: order.get(str(block.get("tool_use_id")), len(order)))
        if len(group) == 1 and group[0].get("content") == results + others:
            merged.append(group[0])  # already one message, results first in call order
        else:
            merged.append(_merged(group, {"role": "user", "content": results + others}))
    return merged


def _has_result(message: dict[str, Any]) -> bool:
    content = message.get("content")
    return isinstance(content, list) and any(
        isinstance(block, dict) and block.get("type") == "tool_result" for block in content
    )


# Merged messages built from the store's read-only (frozen) messages, by the identity of
# the messages they merge: a read-only view built again after a step hands out the same
# objects for what did not change. Bounded; the sources are kept so an id is not reused.
_MEMO: dict[tuple[int, ...], tuple[tuple[Any, ...], Any]] = {}
_MEMO_SIZE = 4_096


def _merged(group: list[dict[str, Any]], message: dict[str, Any]) -> dict[str, Any]:
    if not all(type(m) is FrozenDict for m in group):
        return message  # the caller's own copies: theirs to change
    key = tuple(id(m) for m in group)
    hit = _MEMO.get(key)
    if hit is not None and all(a is b for a, b in zip(hit[0], group, strict=True)):
        frozen: dict[str, Any] = hit[1]
        return frozen
    if len(_MEMO) >= _MEMO_SIZE:
        _MEMO.clear()
    frozen = freeze(message)
    _MEMO[key] = (tuple(group), frozen)
    return frozen
