"""Codex CLI rollout JSONL → ``responses`` items (``--format responses``).

Codex talks to the Responses API: the ``response_item`` records of a rollout are the input
items it sent and the output items it got back. This converter keeps them as items, shaped
to what the SDK's ``ResponseInputItemParam`` declares (Codex's own bookkeeping keys, such
as ``internal_chat_message_metadata_passthrough``, are left out):

- ``message`` items: user, developer and system messages keep their content parts; an
  assistant message is its text (and its ``phase``, which newer models want back);
- ``reasoning`` items are kept with their summary and their ``encrypted_content``
  verbatim. Codex does not write a reasoning item's ``id``, which the SDK type requires:
  an item without one is given ``rs_`` and a digest of its content (the provider reads the
  encrypted content, not the id, when responses are not stored). A reasoning item without
  encrypted content is kept in the log, but not sent (the format's rule);
- ``function_call`` / ``function_call_output`` and ``custom_tool_call`` /
  ``custom_tool_call_output`` pairs as they are; a ``local_shell_call`` and a
  ``tool_search_call`` become a function call named ``local_shell`` / ``tool_search``
  (their outputs its output: the loaded tools as JSON text); a ``web_search_call`` is kept
  as the provider's item;
- a ``compacted`` record is a boundary, as with the ``openai`` format, and the encrypted
  ``compaction`` item of its ``replacement_history`` is kept whole after it: what Codex
  continued with.

``event_msg`` records give each model response's first item its prompt size, as with the
``openai`` format; ``turn_context`` its model and working directory.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from compactstore._importers.builder import Entry, Item, TranscriptBuilder
from compactstore._importers.codex import (
    COMPACTION_ITEMS,
    answer,
    call_paths,
    payloads,
    replacement_text,
    succeeded,
    token_count,
)
from compactstore._importers.files import Progress, TranscriptFile
from compactstore._importers.jsonl import text_parts
from compactstore._ledger import CallUsage
from compactstore.formats.block_types import NO_EXTENSION, BlockTypeExtension
from compactstore.models import CompactStrategy, CompactTrigger, ImportedBoundary

__all__ = ["convert"]

_ROLES = ("user", "assistant", "developer", "system")
_TRIGGERS = {"auto": CompactTrigger.AUTO, "manual": CompactTrigger.MANUAL}
# Call item type -> (the function name it becomes, None: its own name; the key of its input).
_CALLS: dict[str, tuple[str | None, str]] = {
    "function_call": (None, "arguments"),
    "custom_tool_call": (None, "input"),
    "local_shell_call": ("local_shell", "action"),
    "tool_search_call": ("tool_search", "arguments"),
}
_OUTPUTS = frozenset(
    {
        "function_call_output",
        "custom_tool_call_output",
        "local_shell_call_output",
        "tool_search_output",
    }
)
# The keys of each web search action the SDK declares.
_WEB_ACTIONS = {
    "search": ("type", "query", "queries", "sources"),
    "open_page": ("type", "url"),
    "find_in_page": ("type", "url", "pattern"),
}
_WEB_STATUSES = frozenset({"in_progress", "searching", "completed", "failed", "incomplete"})
_PHASES = frozenset({"commentary", "final_answer"})


@dataclass
class _Call:
    read_path: str | None
    epoch: int
    custom: bool


@dataclass
class _State:
    out: TranscriptBuilder
    cwd: str | None = None
    calls: dict[str, _Call] = field(default_factory=dict)
    answered: set[str] = field(default_factory=set)
    epoch: int = 0
    turn: int | None = None  # the first item of the model response being read
    pending: tuple[int, CallUsage | None] | None = None  # a count not yet given to an item
    model: str | None = None
    instructions: tuple[str, str, float | None] | None = None  # (text, where, timestamp)
    leading: set[str] = field(default_factory=set)  # texts of the leading instructions


def convert(
    file: TranscriptFile,
    progress: Progress | None = None,
    extension: BlockTypeExtension = NO_EXTENSION,
) -> Iterator[Item]:
    """Convert a rollout into Responses items (see the module docstring)."""
    state = _State(TranscriptBuilder(file.name, "codex", "responses", extension))
    for where, kind, payload, timestamp in payloads(file, state.out, progress):
        _record(state, where, kind, payload, timestamp)
        if file.cwd is None and state.cwd:
            file.cwd = state.cwd  # the session's working directory, where it started
        held = 0 if state.instructions is not None else state.turn
        state.out.release(held)
        yield from state.out.drain()
    _prepend_instructions(state)
    yield from state.out.finish()


def _record(
    state: _State, where: str, kind: str, payload: dict[str, Any], timestamp: float | None
) -> None:
    if kind in ("session_meta", "turn_context"):
        if isinstance(payload.get("cwd"), str):
            state.cwd = payload["cwd"]
        if isinstance(payload.get("model"), str) and payload["model"]:
            state.model = payload["model"]
        instructions = payload.get("instructions") if kind == "session_meta" else None
        if isinstance(instructions, str) and instructions.strip() and not state.out.released:
            state.instructions = (instructions, where, timestamp)
    elif kind == "event_msg":
        counted = token_count(state.out, where, payload, state.model)
        if counted is not None:
            # Newer Codex writes the count after the response's items, older before them.
            if state.turn is not None and state.out.entry(state.turn).usage is None:
                entry = state.out.entry(state.turn)
                entry.usage, entry.ledger = counted
            else:
                state.pending = counted
    elif kind == "compacted":
        _compacted(state, where, payload, timestamp)
    elif kind == "response_item":
        _item(state, where, payload, timestamp)


def _prepend_instructions(state: _State) -> None:
    """Session instructions as a leading system message, unless a message before the
    model's first reply already has them (this runs just before that reply is added)."""
    if state.instructions is None:
        return
    text, where, timestamp = state.instructions
    state.instructions = None
    wanted = text.strip()
    if any(_text(entry.message).find(wanted) >= 0 for entry in state.out.held()):
        return
    message = {"type": "message", "role": "system", "content": [_input_text(text)]}
    state.out.insert_first(Entry(message, where, timestamp))


def _text(item: dict[str, Any]) -> str:
    content = item.get("content")
    if isinstance(content, str):
        return content
    return "\n".join(text_parts(content)) if isinstance(content, list) else ""


def _input_text(text: str) -> dict[str, Any]:
    return {"type": "input_text", "text": text}


def _add(
    state: _State,
    where: str,
    item: dict[str, Any],
    timestamp: float | None,
    *,
    model_side: bool,
    **extra: Any,
) -> int:
    """Add an item; the first item of a model response carries its prompt size."""
    if not model_side:
        state.turn = None
        return state.out.add(item, where=where, timestamp=timestamp, **extra)
    _prepend_instructions(state)
    usage, ledger = state.pending if state.pending is not None else (None, None)
    first = state.turn is None
    index = state.out.add(
        item,
        where=where,
        timestamp=timestamp,
        usage=usage if first else None,
        ledger=ledger if first else None,
        **extra,
    )
    if first:
        state.turn, state.pending = index, None
    return index


def _item(state: _State, where: str, item: dict[str, Any], timestamp: float | None) -> None:
    kind = item.get("type")
    if kind == "message":
        _message(state, where, item, timestamp)
    elif kind == "reasoning":
        _reasoning(state, where, item, timestamp)
    elif kind in _CALLS:
        _call(state, where, item, timestamp)
    elif kind in _OUTPUTS:
        _output(state, where, item, timestamp)
    elif kind == "web_search_call":
        _web_search(state, where, item, timestamp)
    elif kind in COMPACTION_ITEMS:
        _compaction_item(state, where, item, timestamp)


def _message(state: _State, where: str, item: dict[str, Any], timestamp: float | None) -> None:
    role = item.get("role")
    if role not in _ROLES:
        raise state.out.error(where, f"message item with unknown role {role!r}")
    content = item.get("content")
    if not isinstance(content, str | list):
        raise state.out.error(where, "message item: 'content' must be a list of parts or text")
    text = _text(item)
    if role == "assistant":
        if not text.strip():
            return
        message: dict[str, Any] = {"type": "message", "role": "assistant", "content": text}
        if item.get("phase") in _PHASES:
            message["phase"] = item["phase"]
        _add(state, where, message, timestamp, model_side=True)
        return
    parts = _input_parts(content)
    if not parts:
        return
    if role in ("developer", "system") and state.out.count == len(state.leading):
        state.leading.add(text)
    message = {"type": "message", "role": role, "content": parts}
    _add(state, where, message, timestamp, model_side=False)


def _input_parts(content: str | list[Any]) -> list[dict[str, Any]]:
    """A message's input parts as the SDK declares them: text parts (empty ones left out)
    and images; any other part as a short text note."""
    if isinstance(content, str):
        return [_input_text(content)] if content.strip() else []
    parts: list[dict[str, Any]] = []
    for part in content:
        if not isinstance(part, dict):
            continue
        kind = part.get("type")
        if isinstance(part.get("text"), str):
            if part["text"].strip():
                parts.append(_input_text(part["text"]))
        elif kind == "input_image" and isinstance(part.get("image_url"), str):
            image = {"type": "input_image", "image_url": part["image_url"]}
            detail = part.get("detail")
            image["detail"] = detail if detail in ("low", "high", "auto") else "auto"
            parts.append(image)
        elif isinstance(kind, str):
            parts.append(_input_text(f"[{kind} part left out]"))
    return parts


def _reasoning(state: _State, where: str, item: dict[str, Any], timestamp: float | None) -> None:
    summary = [
        {"type": "summary_text", "text": part["text"]}
        for part in item.get("summary") or []
        if isinstance(part, dict) and isinstance(part.get("text"), str)
    ]
    secret = item.get("encrypted_content")
    reasoning: dict[str, Any] = {"type": "reasoning", "id": "", "summary": summary}
    if isinstance(secret, str) and secret:
        reasoning["encrypted_content"] = secret
    content = [
        {"type": "reasoning_text", "text": part["text"]}
        for part in item.get("content") or []
        if isinstance(part, dict) and isinstance(part.get("text"), str)
    ]
    if content:
        reasoning["content"] = content
    found = item.get("id")
    if isinstance(found, str) and found:
        reasoning["id"] = found
    else:
        digest = hashlib.sha256(json.dumps(reasoning, sort_keys=True).encode()).hexdigest()
        reasoning["id"] = f"rs_{digest[:48]}"
    _add(state, where, reasoning, timestamp, model_side=True)


def _call(state: _State, where: str, item: dict[str, Any], timestamp: float | None) -> None:
    kind = item["type"]
    call_id = item.get("call_id") or item.get("id")
    if not isinstance(call_id, str) or not call_id:
        raise state.out.error(where, f"{kind} item without a 'call_id'")
    if call_id in state.calls:
        return  # the same call written twice
    fixed, key = _CALLS[kind]
    name = fixed or item.get("name")
    if not isinstance(name, str) or not name:
        raise state.out.error(where, f"{kind} item without a 'name'")
    arguments = item.get(key, item.get("input"))
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    custom = kind == "custom_tool_call"
    call: dict[str, Any] = {
        "type": kind if custom else "function_call",
        "call_id": call_id,
        "name": name,
        "input" if custom else "arguments": text,
    }
    read, writes = call_paths(name, arguments, state.cwd)
    _add(state, where, call, timestamp, model_side=True, write_paths=writes)
    state.calls[call_id] = _Call(read_path=read, epoch=state.epoch, custom=custom)


def _output(state: _State, where: str, item: dict[str, Any], timestamp: float | None) -> None:
    answered = answer(state.calls, state.answered, state.epoch, item)
    if answered is None:
        return
    call_id, call, text = answered
    kind = "custom_tool_call_output" if call.custom else "function_call_output"
    output = {"type": kind, "call_id": call_id, "output": text}
    read = call.read_path if call.read_path is not None and succeeded(text) else None
    _add(state, where, output, timestamp, model_side=False, read_path=read)


def _web_search(state: _State, where: str, item: dict[str, Any], timestamp: float | None) -> None:
    """A search the provider ran: its item, with the action's declared keys."""
    found, action = item.get("id"), item.get("action")
    keys = _WEB_ACTIONS.get(str(action.get("type"))) if isinstance(action, dict) else None
    if not isinstance(found, str) or not found or keys is None:
        return  # nothing the API would take back
    assert isinstance(action, dict)
    status = item.get("status") if item.get("status") in _WEB_STATUSES else "completed"
    search = {
        "type": "web_search_call",
        "id": found,
        "status": status,
        "action": {key: action[key] for key in keys if action.get(key) is not None},
    }
    _add(state, where, search, timestamp, model_side=True)


def _compaction_item(
    state: _State, where: str, item: dict[str, Any], timestamp: float | None
) -> None:
    """An encrypted compaction item, kept whole (only the provider can read it)."""
    secret = item.get("encrypted_content")
    if not isinstance(secret, str) or not secret:
        return
    kept: dict[str, Any] = {"type": "compaction", "encrypted_content": secret}
    if isinstance(item.get("id"), str) and item["id"]:
        kept["id"] = item["id"]
    _add(state, where, kept, timestamp, model_side=False)


def _compacted(state: _State, where: str, payload: dict[str, Any], timestamp: float | None) -> None:
    """A compaction Codex did: a boundary whose summary is the record's ``message`` or the
    messages its ``replacement_history`` kept, then that history's compaction items."""
    state.turn = None
    state.epoch += 1
    summary = payload.get("message")
    history = payload.get("replacement_history")
    if history is not None and not isinstance(history, list):
        raise state.out.error(where, "compacted record: 'replacement_history' must be a list")
    text = summary if isinstance(summary, str) and summary.strip() else None
    strategy = CompactStrategy.FULL
    if history:
        text = replacement_text(state.out, where, history, text, state.leading, notes=False)
        strategy = CompactStrategy.PROVIDER
    secrets = [
        item
        for item in history or []
        if isinstance(item, dict) and item.get("type") == "compaction"
    ]
    if (text or secrets) and state.out.count:
        state.out.add_boundary(
            ImportedBoundary(
                first_kept_index=state.out.count,
                summary_text=text or "[Codex compacted the conversation]",
                trigger=_TRIGGERS.get(str(payload.get("trigger")), CompactTrigger.AUTO),
                timestamp=timestamp,
                strategy=strategy,
            ),
            where=where,
        )
    for item in secrets:
        _compaction_item(state, where, item, timestamp)
