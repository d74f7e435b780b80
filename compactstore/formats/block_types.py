"""Which content block (part, item) types each role may carry, per format.

The SDKs' unions alone do not say which role may carry which block: Anthropic's user and
assistant unions are identical, yet the API refuses ``tool_use`` from a user and an image
from the assistant. :data:`BLOCK_TYPES` is the one list, format by format and role by role;
a test checks that every listed type is in the pinned SDK's union and that every member of
the union is listed for some role or in :data:`EXCLUDED_BLOCK_TYPES` with its reason.

Besides message roles, a list may govern a block list nested in a tool result: ``tool_result``
(the ``content`` of an Anthropic ``tool_result`` block) and the ``output`` lists of Responses
``function_call_output`` / ``custom_tool_call_output`` items (keyed by the item type).

- The live API (``append``/``extend``) refuses any other type with an
  :class:`~compactstore.errors.InvalidMessageError` naming the allowed ones
  (:func:`check_block_types`).
- Importers replace such a block by a short text note and warn (:func:`note_unlisted`).
- ``CompactStore.open(allow_block_types=...)`` extends the lists
  (:func:`block_type_extension`): an iterable of type names extends every role, a mapping
  ``{role: types}`` the named roles (``"*"``: every role).

Server-side tool blocks (:data:`SERVER_TOOL_BLOCKS`: the provider ran the tool and wrote its
result into the same assistant message) are not client tool calls: they never get a
synthetic result and never pair with a ``tool_result``.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from compactstore.errors import InvalidInputError, InvalidMessageError

__all__ = [
    "ALL_ROLES",
    "BLOCK_TYPES",
    "EXCLUDED_BLOCK_TYPES",
    "NO_EXTENSION",
    "SERVER_TOOL_BLOCKS",
    "AllowBlockTypes",
    "BlockTypeExtension",
    "Unlisted",
    "allowed_block_types",
    "block_type_extension",
    "check_block_types",
    "note_unlisted",
    "unlisted_blocks",
]

# Anthropic blocks of tools the provider runs itself: a call and its result both stand in
# the assistant message (no client tool_result answers them).
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

_ANTHROPIC_USER = frozenset(
    {"text", "image", "document", "search_result", "tool_result", "container_upload"}
)
_ANTHROPIC_ASSISTANT = frozenset(
    {"text", "thinking", "redacted_thinking", "tool_use"} | SERVER_TOOL_BLOCKS
)
_RESPONSES_INPUT = frozenset({"input_text", "input_image", "input_file"})

# format -> role (or nested list) -> the block types it may carry.
BLOCK_TYPES: Mapping[str, Mapping[str, frozenset[str]]] = {
    "anthropic": {
        "system": frozenset({"text"}),
        "user": _ANTHROPIC_USER,
        "assistant": _ANTHROPIC_ASSISTANT,
        # Inside a tool_result block (the API nests leaf blocks only).
        "tool_result": frozenset(
            {"text", "image", "document", "search_result", "tool_reference", "browser_state"}
        ),
    },
    # MiniCode speaks Anthropic's block dialect; its tool results are messages of their own.
    "minicode": {
        "system": frozenset({"text"}),
        "user": _ANTHROPIC_USER - {"tool_result"},
        "assistant": _ANTHROPIC_ASSISTANT,
    },
    "openai": {
        "system": frozenset({"text"}),
        "developer": frozenset({"text"}),
        "user": frozenset({"text", "image_url", "input_audio", "file"}),
        "assistant": frozenset({"text", "refusal"}),
        "tool": frozenset({"text"}),
    },
    "responses": {
        "system": _RESPONSES_INPUT,
        "developer": _RESPONSES_INPUT,
        "user": _RESPONSES_INPUT,
        # The SDK's EasyInputMessageParam allows input parts for any role, but the API
        # takes only output_text and refusal parts from the assistant.
        "assistant": frozenset({"output_text", "refusal"}),
        "function_call_output": _RESPONSES_INPUT,
        "custom_tool_call_output": _RESPONSES_INPUT,
    },
}

# format -> block type -> why a member of the SDK's union is listed for no role.
EXCLUDED_BLOCK_TYPES: Mapping[str, Mapping[str, str]] = {
    "anthropic": {},
    "openai": {},
    "responses": {},
}

# A role key of an extension that extends every role.
ALL_ROLES = "*"

# What ``allow_block_types=`` takes: type names (every role) or role -> type names.
AllowBlockTypes = Iterable[str] | Mapping[str, Iterable[str]] | None

# role (or ALL_ROLES) -> the extra types it may carry.
BlockTypeExtension = Mapping[str, frozenset[str]]
NO_EXTENSION: BlockTypeExtension = {}


def block_type_extension(value: Any) -> BlockTypeExtension:
    """``allow_block_types=`` checked: None, an iterable of type names (every role) or a
    mapping of role -> type names.

    Raises:
        InvalidInputError: not one of those, or a name that is not a non-empty string.
    """
    if value is None:
        return NO_EXTENSION
    if isinstance(value, Mapping):
        items = list(value.items())
    elif isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise InvalidInputError(
            "allow_block_types must be a list of block type names or a mapping of role -> "
            f"block type names, got {value!r}"
        )
    else:
        items = [(ALL_ROLES, value)]
    extension: dict[str, frozenset[str]] = {}
    for role, names in items:
        if not isinstance(role, str) or not role:
            raise InvalidInputError(f"allow_block_types: a role must be a string, got {role!r}")
        if isinstance(names, str | bytes) or not isinstance(names, Iterable):
            raise InvalidInputError(
                f"allow_block_types[{role!r}] must be a list of block type names, got {names!r}"
            )
        listed = frozenset(names)
        for name in listed:
            if not isinstance(name, str) or not name:
                raise InvalidInputError(
                    f"allow_block_types: a block type must be a non-empty string, got {name!r}"
                )
        extension[role] = extension.get(role, frozenset()) | listed
    return extension


def allowed_block_types(
    format_name: str, role: str, extension: BlockTypeExtension = NO_EXTENSION
) -> frozenset[str]:
    """The block types ``role`` may carry in ``format_name``, extension included."""
    listed = BLOCK_TYPES.get(format_name, {}).get(role, frozenset())
    return listed | extension.get(role, frozenset()) | extension.get(ALL_ROLES, frozenset())


@dataclass(frozen=True, slots=True)
class Unlisted:
    """A block whose type its role may not carry."""

    where: str  # "content[2]", "content[0].content[1]", "output[0]"
    role: str
    type: str
    allowed: frozenset[str]

    def problem(self, format_name: str) -> str:
        what = _ROLE_WORDS.get(self.role, f"{self.role} items")
        return (
            f"{self.where}: block type {self.type!r} is not allowed in {what} of format "
            f"{format_name} (allowed: {', '.join(sorted(self.allowed))}; "
            f"CompactStore.open(allow_block_types=...) extends the list)"
        )


_ROLE_WORDS = {
    "tool_result": "tool_result content",
    "system": "system messages",
    "developer": "developer messages",
    "user": "user messages",
    "assistant": "assistant messages",
    "tool": "tool messages",
}


def _block_lists(format_name: str, message: dict[str, Any]) -> Iterator[tuple[str, str, list[Any]]]:
    """(role key, where, list) of every block list of ``message`` that a list governs."""
    if format_name == "responses":
        kind = message.get("type", "message" if "role" in message else None)
        if kind == "message":
            role, content = message.get("role"), message.get("content")
            if isinstance(role, str) and isinstance(content, list):
                yield role, "content", content
        elif kind in ("function_call_output", "custom_tool_call_output"):
            output = message.get("output")
            if isinstance(output, list):
                yield kind, "output", output
        return
    role, content = message.get("role"), message.get("content")
    if not isinstance(role, str) or not isinstance(content, list):
        return
    yield role, "content", content
    if format_name != "anthropic":
        return
    for index, block in enumerate(content):
        if isinstance(block, dict) and block.get("type") == "tool_result":
            inner = block.get("content")
            if isinstance(inner, list):
                yield "tool_result", f"content[{index}].content", inner


def unlisted_blocks(
    format_name: str, message: dict[str, Any], extension: BlockTypeExtension = NO_EXTENSION
) -> list[Unlisted]:
    """The blocks of ``message`` whose type their role may not carry (in order)."""
    if format_name not in BLOCK_TYPES:
        return []
    found: list[Unlisted] = []
    for role, where, blocks in _block_lists(format_name, message):
        allowed = allowed_block_types(format_name, role, extension)
        for index, block in enumerate(blocks):
            kind = block.get("type") if isinstance(block, dict) else None
            if isinstance(kind, str) and kind not in allowed:
                found.append(Unlisted(f"{where}[{index}]", role, kind, allowed))
    return found


def check_block_types(
    format_name: str, message: dict[str, Any], extension: BlockTypeExtension = NO_EXTENSION
) -> None:
    """Refuse a message carrying a block its role may not carry.

    Raises:
        InvalidMessageError: naming the block, its role and the allowed types.
    """
    found = unlisted_blocks(format_name, message, extension)
    if found:
        raise InvalidMessageError(found[0].problem(format_name))


def note_unlisted(
    format_name: str, message: dict[str, Any], extension: BlockTypeExtension = NO_EXTENSION
) -> tuple[dict[str, Any], list[str]]:
    """``message`` with each block its role may not carry (``extension`` included) replaced
    by a short text note (``[banana block left out]``), and the types replaced; the message
    itself when none."""
    found = unlisted_blocks(format_name, message, extension)
    if not found:
        return message, []
    new = copy.deepcopy(message)
    for role, _, blocks in _block_lists(format_name, new):
        allowed = allowed_block_types(format_name, role, extension)
        for index, block in enumerate(blocks):
            kind = block.get("type") if isinstance(block, dict) else None
            if isinstance(kind, str) and kind not in allowed:
                blocks[index] = _note(format_name, role, f"[{kind} block left out]")
    return new, [item.type for item in found]


def _note(format_name: str, role: str, text: str) -> dict[str, Any]:
    if format_name != "responses":
        return {"type": "text", "text": text}
    if role == "assistant":
        return {"type": "output_text", "text": text, "annotations": []}
    return {"type": "input_text", "text": text}
