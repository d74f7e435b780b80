"""Codex CLI rollout JSONL → ``openai`` messages.

A rollout is a list of ``{timestamp, type, payload}`` records (older rollouts wrote the
response items as bare records). What the model saw is in the ``response_item`` records:

- ``message`` items become ``user``, ``developer``, ``system`` or ``assistant`` messages;
  a user, developer or system message of several text parts keeps them as parts (newer
  Codex sends the AGENTS.md instructions, the ``<environment_context>`` block and the
  request as parts of one message), an assistant's are joined into text;
- ``function_call`` items become ``tool_calls`` of an assistant message — consecutive calls
  (parallel ones) and the assistant text before them form one message — and their
  ``function_call_output`` becomes a ``tool`` message, paired by ``call_id``; the output
  string is kept verbatim, as the model saw it;
- ``custom_tool_call`` becomes a ``custom`` tool call, ``local_shell_call`` a function
  call named ``local_shell`` whose arguments are the action; a code-mode ``exec`` call (a
  program calling ``tools.exec_command``, ``tools.apply_patch``…) reads and writes the
  files its inner calls do, and ``wait`` is an ordinary call;
- ``tool_search_call`` / ``tool_search_output`` (tools loaded on demand) are a call named
  ``tool_search`` and its result; a ``web_search_call`` (run by the provider, no output
  item) is a ``web_search`` call with its action as arguments, answered by a note;
- a ``compacted`` record is a compaction Codex did: an imported boundary. Its summary is
  the record's ``message`` (a compaction run in the client: strategy ``full``) or, when
  the record has a ``replacement_history`` (a server-side compaction: strategy
  ``provider``), the messages that history kept, with their roles (but the leading
  system/developer messages, which stay in the context), then any ``message``;
  an encrypted ``compaction`` item in it is named by a note (the ``openai`` format cannot
  carry it). The trigger is the record's when it has one, else ``auto``.

Dropped: ``reasoning`` items (encrypted, and not part of the Chat Completions format),
``event_msg`` records (they repeat the items for the UI; ``token_count`` events give each
assistant message its prompt size), ``turn_context``, repeated calls and
outputs whose call is unknown or already answered.
"""

from __future__ import annotations

import json
import posixpath
import re
import shlex
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from compactstore._context.code_mode import CODE_MODE_TOOLS, inner_calls
from compactstore._importers.builder import Entry, Item, TranscriptBuilder
from compactstore._importers.codex_records import CALL_TYPES, OUTPUT_TYPES, payloads, unwrap
from compactstore._importers.files import Progress, TranscriptFile
from compactstore._importers.jsonl import text_parts
from compactstore._ledger import CallUsage, codex_usage
from compactstore.errors import InvalidInputError
from compactstore.formats.block_types import NO_EXTENSION, BlockTypeExtension
from compactstore.models import CompactStrategy, CompactTrigger, ImportedBoundary

__all__ = [
    "COMPACTION_ITEMS",
    "answer",
    "apply_patch_paths",
    "call_paths",
    "convert",
    "output_text",
    "payloads",
    "replacement_text",
    "shell_read_path",
    "succeeded",
    "token_count",
    "unwrap",
]

# Items a server-side compaction returns in place of the history it summarised.
COMPACTION_ITEMS = frozenset({"compaction", "compaction_summary"})
_TRIGGERS = {"auto": CompactTrigger.AUTO, "manual": CompactTrigger.MANUAL}
# Calls the provider runs itself: the rollout holds the call and no output item.
_SERVER_CALLS = {"web_search_call": "web_search"}
_SHELL_TOOLS = frozenset(
    {"shell", "container.exec", "local_shell", "shell_command", "exec_command"}
)
_SHELLS = frozenset({"bash", "zsh", "sh", "dash"})
_PATCH_TARGET = re.compile(r"^\*\*\* (?:Add File|Update File|Delete File|Move to): (.+?)\s*$", re.M)
_SED_PRINT = re.compile(r"^\d+(,\d+)?p$")
_EXIT_CODE = re.compile(r"^Exit code: (-?\d+)", re.M)


@dataclass
class _Call:
    read_path: str | None
    epoch: int


@dataclass
class _State:
    out: TranscriptBuilder
    cwd: str | None = None
    calls: dict[str, _Call] = field(default_factory=dict)
    answered: set[str] = field(default_factory=set)
    epoch: int = 0
    group: int | None = None  # index of the assistant message still taking items
    pending_usage: int | None = None  # from a token_count event not yet given to a message
    pending_ledger: CallUsage | None = None  # the same event's usage split
    model: str | None = None  # the model of the current turn (turn_context)
    instructions: tuple[str, str, float | None] | None = None  # (text, where, timestamp)
    # The texts of the leading system/developer messages: the store pins them, so they
    # stay in the context after a compaction and are not repeated in its summary.
    leading: set[str] = field(default_factory=set)


def convert(
    file: TranscriptFile,
    progress: Progress | None = None,
    extension: BlockTypeExtension = NO_EXTENSION,
) -> Iterator[Item]:
    """Convert a rollout (see the module docstring for what is kept)."""
    state = _State(TranscriptBuilder(file.name, "codex", "openai", extension))
    for where, kind, payload, timestamp in payloads(file, state.out, progress):
        if kind == "session_meta":
            _session_meta(state, where, payload, timestamp)
        elif kind == "turn_context":
            if isinstance(payload.get("cwd"), str):
                state.cwd = payload["cwd"]
            if isinstance(payload.get("model"), str) and payload["model"]:
                state.model = payload["model"]
        elif kind == "event_msg":
            _event(state, where, payload)
        elif kind == "compacted":
            _compacted(state, where, payload, timestamp)
        elif kind == "response_item":
            _item(state, where, payload, timestamp)
        if file.cwd is None and state.cwd:
            file.cwd = state.cwd  # the session's working directory, where it started
        state.out.release(_held_from(state))
        yield from state.out.drain()
    _prepend_instructions(state)
    yield from state.out.finish()


def _held_from(state: _State) -> int | None:
    """The first message the records to come may still change: all of them while the
    session instructions may still have to go first, else the assistant message taking
    items."""
    return 0 if state.instructions is not None else state.group


def _session_meta(
    state: _State, where: str, payload: dict[str, Any], timestamp: float | None
) -> None:
    if isinstance(payload.get("cwd"), str):
        state.cwd = payload["cwd"]
    instructions = payload.get("instructions")
    # (Instructions met after the conversation started cannot go before it any more.)
    if isinstance(instructions, str) and instructions.strip() and not state.out.released:
        state.instructions = (instructions, where, timestamp)


def _prepend_instructions(state: _State) -> None:
    """Session instructions as a leading system message, unless a message before the
    model's first reply already has them (this runs just before that reply is added).

    Codex usually also sends them as a user message (``<user_instructions>``), which is
    then kept where it was instead.
    """
    if state.instructions is None:
        return
    text, where, timestamp = state.instructions
    state.instructions = None
    wanted = text.strip()
    if any(wanted in "\n".join(_content_texts(entry.message)) for entry in state.out.held()):
        return
    state.out.insert_first(Entry({"role": "system", "content": text}, where, timestamp))


def _content_texts(message: dict[str, Any]) -> list[str]:
    content = message.get("content")
    if isinstance(content, str):
        return [content]
    return text_parts(content) if isinstance(content, list) else []


def token_count(
    out: TranscriptBuilder, where: str, payload: dict[str, Any], model: str | None
) -> tuple[int, CallUsage | None] | None:
    """The prompt size and billed usage a ``token_count`` event reports for the last model
    call (None for other events, and for one without a count)."""
    if payload.get("type") != "token_count":
        return None
    info = payload.get("info")
    last = info.get("last_token_usage") if isinstance(info, dict) else None
    tokens = last.get("input_tokens") if isinstance(last, dict) else None
    if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens <= 0:
        return None
    assert isinstance(last, dict)
    try:
        return tokens, codex_usage(last, model)
    except InvalidInputError as exc:
        raise out.error(where, str(exc)) from None


def _event(state: _State, where: str, payload: dict[str, Any]) -> None:
    counted = token_count(state.out, where, payload, state.model)
    if counted is None:
        return
    tokens, ledger = counted
    # Newer Codex writes the count after the response's items, older before them.
    if state.group is not None and state.out.entry(state.group).usage is None:
        state.out.entry(state.group).usage = tokens
        state.out.entry(state.group).ledger = ledger
    else:
        state.pending_usage, state.pending_ledger = tokens, ledger


def _compacted(state: _State, where: str, payload: dict[str, Any], timestamp: float | None) -> None:
    """A compaction Codex did: the context after it is the summary ``message`` (a compaction
    run in the client) or the ``replacement_history`` the server returned (its messages, and
    any encrypted ``compaction`` item)."""
    state.group = None
    state.epoch += 1
    summary = payload.get("message")
    history = payload.get("replacement_history")
    if history is not None and not isinstance(history, list):
        raise state.out.error(where, "compacted record: 'replacement_history' must be a list")
    text = summary if isinstance(summary, str) and summary.strip() else None
    strategy = CompactStrategy.FULL
    if history:
        text = replacement_text(state.out, where, history, text, state.leading)
        strategy = CompactStrategy.PROVIDER
    if not text or not state.out.count:
        return
    trigger = _TRIGGERS.get(str(payload.get("trigger")), CompactTrigger.AUTO)
    state.out.add_boundary(
        ImportedBoundary(
            first_kept_index=state.out.count,
            summary_text=text,
            trigger=trigger,
            timestamp=timestamp,
            strategy=strategy,
        ),
        where=where,
    )


def replacement_text(
    out: TranscriptBuilder,
    where: str,
    history: list[Any],
    message: str | None,
    leading: set[str],
    *,
    notes: bool = True,
) -> str | None:
    """What a server-side compaction left in the context, as one summary text: each kept
    message with its role (but the session's ``leading`` instructions, which stay in the
    context), and (``notes``) a note for an encrypted ``compaction`` item (the Chat
    Completions format cannot carry it; only the provider can read it)."""
    parts: list[str] = []
    for number, item in enumerate(history):
        if not isinstance(item, dict):
            raise out.error(where, f"replacement_history[{number}] must be an object")
        kind = item.get("type")
        if kind == "message":
            content = item.get("content")
            if isinstance(content, str):
                body = content
            elif isinstance(content, list):
                body = "\n".join(text_parts(content))
            else:
                continue
            if body.strip() and body not in leading:
                parts.append(f"[{item.get('role', 'user')}]\n{body}")
        elif kind in COMPACTION_ITEMS and notes:
            secret = item.get("encrypted_content")
            size = len(secret) if isinstance(secret, str) else 0
            parts.append(
                f"[{kind} item: {size:,} characters of encrypted content only the provider "
                "can read; not imported]"
            )
    if message is not None:
        parts.append(message)
    if not parts:
        return None
    head = "[Codex compacted the conversation; what it kept in the context follows]"
    return "\n\n".join([head, *parts])


def _item(state: _State, where: str, item: dict[str, Any], timestamp: float | None) -> None:
    kind = item.get("type") if isinstance(item.get("type"), str) else None
    if kind == "message":
        _message(state, where, item, timestamp)
    elif kind in CALL_TYPES:
        _call(state, where, item, timestamp)
    elif kind in OUTPUT_TYPES:
        _output(state, where, item, timestamp)
    elif kind in _SERVER_CALLS:
        _server_call(state, where, item, timestamp)


def _server_call(state: _State, where: str, item: dict[str, Any], timestamp: float | None) -> None:
    """A call the provider ran (a web search): a function call with its action as the
    arguments, answered at once by a note saying so (the results reached the model inside
    the provider and are not in the rollout)."""
    name = _SERVER_CALLS[item["type"]]
    call_id = item.get("id") or item.get("call_id")
    if not isinstance(call_id, str) or not call_id:
        raise state.out.error(where, f"{item['type']} item without an 'id'")
    action = item.get("action") if isinstance(item.get("action"), dict) else {}
    call = {"type": "function_call", "call_id": call_id, "name": name, "arguments": action}
    _call(state, where, call, timestamp)
    status = item.get("status") if isinstance(item.get("status"), str) else "done"
    note = f"[{name} {status}: run by the provider; its results are not in the rollout]"
    _output(state, where, {"call_id": call_id, "output": note}, timestamp)


def _message(state: _State, where: str, item: dict[str, Any], timestamp: float | None) -> None:
    role = item.get("role")
    if role not in ("user", "assistant", "developer", "system"):
        raise state.out.error(where, f"message item with unknown role {role!r}")
    content = item.get("content")
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        text = "\n".join(text_parts(content))
    else:
        raise state.out.error(where, "message item: 'content' must be a list of parts or text")
    if not text.strip():
        return
    out = state.out
    if role != "assistant":
        state.group = None
        if role in ("developer", "system") and out.count == len(state.leading):
            state.leading.add(text)
        out.add({"role": role, "content": _parts(content, text)}, where=where, timestamp=timestamp)
        return
    if state.group is not None:
        message = out.entry(state.group).message
        earlier = message.get("content")
        message["content"] = f"{earlier}\n\n{text}" if earlier else text
        return
    _open_group(state, where, timestamp, content=text)


def _parts(content: Any, text: str) -> str | list[dict[str, Any]]:
    """A user, developer or system message's content: its text parts kept as parts when
    there are several (newer Codex sends the AGENTS.md instructions, the environment and
    the request as parts of one message; the classifier tells them apart by part)."""
    if not isinstance(content, list):
        return text
    parts = [part for part in text_parts(content) if part.strip()]
    if len(parts) < 2:
        return text
    return [{"type": "text", "text": part} for part in parts]


def _open_group(state: _State, where: str, timestamp: float | None, *, content: str | None) -> int:
    _prepend_instructions(state)
    state.group = state.out.add(
        {"role": "assistant", "content": content},
        where=where,
        timestamp=timestamp,
        usage=state.pending_usage,
        ledger=state.pending_ledger,
    )
    state.pending_usage, state.pending_ledger = None, None
    return state.group


def _call(state: _State, where: str, item: dict[str, Any], timestamp: float | None) -> None:
    kind = item["type"]
    call_id = item.get("call_id") or item.get("id")
    if not isinstance(call_id, str) or not call_id:
        raise state.out.error(where, f"{kind} item without a 'call_id'")
    if call_id in state.calls:
        return  # the same call written twice
    name: Any = {"local_shell_call": "local_shell", "tool_search_call": "tool_search"}.get(
        kind, item.get("name")
    )
    arguments = item.get("action" if kind == "local_shell_call" else "arguments", item.get("input"))
    if not isinstance(name, str) or not name:
        raise state.out.error(where, f"{kind} item without a 'name'")
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    if kind == "custom_tool_call":
        call = {"id": call_id, "type": "custom", "custom": {"name": name, "input": text}}
    else:
        call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": text}}
    index = (
        state.group
        if state.group is not None
        else _open_group(state, where, timestamp, content=None)
    )
    entry = state.out.entry(index)
    entry.message.setdefault("tool_calls", []).append(call)
    read, writes = call_paths(name, arguments, state.cwd)
    entry.write_paths.extend(path for path in writes if path not in entry.write_paths)
    state.calls[call_id] = _Call(read_path=read, epoch=state.epoch)


def call_paths(name: str, arguments: Any, cwd: str | None) -> tuple[str | None, list[str]]:
    """(the one file a call reads, the files it writes); a code-mode program (exec) reads
    and writes through the tools it calls."""
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    inner = inner_calls(text) if name in CODE_MODE_TOOLS else [(name, _parse_arguments(arguments))]
    writes: list[str] = []
    for inner_name, inner_arguments in inner:
        for path in _write_paths(inner_name, inner_arguments, text, cwd):
            if path not in writes:
                writes.append(path)
    read = _read_path(*inner[0], cwd) if len(inner) == 1 else None
    return read, writes


def _output(state: _State, where: str, item: dict[str, Any], timestamp: float | None) -> None:
    state.group = None
    answered = answer(state.calls, state.answered, state.epoch, item)
    if answered is None:
        return
    call_id, call, text = answered
    read = call.read_path if call.read_path is not None and succeeded(text) else None
    state.out.add(
        {"role": "tool", "tool_call_id": call_id, "content": text},
        where=where,
        timestamp=timestamp,
        read_path=read,
    )


class _Epoched(Protocol):
    epoch: int


C = TypeVar("C", bound=_Epoched)


def answer(
    calls: Mapping[str, C], answered: set[str], epoch: int, item: dict[str, Any]
) -> tuple[str, C, str] | None:
    """(call id, the call, the output's text) of an output item, now marked answered; None
    for an output of an unknown call, one answered already, or one compacted away (the
    store would refuse it)."""
    call_id = item.get("call_id") or item.get("id")
    call = calls.get(call_id) if isinstance(call_id, str) else None
    if call is None or call_id in answered or call.epoch != epoch:
        return None
    assert isinstance(call_id, str)
    answered.add(call_id)
    if "output" not in item and "tools" in item:  # tool_search_output: the tools it loaded
        return call_id, call, json.dumps(item["tools"], ensure_ascii=False)
    return call_id, call, output_text(item.get("output"))


def output_text(output: Any) -> str:
    if isinstance(output, str):
        return output
    if isinstance(output, list):
        return "\n".join(text_parts(output))
    if isinstance(output, dict) and isinstance(output.get("content"), str):
        return str(output["content"])
    return json.dumps(output, ensure_ascii=False)


def succeeded(output: str) -> bool:
    """Whether a shell output says the command worked (no evidence of failure)."""
    if output.startswith(("failed in sandbox", "execution error", "error:")):
        return False
    try:
        parsed = json.loads(output)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        meta = parsed.get("metadata")
        code = meta.get("exit_code") if isinstance(meta, dict) else None
        return code in (None, 0)
    match = _EXIT_CODE.search(output[:200])
    return match is None or int(match.group(1)) == 0


# -- what a call reads or writes ----------------------------------------------------------


def _parse_arguments(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments  # a custom tool's free-form input (apply_patch)
    return arguments


def _command(arguments: Any) -> tuple[list[str] | str | None, str | None]:
    """A shell call's command (argv or script) and working directory."""
    if not isinstance(arguments, dict):
        return None, None
    command = arguments.get("command", arguments.get("cmd"))
    workdir = arguments.get("workdir", arguments.get("working_directory"))
    if isinstance(command, list) and all(isinstance(part, str) for part in command):
        argv: list[str] | str | None = list(command)
    elif isinstance(command, str):
        argv = command
    else:
        argv = None
    return argv, workdir if isinstance(workdir, str) else None


def _script_argv(command: list[str] | str) -> list[str] | None:
    """The argv of a single simple command (``bash -lc "cat f"`` included), else None."""
    if isinstance(command, list):
        if (
            len(command) == 3
            and posixpath.basename(command[0]) in _SHELLS
            and command[1]
            in (
                "-lc",
                "-c",
            )
        ):
            command = command[2]
        else:
            return command
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        tokens = list(lexer)
    except ValueError:
        return None
    # Pipes, redirections, sequences: not a plain read of one file.
    if any(token and set(token) <= set("();<>|&") for token in tokens):
        return None
    return tokens


def _resolve(path: str, workdir: str | None, cwd: str | None) -> str:
    base = workdir or cwd
    if base and not posixpath.isabs(base) and cwd:
        base = posixpath.join(cwd, base)
    if base and not posixpath.isabs(path):
        path = posixpath.join(base, path)
    return posixpath.normpath(path) if posixpath.isabs(path) else path


def shell_read_path(command: list[str] | str, workdir: str | None, cwd: str | None) -> str | None:
    """The one file a ``cat FILE`` or ``sed -n 'A,Bp' FILE`` command reads, else None."""
    argv = _script_argv(command)
    if not argv:
        return None
    program, args = posixpath.basename(argv[0]), argv[1:]
    files: list[str]
    if program == "cat":
        files = [a for a in args if not a.startswith("-")]
        if len(files) != len(args):
            return None
    elif program == "sed":
        if len(args) != 3 or args[0] != "-n" or not _SED_PRINT.match(args[1]):
            return None
        files = [args[2]]
    else:
        return None
    if len(files) != 1:
        return None
    return _resolve(files[0], workdir, cwd)


def _read_path(name: str, arguments: Any, cwd: str | None) -> str | None:
    if name not in _SHELL_TOOLS:
        return None
    command, workdir = _command(arguments)
    return None if command is None else shell_read_path(command, workdir, cwd)


def apply_patch_paths(patch: str) -> list[str]:
    """The files an ``apply_patch`` patch adds, updates, deletes or moves to."""
    if "*** Begin Patch" not in patch:
        return []
    paths: list[str] = []
    for match in _PATCH_TARGET.finditer(patch):
        if match.group(1) not in paths:
            paths.append(match.group(1))
    return paths


def _write_paths(name: str, arguments: Any, text: str, cwd: str | None) -> list[str]:
    if name == "apply_patch":
        patch = arguments.get("input") if isinstance(arguments, dict) else arguments
        found = apply_patch_paths(patch if isinstance(patch, str) else text)
        return [_resolve(p, None, cwd) for p in found]
    if name not in _SHELL_TOOLS:
        return []
    command, workdir = _command(arguments)
    if command is None:
        return []
    script = command if isinstance(command, str) else "\n".join(command)
    if "apply_patch" not in script:
        return []
    return [_resolve(p, workdir, cwd) for p in apply_patch_paths(script)]
