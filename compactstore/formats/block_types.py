"""Which content block (part, item) types each role may carry, per format.

The SDKs' unions alone do not say which role may carry which block: Anthropic's user and
assistant unions are identical, yet the API refuses ``tool_use`` from a user and an image
from the assistant. Each format lists them (``MessageFormat.block_types``, gathered in
:data:`BLOCK_TYPES`), role by role;
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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from compactstore.errors import InvalidInputError, InvalidMessageError
from compactstore.formats import FORMAT_NAMES, get_format
from compactstore.formats.anthropic import SERVER_TOOL_BLOCKS
from compactstore.formats.sdk_types import SDK_FORMATS

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

# format -> role (or nested list) -> the block types it may carry: each format's
# ``MessageFormat.block_types``.
BLOCK_TYPES: Mapping[str, Mapping[str, frozenset[str]]] = {
    name: get_format(name).block_types for name in FORMAT_NAMES if get_format(name).block_types
}

# format -> block type -> why a member of the SDK's union is listed for no role.
EXCLUDED_BLOCK_TYPES: Mapping[str, Mapping[str, str]] = {
    name: get_format(name).excluded_block_types for name in SDK_FORMATS
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


def unlisted_blocks(
    format_name: str, message: dict[str, Any], extension: BlockTypeExtension = NO_EXTENSION
) -> list[Unlisted]:
    """The blocks of ``message`` whose type their role may not carry (in order)."""
    if format_name not in BLOCK_TYPES:
        return []
    found: list[Unlisted] = []
    for role, where, blocks in get_format(format_name).block_lists(message):
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
    fmt = get_format(format_name)
    for role, _, blocks in fmt.block_lists(new):
        allowed = allowed_block_types(format_name, role, extension)
        for index, block in enumerate(blocks):
            kind = block.get("type") if isinstance(block, dict) else None
            if isinstance(kind, str) and kind not in allowed:
                blocks[index] = fmt.text_block(role, f"[{kind} block left out]")
    return new, [item.type for item in found]
