"""The OpenAI Responses API format: a conversation is a list of input items.

Each stored message is one item of ``ResponseInputItemParam``. Every item type of the SDK is in
exactly one class (:data:`ITEM_CLASSES`):

- ``message``: a ``message`` item (``role`` user, system, developer or assistant; ``type`` may
  be left out, as ``EasyInputMessageParam`` allows).
- ``call`` / ``output``: the two sides of a pair, matched by the key :data:`CALLS` and
  :data:`OUTPUTS` name (``call_id`` for most; ``mcp_approval_request`` by its ``id``, answered by
  ``approval_request_id``; ``local_shell_call_output`` by its ``id`` — or its ``call_id`` when an
  SDK stored one — equal to the call's ``call_id``). A call whose output never came gets a
  stand-in error output in the active context; where no stand-in is possible
  (:data:`NO_STAND_IN`: a computer call needs a screenshot, an approval request the user's
  decision, a program output an id the server made) the orphan call is left out of the
  context, with the reasoning item glued to it.
- ``glue``: a ``reasoning`` item belongs to the item after it: a cut never separates them and
  nothing is ever inserted between them.
- ``opaque``: a provider ``compaction`` item, kept whole.
- ``hosted``: items of tools the provider ran (web search, file search, image generation, code
  interpreter, MCP calls and tool lists) and the client's configuration items
  (``additional_tools``, ``configuration_update``), passed through verbatim.
- ``refused``: ``item_reference`` (refused unless ``CompactionConfig.responses_store``: without
  stored responses the id resolves to nothing) and ``compaction_trigger`` (it asks the provider
  to compact the context, which is this library's job).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar, Literal

from compactstore._context.media import GENERATED_IMAGE, MEDIA_BLOCK_TYPES
from compactstore._context.media_checks import check_media_block, check_user_media
from compactstore.formats._typed import to_request
from compactstore.formats.base import (
    THINKING_NOTE,
    Kind,
    MessageFormat,
    ResultContent,
    ToolCall,
    ToolResult,
    check_blocks,
    check_nonempty_str,
    error_prefixed,
    json_text,
    result_blocks,
    type_name,
    usage_count,
)

__all__ = [
    "CALLS",
    "GLUE",
    "HOSTED",
    "ITEM_CLASSES",
    "NO_STAND_IN",
    "OPAQUE",
    "OUTPUTS",
    "REFUSED",
    "ItemClass",
    "ResponsesFormat",
    "item_type",
]

ItemClass = Literal["message", "call", "output", "glue", "opaque", "hosted", "refused"]

# Call item type -> (key holding its id, tool name when the item names none, input key).
CALLS: dict[str, tuple[str, str | None, str]] = {
    "function_call": ("call_id", None, "arguments"),
    "custom_tool_call": ("call_id", None, "input"),
    "computer_call": ("call_id", "computer", "action"),
    "local_shell_call": ("call_id", "local_shell", "action"),
    "shell_call": ("call_id", "shell", "action"),
    "apply_patch_call": ("call_id", "apply_patch", "operation"),
    "mcp_approval_request": ("id", None, "arguments"),
    "tool_search_call": ("call_id", "tool_search", "arguments"),
    "program": ("call_id", "program", "code"),
}
# Output item type -> (key naming the call it answers, key holding its content).
OUTPUTS: dict[str, tuple[str, str]] = {
    "function_call_output": ("call_id", "output"),
    "custom_tool_call_output": ("call_id", "output"),
    "computer_call_output": ("call_id", "output"),
    "local_shell_call_output": ("id", "output"),
    "shell_call_output": ("call_id", "output"),
    "apply_patch_call_output": ("call_id", "output"),
    "mcp_approval_response": ("approval_request_id", "reason"),
    "tool_search_output": ("call_id", "tools"),
    "program_output": ("call_id", "result"),
}
# Calls an orphan of which is dropped from the context: no stand-in output is possible.
NO_STAND_IN = frozenset({"computer_call", "mcp_approval_request", "program"})
# Outputs whose content cannot be replaced by text (a screenshot, an approval decision,
# tool definitions): no compaction stage previews or clears them.
_NOT_REPLACEABLE = frozenset(
    {"computer_call_output", "mcp_approval_response", "tool_search_output"}
)
GLUE = frozenset({"reasoning"})
OPAQUE = frozenset({"compaction"})
HOSTED = frozenset(
    {
        "web_search_call",
        "file_search_call",
        "image_generation_call",
        "code_interpreter_call",
        "mcp_call",
        "mcp_list_tools",
        "additional_tools",
        "configuration_update",
    }
)
REFUSED = frozenset({"item_reference", "compaction_trigger"})

ITEM_CLASSES: dict[str, ItemClass] = {
    "message": "message",
    **dict.fromkeys(CALLS, "call"),
    **dict.fromkeys(OUTPUTS, "output"),
    **dict.fromkeys(GLUE, "glue"),
    **dict.fromkeys(OPAQUE, "opaque"),
    **dict.fromkeys(HOSTED, "hosted"),
    **dict.fromkeys(REFUSED, "refused"),
}

_ROLES = ("assistant", "developer", "system", "user")
_INPUT_PARTS = frozenset({"input_text", "input_image", "input_file"})

ERROR_PREFIX = "Error: "


def item_type(item: Mapping[str, Any]) -> str:
    """An item's type; a message may leave ``type`` out (``EasyInputMessageParam``)."""
    value = item.get("type")
    if value is None and "role" in item:
        return "message"
    if value is None and "id" in item and len(item) <= 2:
        return "item_reference"  # its ``type`` is optional too
    return value if isinstance(value, str) else ""


def _output_key(item: dict[str, Any]) -> str:
    """The call id an output item answers (a local shell output: call_id when present)."""
    kind = item_type(item)
    if kind == "local_shell_call_output" and isinstance(item.get("call_id"), str):
        return str(item["call_id"])
    return str(item.get(OUTPUTS[kind][0], ""))


def _parts(content: Any) -> list[str]:
    """The texts of a content value: a string, or its text parts in order."""
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        return [
            str(part.get("text", ""))
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        ]
    return []


def _parts_text(content: Any) -> str:
    """The text of a content value: a string, or its text parts joined."""
    return "\n".join(_parts(content))


class ResponsesFormat(MessageFormat):
    """Responses API input items, one item per message of the log."""

    name = "responses"
    groups_turns = True
    reuses_call_ids = True
    block_types: ClassVar[Mapping[str, frozenset[str]]] = {
        "system": _INPUT_PARTS,
        "developer": _INPUT_PARTS,
        "user": _INPUT_PARTS,
        # The SDK's EasyInputMessageParam allows input parts for any role, but the API
        # takes only output_text and refusal parts from the assistant.
        "assistant": frozenset({"output_text", "refusal"}),
        "function_call_output": _INPUT_PARTS,
        "custom_tool_call_output": _INPUT_PARTS,
    }
    read_block_types = frozenset({"input_text", "output_text"})
    result_block_types = ("input_text", "input_image", "input_file")
    sdk_extra = "openai"
    request_key = "input"
    response_name = "an OpenAI Responses Response"

    def examples(self) -> list[dict[str, Any]]:
        return copy.deepcopy(_EXAMPLES)

    def block_lists(self, message: dict[str, Any]) -> Iterator[tuple[str, str, list[Any]]]:
        """A message item's content, a function or custom tool output's ``output`` list."""
        kind = message.get("type", "message" if "role" in message else None)
        if kind == "message":
            yield from super().block_lists(message)
        elif kind in ("function_call_output", "custom_tool_call_output"):
            output = message.get("output")
            if isinstance(output, list):
                yield kind, "output", output

    def thinking_count(self, message: Mapping[str, Any]) -> int:
        """A reasoning item is one thinking block."""
        return 1 if item_type(message) in GLUE else 0

    def text_block(self, role: str, text: str) -> dict[str, Any]:
        if role == "assistant":
            return {"type": "output_text", "text": text, "annotations": []}
        return {"type": "input_text", "text": text}

    def request_type(self) -> Any:
        """``openai.types.responses.ResponseInputItemParam``."""
        try:
            import openai.types.responses
        except ImportError:
            raise self.sdk_missing() from None
        return openai.types.responses.ResponseInputItemParam

    def is_response(self, response: Any) -> bool:
        return getattr(response, "object", None) == "response" and hasattr(response, "output")

    def response_turn(self, response: Any) -> tuple[list[dict[str, Any]], int | None]:
        """Every output item; the prompt is ``input_tokens`` (cached tokens included)."""
        item_type_ = self.request_type()
        items = [to_request(item_type_, item) for item in getattr(response, "output", None) or []]
        return items, usage_count(getattr(response, "usage", None), "input_tokens")

    def tool_definition(
        self, name: str, description: str, schema: dict[str, Any]
    ) -> dict[str, Any]:
        """``{"type": "function", "name", "description", "parameters", "strict"}``; not
        strict: strict mode would make every property required."""
        return {
            "type": "function",
            "name": name,
            "description": description,
            "parameters": schema,
            "strict": False,
        }

    def validate(self, message: Any) -> None:
        if not isinstance(message, dict):
            raise self.fail(f"an item must be a dict, got {type_name(message)}")
        kind = item_type(message)
        if kind not in ITEM_CLASSES:
            shown = message.get("type")
            raise self.fail(
                f"unknown item type {shown!r} for format responses (expected one of: "
                f"{', '.join(sorted(ITEM_CLASSES))})"
                if shown is not None
                else "item has neither 'type' nor 'role'"
            )
        item_class = ITEM_CLASSES[kind]
        if kind == "compaction_trigger":
            raise self.fail(
                "compaction_trigger items are refused: they ask the provider to compact the "
                "context, which compactstore does itself"
            )
        if item_class == "message":
            self._check_message(message)
        elif item_class == "call":
            self._check_call(message, kind)
        elif item_class == "output":
            self._check_output(message, kind)
        elif kind == "reasoning":
            if not isinstance(message.get("summary"), list):
                shown = type_name(message.get("summary"))
                raise self.fail(f"reasoning item needs a list 'summary', got {shown}")
        elif kind == "compaction":
            check_nonempty_str(message, "encrypted_content", "compaction item", "")
        elif kind == "item_reference":
            check_nonempty_str(message, "id", "item_reference item", "")

    def _check_call(self, message: dict[str, Any], kind: str) -> None:
        key, name, _ = CALLS[kind]
        check_nonempty_str(message, key, f"{kind} item", "")
        if name is None:
            check_nonempty_str(message, "name", f"{kind} item", "")
        if kind == "function_call" and not isinstance(message.get("arguments"), str):
            raise self.fail(
                "function_call item needs a string 'arguments' (JSON text), "
                f"got {type_name(message.get('arguments'))}"
            )
        if kind == "custom_tool_call" and not isinstance(message.get("input"), str):
            raise self.fail(
                f"custom_tool_call item needs a string 'input', "
                f"got {type_name(message.get('input'))}"
            )

    def _check_output(self, message: dict[str, Any], kind: str) -> None:
        key = OUTPUTS[kind][0]
        if kind == "local_shell_call_output" and "call_id" in message:
            key = "call_id"
        check_nonempty_str(message, key, f"{kind} item", "")
        content = message.get(OUTPUTS[kind][1])
        if kind not in _NOT_REPLACEABLE and isinstance(content, list):
            for i, part in enumerate(content):
                if isinstance(part, dict) and part.get("type") in MEDIA_BLOCK_TYPES:
                    check_media_block(part, f"{OUTPUTS[kind][1]}[{i}]: ")

    def _check_message(self, message: dict[str, Any]) -> None:
        role = message.get("role")
        if not isinstance(role, str) or role not in _ROLES:
            raise self.fail(
                f"unknown role {role!r} for format responses (expected one of: {', '.join(_ROLES)})"
                if isinstance(role, str)
                else f"message item needs a string 'role', got {type_name(role)}"
            )
        if "content" not in message:
            raise self.fail("message item has no 'content'")
        content = message["content"]
        if isinstance(content, str):
            return
        if not isinstance(content, list):
            raise self.fail(
                "message 'content' must be a string or a list of content parts, "
                f"got {type_name(content)}"
            )
        check_blocks(content, "content")
        check_user_media(message, ("input_image", "input_file"))

    def check_config(self, message: dict[str, Any], config: Any) -> None:
        if item_type(message) == "item_reference" and not getattr(config, "responses_store", False):
            raise self.fail(
                "item_reference items need stored responses: set "
                "CompactionConfig(responses_store=True) if the provider keeps them, or append "
                "the item itself"
            )

    def item_class(self, message: dict[str, Any]) -> ItemClass:
        """The class of an item (see the module's docstring)."""
        return ITEM_CLASSES.get(item_type(message), "hosted")

    def kind(self, message: dict[str, Any]) -> Kind:
        item_class = self.item_class(message)
        if item_class == "message":
            role = message.get("role")
            if role in ("system", "developer"):
                return "system"
            return "assistant" if role == "assistant" else "user"
        if item_class == "output":
            return "tool"
        if item_type(message) in ("additional_tools", "configuration_update"):
            return "system"  # the client's (a developer item), not the model's
        return "assistant"

    def glued(self, message: dict[str, Any]) -> bool:
        return item_type(message) in GLUE

    def droppable_orphan(self, message: dict[str, Any]) -> bool:
        return item_type(message) in NO_STAND_IN

    def tool_calls(self, message: dict[str, Any]) -> list[ToolCall]:
        kind = item_type(message)
        spec = CALLS.get(kind)
        if spec is None:
            return []
        key, name, input_key = spec
        return [
            ToolCall(
                id=str(message.get(key, "")),
                name=str(message.get("name", "")) if name is None else name,
                input=message.get(input_key, message.get("actions", "")),
            )
        ]

    def tool_results(self, message: dict[str, Any]) -> list[ToolResult]:
        kind = item_type(message)
        if kind not in OUTPUTS:
            return []
        content = message.get(OUTPUTS[kind][1])
        if kind == "shell_call_output" and isinstance(content, list):
            text = "\n".join(
                "\n".join(
                    str(chunk.get(k, ""))
                    for k in ("stdout", "stderr")
                    if isinstance(chunk, dict) and chunk.get(k)
                )
                for chunk in content
            )
        elif kind in _NOT_REPLACEABLE or not isinstance(content, str | list):
            text = "" if content is None else json_text(content)
        else:
            text = _parts_text(content) if isinstance(content, list) else content
            if isinstance(content, list):
                # Other parts count as their JSON; media parts by their size.
                text = "\n".join(
                    [
                        text,
                        *(
                            json_text(p)
                            for p in content
                            if not _is_text_part(p)
                            and not (isinstance(p, dict) and p.get("type") in MEDIA_BLOCK_TYPES)
                        ),
                    ]
                ).strip("\n")
        return [
            ToolResult(
                tool_use_id=_output_key(message),
                text=text,
                is_error=kind == "apply_patch_call_output" and message.get("status") == "failed",
                replaceable=kind not in _NOT_REPLACEABLE,
                blocks=result_blocks(content) if kind not in _NOT_REPLACEABLE else None,
            )
        ]

    def text(self, message: dict[str, Any]) -> str:
        if self.item_class(message) != "message":
            return ""
        return _parts_text(message.get("content"))

    def text_parts(self, message: dict[str, Any]) -> list[str]:
        if self.item_class(message) != "message":
            return []
        return _parts(message.get("content"))

    def token_text(self, message: dict[str, Any]) -> str:
        item_class = self.item_class(message)
        if item_class in ("message", "call", "output"):
            return super().token_text(message)
        # Reasoning, compaction and hosted items cost what they send: their JSON; a generated
        # image counts by its size (tokens.message_tokens adds it), not its base64.
        if item_type(message) == GENERATED_IMAGE and isinstance(message.get("result"), str):
            return json_text({key: v for key, v in message.items() if key != "result"})
        return json_text(message)

    def replace_tool_results(
        self, message: dict[str, Any], replacements: dict[str, str]
    ) -> dict[str, Any]:
        new = copy.deepcopy(message)
        kind = item_type(new)
        if kind not in OUTPUTS or kind in _NOT_REPLACEABLE:
            return new
        key = _output_key(new)
        if key not in replacements:
            return new
        text = replacements[key]
        if kind == "shell_call_output":
            new["output"] = [
                {"stdout": text, "stderr": "", "outcome": {"type": "exit", "exit_code": 0}}
            ]
        else:
            new[OUTPUTS[kind][1]] = text
        return new

    def tool_result_message(
        self, tool_use_id: str, content: ResultContent, *, tool_name: str, is_error: bool
    ) -> dict[str, Any]:
        """A ``function_call_output`` item; an error is marked by an ``"Error: "`` prefix
        (the item has no error flag)."""
        return {
            "type": "function_call_output",
            "call_id": tool_use_id,
            "output": error_prefixed(content, "input_text") if is_error else content,
        }

    def summary_message(self, text: str) -> dict[str, Any]:
        """A user message item."""
        return {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": text}],
        }

    def synthetic_results(self, calls: list[ToolCall], text: str) -> list[dict[str, Any]]:
        """``function_call_output`` stand-ins; the active context answers each orphan by the
        type of its call item instead (:meth:`answer_orphans`)."""
        return [
            {"type": "function_call_output", "call_id": call.id, "output": text} for call in calls
        ]

    def stand_in(self, message: dict[str, Any], text: str) -> dict[str, Any] | None:
        """The stand-in output answering the call item ``message`` (None: impossible)."""
        kind = item_type(message)
        if kind not in CALLS or kind in NO_STAND_IN:
            return None
        call_id = str(message[CALLS[kind][0]])
        if kind == "local_shell_call":
            return {"type": "local_shell_call_output", "id": call_id, "output": text}
        if kind == "shell_call":
            return {
                "type": "shell_call_output",
                "call_id": call_id,
                "output": [
                    {"stdout": "", "stderr": text, "outcome": {"type": "exit", "exit_code": 1}}
                ],
            }
        if kind == "apply_patch_call":
            return {
                "type": "apply_patch_call_output",
                "call_id": call_id,
                "status": "failed",
                "output": text,
            }
        if kind == "tool_search_call":
            return {"type": "tool_search_output", "call_id": call_id, "tools": []}
        output_type = (
            "custom_tool_call_output" if kind == "custom_tool_call" else ("function_call_output")
        )
        return {"type": output_type, "call_id": call_id, "output": text}

    def answer_orphans(
        self, message: dict[str, Any], calls: list[ToolCall], text: str
    ) -> list[dict[str, Any]] | None:
        """Stand-ins for the orphan calls of ``message``; None when it must be dropped."""
        stand_in = self.stand_in(message, text)
        return None if stand_in is None else [stand_in]

    def thinking_noted(self, message: dict[str, Any]) -> dict[str, Any]:
        """A reasoning item becomes an assistant message saying it was left out: its summary
        and encrypted content never reach a summarizer."""
        if item_type(message) != "reasoning":
            return message
        return {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": THINKING_NOTE}],
        }

    leaves_messages_out = True

    def sent(self, message: Mapping[str, Any], config: Any) -> bool:
        """Without stored responses, a reasoning item that carries no ``encrypted_content``
        cannot be resolved by the provider: it is not sent (nor counted)."""
        return (
            getattr(config, "responses_store", False)
            or item_type(message) != "reasoning"
            or bool(message.get("encrypted_content"))
        )

    def wire_view(self, messages: list[dict[str, Any]], config: Any) -> list[dict[str, Any]]:
        """The items :meth:`sent` keeps."""
        if getattr(config, "responses_store", False):
            return messages
        return [m for m in messages if self.sent(m, config)]


def _is_text_part(part: Any) -> bool:
    return isinstance(part, dict) and isinstance(part.get("text"), str)


_PARTS: list[dict[str, Any]] = [
    {"type": "input_text", "text": "The build log says the linker failed."},
    {"type": "input_image", "image_url": "https://example.com/plot.png", "detail": "auto"},
    {"type": "input_file", "file_id": "file_build_log"},
]
# A conversation with every part type each role and output may carry
# (ResponsesFormat.examples).
_EXAMPLES: list[dict[str, Any]] = [
    {"type": "message", "role": "system", "content": _PARTS},
    {"type": "message", "role": "developer", "content": _PARTS},
    {"type": "message", "role": "user", "content": _PARTS},
    {
        "type": "message",
        "id": "msg_1",
        "role": "assistant",
        "status": "completed",
        "content": [
            {"type": "output_text", "text": "Reading the log.", "annotations": []},
            {"type": "refusal", "refusal": "I will not delete the log."},
        ],
    },
    {"type": "function_call", "call_id": "call_1", "name": "read_file", "arguments": "{}"},
    {"type": "function_call_output", "call_id": "call_1", "output": _PARTS},
    {"type": "custom_tool_call", "call_id": "call_2", "name": "grep", "input": "undefined"},
    {"type": "custom_tool_call_output", "call_id": "call_2", "output": _PARTS},
    {"type": "message", "role": "assistant", "content": "The linker needs -lm."},
]
