"""OpenHands agent-sdk event streams → ``openai`` messages.

An OpenHands conversation is a log of events, one JSON object per line (the agent server
writes one file per event; joined in order they make this stream). Each event names its
class in ``kind``; the ones the model sees become messages:

- ``SystemPromptEvent``: the system message (``system_prompt``, plus ``dynamic_context``
  when the agent added one);
- ``MessageEvent``: its ``llm_message`` (``user``, ``assistant`` or ``system``) with its text
  parts, and the ``extended_content`` the agent appended to it;
- ``ActionEvent``: a tool call (``tool_call``, in either of the shapes the SDK wrote). The
  calls of one model response share ``llm_response_id`` and form one assistant message,
  whose text is the ``thought`` of the first;
- ``ObservationEvent``, ``UserRejectObservation`` and ``AgentErrorEvent``: the tool result
  of their ``tool_call_id`` (the observation's text, the rejection, or the error);
- the first observation's ``metadata.working_dir`` (the terminal's directory) is the
  session's working directory: the summary's file paths are relative to it;
- ``Condensation``: a compaction the agent's condenser did. OpenHands forgets the events
  listed in ``forgotten_event_ids`` and puts ``summary`` in their place; the events after
  the last forgotten one stay. It becomes an imported boundary that cuts just after the
  last forgotten message (never between a tool call and its result), with the summary.

Everything else (state updates, pauses, condensation requests, events of kinds this module
does not know) is not conversation and is skipped without a warning; so are reasoning
content, results whose call is unknown, already answered or compacted away, and calls whose
result never came (the store answers those as interrupted).

A condensation may keep messages written long before it, so the last :data:`HOLD` messages
stay in memory until the next condensation could no longer cut before them; a
condensation whose kept messages go back further cuts where the held ones start.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from compactstore._importers.builder import Item, TranscriptBuilder, parse_timestamp
from compactstore._importers.codex import shell_read_path
from compactstore._importers.files import Progress, TranscriptFile
from compactstore._importers.jsonl import text_parts
from compactstore.formats.block_types import NO_EXTENSION, BlockTypeExtension
from compactstore.models import CompactTrigger, ImportedBoundary

__all__ = ["HOLD", "convert"]

_RESULT_KINDS = frozenset({"ObservationEvent", "UserRejectObservation", "AgentErrorEvent"})
_ROLES = frozenset({"user", "assistant", "system"})

# How many messages stay held for a later condensation to cut before.
HOLD = 400

_NO_SUMMARY = "[Conversation condensed: the agent forgot {count} earlier events without a summary]"


@dataclass
class _State:
    out: TranscriptBuilder
    ids: dict[str, int] = field(default_factory=dict)  # event id -> index of its message
    open: dict[str, tuple[int, str | None]] = field(default_factory=dict)  # call -> (index, read)
    floor: int = 0  # first message the last condensation kept (no cut goes before it)
    group: int | None = None  # the assistant message of the response being read
    response: str | None = None  # its llm_response_id
    cwd: str | None = None


def convert(
    file: TranscriptFile,
    progress: Progress | None = None,
    extension: BlockTypeExtension = NO_EXTENSION,
) -> Iterator[Item]:
    """Convert an OpenHands event stream (see the module docstring for what is kept)."""
    state = _State(TranscriptBuilder(file.name, "openhands", "openai", extension))
    for number, event in file.records(progress):
        where = f"line {number}"
        kind = event.get("kind")
        timestamp = parse_timestamp(event.get("timestamp"))
        if kind == "SystemPromptEvent":
            _system(state, where, event, timestamp)
        elif kind == "MessageEvent":
            _message(state, where, event, timestamp)
        elif kind == "ActionEvent":
            _action(state, where, event, timestamp)
        elif kind in _RESULT_KINDS:
            _result(state, where, event, timestamp)
            if file.cwd is None:
                file.cwd = state.cwd = _working_dir(event)
        elif kind == "Condensation":
            _condensation(state, where, event, timestamp)
        state.out.release(_held_from(state))
        yield from state.out.drain()
    yield from state.out.finish()


def _working_dir(event: dict[str, Any]) -> str | None:
    """The terminal's working directory an observation reports (``metadata.working_dir``):
    the first one is the session's, what the file paths are relative to."""
    observation = event.get("observation")
    meta = observation.get("metadata") if isinstance(observation, dict) else None
    found = meta.get("working_dir") if isinstance(meta, dict) else None
    return found if isinstance(found, str) and found.strip() else None


def _held_from(state: _State) -> int:
    """The first message a later event may still change or cut before."""
    start = max(state.floor, state.out.count - HOLD)
    if state.group is not None:
        start = min(start, state.group)
    # Ids go in about in message order: forget those of messages no longer held.
    while state.ids and next(iter(state.ids.values())) < start:
        del state.ids[next(iter(state.ids))]
    return start


def _text(value: Any) -> str:
    """The text of a content value: a string, one text part, or a list of parts."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        return value["text"] if isinstance(value.get("text"), str) else ""
    if isinstance(value, list):
        return "\n".join(t for t in text_parts(value) if t)
    return ""


def _add(
    state: _State, where: str, event: dict[str, Any], message: dict[str, Any], **extra: Any
) -> int:
    """Add a message that is not a tool result: it closes the response being read and the
    calls still waiting for a result (the store answers those as interrupted)."""
    state.group = state.response = None
    state.open.clear()
    index = state.out.add(message, where=where, **extra)
    if isinstance(event.get("id"), str):
        state.ids[event["id"]] = index
    return index


def _system(state: _State, where: str, event: dict[str, Any], timestamp: float | None) -> None:
    parts = [_text(event.get("system_prompt")), _text(event.get("dynamic_context"))]
    text = "\n\n".join(p for p in parts if p.strip())
    if text.strip():
        _add(state, where, event, {"role": "system", "content": text}, timestamp=timestamp)


def _message(state: _State, where: str, event: dict[str, Any], timestamp: float | None) -> None:
    llm = event.get("llm_message")
    if not isinstance(llm, dict):
        raise state.out.error(where, "a MessageEvent needs an 'llm_message' object")
    role = llm.get("role")
    if role not in _ROLES:
        return  # a tool message written as a MessageEvent has no call to answer here
    parts = [_text(llm.get("content")), _text(event.get("extended_content"))]
    text = "\n\n".join(p for p in parts if p.strip())
    if text.strip():
        _add(state, where, event, {"role": role, "content": text}, timestamp=timestamp)


def _call_of(event: dict[str, Any]) -> tuple[str | None, str | None, str]:
    """(id, name, arguments) of an ActionEvent's call, from ``tool_call`` in the shape the
    SDK wrote (``{id, name, arguments}`` or OpenAI's ``{id, function: {...}}``), else from
    the event's own ``tool_call_id``/``tool_name``/``action``."""
    raw = event.get("tool_call")
    call: dict[str, Any] = raw if isinstance(raw, dict) else {}
    inner = call.get("function")
    function: dict[str, Any] = inner if isinstance(inner, dict) else call
    call_id = call.get("id") or event.get("tool_call_id")
    name = function.get("name") or event.get("tool_name")
    arguments = function.get("arguments")
    if arguments is None:
        action = event.get("action")
        arguments = (
            {k: v for k, v in action.items() if k != "kind"} if isinstance(action, dict) else {}
        )
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return (
        call_id if isinstance(call_id, str) and call_id else None,
        name if isinstance(name, str) and name else None,
        arguments,
    )


def _action(state: _State, where: str, event: dict[str, Any], timestamp: float | None) -> None:
    call_id, name, arguments = _call_of(event)
    if call_id is None or name is None:
        raise state.out.error(where, "an ActionEvent needs a tool call with an id and a name")
    if call_id in state.open:
        return  # the same call written twice
    response = event.get("llm_response_id")
    response = response if isinstance(response, str) and response else None
    thought = _text(event.get("thought"))
    if state.group is None or response is None or response != state.response:
        index = _add(
            state,
            where,
            event,
            {"role": "assistant", "content": thought if thought.strip() else None},
            timestamp=timestamp,
        )
        state.group, state.response = index, response
    else:
        index = state.group
        message = state.out.entry(index).message
        if thought.strip():
            earlier = message.get("content")
            message["content"] = f"{earlier}\n\n{thought}" if earlier else thought
        if isinstance(event.get("id"), str):
            state.ids[event["id"]] = index
    entry = state.out.entry(index)
    entry.message.setdefault("tool_calls", []).append(
        {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
    )
    read, write = _files(name, arguments, state.cwd)
    if write is not None and write not in entry.write_paths:
        entry.write_paths.append(write)
    state.open[call_id] = (index, read)


def _files(name: str, arguments: str, cwd: str | None) -> tuple[str | None, str | None]:
    """The file a call reads and the file it writes (the editor's ``path``; ``cat``)."""
    try:
        args = json.loads(arguments)
    except (ValueError, RecursionError):
        return None, None
    if not isinstance(args, dict):
        return None, None
    path = args.get("path") if isinstance(args.get("path"), str) and args["path"] else None
    command = args.get("command")
    if name in ("str_replace_editor", "file_editor"):
        if command == "view":
            return path, None
        if command in ("create", "str_replace", "insert", "undo_edit"):
            return None, path
        return None, None
    if name in ("execute_bash", "terminal", "bash") and isinstance(command, str):
        return shell_read_path(command, None, cwd), None
    return None, None


# Where an observation keeps the text the model saw, in order of preference.
_RESULT_KEYS = ("content", "output", "message", "text")


def _result_text(event: dict[str, Any]) -> tuple[str, bool]:
    """(the text the model saw for a result, whether it reports a failure)."""
    kind = event.get("kind")
    if kind == "UserRejectObservation":
        reason = event.get("rejection_reason")
        return f"Action rejected: {reason if isinstance(reason, str) else 'by the user'}", True
    if kind == "AgentErrorEvent":
        error = event.get("error")
        return (error if isinstance(error, str) else json.dumps(error, ensure_ascii=False)), True
    observation = event.get("observation")
    if not isinstance(observation, dict):
        return _text(observation), False
    text = next((found for key in _RESULT_KEYS if (found := _text(observation.get(key)))), "")
    text, failed = _with_failure(observation, text)
    if not text:
        text = json.dumps({k: v for k, v in observation.items() if k != "kind"}, ensure_ascii=False)
    return text, failed


def _with_failure(observation: dict[str, Any], text: str) -> tuple[str, bool]:
    """An observation's text with its error and exit code, and whether it failed."""
    failed = observation.get("is_error") is True
    error = observation.get("error")
    if isinstance(error, str) and error and error not in ("False", "false"):
        failed = True
        text = f"{text}\n{error}" if text and error not in text else text or error
    meta = observation.get("metadata")
    code = meta.get("exit_code") if isinstance(meta, dict) else observation.get("exit_code")
    if isinstance(code, int) and not isinstance(code, bool):
        failed = failed or code != 0
        text = f"{text}\n[The command completed with exit code {code}.]"
    return text, failed


def _result(state: _State, where: str, event: dict[str, Any], timestamp: float | None) -> None:
    call_id = event.get("tool_call_id")
    opened = state.open.pop(call_id, None) if isinstance(call_id, str) else None
    # Unknown, answered already, abandoned, or cut away by a condensation: no result.
    if opened is None or opened[0] < state.floor:
        return
    assert isinstance(call_id, str)
    text, failed = _result_text(event)
    index = state.out.add(
        {"role": "tool", "tool_call_id": call_id, "content": text},
        where=where,
        timestamp=timestamp,
        read_path=None if failed else opened[1],
    )
    if isinstance(event.get("id"), str):
        state.ids[event["id"]] = index


def _condensation(
    state: _State, where: str, event: dict[str, Any], timestamp: float | None
) -> None:
    forgotten = event.get("forgotten_event_ids")
    forgotten = [i for i in forgotten if isinstance(i, str)] if isinstance(forgotten, list) else []
    out = state.out
    if not forgotten or not out.count:
        return
    known = [state.ids[i] for i in forgotten if i in state.ids]
    # Everything up to the last forgotten message goes; what came after it stays. Forgotten
    # events this module has no message of (or no longer holds) cut where the held start.
    cut = max(known) + 1 if known else max(out.released, state.floor)
    cut = max(cut, out.released, state.floor)
    while cut < out.count and out.entry(cut).message["role"] == "tool":
        cut += 1  # a result stays with its call
    if cut == 0:
        return
    summary = event.get("summary")
    if not isinstance(summary, str) or not summary.strip():
        summary = _NO_SUMMARY.format(count=len(forgotten))
    out.add_boundary(
        ImportedBoundary(
            first_kept_index=cut,
            summary_text=summary,
            trigger=CompactTrigger.AUTO,
            timestamp=timestamp,
        ),
        where=where,
    )
    state.floor = cut
    state.group = state.response = None
    # Calls cut away can no longer be answered.
    for call_id in [c for c, (index, _) in state.open.items() if index < cut]:
        del state.open[call_id]
