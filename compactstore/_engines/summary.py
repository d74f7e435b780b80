"""The rule-based summary: a handoff an agent can continue from.

Sections, each written only when it has something to say: the original request; every later
user instruction, in order; pending tasks from the latest plan/todo call; current work (the last
assistant text before the cut) and its stated next step; files, one line each (one normalised
path per file, relative to the session's working directory, with what was done to it, newest
first); errors, unescaped and short, marked resolved once a later call of the same tool with
the same input succeeded; and a recall line when recall is enabled.

The summary is cumulative: :func:`fold` adds the messages a cut removes to the previous
boundary's state (a version-1 state is read as version 2), and :func:`render` writes the
state within its budget (:func:`budget_for`: ``summary_max_tokens``, and at most
``summary_max_window_share`` of the window). Over budget, the oldest instructions are cut to
``summary_instruction_chars`` first; while they still take more than half of the budget the
oldest become one "N earlier instructions (seqs a–b)" line. Both are pure functions of their
inputs, so a replay writes the same text.
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from compactstore._context.active import ActiveContext, ContextMessage
from compactstore._context.boilerplate import request_text, strip_boilerplate
from compactstore._context.code_mode import CODE_MODE_TOOLS, inner_calls
from compactstore._engines.summary_render import budget_for, one_line, render
from compactstore._engines.tasks import next_plan, plan_items
from compactstore.formats import ToolCall
from compactstore.formats.base import ToolResult, json_text
from compactstore.models import (
    CurrentWork,
    ErrorEntry,
    FileAction,
    FileEntry,
    Instruction,
    SummaryState,
)

__all__ = [
    "PATH_PATTERN",
    "budget_for",
    "file_actions",
    "fold",
    "is_absolute",
    "normalise_path",
    "original_request",
    "plan_items",
    "render",
]

# Tool-call input keys that name a file the tool read or wrote.
FILE_KEYS = ("file_path", "path", "filePath", "notebook_path", "filename", "file")

# A path-like token inside a command: a directory part and a file extension; a Windows
# one may start with a drive and use backslashes.
PATH_PATTERN = re.compile(
    r"(?<![\w/\\.:-])(?:[A-Za-z]:)?(?:\.{1,2}[/\\]|[/\\])?"
    r"(?:[\w@+\[\]()-][\w.@+\[\]()-]*[/\\])+[\w@+-][\w.@+-]*\.[A-Za-z0-9]{1,8}"
    r"(?![\w/\\])"
)

_READ_TOOLS = frozenset({"read", "read_file", "view", "open", "notebookread", "cat"})
_WRITE_TOOLS = frozenset({"write", "write_file", "create", "create_file"})
_EDIT_TOOLS = frozenset(
    {"edit", "multiedit", "edit_file", "notebookedit", "str_replace", "replace", "insert"}
)
_SEARCH_TOOLS = frozenset({"grep", "glob", "search", "find_file", "search_file", "ls"})
_READ_COMMANDS = frozenset(
    {"cat", "head", "tail", "less", "more", "nl", "wc", "sed", "awk", "grep", "rg", "bat", "diff"}
)
_PATCH_FILE = re.compile(r"^\*\*\* (Add|Update|Delete) File: (.+)$", re.MULTILINE)
_PATCH_ACTIONS: dict[str, FileAction] = {
    "Add": "created",
    "Update": "modified",
    "Delete": "deleted",
}
_PATCH_MOVE = re.compile(r"^\*\*\* Move to: (.+)$", re.MULTILINE)
_PERSISTED = re.compile(r"^\[Tool result persisted: [^\]]*, blob (\d+)\]\s*")
_ENV_CWD = re.compile(r"<cwd>\s*([^<\n]+?)\s*</cwd>")
# Input keys that change between two runs of the same command without changing what it does.
_VOLATILE_KEYS = frozenset({"description", "timeout", "timeout_ms", "run_in_background"})
_NEXT_STEP = re.compile(
    r"\b(?:next(?: step)?|now (?:i(?:'ll| will)|let me)|let me|i(?:'ll| will)|i'm going to|"
    r"going to|then i(?:'ll| will))\b",
    re.IGNORECASE,
)


# -- what the messages say ------------------------------------------------------------------


def original_request(context: ActiveContext) -> str | None:
    """What the user asked: the real request (the first user message that is not client
    boilerplate, pinned at insert), boilerplate removed; None before it was appended."""
    for item in context.items:
        if item.seq is not None and item.seq == context.real_request_seq:
            text = request_text(
                context.fmt.text_parts(item.message), context.config.boilerplate_patterns
            )
            return text or None
    return None


def _arguments(call: ToolCall) -> Any:
    arguments = call.input
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return {"command": arguments}
    return arguments


def _command(arguments: Any) -> str:
    """The shell text of a command argument (Codex passes ["bash", "-lc", script])."""
    command = (
        arguments.get("command") or arguments.get("cmd") if isinstance(arguments, dict) else None
    )
    if isinstance(command, list):
        parts = [str(part) for part in command]
        if len(parts) >= 3 and parts[1] in ("-lc", "-c"):
            return parts[-1]
        return " ".join(parts)
    return command if isinstance(command, str) else ""


def _looks_like_file(path: str) -> bool:
    return "." in posixpath.basename(path.rstrip("/"))


def _in_directory(directory: str | None, path: str) -> str:
    """``path`` as seen from ``directory`` (a ``cd`` or the call's working directory)."""
    if not directory or is_absolute(path) or path.startswith("~"):
        return path
    return directory.rstrip("/\\") + "/" + path


def _command_files(script: str, workdir: str | None = None) -> list[tuple[str, FileAction]]:
    """(path, action) for the files a shell script names; a relative path is taken from
    ``workdir`` and the directories ``cd`` (or ``Set-Location``/``pushd``) moves to."""
    found: list[tuple[str, FileAction]] = []
    for kind, path in _PATCH_FILE.findall(script):
        found.append((_in_directory(workdir, path.strip()), _PATCH_ACTIONS[kind]))
    found.extend(
        (_in_directory(workdir, path.strip()), "created") for path in _PATCH_MOVE.findall(script)
    )
    if found:
        return found
    directory = workdir
    for segment in re.split(r"&&|\|\||;|\||\n", script):
        words = segment.split()
        if not words:
            continue
        program = posixpath.basename(words[0])
        if program.lower() in ("cd", "set-location", "pushd", "sl") and len(words) == 2:
            target = words[1].strip("'\"")
            directory = _in_directory(directory, target) if target != "-" else directory
            continue
        paths = [_in_directory(directory, m.group(0)) for m in PATH_PATTERN.finditer(segment)]
        action: FileAction
        if program == "rm":
            action = "deleted"
        elif program in _READ_COMMANDS:
            action = "read"
        else:
            action = "named"
        if program == "mv" and len(paths) == 2:
            found += [(paths[0], "deleted"), (paths[1], "created")]
            continue
        found.extend((path, action) for path in paths)
    return found


def file_actions(call: ToolCall) -> list[tuple[str, FileAction]]:
    """(path, action) for each file a tool call works on: created, modified, deleted, read,
    or named (a path inside some other command). Paths are as the call spells them, a
    relative one in a shell command taken from the directory it runs in (its ``workdir``,
    and where a ``cd`` earlier in the command moved)."""
    inner = _inner_calls(call)
    if inner is not None:
        return [found for each in inner for found in file_actions(each)]
    arguments = _arguments(call)
    if not isinstance(arguments, dict):
        return []
    named = [
        value.strip()
        for key in FILE_KEYS
        if isinstance(value := arguments.get(key), str) and value.strip()
    ]
    known = _tool_files(call.name.lower(), arguments, named)
    if known is not None:
        return known
    found: list[tuple[str, FileAction]] = [
        (path, "named") for path in named if _looks_like_file(path)
    ]
    script = _command(arguments)
    if not script:
        return found
    return found + _command_files(script, _workdir(arguments))


def _tool_files(
    name: str, arguments: dict[str, Any], named: list[str]
) -> list[tuple[str, FileAction]] | None:
    """What a file tool (read, write, edit, search) does to the paths it names; None for
    other tools."""
    if name in _READ_TOOLS:
        return [(path, "read") for path in named]
    if name in _WRITE_TOOLS or arguments.get("command") == "create":
        return [(path, "created") for path in named]
    if name in _EDIT_TOOLS or name == "str_replace_editor":
        edit: FileAction = "read" if arguments.get("command") == "view" else "modified"
        return [(path, edit) for path in named]
    if name in _SEARCH_TOOLS:
        return [(path, "read") for path in named if _looks_like_file(path)]
    return None


def _workdir(arguments: dict[str, Any]) -> str | None:
    """The directory a shell command runs in, when the call names one."""
    return next(
        (
            value
            for key in ("workdir", "cwd", "working_directory")
            if isinstance(value := arguments.get(key), str) and value.strip()
        ),
        None,
    )


def _inner_calls(call: ToolCall) -> list[ToolCall] | None:
    """The tool calls a code-mode program (Codex's ``exec``) makes, None for other calls."""
    if call.name not in CODE_MODE_TOOLS or not isinstance(call.input, str):
        return None
    return [
        ToolCall(call.id, name, arguments["input"] if list(arguments) == ["input"] else arguments)
        for name, arguments in inner_calls(call.input)
        if isinstance(arguments, dict)
    ]


# A Windows drive ("D:" then a separator or the end); a drive as MSYS/Git Bash, WSL and
# Cygwin spell it ("/d/…", "/mnt/d/…", "/cygdrive/d/…"); a home directory.
_DRIVE = re.compile(r"^([A-Za-z]):(?=[\\/]|$)")
_POSIX_DRIVE = re.compile(r"^/(?:mnt/|cygdrive/)?([A-Za-z])(?=/|$)")
_HOME = re.compile(r"^(?:/Users/[^/]+|/home/[^/]+|/root|[A-Z]:/Users/[^/]+)(?=/|$)")


def is_absolute(path: str) -> bool:
    """Whether a path names its file without a working directory (POSIX or Windows)."""
    return path.startswith(("/", "\\")) or _DRIVE.match(path) is not None


def _portable(path: str, windows: bool) -> str:
    """A path in one spelling: on Windows (a drive in the path, or a Windows working
    directory) forward slashes, the drive in capitals, an MSYS-style drive as a drive."""
    drive = _DRIVE.match(path)
    if not (windows or drive):
        return path
    path = path.replace("\\", "/")
    if drive:
        return drive.group(1).upper() + path[1:]
    posix_drive = _POSIX_DRIVE.match(path)
    if posix_drive:
        return f"{posix_drive.group(1).upper()}:{path[posix_drive.end() :] or '/'}"
    return path


def normalise_path(path: str, cwd: str | None) -> str:
    """One spelling per file whatever the OS: relative to ``cwd`` when under it (a Windows
    ``cwd`` compared without regard to case), ``./`` and ``..`` resolved, Windows paths with
    forward slashes and the drive in capitals (``D:\\w\\a.js``, ``/d/w/a.js`` and ``a.js``
    are one file under ``D:\\w``), ``~`` as the home directory ``cwd`` lies in."""
    path = path.strip().strip("'\"`")
    if not path:
        return path
    windows = cwd is not None and _DRIVE.match(cwd.strip()) is not None
    path = _portable(path, windows)
    root = _portable(cwd.strip(), windows).rstrip("/") if cwd else None
    if root is not None and (path == "~" or path.startswith("~/")):
        home = _HOME.match(root)
        path = home.group(0) + path[1:] if home else path
    if root and is_absolute(path):
        fold = str.lower if windows or _DRIVE.match(path) else str
        if fold(path) == fold(root):
            return "."
        if fold(path).startswith(fold(root) + "/"):
            path = path[len(root) + 1 :]
    normal = posixpath.normpath(path)
    return normal[2:] if normal.startswith("./") else normal


def _result_outcome(text: str, flagged: bool) -> tuple[bool, str]:
    """(is an error, the text a person reads) of a tool result. Codex shell results are
    JSON with the output and its exit code."""
    if text.startswith('{"output"'):
        try:
            data = json.loads(text)
        except ValueError:
            data = None
        if isinstance(data, dict) and isinstance(data.get("output"), str):
            metadata = data.get("metadata")
            code = metadata.get("exit_code") if isinstance(metadata, dict) else None
            return flagged or (isinstance(code, int) and code != 0), data["output"]
    return flagged or text.startswith("Error: "), text


def _call_key(call: ToolCall) -> str:
    """The call's tool and input, normalised, for "the same call again"."""
    arguments = _arguments(call)
    if isinstance(arguments, dict):
        arguments = {k: v for k, v in arguments.items() if k not in _VOLATILE_KEYS}
    return call.name + " " + " ".join(json_text(arguments).split())


def _next_step(text: str) -> str | None:
    """The last sentence of an assistant text that says what comes next."""
    sentences = [s.strip() for s in re.split(r"(?<=[.!?])\s+|\n+", text) if s.strip()]
    return next((s for s in reversed(sentences) if _NEXT_STEP.search(s)), None)


# -- the state ------------------------------------------------------------------------------


def _cwd(
    context: ActiveContext, removed: Sequence[ContextMessage], known: str | None
) -> str | None:
    if context.cwd:
        return context.cwd
    if known:
        return known
    for item in (*context.head, *removed):
        if item.kind == "user":
            match = _ENV_CWD.search(context.fmt.text(item.message))
            if match:
                return match.group(1)
    return None


def _upgraded(instructions: Iterable[Instruction], patterns: tuple[str, ...]) -> list[Instruction]:
    """The instructions, with those a version-1 state held as topics (no seq) cleaned of
    client boilerplate, and dropped when nothing else was left."""
    kept: list[Instruction] = []
    for entry in instructions:
        if entry.seq is None:
            text = request_text(entry.text, patterns)
            if not text:
                continue
            entry = entry.model_copy(update={"text": text})
        kept.append(entry)
    return kept


def fold(
    previous: SummaryState, removed: Sequence[ContextMessage], context: ActiveContext
) -> SummaryState:
    """The summary state after summarising ``removed`` on top of ``previous`` (a version-1
    state was upgraded when it was read)."""
    config = context.config
    work = _current_work(removed, context)
    if work is None:
        work = previous.current_work
    cwd = _cwd(context, removed, previous.cwd)
    request = original_request(context) or previous.original_request
    folding = _Folding(previous, context, cwd)
    for item in removed:
        folding.message(item)
    files, errors = folding.files, folding.errors
    removed_seqs = [item.seq for item in removed if item.seq is not None]
    if cwd is None:
        cwd = _infer_cwd(files)
    first = [s for s in (previous.first_seq, *removed_seqs[:1]) if s is not None]
    last = [s for s in (previous.last_seq, *removed_seqs[-1:]) if s is not None]
    return SummaryState(
        original_request=request,
        cwd=cwd,
        instructions=tuple(folding.instructions),
        earlier_instructions=previous.earlier_instructions,
        plan=folding.plan,
        current_work=work,
        files=_merge_spellings(files.values(), cwd),
        errors=tuple(errors[-config.summary_max_errors :] if config.summary_max_errors else ()),
        compactions=previous.compactions + 1,
        messages_removed=previous.messages_removed + len(removed),
        first_seq=min(first, default=None),
        last_seq=max(last, default=None),
    )


class _Folding:
    """The state :func:`fold` builds, message by message: instructions, the plan, files
    and errors (an error is resolved once a later identical call succeeds)."""

    def __init__(self, previous: SummaryState, context: ActiveContext, cwd: str | None) -> None:
        self.context = context
        self.config = context.config
        self.patterns = context.config.boilerplate_patterns
        self.cwd = cwd
        self.instructions = _upgraded(previous.instructions, self.patterns)
        self.plan = previous.plan
        self.files = {entry.path: entry for entry in _merge_spellings(previous.files, cwd)}
        self.errors = list(previous.errors)
        # Where the unresolved errors of each call are in ``errors``: a success resolves them.
        self.unresolved: dict[str, list[int]] = {}
        for index, error in enumerate(self.errors):
            if error.key and not error.resolved:
                self.unresolved.setdefault(error.key, []).append(index)
        self.calls: dict[str, ToolCall] = {}

    def message(self, item: ContextMessage) -> None:
        context, seq = self.context, item.seq
        if (
            item.kind == "user"
            and context.fmt.is_request(item.message)
            and seq != context.real_request_seq
        ):
            self.instruction(item)
        for call in item.calls:
            self.call(call, seq)
        for result in item.results:
            self.result(result, seq)

    def instruction(self, item: ContextMessage) -> None:
        said = request_text(self.context.fmt.text_parts(item.message), self.patterns)
        if said:
            text = " ".join(said.split())[: self.config.summary_request_chars]
            self.instructions.append(Instruction(seq=item.seq, text=text))

    def call(self, call: ToolCall, seq: int | None) -> None:
        self.calls[call.id] = call
        self.plan = next_plan(self.plan, call, seq, self.config.plan_tool_names)
        for path, action in file_actions(call):
            _touch(self.files, normalise_path(path, self.cwd), action, seq)

    def result(self, result: ToolResult, seq: int | None) -> None:
        made = self.calls.get(result.tool_use_id)
        if made is None:
            return
        failed, shown = _result_outcome(result.text, result.is_error)
        key = _call_key(made)
        if failed:
            self.error(made, key, shown, seq)
            return
        for index in self.unresolved.pop(key, ()):
            self.errors[index] = self.errors[index].model_copy(update={"resolved": True})
        if made.name.lower() in _WRITE_TOOLS and "updated" in result.text[:200].lower():
            self.updated(made)

    def error(self, made: ToolCall, key: str, shown: str, seq: int | None) -> None:
        persisted = _PERSISTED.match(shown)
        if persisted:
            shown = shown[persisted.end() :]
        text = one_line(strip_boilerplate(shown, self.patterns), self.config.summary_error_chars)
        if persisted:
            text += f" (whole output: blob {persisted.group(1)})"
        self.unresolved.setdefault(key, []).append(len(self.errors))
        self.errors.append(ErrorEntry(tool=made.name, key=key, text=text, seq=seq))

    def updated(self, made: ToolCall) -> None:
        """A write tool that says it updated a file: a file this summary has as created
        was modified (it existed before)."""
        for path, _ in file_actions(made):
            normal = normalise_path(path, self.cwd)
            entry = self.files.get(normal)
            if entry is not None and "created" in entry.actions:
                actions = [a for a in entry.actions if a != "created"]
                if "modified" not in actions:
                    actions.append("modified")
                self.files[normal] = entry.model_copy(update={"actions": tuple(actions)})


def _current_work(removed: Sequence[ContextMessage], context: ActiveContext) -> CurrentWork | None:
    """The last assistant text among ``removed`` (client boilerplate removed), if any."""
    patterns = context.config.boilerplate_patterns
    for item in reversed(removed):
        if item.kind == "assistant":
            said = strip_boilerplate(context.fmt.text(item.message), patterns)
            if said:
                chars = context.config.summary_request_chars
                return CurrentWork(seq=item.seq, text=said[:chars], next_step=_next_step(said))
    return None


def _suffixes(path: str) -> Iterator[tuple[str, str]]:
    """(head, tail) for each "/" in ``path``: ``path`` ends with "/" + tail."""
    at = path.find("/")
    while at >= 0:
        yield path[:at], path[at + 1 :]
        at = path.find("/", at + 1)


def _infer_cwd(files: dict[str, FileEntry]) -> str | None:
    """The working directory two spellings of one file show: ``/w/lib/a.ex`` and
    ``lib/a.ex`` give ``/w`` (the most frequent such prefix)."""
    relative = {p for p in files if not is_absolute(p) and "/" in p and not p.startswith("..")}
    prefixes: dict[str, int] = {}
    for path in files:
        if is_absolute(path):
            for head, tail in _suffixes(path):
                if tail in relative:
                    prefix = head or "/"
                    prefixes[prefix] = prefixes.get(prefix, 0) + 1
    return max(sorted(prefixes), key=prefixes.__getitem__) if prefixes else None


def _touch(files: dict[str, FileEntry], path: str, action: FileAction, seq: int | None) -> None:
    if not path or path == ".":
        return
    entry = files.pop(path, None)
    known: list[FileAction] = list(entry.actions) if entry is not None else []
    actions: list[FileAction] = [a for a in known if a != "named"] if action != "named" else known
    if action not in actions and not (action == "named" and actions):
        actions.append(action)
    files[path] = FileEntry(path=path, actions=tuple(actions), seq=seq)  # re-inserted: newest last


def _merge_spellings(entries: Iterable[FileEntry], cwd: str | None) -> tuple[FileEntry, ...]:
    """One entry per file, oldest first: paths normalised against ``cwd``, and without one,
    an absolute path that ends with a relative one listed too is that file."""
    files = [e.model_copy(update={"path": normalise_path(e.path, cwd)}) for e in entries]
    # Each relative path and where it is first listed: an absolute path that ends with
    # several is the first of them.
    relative: dict[str, int] = {}
    for index, entry in enumerate(files):
        if not is_absolute(entry.path):
            relative.setdefault(entry.path, index)
    merged: dict[str, FileEntry] = {}
    for entry in files:
        target = entry.path
        if is_absolute(target) and cwd is None:
            ends = [tail for _, tail in _suffixes(target) if tail in relative]
            target = min(ends, key=relative.__getitem__, default=target)
        known = merged.pop(target, None)
        if known is None:
            merged[target] = entry.model_copy(update={"path": target})
            continue
        actions = [*known.actions, *(a for a in entry.actions if a not in known.actions)]
        if len(actions) > 1 and "named" in actions:
            actions.remove("named")
        seqs = [s for s in (known.seq, entry.seq) if s is not None]
        merged[target] = FileEntry(path=target, actions=tuple(actions), seq=max(seqs, default=None))
    return tuple(sorted(merged.values(), key=lambda e: -1 if e.seq is None else e.seq))


# -- the text -------------------------------------------------------------------------------
