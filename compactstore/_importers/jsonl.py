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

from collections.abc import Iterator
from typing import Any

from compactstore._importers.builder import Item, TranscriptBuilder
from compactstore._importers.files import Progress, TranscriptFile
from compactstore.errors import InvalidInputError
from compactstore.formats.block_types import NO_EXTENSION, BlockTypeExtension

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


def detect_format(file: TranscriptFile) -> str:
    """The session format a plain JSONL file's messages are written in (see the module
    docstring); one pass over the file, keeping only what it has seen."""
    roles: set[str] = set()
    blocks: set[str] = set()
    openai_keys = False
    for number, message in file.records():
        role = message.get("role")
        if role is None:
            raise InvalidInputError(f"{file.name} line {number}: a message needs a 'role'")
        if isinstance(role, str):
            roles.add(role)
        blocks |= _block_types(message)
        openai_keys = openai_keys or "tool_calls" in message or "tool_call_id" in message
    if "tool_result" in roles:
        return "minicode"
    if roles & _OPENAI_ROLES or blocks & _OPENAI_PARTS or openai_keys:
        return "openai"
    if "tool_result" in blocks:
        return "anthropic"
    if "tool_use" in blocks:
        return "minicode" if "system" in roles else "anthropic"
    return "openai" if "system" in roles else "anthropic"


def convert(
    file: TranscriptFile,
    format: str,
    progress: Progress | None = None,
    extension: BlockTypeExtension = NO_EXTENSION,
) -> Iterator[Item]:
    """Take each line as one message of ``format``."""
    out = TranscriptBuilder(file.name, "jsonl", format, extension)
    for number, message in file.records(progress):
        if "role" not in message:
            raise out.error(f"line {number}", "a message needs a 'role'")
        out.add(message, where=f"line {number}")
        out.release()
        yield from out.drain()
    yield from out.finish()
