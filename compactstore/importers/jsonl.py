"""Plain JSONL: one message per line, in any session format, imported verbatim.

This is what ``compactstore export`` writes, so an exported session imports back as the
same messages. The format is read from the messages' shapes when it is not given:

- a ``tool_result`` role → ``minicode``;
- ``tool_calls``, a ``tool`` or ``developer`` role, or OpenAI-only content parts → ``openai``;
- ``tool_use``/``tool_result`` blocks → ``anthropic`` (``minicode`` when they come with a
  ``system`` role, which Anthropic messages cannot have);
- text only → ``anthropic``, unless a ``system`` role exists → ``openai``.

Nothing is dropped or repaired: a message that does not fit the format, or a tool result
without its call, fails the import naming its line.
"""

from __future__ import annotations

from typing import Any

from compactstore.importers import Record, Transcript, TranscriptBuilder

__all__ = ["convert", "detect_format", "text_parts"]

_OPENAI_ROLES = frozenset({"tool", "developer"})
_OPENAI_PARTS = frozenset({"image_url", "input_audio", "refusal", "file"})
_TEXT_PARTS = frozenset({"text", "input_text", "output_text"})


def text_parts(parts: list[Any]) -> list[str]:
    """The texts of a list of content parts (``text``/``input_text``/``output_text``)."""
    texts: list[str] = []
    for part in parts:
        if isinstance(part, str):
            texts.append(part)
        elif (
            isinstance(part, dict)
            and part.get("type") in _TEXT_PARTS
            and isinstance(part.get("text"), str)
        ):
            texts.append(part["text"])
    return texts


def _block_types(message: dict[str, Any]) -> set[str]:
    content = message.get("content")
    if not isinstance(content, list):
        return set()
    return {str(block.get("type")) for block in content if isinstance(block, dict)}


def detect_format(messages: list[dict[str, Any]]) -> str:
    """The session format these messages are written in (see the module docstring)."""
    roles = {m["role"] for m in messages if isinstance(m.get("role"), str)}
    blocks: set[str] = set()
    for message in messages:
        blocks |= _block_types(message)
    if "tool_result" in roles:
        return "minicode"
    if (
        roles & _OPENAI_ROLES
        or blocks & _OPENAI_PARTS
        or any("tool_calls" in m or "tool_call_id" in m for m in messages)
    ):
        return "openai"
    if "tool_result" in blocks:
        return "anthropic"
    if "tool_use" in blocks:
        return "minicode" if "system" in roles else "anthropic"
    return "openai" if "system" in roles else "anthropic"


def convert(name: str, records: list[Record], *, format: str | None = None) -> Transcript:
    """Take each line as one message of ``format`` (detected when None)."""
    for number, record in records:
        if "role" not in record:
            raise TranscriptBuilder(name, "jsonl", "anthropic").error(
                f"line {number}", "a message needs a 'role'"
            )
    messages = [record for _, record in records]
    out = TranscriptBuilder(name, "jsonl", format or detect_format(messages))
    for number, message in records:
        out.add(message, where=f"line {number}")
    return out.finish()
