"""A provider's compaction as a message holds it (pure functions of the message): the
Anthropic ``compaction`` block a message starts with, an OpenAI Responses ``compaction`` item,
their readable text and the note that names an opaque one."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "ITEM_NOTE",
    "compaction_block",
    "compaction_text",
    "item_note",
    "provided_note",
    "provided_text",
]

ITEM_NOTE = "compaction by the provider: opaque item {id}, no readable summary"


def compaction_block(message: Mapping[str, Any]) -> dict[str, Any] | None:
    """The compaction block a message starts with (an Anthropic message whose first content
    block has type ``compaction``), else None."""
    content = message.get("content")
    if not isinstance(content, list) or not content:
        return None
    first = content[0]
    if isinstance(first, dict) and first.get("type") == "compaction":
        return first
    return None


def compaction_text(message: dict[str, Any]) -> str:
    """The readable summary of a provider's compaction message (a note when opaque)."""
    block = compaction_block(message) or {}
    text = block.get("content")
    if isinstance(text, str) and text:
        return text
    return "[compaction by the provider: opaque block, no readable summary]"


def provided_text(message: dict[str, Any]) -> str | None:
    """The readable summary of a provider's compaction (an Anthropic block's ``content``);
    None for an opaque one (an encrypted block, every OpenAI compaction item)."""
    block = compaction_block(message)
    text = block.get("content") if block is not None else None
    return text if isinstance(text, str) and text else None


def provided_note(message: dict[str, Any]) -> str:
    """The one-line note naming an opaque provider compaction."""
    if compaction_block(message) is not None:
        return "compaction by the provider: opaque block, no readable summary"
    return item_note(message)


def item_note(item: Mapping[str, Any]) -> str:
    """The one-line note a boundary's summary starts with for an opaque item."""
    return ITEM_NOTE.format(id=item.get("id") or "(no id)")
