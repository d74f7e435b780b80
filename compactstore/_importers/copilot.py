"""GitHub Copilot CLI session logs (``events.jsonl``) → ``openai`` messages.

Copilot CLI writes every session event as one line ``{type, id, timestamp, parentId,
data}``. The conversation is in these:

- ``system.message``: the system (or ``developer``) prompt, written again at each
  interaction: kept once, and again only when it changed;
- ``user.message``: what the person typed (``data.content``; the copy the client sent,
  ``transformedContent``, adds the date and client reminders around it);
- ``assistant.message``: one model response, its text (``content``) and its tool calls
  (``toolRequests``: ``toolCallId``, ``name``, ``arguments``);
- ``tool.execution_complete``: a call's result (``result.content``, or ``error.message``
  when it failed), paired by ``toolCallId``;
- ``session.compaction_complete``: a compaction Copilot did; with its summary
  (``summaryContent``) it becomes an imported boundary.

Events of a subagent (``parentToolCallId`` set) belong to the subagent's own conversation
and are skipped, as are hooks, turn markers, session information, reasoning, streaming
deltas, telemetry and events of types this module does not know, without a warning; so are
results whose call is unknown or already answered.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from compactstore._importers.builder import Item, TranscriptBuilder, parse_timestamp
from compactstore._importers.codex import apply_patch_paths, shell_read_path
from compactstore._importers.files import Progress, TranscriptFile
from compactstore._importers.jsonl import text_parts
from compactstore.formats.block_types import NO_EXTENSION, BlockTypeExtension
from compactstore.models import CompactTrigger, ImportedBoundary

__all__ = ["READ_TOOLS", "WRITE_TOOLS", "convert"]

READ_TOOLS = frozenset({"view", "read_file"})
WRITE_TOOLS = frozenset({"edit", "create", "str_replace", "insert", "write_file"})
_SHELL_TOOLS = frozenset({"bash", "shell", "powershell"})


@dataclass
class _State:
    out: TranscriptBuilder
    cwd: str | None = None
    system: str | None = None  # the system prompt kept last
    open: dict[str, str | None] = field(default_factory=dict)  # call id -> the file it reads


def convert(
    file: TranscriptFile,
    progress: Progress | None = None,
    extension: BlockTypeExtension = NO_EXTENSION,
) -> Iterator[Item]:
    """Convert a Copilot CLI event log (see the module docstring for what is kept)."""
    state = _State(TranscriptBuilder(file.name, "copilot-cli", "openai", extension))
    for number, event in file.records(progress):
        where = f"line {number}"
        kind = event.get("type")
        data = event.get("data")
        if not isinstance(kind, str):
            continue
        if not isinstance(data, dict):
            raise state.out.error(where, f"a {kind} event needs a 'data' object")
        if data.get("parentToolCallId"):
            continue  # a subagent's own conversation
        timestamp = parse_timestamp(event.get("timestamp"))
        if kind == "session.start":
            context = data.get("context")
            cwd = context.get("cwd") if isinstance(context, dict) else None
            state.cwd = cwd if isinstance(cwd, str) and cwd else state.cwd
        elif kind == "system.message":
            _system(state, where, data, timestamp)
        elif kind == "user.message":
            _user(state, where, data, timestamp)
        elif kind == "assistant.message":
            _assistant(state, where, data, timestamp)
        elif kind == "tool.execution_complete":
            _result(state, where, data, timestamp)
        elif kind == "session.compaction_complete":
            _compaction(state, where, data, timestamp)
        state.out.release()
        yield from state.out.drain()
    yield from state.out.finish()


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(text_parts(value))
    return ""


def _add(
    state: _State,
    where: str,
    message: dict[str, Any],
    timestamp: float | None,
    write_paths: list[str] | None = None,
) -> None:
    state.open.clear()  # calls left unanswered were abandoned
    state.out.add(message, where=where, timestamp=timestamp, write_paths=write_paths)


def _system(state: _State, where: str, data: dict[str, Any], timestamp: float | None) -> None:
    text = _text(data.get("content"))
    role = "developer" if data.get("role") == "developer" else "system"
    if text.strip() and text != state.system:
        state.system = text
        _add(state, where, {"role": role, "content": text}, timestamp)


def _user(state: _State, where: str, data: dict[str, Any], timestamp: float | None) -> None:
    text = _text(data.get("content"))
    if not text.strip():
        text = _text(data.get("transformedContent"))
    if text.strip():
        _add(state, where, {"role": "user", "content": text}, timestamp)


def _assistant(state: _State, where: str, data: dict[str, Any], timestamp: float | None) -> None:
    text = _text(data.get("content"))
    requests = data.get("toolRequests")
    if requests is not None and not isinstance(requests, list):
        raise state.out.error(where, "assistant.message: 'toolRequests' must be a list")
    calls: list[dict[str, Any]] = []
    reads: dict[str, str | None] = {}
    writes: list[str] = []
    for request in requests or []:
        call_id = request.get("toolCallId") if isinstance(request, dict) else None
        name = request.get("name") if isinstance(request, dict) else None
        if not isinstance(call_id, str) or not call_id or not isinstance(name, str) or not name:
            raise state.out.error(
                where, "assistant.message: a tool request needs a 'toolCallId' and a 'name'"
            )
        if call_id in reads:
            continue  # the same request twice
        assert isinstance(request, dict)
        arguments = request.get("arguments", {})
        text_args = (
            arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
        )
        calls.append(
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": text_args}}
        )
        read, written = _files(name, arguments, state.cwd)
        reads[call_id] = read
        writes.extend(p for p in written if p not in writes)
    if not text.strip() and not calls:
        return
    message: dict[str, Any] = {"role": "assistant", "content": text if text.strip() else None}
    if calls:
        message["tool_calls"] = calls
    _add(state, where, message, timestamp, writes)
    state.open.update(reads)


def _files(name: str, arguments: Any, cwd: str | None) -> tuple[str | None, list[str]]:
    """The file a call reads and the files it writes."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            return None, apply_patch_paths(arguments) if name == "apply_patch" else []
    if not isinstance(arguments, dict):
        return None, []
    path = arguments.get("path") or arguments.get("file_path")
    path = path if isinstance(path, str) and path else None
    if name in READ_TOOLS:
        return path, []
    if name in WRITE_TOOLS:
        return None, [path] if path else []
    if name == "apply_patch":
        patch = arguments.get("input") or arguments.get("patch")
        return None, apply_patch_paths(patch) if isinstance(patch, str) else []
    command = arguments.get("command")
    if name in _SHELL_TOOLS and isinstance(command, str):
        return shell_read_path(command, None, cwd), []
    return None, []


def _result(state: _State, where: str, data: dict[str, Any], timestamp: float | None) -> None:
    call_id = data.get("toolCallId")
    if not isinstance(call_id, str) or call_id not in state.open:
        return  # unknown, answered already, or abandoned
    read = state.open.pop(call_id)
    success = data.get("success") is not False
    result = data.get("result")
    error = data.get("error")
    text = _text(result.get("content")) if isinstance(result, dict) else _text(result)
    if not text and isinstance(error, dict):
        text = _text(error.get("message"))
    elif not text and isinstance(error, str):
        text = error
    if not text:
        text = "(no output)" if success else "(the tool failed without a message)"
    state.out.add(
        {"role": "tool", "tool_call_id": call_id, "content": text},
        where=where,
        timestamp=timestamp,
        read_path=read if success else None,
    )


def _compaction(state: _State, where: str, data: dict[str, Any], timestamp: float | None) -> None:
    summary = data.get("summaryContent")
    if data.get("success") is False or not isinstance(summary, str) or not summary.strip():
        return
    if not state.out.count:
        return
    before = data.get("preCompactionTokens")
    tokens = before if isinstance(before, int) and not isinstance(before, bool) else None
    trigger = CompactTrigger.MANUAL if data.get("trigger") == "manual" else CompactTrigger.AUTO
    state.open.clear()  # calls before the compaction can no longer be answered
    state.out.add_boundary(
        ImportedBoundary(
            first_kept_index=state.out.count,
            summary_text=summary,
            trigger=trigger,
            tokens_before=tokens,
            timestamp=timestamp,
        ),
        where=where,
    )
