"""The OpenAI Chat Completions format.

Tool calls live in an assistant message's ``tool_calls``; each result is a ``tool`` message
with the call's ``tool_call_id``. Keys this adapter does not know pass through untouched;
the types of the keys it knows are checked; the content part types each role may carry are
listed in ``OpenAIFormat.block_types``, so a stored message is one the API takes back.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, ClassVar

from compactstore._context.media import MEDIA_BLOCK_TYPES
from compactstore._context.media_checks import check_user_media
from compactstore.errors import InvalidInputError
from compactstore.formats._typed import to_request
from compactstore.formats.base import (
    Kind,
    ResultContent,
    ToolCall,
    ToolResult,
    check_blocks,
    check_nonempty_str,
    check_role,
    error_prefixed,
    flatten_result,
    type_name,
    usage_count,
)
from compactstore.formats.result_messages import ResultMessageFormat

__all__ = ["OpenAIFormat"]

_ROLES = ("assistant", "developer", "system", "tool", "user")

# The payload key of each tool-call type and the key holding its input text.
_CALL_PAYLOAD = {"function": "arguments", "custom": "input"}


class OpenAIFormat(ResultMessageFormat):
    """Chat Completions messages (``system``, ``developer``, ``user``, ``assistant``, ``tool``).

    The API has no error flag on tool results: ``tool_result_message(..., is_error=True)``
    prefixes the content with ``"Error: "`` instead, and ``tool_results()`` always reports
    ``is_error=False``.
    """

    name = "openai"
    result_role = "tool"
    result_id_key = "tool_call_id"
    reuses_call_ids = True
    block_types: ClassVar[Mapping[str, frozenset[str]]] = {
        "system": frozenset({"text"}),
        "developer": frozenset({"text"}),
        "user": frozenset({"text", "image_url", "input_audio", "file"}),
        "assistant": frozenset({"text", "refusal"}),
        "tool": frozenset({"text"}),
    }
    result_block_types = ("text",)
    sdk_extra = "openai"
    request_key = "messages"
    response_name = "an OpenAI ChatCompletion"

    def examples(self) -> list[dict[str, Any]]:
        return copy.deepcopy(_EXAMPLES)

    def result_block_problem(self, kind: Any) -> str | None:
        if kind in MEDIA_BLOCK_TYPES:
            return (
                f"format openai: a Chat Completions tool message takes text only, so a "
                f"tool result cannot carry {kind!r} content; use format 'anthropic' or "
                f"'responses' for images and documents, or send a text description"
            )
        return super().result_block_problem(kind)

    def request_type(self) -> Any:
        """``openai.types.chat.ChatCompletionMessageParam``."""
        try:
            import openai.types.chat
        except ImportError:
            raise self.sdk_missing() from None
        return openai.types.chat.ChatCompletionMessageParam

    def is_response(self, response: Any) -> bool:
        return hasattr(response, "choices") and getattr(response, "object", None) == (
            "chat.completion"
        )

    def response_turn(self, response: Any) -> tuple[list[dict[str, Any]], int | None]:
        """The first choice's message; the prompt is ``prompt_tokens``."""
        choices = getattr(response, "choices", None) or []
        if not choices:
            raise InvalidInputError("the ChatCompletion has no choices to store")
        messages = [to_request(self.request_type(), choices[0].message)]
        return messages, usage_count(getattr(response, "usage", None), "prompt_tokens")

    def tool_definition(
        self, name: str, description: str, schema: dict[str, Any]
    ) -> dict[str, Any]:
        """``{"type": "function", "function": {...}}`` (Chat Completions)."""
        function = {"name": name, "description": description, "parameters": schema}
        return {"type": "function", "function": function}

    def validate(self, message: Any) -> None:
        if isinstance(message, dict) and message.get("role") == "function":
            raise self.fail(
                "role 'function' (the deprecated function-calling API) is not supported by "
                "format openai; use assistant 'tool_calls' and 'tool' messages"
            )
        role = check_role(message, _ROLES, self.name)
        has_calls = False
        if "tool_calls" in message:
            if role != "assistant":
                raise self.fail(
                    f"'tool_calls' is only allowed on assistant messages (this message's role "
                    f"is {role!r})"
                )
            self._check_tool_calls(message["tool_calls"])
            has_calls = True
        if "tool_call_id" in message and role != "tool":
            raise self.fail(
                f"'tool_call_id' is only allowed on tool messages (this message's role is {role!r})"
            )
        if role == "tool":
            check_nonempty_str(message, "tool_call_id", "tool message", "")
        if message.get("content") is None:
            if not has_calls:
                raise self.fail(
                    f"{role} message needs 'content' (only an assistant message with "
                    "'tool_calls' may leave it out or set it to null)"
                )
        else:
            self._check_content(message["content"], role)
            check_user_media(message, ("image_url", "file"))
        self._check_optional_keys(message)

    def _check_content(self, content: Any, role: str) -> None:
        if isinstance(content, str):
            return
        if not isinstance(content, list):
            raise self.fail(
                "message 'content' must be a string or a list of content parts, "
                f"got {type_name(content)}"
            )
        # Which part types each role may carry: block_types (checked on append).
        for i, part in enumerate(check_blocks(content, "content")):
            if part["type"] == "refusal" and not isinstance(part.get("refusal"), str):
                raise self.fail(
                    f"content[{i}]: refusal part needs a string 'refusal', "
                    f"got {type_name(part.get('refusal'))}"
                )

    def _check_tool_calls(self, tool_calls: Any) -> None:
        if not isinstance(tool_calls, list):
            raise self.fail(f"'tool_calls' must be a list, got {type_name(tool_calls)}")
        if not tool_calls:
            # The API rejects an empty array; leave the key out instead.
            raise self.fail("'tool_calls' must not be an empty list (leave the key out)")
        seen: set[str] = set()
        for i, call in enumerate(tool_calls):
            at = f"tool_calls[{i}]: "
            if not isinstance(call, dict):
                raise self.fail(f"{at}tool call must be a dict, got {type_name(call)}")
            call_id = check_nonempty_str(call, "id", "tool call", at)
            call_type = call.get("type")
            if call_type not in _CALL_PAYLOAD:
                raise self.fail(
                    f"{at}tool call 'type' must be 'function' or 'custom', got {call_type!r}"
                )
            payload = call.get(call_type)
            if not isinstance(payload, dict):
                raise self.fail(
                    f"{at}{call_type} tool call needs a dict {call_type!r}, "
                    f"got {type_name(payload)}"
                )
            check_nonempty_str(payload, "name", f"{call_type} tool call", at)
            input_key = _CALL_PAYLOAD[call_type]
            # The model's arguments are JSON text that need not parse; the API stores a string.
            if not isinstance(payload.get(input_key), str):
                raise self.fail(
                    f"{at}{call_type} tool call needs a string {input_key!r} (JSON text), "
                    f"got {type_name(payload.get(input_key))}"
                )
            if call_id in seen:
                raise self.fail(f"{at}duplicate tool call id {call_id!r} in one message")
            seen.add(call_id)

    def _check_optional_keys(self, message: dict[str, Any]) -> None:
        if "name" in message and not isinstance(message["name"], str):
            raise self.fail(f"message 'name' must be a string, got {type_name(message['name'])}")
        if message["role"] != "assistant":
            return
        refusal = message.get("refusal")
        if refusal is not None and not isinstance(refusal, str):
            raise self.fail(f"message 'refusal' must be a string or null, got {type_name(refusal)}")
        audio = message.get("audio")
        if audio is not None and not (isinstance(audio, dict) and isinstance(audio.get("id"), str)):
            raise self.fail("message 'audio' must be null or a dict with a string 'id'")

    def kind(self, message: dict[str, Any]) -> Kind:
        role = message.get("role")
        if role in ("system", "developer"):
            return "system"
        if role == "tool":
            return "tool"
        if role == "assistant":
            return "assistant"
        return "user"

    def tool_calls(self, message: dict[str, Any]) -> list[ToolCall]:
        if message.get("role") != "assistant":
            return []
        calls: list[ToolCall] = []
        for call in message.get("tool_calls") or []:
            call_type = call.get("type", "function")
            payload = call.get(call_type) or {}
            calls.append(
                ToolCall(
                    id=call["id"],
                    name=payload.get("name", ""),
                    input=payload.get(_CALL_PAYLOAD.get(call_type, "arguments"), ""),
                )
            )
        return calls

    def tool_results(self, message: dict[str, Any]) -> list[ToolResult]:
        if message.get("role") != "tool":
            return []
        return [
            ToolResult(
                tool_use_id=message["tool_call_id"],
                text=flatten_result(message.get("content")),
                is_error=False,
            )
        ]

    def tool_result_message(
        self, tool_use_id: str, content: ResultContent, *, tool_name: str, is_error: bool
    ) -> dict[str, Any]:
        """A ``tool`` message; an error is marked by an ``"Error: "`` prefix (no flag exists)."""
        return {
            "role": "tool",
            "tool_call_id": tool_use_id,
            "content": error_prefixed(content, "text") if is_error else content,
        }

    def synthetic_results(self, calls: list[ToolCall], text: str) -> list[dict[str, Any]]:
        return [{"role": "tool", "tool_call_id": call.id, "content": text} for call in calls]


# A conversation with every part type each role may carry (OpenAIFormat.examples).
_EXAMPLES: list[dict[str, Any]] = [
    {"role": "system", "content": [{"type": "text", "text": "You are a careful coding agent."}]},
    {"role": "developer", "content": [{"type": "text", "text": "Answer briefly."}]},
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "Why does the build fail?"},
            {"type": "image_url", "image_url": {"url": "https://example.com/plot.png"}},
            {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
            {"type": "file", "file": {"file_id": "file_build_log"}},
        ],
    },
    {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Reading the log."},
            {"type": "refusal", "refusal": "I will not delete the log."},
        ],
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "read_file", "arguments": '{"path": "log"}'},
            },
            {"id": "call_2", "type": "custom", "custom": {"name": "grep", "input": "undefined"}},
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "ld: sqrt"}]},
    {"role": "tool", "tool_call_id": "call_2", "content": "ld: undefined symbol: sqrt"},
    {"role": "assistant", "content": "The linker needs -lm."},
]
