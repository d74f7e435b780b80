"""mini-swe-agent trajectories (``.traj.json``) → ``openai`` messages.

mini-swe-agent saves its run as one JSON document: ``info`` (version, model, exit status,
configuration), ``trajectory_format`` (``mini-swe-agent-1``…) and ``messages``, the chat the
model saw, in OpenAI's shape. The classic agent has no tools: the model answers with a
``bash`` block in its text and the command's output comes back as the next user message
(``<returncode>…</returncode><output>…</output>``), so the messages are taken as they are.
Agents that call tools (mini-swe-agent 2) write ``tool_calls`` on assistant messages and
``tool`` messages, which are kept paired; with a Responses-API model the trajectory holds
whole responses (``object: "response"``, their ``output`` items) and
``function_call_output`` items instead, which are read the same way.

Kept: ``system``, ``developer``, ``user``, ``assistant`` and ``tool`` messages with their
text (content parts joined), the prompt size of each model call (``extra.response.usage``)
and timestamps when the trajectory has them. Dropped: the bookkeeping in ``extra``, messages
of other roles (the ``exit`` record), tool results whose call is unknown or already
answered. A ``cat FILE`` or ``sed -n 'A,Bp' FILE`` command whose output says it worked
counts as a read of that file.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from compactstore._importers.builder import (
    Item,
    NoMessagesError,
    TranscriptBuilder,
    parse_timestamp,
)
from compactstore._importers.codex import shell_read_path
from compactstore._importers.files import Progress, TranscriptFile, parse_json
from compactstore._importers.jsonl import text_parts
from compactstore.errors import InvalidInputError
from compactstore.formats.block_types import NO_EXTENSION, BlockTypeExtension

__all__ = ["convert", "is_trajectory"]

_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
_BASH_BLOCK = re.compile(r"```(?:bash|sh|shell)?[ \t]*\n(.*?)\n```", re.S)
_RETURN_CODE = re.compile(r"^\s*<returncode>(-?\d+)</returncode>")


def is_trajectory(value: Any) -> bool:
    """Whether a JSON document is a mini-swe-agent trajectory."""
    if not isinstance(value, dict) or not isinstance(value.get("messages"), list):
        return False
    version = value.get("trajectory_format")
    info = value.get("info")
    return (isinstance(version, str) and version.startswith("mini-swe-agent")) or (
        isinstance(info, dict) and "mini_version" in info
    )


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
    document, messages = _document(file)
    cwd = _cwd(document)
    out = TranscriptBuilder(name, "mini-swe-agent", "openai", extension)
    open_calls: dict[str, str | None] = {}  # unanswered call id -> the file it reads
    pending_read: str | None = None  # the file the last bash block reads
    total = len(messages)
    for index, entry in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(entry, dict):
            raise out.error(where, "a message must be an object")
        entry = _chat_shaped(entry)
        role = entry.get("role")
        if not isinstance(role, str) or role not in _ROLES:
            continue  # the exit record, or an item that is not a message
        text = _content(out, where, entry.get("content"))
        raw = entry.get("extra")
        extra: dict[str, Any] = raw if isinstance(raw, dict) else {}
        timestamp = parse_timestamp(extra.get("timestamp", entry.get("timestamp")))
        if role == "tool":
            _tool_result(out, where, entry, text, timestamp, open_calls, extra)
        elif role == "assistant":
            open_calls.clear()  # calls left unanswered were abandoned
            message: dict[str, Any] = {"role": "assistant", "content": text}
            calls = _tool_calls(out, where, entry.get("tool_calls"), open_calls, cwd)
            if calls:
                message["tool_calls"] = calls
                if not text.strip():
                    message["content"] = None
            pending_read = None if calls else _bash_read(text, cwd)
            out.add(message, where=where, timestamp=timestamp, usage=_usage(extra))
        else:
            open_calls.clear()
            read = pending_read if role == "user" and _succeeded(text, extra) else None
            pending_read = None
            out.add(
                {"role": role, "content": text}, where=where, timestamp=timestamp, read_path=read
            )
        if progress is not None:
            progress(index + 1, total)
        out.release()
        yield from out.drain()
    yield from out.finish()


def _document(file: TranscriptFile) -> tuple[Any, list[Any]]:
    """The trajectory document and its ``messages`` list."""
    name = file.name
    try:
        document = parse_json(name, file.text())
    except InvalidInputError:
        if _is_jsonl(file):  # records, one per line: another kind of transcript
            raise NoMessagesError(
                f"{name} is not a mini-swe-agent trajectory: it is JSONL, not one JSON document"
            ) from None
        raise
    messages = document.get("messages") if isinstance(document, dict) else None
    if not isinstance(messages, list):
        raise NoMessagesError(
            f"{name} is not a mini-swe-agent trajectory: it has no 'messages' list"
        )
    return document, messages


def _tool_result(
    out: TranscriptBuilder,
    where: str,
    entry: dict[str, Any],
    text: str,
    timestamp: float | None,
    open_calls: dict[str, str | None],
    extra: dict[str, Any],
) -> None:
    """A tool message answering an open call (else left out: unknown, or answered)."""
    call_id = entry.get("tool_call_id")
    if not isinstance(call_id, str) or call_id not in open_calls:
        return
    read = open_calls.pop(call_id)
    out.add(
        {"role": "tool", "tool_call_id": call_id, "content": text},
        where=where,
        timestamp=timestamp,
        read_path=read if _succeeded(text, extra) else None,
    )


def _is_jsonl(file: TranscriptFile) -> bool:
    """Whether the file's first two records are each a JSON object on its own line."""
    seen = 0
    for _, text, _ in file.lines():
        if not text.strip():
            continue
        try:
            if not isinstance(json.loads(text), dict):
                return False
        except (ValueError, RecursionError):
            return False
        seen += 1
        if seen == 2:
            return True
    return False


def _cwd(document: dict[str, Any]) -> str | None:
    info = document.get("info")
    config = info.get("config") if isinstance(info, dict) else None
    environment = config.get("environment") if isinstance(config, dict) else None
    cwd = environment.get("cwd") if isinstance(environment, dict) else None
    return cwd if isinstance(cwd, str) and cwd else None


def _content(out: TranscriptBuilder, where: str, content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(text_parts(content))
    raise out.error(where, "'content' must be text or a list of text parts")


def _chat_shaped(entry: dict[str, Any]) -> dict[str, Any]:
    """A message of a Responses-API model in the chat shape of the others: a whole
    response (``object: "response"``) becomes an assistant message with its text and
    function calls, a ``function_call_output`` item a tool message."""
    if entry.get("object") == "response":
        texts: list[str] = []
        calls: list[dict[str, Any]] = []
        for item in entry.get("output") or []:
            if not isinstance(item, dict):
                continue
            if item.get("type") == "message" and isinstance(item.get("content"), list):
                texts.extend(text_parts(item["content"]))
            elif item.get("type") == "function_call":
                calls.append(
                    {
                        "id": item.get("call_id") or item.get("id"),
                        "type": "function",
                        "function": {"name": item.get("name"), "arguments": item.get("arguments")},
                    }
                )
        raw = entry.get("extra")
        extra: dict[str, Any] = raw if isinstance(raw, dict) else {}
        return {
            "role": "assistant",
            "content": "\n".join(texts),
            "tool_calls": calls or None,
            "extra": {"response": {"usage": entry.get("usage")}, **extra},
        }
    if entry.get("type") == "function_call_output" and "role" not in entry:
        output = entry.get("output")
        return {
            "role": "tool",
            "tool_call_id": entry.get("call_id"),
            "content": output if isinstance(output, str | list) else json.dumps(output),
            "extra": entry.get("extra"),
        }
    return entry


def _usage(extra: dict[str, Any]) -> int | None:
    """The prompt size of the model call, from the response's usage (chat completions'
    ``prompt_tokens`` or the Responses API's ``input_tokens``)."""
    response = extra.get("response")
    usage = response.get("usage") if isinstance(response, dict) else None
    tokens = None
    if isinstance(usage, dict):
        tokens = usage.get("prompt_tokens", usage.get("input_tokens"))
    if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens > 0:
        return tokens
    return None


def _succeeded(text: str, extra: dict[str, Any]) -> bool:
    """Whether an observation says its command worked (``extra.returncode``, or the
    ``<returncode>`` the observation template writes)."""
    code = extra.get("returncode")
    if isinstance(code, int) and not isinstance(code, bool):
        return code == 0
    match = _RETURN_CODE.match(text)
    return match is None or int(match.group(1)) == 0


def _bash_read(text: str, cwd: str | None) -> str | None:
    """The file the action reads, when the message's one bash block is a plain read."""
    blocks = _BASH_BLOCK.findall(text)
    if len(blocks) != 1:
        return None
    return shell_read_path(blocks[0].strip(), None, cwd)


def _tool_calls(
    out: TranscriptBuilder,
    where: str,
    calls: Any,
    open_calls: dict[str, str | None],
    cwd: str | None,
) -> list[dict[str, Any]]:
    if calls is None:
        return []
    if not isinstance(calls, list):
        raise out.error(where, "'tool_calls' must be a list")
    result: list[dict[str, Any]] = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(call.get("id"), str):
            raise out.error(where, "a tool call needs an 'id' and a 'function'")
        if call["id"] in open_calls:
            continue  # the same call twice in one message
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise out.error(where, "a tool call needs a function 'name'")
        arguments = function.get("arguments", "")
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        result.append(
            {
                "id": call["id"],
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }
        )
        open_calls[call["id"]] = _call_read(arguments, cwd)
    return result


def _call_read(arguments: str, cwd: str | None) -> str | None:
    try:
        args = json.loads(arguments)
    except (ValueError, RecursionError):
        return None
    command = args.get("command") if isinstance(args, dict) else None
    return shell_read_path(command, None, cwd) if isinstance(command, str) else None
