"""Import agent transcripts written by other tools into a compactstore session.

Four sources are understood, detected from the file's content:

- ``claude-code``: Claude Code transcript JSONL (session format ``anthropic``);
- ``codex``: Codex CLI rollout JSONL (session format ``openai``);
- ``swe-agent``: SWE-agent ``.traj`` trajectories (session format ``openai``);
- ``jsonl``: plain JSONL, one message per line, in any session format.

Every importer parses the whole file and checks the result (message shapes, tool-call
pairing, boundaries) before anything is written, so a malformed file fails with its line
number and leaves the database untouched; :meth:`CompactStore.import_session` then stores
the transcript in one transaction.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from compactstore.core.checks import MAX_TIMESTAMP
from compactstore.core.pairing import Conversation
from compactstore.errors import InvalidInputError, InvalidMessageError
from compactstore.formats import FORMAT_NAMES, get_format
from compactstore.models import ImportedBoundary

if TYPE_CHECKING:
    import os

    from compactstore.store import CompactStore, Session

__all__ = [
    "SOURCES",
    "SOURCE_FORMATS",
    "Progress",
    "Record",
    "Transcript",
    "TranscriptBuilder",
    "detect",
    "import_file",
    "load_text",
    "parse_json",
    "parse_timestamp",
    "read_records",
    "read_transcript",
]

SOURCES: tuple[str, ...] = ("claude-code", "codex", "swe-agent", "jsonl")

# The session format each source produces; None: the file's messages decide (plain JSONL).
SOURCE_FORMATS: dict[str, str | None] = {
    "claude-code": "anthropic",
    "codex": "openai",
    "swe-agent": "openai",
    "jsonl": None,
}

Progress = Callable[[int, int], None]

# One parsed JSONL line: (1-based line number, the object on it).
Record = tuple[int, dict[str, Any]]

# How many records detection looks at before giving up on a file.
_DETECT_RECORDS = 50

_CODEX_RECORD_TYPES = frozenset(
    {"session_meta", "response_item", "event_msg", "turn_context", "compacted"}
)
# Older Codex rollouts wrote response items as top-level records, without a payload wrapper.
_CODEX_ITEM_TYPES = frozenset(
    {
        "message",
        "function_call",
        "function_call_output",
        "custom_tool_call",
        "custom_tool_call_output",
        "local_shell_call",
        "local_shell_call_output",
        "reasoning",
        "web_search_call",
    }
)
_CLAUDE_RECORD_TYPES = frozenset(
    {
        "user",
        "assistant",
        "system",
        "summary",
        "progress",
        "file-history-snapshot",
        "queue-operation",
        "attachment",
    }
)
_CLAUDE_MARKERS = ("uuid", "parentUuid", "sessionId", "leafUuid", "messageId", "isSidechain")


@dataclass(frozen=True)
class Transcript:
    """A whole transcript, converted to one session format and ready to import.

    The per-message lists are as long as ``messages``.
    """

    source: str  # "claude-code" | "codex" | "swe-agent" | "jsonl"
    format: str  # session format: anthropic | openai | minicode
    messages: list[dict[str, Any]]
    timestamps: list[float | None]  # epoch seconds
    boundaries: list[ImportedBoundary]
    # The prompt size the provider reported for the model call that produced this
    # assistant message; None for other messages and when the transcript does not say.
    usage: list[int | None]
    # For a tool-result message of a file read: the file read; else None.
    read_paths: list[str | None]
    # Files written or edited by the tool calls of this (assistant) message.
    write_paths: list[list[str]]


@dataclass
class TranscriptBuilder:
    """Collects converted messages with their source location, then checks them all.

    Importers add messages as they walk the file; :meth:`finish` validates every message
    against the session format and checks tool-call pairing the way the store will, so a
    problem is reported with the line it came from instead of a message index.
    """

    name: str
    source: str
    format: str
    messages: list[dict[str, Any]] = field(default_factory=list)
    where: list[str] = field(default_factory=list)
    timestamps: list[float | None] = field(default_factory=list)
    usage: list[int | None] = field(default_factory=list)
    read_paths: list[str | None] = field(default_factory=list)
    write_paths: list[list[str]] = field(default_factory=list)
    boundaries: list[ImportedBoundary] = field(default_factory=list)
    boundary_where: list[str] = field(default_factory=list)

    def add(
        self,
        message: dict[str, Any],
        *,
        where: str,
        timestamp: float | None = None,
        usage: int | None = None,
        read_path: str | None = None,
        write_paths: list[str] | None = None,
    ) -> int:
        """Append a message; returns its index."""
        self.messages.append(message)
        self.where.append(where)
        self.timestamps.append(timestamp)
        self.usage.append(usage)
        self.read_paths.append(read_path)
        self.write_paths.append(list(write_paths or []))
        return len(self.messages) - 1

    def add_boundary(self, boundary: ImportedBoundary, *, where: str) -> None:
        """Record a compaction the agent did, cutting before the next message added.

        A second boundary with no message in between replaces the first: the later summary
        is the one the agent continued with.
        """
        if self.boundaries and self.boundaries[-1].first_kept_index == boundary.first_kept_index:
            self.boundaries[-1] = boundary
            self.boundary_where[-1] = where
            return
        self.boundaries.append(boundary)
        self.boundary_where.append(where)

    def error(self, where: str, problem: str) -> InvalidInputError:
        """An error naming the file and the place in it."""
        return InvalidInputError(f"{self.name} {where}: {problem}")

    def finish(self) -> Transcript:
        """Check the whole transcript as the store will, and freeze it."""
        if not self.messages:
            raise InvalidInputError(f"{self.name} holds no conversation messages to import")
        adapter = get_format(self.format)
        starts = {b.first_kept_index for b in self.boundaries}
        conversation = Conversation(adapter)
        for index, message in enumerate(self.messages):
            where = self.where[index]
            try:
                adapter.validate(message)
            except InvalidMessageError as exc:
                raise self.error(where, f"not a valid {self.format} message: {exc}") from None
            if index in starts:
                conversation.cut()
            try:
                conversation.admit(message)
            except InvalidMessageError as exc:
                raise self.error(where, str(exc)) from None
        for boundary, where in zip(self.boundaries, self.boundary_where, strict=True):
            if not 0 < boundary.first_kept_index <= len(self.messages):
                raise self.error(where, "compaction boundary with no conversation before it")
        return Transcript(
            source=self.source,
            format=self.format,
            messages=self.messages,
            timestamps=self.timestamps,
            boundaries=self.boundaries,
            usage=self.usage,
            read_paths=self.read_paths,
            write_paths=self.write_paths,
        )


# -- reading files ------------------------------------------------------------------------


def load_text(path: str | os.PathLike[str]) -> str:
    """The file's text, which must be UTF-8 and not empty."""
    file = Path(path)
    try:
        data = file.read_bytes()
    except OSError as exc:
        raise InvalidInputError(f"cannot read {file}: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInputError(
            f"{file.name} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})"
        ) from None
    text = text.removeprefix("\ufeff")  # a byte-order mark is not content
    if not text.strip():
        raise InvalidInputError(f"{file.name} is empty: there is nothing to import")
    return text


def parse_json(name: str, text: str, line: int | None = None) -> Any:
    """Parse one JSON value: a whole document, or line ``line`` of a JSONL file."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidInputError(
            f"{name} line {line or exc.lineno}: not valid JSON ({exc.msg} at column {exc.colno})"
        ) from None
    except RecursionError:
        where = f"{name} line {line}" if line is not None else name
        raise InvalidInputError(f"{where}: JSON nested too deeply") from None


def read_records(name: str, text: str, progress: Progress | None = None) -> list[Record]:
    """Parse JSONL text: every non-blank line must be one JSON object.

    ``progress(done, total)`` is called as lines are parsed (counting lines).
    """
    lines = text.splitlines()
    total = len(lines)
    step = max(1, total // 100)
    records: list[Record] = []
    for number, line in enumerate(lines, start=1):
        if line.strip():
            value = parse_json(name, line, number)
            if not isinstance(value, dict):
                raise InvalidInputError(
                    f"{name} line {number}: expected a JSON object, got {_json_kind(value)}"
                )
            records.append((number, value))
        if progress is not None and (number % step == 0 or number == total):
            progress(number, total)
    return records


def _json_kind(value: Any) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    return "null"


def parse_timestamp(value: Any) -> float | None:
    """Epoch seconds from an ISO-8601 string or a number (milliseconds when very large).

    A missing or unreadable timestamp is None: the store then uses the import time.
    """
    if isinstance(value, str) and value:
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            return None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)  # agents write UTC without saying so
        seconds = moment.timestamp()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        if not -1e300 < value < 1e300:  # also refuses NaN, and ints too big for a float
            return None
        seconds = value / 1000 if value > 1e11 else value  # very large: milliseconds
    else:
        return None
    return float(seconds) if 0 <= seconds <= MAX_TIMESTAMP else None


# -- detection ----------------------------------------------------------------------------


def _classify(record: dict[str, Any]) -> str | None:
    """The source a JSONL record belongs to, or None when it does not tell."""
    kind = record.get("type") if isinstance(record.get("type"), str) else None
    if kind in _CODEX_RECORD_TYPES and "payload" in record:
        return "codex"
    if "record_type" in record or (kind in _CODEX_ITEM_TYPES and "payload" not in record):
        return "codex"
    if kind in _CLAUDE_RECORD_TYPES and any(key in record for key in _CLAUDE_MARKERS):
        return "claude-code"
    if "role" in record:
        return "jsonl"
    if kind is None and {"id", "timestamp", "instructions"} <= record.keys():
        return "codex"  # the session header of an old rollout
    return None


def _is_trajectory(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("history"), list)


def _detect_text(name: str, text: str, suffix: str) -> str:
    if suffix == ".traj":
        return "swe-agent"
    first = next((line for line in text.splitlines() if line.strip()), "")
    try:
        head = json.loads(first)
    except RecursionError:
        raise InvalidInputError(f"{name}: JSON nested too deeply") from None
    except json.JSONDecodeError:
        # Not JSONL: a pretty-printed JSON document may still be a trajectory.
        try:
            whole = json.loads(text)
        except RecursionError:
            raise InvalidInputError(f"{name}: JSON nested too deeply") from None
        except json.JSONDecodeError:
            whole = None
        if _is_trajectory(whole):
            return "swe-agent"
        head = None
    if _is_trajectory(head):
        return "swe-agent"
    number = 0
    for number, line in enumerate(text.splitlines(), start=1):
        if number > _DETECT_RECORDS * 4:
            break
        if not line.strip():
            continue
        record = parse_json(name, line, number)
        if not isinstance(record, dict):
            raise InvalidInputError(
                f"{name} line {number}: expected a JSON object, got {_json_kind(record)}"
            )
        source = _classify(record)
        if source is not None:
            return source
    raise InvalidInputError(
        f"cannot tell what kind of transcript {name} is: its records are neither Claude Code, "
        f"Codex rollout, SWE-agent nor plain messages (with a 'role'); give the format"
    )


def detect(path: str | os.PathLike[str]) -> str:
    """The source of a transcript file, from its content: one of :data:`SOURCES`.

    Raises:
        InvalidInputError: unreadable, not UTF-8, empty, or not a known kind of transcript.
    """
    file = Path(path)
    return _detect_text(file.name, load_text(file), file.suffix.lower())


# -- reading and importing ----------------------------------------------------------------


def read_transcript(
    path: str | os.PathLike[str],
    *,
    format: str | None = None,
    source: str | None = None,
    progress: Progress | None = None,
) -> Transcript:
    """Read and convert a whole transcript file, checking it fully; stores nothing.

    Args:
        path: the transcript file.
        format: the session format of a plain JSONL file (detected when None); for the
            other sources it must match the format they produce.
        source: one of :data:`SOURCES` (detected from the content when None).
        progress: called as ``progress(done, total)`` while the file is read.

    Raises:
        InvalidInputError: the file is malformed; the message names the line.
    """
    if source is not None and source not in SOURCES:
        raise InvalidInputError(
            f"unknown transcript source {source!r} (expected one of: {', '.join(SOURCES)})"
        )
    if format is not None:
        get_format(format)  # raises, naming the valid formats
    file = Path(path)
    text = load_text(file)
    found = source or _detect_text(file.name, text, file.suffix.lower())
    produces = SOURCE_FORMATS[found]
    if format is not None and produces is not None and format != produces:
        raise InvalidInputError(
            f"{file.name} is a {found} transcript, which imports as format {produces!r}, "
            f"not {format!r}"
        )
    if found == "claude-code":
        from compactstore.importers.claude_code import convert as convert_claude_code

        return convert_claude_code(file.name, read_records(file.name, text, progress))
    if found == "codex":
        from compactstore.importers.codex import convert as convert_codex

        return convert_codex(file.name, read_records(file.name, text, progress))
    if found == "swe-agent":
        from compactstore.importers.swe_agent import convert as convert_swe_agent

        return convert_swe_agent(file.name, text, progress)
    from compactstore.importers.jsonl import convert as convert_jsonl

    return convert_jsonl(file.name, read_records(file.name, text, progress), format=format)


def import_file(
    store: CompactStore,
    path: str | os.PathLike[str],
    *,
    session_id: str | None = None,
    format: str | None = None,
    context_window: int | None = None,
    progress: Progress | None = None,
) -> Session:
    """Import a transcript file as a new session, in one transaction.

    ``format`` is a session format (for plain JSONL) or a source name from
    :data:`SOURCES`; both are detected from the content when it is None. The session id
    defaults to the file's stem.

    Raises:
        InvalidInputError: the file is malformed (nothing is stored).
        ConflictError: the session already exists.
    """
    source: str | None = None
    session_format: str | None = None
    if format in SOURCES:
        source = format
    elif format is not None and format not in FORMAT_NAMES:
        raise InvalidInputError(
            f"unknown import format {format!r} (expected a source: {', '.join(SOURCES)}; "
            f"or a message format: {', '.join(FORMAT_NAMES)})"
        )
    else:
        session_format = format
    file = Path(path)
    transcript = read_transcript(file, format=session_format, source=source, progress=progress)
    try:
        return store.import_session(
            session_id if session_id is not None else file.stem,
            transcript.messages,
            format=transcript.format,
            context_window=context_window,
            timestamps=transcript.timestamps,
            boundaries=transcript.boundaries,
            usage=transcript.usage,
        )
    except InvalidMessageError as exc:
        raise InvalidMessageError(f"{file.name}: {exc}") from None
