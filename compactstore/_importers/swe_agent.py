"""SWE-agent ``.traj`` trajectories → ``openai`` messages.

The trajectory's ``history`` is the chat the model saw, already close to OpenAI's shape:
``system``, ``user``, ``assistant`` (with ``tool_calls``) and ``tool`` messages. Tool
messages carry a list ``tool_call_ids``; each id becomes its own ``tool`` message with the
observation. SWE-agent's bookkeeping keys (``agent``, ``message_type``, ``thought``,
``action``, ``is_demo``…) are dropped, since the API refuses unknown keys, as are tool
results whose call is unknown or already answered. History entries have no timestamps.

Some trajectories reuse a call id for a later, different call once the earlier one was
answered; the ``openai`` format keys calls by (id, call seq), so the id is kept as it is.
Only an id used again while its earlier call is still unanswered (the store
would refuse it) gets a suffix (``call_x~2``), and the result that follows is paired with
that new id.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from compactstore._importers.builder import Item, TranscriptBuilder
from compactstore._importers.files import Progress, TranscriptFile, parse_json
from compactstore._importers.jsonl import text_parts
from compactstore.errors import InvalidInputError
from compactstore.formats.block_types import NO_EXTENSION, BlockTypeExtension

__all__ = ["READ_COMMANDS", "WRITE_COMMANDS", "convert"]

_ROLES = frozenset({"system", "user", "assistant", "tool"})
# str_replace_editor commands that read or change the file at ``path``; the windowed
# editor's ``open`` reads and its ``create``/``edit`` write.
READ_COMMANDS = frozenset({"view"})
WRITE_COMMANDS = frozenset({"create", "str_replace", "insert", "undo_edit"})


def convert(
    file: TranscriptFile,
    progress: Progress | None = None,
    extension: BlockTypeExtension = NO_EXTENSION,
) -> Iterator[Item]:
    """Convert a trajectory document (see the module docstring for what is kept).

    A trajectory is one JSON document, so it is read whole; its messages are handed on as
    they are converted.
    """
    name = file.name
    document = parse_json(name, file.text())
    history = document.get("history") if isinstance(document, dict) else None
    if not isinstance(history, list):
        raise InvalidInputError(f"{name} is not a SWE-agent trajectory: it has no 'history' list")
    out = TranscriptBuilder(name, "swe-agent", "openai", extension)
    # Unanswered calls: id (as stored) -> the file a view call reads.
    reads: dict[str, str | None] = {}
    aliases: dict[str, str] = {}  # call id in the file -> id of its latest call as stored
    open_file: list[str | None] = [None]  # the windowed editor's open file
    total = len(history)
    for index, entry in enumerate(history):
        where = f"history[{index}]"
        if not isinstance(entry, dict):
            raise out.error(where, "a history entry must be an object")
        role = entry.get("role")
        if not isinstance(role, str) or role not in _ROLES:
            raise out.error(where, f"unknown role {role!r}")
        content = _content(out, where, entry.get("content"))
        if role == "tool":
            ids = entry.get("tool_call_ids")
            if ids is None and isinstance(entry.get("tool_call_id"), str):
                ids = [entry["tool_call_id"]]
            if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
                raise out.error(where, "a tool entry needs a list of 'tool_call_ids'")
            for original in ids:
                call_id = aliases.get(original)
                if call_id is None or call_id not in reads:
                    continue  # unknown, or answered already
                out.add(
                    {"role": "tool", "tool_call_id": call_id, "content": content},
                    where=where,
                    read_path=reads.pop(call_id),
                )
        elif role == "assistant":
            message: dict[str, Any] = {"role": "assistant", "content": content}
            writes: list[str] = []
            calls = _tool_calls(
                out, where, entry.get("tool_calls"), reads, aliases, open_file, writes
            )
            if calls:
                message["tool_calls"] = calls
            out.add(message, where=where, write_paths=writes)
        else:
            out.add({"role": role, "content": content}, where=where)
        if progress is not None:
            progress(index + 1, total)
        out.release()
        yield from out.drain()
    yield from out.finish()


def _content(out: TranscriptBuilder, where: str, content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        # Newer trajectories split content into text parts (with cache-control marks).
        return "\n".join(text_parts(content))
    raise out.error(where, "'content' must be text or a list of text parts")


def _tool_calls(
    out: TranscriptBuilder,
    where: str,
    calls: Any,
    reads: dict[str, str | None],
    aliases: dict[str, str],
    open_file: list[str | None],
    writes: list[str],
) -> list[dict[str, Any]]:
    """The calls in OpenAI's shape; notes what each reads and collects what they write."""
    if calls is None:
        return []
    if not isinstance(calls, list):
        raise out.error(where, "'tool_calls' must be a list")
    result: list[dict[str, Any]] = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(call.get("id"), str):
            raise out.error(where, "a tool call needs an 'id' and a 'function'")
        call_id = original = call["id"]
        suffix = 1
        while call_id in reads:
            suffix += 1
            call_id = f"{original}~{suffix}"
        aliases[original] = call_id
        arguments = function.get("arguments", "")
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        name = function.get("name")
        result.append(
            {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }
        )
        read, write = _files(result[-1]["function"], open_file)
        reads[call_id] = read
        if write is not None and write not in writes:
            writes.append(write)
    return result


def _arguments(function: dict[str, Any]) -> dict[str, Any]:
    try:
        parsed = json.loads(function["arguments"])
    except (ValueError, RecursionError):  # kept as text in the message; only paths are lost
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _nonempty(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _files(function: dict[str, Any], open_file: list[str | None]) -> tuple[str | None, str | None]:
    """The file a call reads and the file it writes, following the windowed editor's
    open file (``open``/``create`` set it, ``edit`` changes it)."""
    name, args = function["name"], _arguments(function)
    if name == "str_replace_editor":
        path, command = _nonempty(args.get("path")), _nonempty(args.get("command"))
        return (path if command in READ_COMMANDS else None), (
            path if command in WRITE_COMMANDS else None
        )
    if name == "open":
        open_file[0] = _nonempty(args.get("path")) or open_file[0]
        return _nonempty(args.get("path")), None
    if name == "create":
        open_file[0] = _nonempty(args.get("filename")) or open_file[0]
        return None, _nonempty(args.get("filename"))
    if name == "edit":
        return None, open_file[0]
    return None, None
