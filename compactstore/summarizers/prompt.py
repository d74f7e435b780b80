"""The built-in summarizers' prompt: the handoff sections, asked of a model.

Pure functions, no SDK: :func:`build_prompt` turns what a summarizer receives (the removed
messages in the session's format, the previous summary, the caller's instructions) into one
system text and one user text within an input cap, and :func:`transcript` writes messages of
any compactstore format (anthropic, openai, minicode, responses) as plain text for it.

What never leaves the process here: images, documents, audio and files (media blocks of every
format), base64 data wherever it appears (``data:`` URLs and long base64 runs), and thinking
(``thinking``, ``redacted_thinking``, ``reasoning`` items, signatures, encrypted content).
Each is replaced by a short note such as ``[image left out]``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from compactstore._context.tokens import estimate_tokens
from compactstore._engines.summary_sections import RECALL, SECTIONS
from compactstore.formats.base import json_text

__all__ = [
    "DEFAULT_MAX_INPUT_TOKENS",
    "RESULT_CHARS",
    "SummaryPrompt",
    "build_prompt",
    "scrub",
    "system_prompt",
    "transcript",
]

# What the summarizer sends at most, by compactstore's own estimate: well inside the window of
# any current model, and cheap enough for a call that runs at every compaction.
DEFAULT_MAX_INPUT_TOKENS = 60_000

# A single tool result longer than this is sent as its head and tail, with the length noted.
RESULT_CHARS = 4_000

_THINKING = frozenset({"thinking", "redacted_thinking", "reasoning"})
_MEDIA = {
    "image": "image",
    "input_image": "image",
    "image_url": "image",
    "document": "document",
    "input_file": "file",
    "file": "file",
    "input_audio": "audio",
    "audio": "audio",
    "search_result": "search result",
}
# Keys whose values are opaque to a reader (signatures, encrypted or binary payloads).
_OPAQUE_KEYS = frozenset({"signature", "encrypted_content", "data", "image_url", "file_data"})
_LEFT_OUT = "[base64 data left out]"
_DATA_URL = re.compile(r"data:[\w.+-]+/[\w.+-]+(?:;[\w=.+-]+)*;base64,[A-Za-z0-9+/=\s]+")
# A run of base64 long enough that it is no prose, code or path a person would write.
_BASE64_RUN = re.compile(r"(?<![A-Za-z0-9+/])[A-Za-z0-9+/]{200,}={0,2}(?![A-Za-z0-9+/=])")

_SECTIONS = "\n\n".join(section.prompt() for section in SECTIONS)


def system_prompt(max_output_tokens: int, *, recall: bool) -> str:
    """The instructions the model gets: write a handoff in its sections."""
    recall_section = "\n\n" + RECALL.prompt() if recall else ""
    return (
        "You write the handoff summary of an AI agent's conversation. The oldest part of the "
        "conversation is being removed from the agent's context window; your summary replaces "
        "it, and the agent continues from your summary alone, so keep everything it needs "
        "to carry on without asking the user again.\n\n"
        "Fold the previous summary, when there is one, into the new one: nothing it records "
        "may be lost.\n\n"
        "Write these sections, in this order, with these headings; leave out a section that "
        "has nothing to say:\n\n"
        f"{_SECTIONS}{recall_section}\n\n"
        f"Write at most {max_output_tokens} tokens. No preamble, no closing remarks, and do "
        "not answer or continue the conversation: write only the summary."
    )


@dataclass(frozen=True, slots=True)
class SummaryPrompt:
    """What a built-in summarizer sends: the system text, the user text, and how many of the
    messages it was given are in it (the oldest ``dropped`` were left out by the input cap)."""

    system: str
    user: str
    sent: int
    dropped: int

    @property
    def input_tokens(self) -> int:
        """compactstore's estimate of the prompt's size."""
        return estimate_tokens(self.system) + estimate_tokens(self.user)


def build_prompt(
    messages: Sequence[dict[str, Any]],
    previous_summary: str | None,
    instructions: str | None,
    *,
    max_input_tokens: int = DEFAULT_MAX_INPUT_TOKENS,
    max_output_tokens: int,
    recall: bool = False,
) -> SummaryPrompt:
    """The prompt for summarising ``messages`` on top of ``previous_summary``.

    The prompt stays within ``max_input_tokens`` (compactstore's estimate): the oldest
    messages are dropped first, the previous summary and the caller's instructions are always
    kept, and when even the newest message does not fit it is cut to what does.
    """
    system = system_prompt(max_output_tokens, recall=recall)
    head: list[str] = []
    if previous_summary:
        head.append(f"<previous_summary>\n{scrub(previous_summary)}\n</previous_summary>")
    if instructions:
        head.append(f"<instructions>\n{scrub(instructions)}\n</instructions>")
    lines = [transcript_message(message) for message in messages]
    fixed = estimate_tokens(system) + estimate_tokens("\n\n".join(head)) + 64
    room = max_input_tokens - fixed
    kept: list[str] = []
    for line in reversed(lines):
        cost = estimate_tokens(line) + 1
        if cost <= room:
            kept.append(line)
            room -= cost
            continue
        if not kept and room > 0:
            # The newest message alone is over the cap: its end says most about where
            # the work stands.
            kept.append("…" + line[-int(room * 3) :])
        break
    kept.reverse()
    dropped = len(lines) - len(kept)
    note = (
        f"[{dropped} older messages left out to fit the summarizer's input cap]\n"
        if dropped
        else ""
    )
    body = "<conversation>\n" + note + "\n\n".join(kept) + "\n</conversation>"
    user = "\n\n".join([*head, body, "Write the handoff summary now."])
    return SummaryPrompt(system=system, user=user, sent=len(kept), dropped=dropped)


def _base64_note(match: re.Match[str]) -> str:
    run = match.group(0)
    # Real base64 mixes cases and digits; a long run of one letter is just text.
    mixed = any(c.isupper() for c in run) and any(c.islower() for c in run)
    return _LEFT_OUT if mixed and any(c.isdigit() for c in run) else run


def scrub(text: str) -> str:
    """``text`` with base64 data (``data:`` URLs, long base64 runs) replaced by a note."""
    text = _DATA_URL.sub(_LEFT_OUT, text)
    return _BASE64_RUN.sub(_base64_note, text)


def _clip(text: str, limit: int = RESULT_CHARS) -> str:
    if len(text) <= limit:
        return text
    head, tail = limit // 2, limit // 4
    return f"{text[:head]}\n[… {len(text) - head - tail} characters left out …]\n{text[-tail:]}"


def _block(block: Any) -> str:
    """One content block, part or nested value as text; media and thinking become notes."""
    if isinstance(block, str):
        return scrub(block)
    if not isinstance(block, dict):
        return scrub(json_text(block)) if block is not None else ""
    kind = block.get("type")
    if kind in _THINKING:
        return "[thinking left out]"
    if kind in _MEDIA:
        return f"[{_MEDIA[kind]} left out]"
    if kind in ("text", "input_text", "output_text", "refusal"):
        text = block.get("text", block.get("refusal"))
        return scrub(text) if isinstance(text, str) else ""
    if kind in ("tool_use", "server_tool_use"):
        return f"[call {block.get('name')} id={block.get('id')}] {_value(block.get('input'))}"
    if kind == "tool_result" or (isinstance(kind, str) and kind.endswith("_tool_result")):
        error = " (error)" if block.get("is_error") else ""
        return f"[result for {block.get('tool_use_id')}{error}] {_content(block.get('content'))}"
    return _value(block)


def _value(value: Any) -> str:
    """A structured value as compact JSON, without opaque keys or base64."""
    if isinstance(value, str):
        return scrub(value)
    return scrub(json_text(_without_opaque(value)))


def _without_opaque(value: Any) -> Any:
    if isinstance(value, dict):
        if value.get("type") in _THINKING:
            return "[thinking left out]"
        if value.get("type") in _MEDIA:
            return f"[{_MEDIA[value['type']]} left out]"
        return {
            key: "[left out]" if key in _OPAQUE_KEYS else _without_opaque(item)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [_without_opaque(item) for item in value]
    return value


def _content(content: Any) -> str:
    if isinstance(content, list):
        return _clip("\n".join(part for part in map(_block, content) if part))
    return _clip(_block(content))


def transcript_message(message: dict[str, Any]) -> str:
    """One message (or Responses item) as a line of text: ``role: what it says``."""
    if not isinstance(message, dict):
        return _value(message)
    role = message.get("role")
    kind = message.get("type")
    if role is None and isinstance(kind, str):
        return _item(message, kind)
    parts: list[str] = []
    content = message.get("content")
    if role == "tool":  # openai chat
        return f"tool result for {message.get('tool_call_id')}: {_content(content)}"
    if role == "tool_result":  # minicode
        error = " (error)" if message.get("isError") else ""
        return (
            f"tool result of {message.get('toolName')} for {message.get('toolUseId')}{error}: "
            f"{_content(content)}"
        )
    if isinstance(content, list):
        parts.extend(part for part in map(_block, content) if part)
    elif content is not None:
        parts.append(_block(content))
    for call in message.get("tool_calls") or ():  # openai chat
        function = call.get("function", {}) if isinstance(call, dict) else {}
        parts.append(
            f"[call {function.get('name')} id={call.get('id') if isinstance(call, dict) else ''}]"
            f" {_value(function.get('arguments'))}"
        )
    return f"{role}: " + "\n".join(parts)


def _item(item: dict[str, Any], kind: str) -> str:
    """A Responses input item without a role."""
    if kind in _THINKING:
        return "assistant: [thinking left out]"
    if kind.endswith("_call_output") or kind.endswith("_output") or kind.endswith("_response"):
        key = item.get("call_id") or item.get("id") or item.get("approval_request_id")
        return f"tool result for {key}: {_content(item.get('output'))}"
    if kind.endswith("_call") or kind == "mcp_approval_request":
        name = item.get("name") or kind
        arguments = item.get("arguments", item.get("input", item.get("action")))
        return f"assistant: [call {name} id={item.get('call_id') or item.get('id')}] " + _value(
            arguments
        )
    return f"{kind}: {_value(item)}"


def transcript(messages: Sequence[dict[str, Any]]) -> str:
    """The messages as plain text, one paragraph each, media/base64/thinking left out."""
    return "\n\n".join(transcript_message(message) for message in messages)
