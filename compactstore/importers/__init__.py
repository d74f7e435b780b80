"""Import agent transcripts written by other tools into a compactstore session.

These sources are understood, detected from the file's content:

- ``claude-code``: Claude Code transcript JSONL (session format ``anthropic``);
- ``codex``: Codex CLI rollout JSONL (session format ``openai``);
- ``swe-agent``: SWE-agent ``.traj`` trajectories (session format ``openai``);
- ``openhands``: OpenHands agent-sdk event streams, one event per line (``openai``);
- ``mini-swe-agent``: mini-swe-agent ``.traj.json`` trajectories (``openai``);
- ``copilot-cli``: GitHub Copilot CLI ``events.jsonl`` session logs (``openai``);
- ``jsonl``: plain JSONL, one message per line, in any session format.

Files are read line by line (plain or gzip, or standard input) and converted as they are
read; every message is checked as the store will check it (shape, tool-call pairing,
boundaries), so a malformed file fails naming its line. Nothing reaches the database until
the whole file has been read and checked.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import warnings
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from compactstore.core.checks import MAX_TIMESTAMP
from compactstore.core.pairing import Conversation
from compactstore.errors import (
    CompactStoreWarning,
    ConflictError,
    InvalidInputError,
    InvalidMessageError,
    NotFoundError,
)
from compactstore.formats import FORMAT_NAMES, get_format
from compactstore.formats.block_types import NO_EXTENSION, BlockTypeExtension, note_unlisted
from compactstore.importers.files import (
    Progress,
    Record,
    TranscriptFile,
    open_transcript,
    parse_json,
)
from compactstore.ledger import CallUsage
from compactstore.media_checks import note_bad_media
from compactstore.models import ImportedBoundary, ImportedMessage

if TYPE_CHECKING:
    from compactstore.store import CompactStore, Session

__all__ = [
    "SOURCES",
    "SOURCE_FORMATS",
    "BoundaryEntry",
    "Entry",
    "Item",
    "Progress",
    "Record",
    "Transcript",
    "TranscriptBuilder",
    "TranscriptFile",
    "collect",
    "convert",
    "detect",
    "import_file",
    "open_transcript",
    "parse_json",
    "parse_timestamp",
    "read_transcript",
]

SOURCES: tuple[str, ...] = (
    "claude-code",
    "codex",
    "swe-agent",
    "openhands",
    "mini-swe-agent",
    "copilot-cli",
    "jsonl",
)

# The session format each source produces; None: the file's messages decide (plain JSONL).
SOURCE_FORMATS: dict[str, str | None] = {
    "claude-code": "anthropic",
    "codex": "openai",
    "swe-agent": "openai",
    "openhands": "openai",
    "mini-swe-agent": "openai",
    "copilot-cli": "openai",
    "jsonl": None,
}

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
# OpenHands agent-sdk event classes, and Copilot CLI event namespaces (see their modules).
_OPENHANDS_KINDS = frozenset(
    {
        "SystemPromptEvent",
        "MessageEvent",
        "ActionEvent",
        "ObservationEvent",
        "UserRejectObservation",
        "AgentErrorEvent",
        "Condensation",
        "CondensationRequest",
        "CondensationSummaryEvent",
        "ConversationStateUpdateEvent",
        "PauseEvent",
    }
)
_COPILOT_PREFIXES = ("session.", "user.", "assistant.", "tool.", "system.", "hook.", "subagent.")
_CLAUDE_MARKERS = ("uuid", "parentUuid", "sessionId", "leafUuid", "messageId", "isSidechain")


@dataclass(frozen=True)
class Transcript:
    """A whole transcript, converted to one session format and ready to import.

    The per-message lists are as long as ``messages``.
    """

    source: str  # one of SOURCES
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
    # What the model call that produced this message was billed for, when reported.
    ledgers: list[CallUsage | None] = field(default_factory=list)
    # The agent's working directory, when the transcript records it (paths are relative
    # to it).
    cwd: str | None = None


@dataclass
class Entry:
    """One converted message with where it came from and what the importer learnt of it."""

    message: dict[str, Any]
    where: str  # its place in the file: "line 12", "history[3]"
    timestamp: float | None = None  # epoch seconds
    usage: int | None = None  # the provider's prompt size for the call that produced it
    read_path: str | None = None  # a tool result of a file read: the file
    write_paths: list[str] = field(default_factory=list)  # files its tool calls write
    ledger: CallUsage | None = None  # what the call that produced it was billed for


@dataclass(frozen=True)
class BoundaryEntry:
    """A compaction the agent did, cutting before message ``boundary.first_kept_index``."""

    boundary: ImportedBoundary
    where: str


# What a converter yields, in order: messages, and each boundary just before the message
# it cuts before (or after the last message).
Item = Entry | BoundaryEntry


class TranscriptBuilder:
    """Collects converted messages, checks them and hands them on in order, a few at a time.

    Importers add messages as they walk the file. A message stays in the builder while the
    importer may still change it (the blocks of one API response arrive on several lines,
    a boundary's summary comes after it): the importer says so by calling :meth:`release`
    with the first index it may still touch. Released messages are checked against the
    session format and for tool-call pairing the way the store will, so a problem is
    reported with the line it came from instead of a message index; :meth:`drain` hands
    them out. Memory therefore stays bounded by the longest run of held messages.
    """

    def __init__(
        self,
        name: str,
        source: str,
        format: str,
        extension: BlockTypeExtension = NO_EXTENSION,
    ) -> None:
        self.name = name
        self.source = source
        self.format = format
        self._extension = extension  # block types the target store accepts beyond the lists
        self._adapter = get_format(format)
        self._held: deque[Entry] = deque()  # messages from index self._base on
        self._base = 0
        self._boundaries: list[BoundaryEntry] = []  # not yet handed out
        self._outbox: list[Item] = []
        # Pairing, checked by the rules the store applies, as messages are handed out.
        self._conversation = Conversation(self._adapter)
        self._noted: set[str] = set()  # block types replaced by a note (warned once each)

    @property
    def count(self) -> int:
        """How many messages have been added."""
        return self._base + len(self._held)

    @property
    def released(self) -> int:
        """How many messages have been released (they can no longer change)."""
        return self._base

    def add(
        self,
        message: dict[str, Any],
        *,
        where: str,
        timestamp: float | None = None,
        usage: int | None = None,
        read_path: str | None = None,
        write_paths: list[str] | None = None,
        ledger: CallUsage | None = None,
    ) -> int:
        """Append a message; returns its index."""
        self._held.append(
            Entry(message, where, timestamp, usage, read_path, list(write_paths or []), ledger)
        )
        return self.count - 1

    def entry(self, index: int) -> Entry:
        """A message not yet released, to change it."""
        assert index >= self._base, f"message {index} was already released"
        return self._held[index - self._base]

    def held(self) -> deque[Entry]:
        """The messages not yet released, oldest first."""
        return self._held

    def insert_first(self, entry: Entry) -> None:
        """Put a message before all others (nothing may have been released yet)."""
        assert self._base == 0 and not self._outbox
        self._held.appendleft(entry)
        self._boundaries = [
            BoundaryEntry(
                item.boundary.model_copy(
                    update={"first_kept_index": item.boundary.first_kept_index + 1}
                ),
                item.where,
            )
            for item in self._boundaries
        ]

    def add_boundary(self, boundary: ImportedBoundary, *, where: str) -> None:
        """Record a compaction the agent did, cutting before the next message added.

        A second boundary with no message in between replaces the first: the later summary
        is the one the agent continued with.
        """
        if not boundary.first_kept_index > 0:
            raise self.error(where, "compaction boundary with no conversation before it")
        if (
            self._boundaries
            and self._boundaries[-1].boundary.first_kept_index == boundary.first_kept_index
        ):
            self._boundaries[-1] = BoundaryEntry(boundary, where)
            return
        self._boundaries.append(BoundaryEntry(boundary, where))

    def error(self, where: str, problem: str) -> InvalidInputError:
        """An error naming the file and the place in it."""
        return InvalidInputError(f"{self.name} {where}: {problem}")

    def release(self, upto: int | None = None) -> None:
        """Check and hand on the messages before index ``upto`` (None: all of them)."""
        end = self.count if upto is None else min(upto, self.count)
        while self._base < end:
            index = self._base
            while self._boundaries and self._boundaries[0].boundary.first_kept_index == index:
                self._conversation.cut()
                self._outbox.append(self._boundaries.pop(0))
            entry = self._held.popleft()
            self._check(entry)
            self._outbox.append(entry)
            self._base += 1

    def drain(self) -> list[Item]:
        """The checked items released since the last call, in order."""
        out, self._outbox = self._outbox, []
        return out

    def finish(self) -> list[Item]:
        """Release everything and check the transcript is whole; the last items."""
        if not self.count:
            raise _NoMessagesError(f"{self.name} holds no conversation messages to import")
        self.release()
        for item in self._boundaries:
            if item.boundary.first_kept_index > self.count:
                raise self.error(item.where, "compaction boundary after the end of the transcript")
            self._outbox.append(item)
        self._boundaries = []
        return self.drain()

    def note_media(self, where: str, message: dict[str, Any]) -> dict[str, Any]:
        """``message`` with each image or document the provider would refuse (base64 that
        does not decode, bytes that are not the declared type) replaced by a text note
        saying why; one warning per file. The rest of the transcript imports."""
        message, problems = note_bad_media(message)
        if problems and "<bad media>" not in self._noted:
            self._noted.add("<bad media>")
            warnings.warn(
                f"{self.name} {where}: an image or document the provider would refuse was "
                f"replaced by a text note ({problems[0]})",
                CompactStoreWarning,
                stacklevel=3,
            )
        return message

    def _check(self, entry: Entry) -> None:
        # A block its role may not carry becomes a short text note, once a
        # warning per type and file; then so does media the provider would refuse.
        entry.message, replaced = note_unlisted(self.format, entry.message, self._extension)
        for kind in replaced:
            if kind not in self._noted:
                self._noted.add(kind)
                warnings.warn(
                    f"{self.name} {entry.where}: {kind!r} blocks are not allowed in "
                    f"{self.format} messages of that role; replaced by a text note "
                    f"('[{kind} block left out]')",
                    CompactStoreWarning,
                    stacklevel=2,
                )
        entry.message = self.note_media(entry.where, entry.message)
        try:
            self._adapter.validate(entry.message)
        except InvalidMessageError as exc:
            raise self.error(entry.where, f"not a valid {self.format} message: {exc}") from None
        try:
            self._conversation.admit(entry.message)
        except InvalidMessageError as exc:
            raise self.error(entry.where, str(exc)) from None


def collect(source: str, format: str, items: Iterable[Item]) -> Transcript:
    """A whole :class:`Transcript` from a converter's items."""
    out = Transcript(source, format, [], [], [], [], [], [])
    for item in items:
        if isinstance(item, BoundaryEntry):
            out.boundaries.append(item.boundary)
            continue
        out.messages.append(item.message)
        out.timestamps.append(item.timestamp)
        out.usage.append(item.usage)
        out.read_paths.append(item.read_path)
        out.write_paths.append(item.write_paths)
        out.ledgers.append(item.ledger)
    return out


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
    if record.get("kind") in _OPENHANDS_KINDS and "source" in record:
        return "openhands"
    if (
        kind is not None
        and kind.startswith(_COPILOT_PREFIXES)
        and isinstance(record.get("data"), dict)
        and "parentId" in record
    ):
        return "copilot-cli"
    if "role" in record:
        return "jsonl"
    if kind is None and {"id", "timestamp", "instructions"} <= record.keys():
        return "codex"  # the session header of an old rollout
    return None


def _is_trajectory(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("history"), list)


def _trajectory_source(value: Any) -> str | None:
    """The source of a whole-document trajectory, or None."""
    from compactstore.importers.mini_swe_agent import is_trajectory

    if is_trajectory(value):
        return "mini-swe-agent"
    return "swe-agent" if _is_trajectory(value) else None


def _detect(file: TranscriptFile, *, plain: bool = False) -> str:
    """The file's source; ``plain``: the caller named a message format, so a file that is
    no other source is plain JSONL (its lines then say what is wrong with them)."""
    if file.suffix == ".traj":
        return "swe-agent"
    first = next((text for _, text, _ in file.lines() if text.strip()), "")
    try:
        head = json.loads(first)
    except RecursionError:
        raise InvalidInputError(f"{file.name}: JSON nested too deeply") from None
    except json.JSONDecodeError:
        head = None
        # Not JSONL: a pretty-printed JSON document may still be a trajectory.
        if first.lstrip().startswith("{"):
            try:
                whole = json.loads(file.text())
            except RecursionError:
                raise InvalidInputError(f"{file.name}: JSON nested too deeply") from None
            except ValueError:  # not JSON, or a number too long to read
                whole = None
            found = _trajectory_source(whole)
            if found is not None:
                return found
    except ValueError:
        head = None  # a number too long to read: reading the records names its line
    found = _trajectory_source(head)
    if found is not None:
        return found
    for number, record in file.records():
        if number > _DETECT_RECORDS * 4:
            break
        source = _classify(record)
        if source is not None:
            return source
    if plain:
        return "jsonl"
    raise InvalidInputError(
        f"cannot tell what kind of transcript {file.name} is: its records are none of Claude "
        f"Code, Codex rollout, SWE-agent, OpenHands, mini-swe-agent, Copilot CLI or plain "
        f"messages (with a 'role'); give the format"
    )


def detect(path: str | os.PathLike[str]) -> str:
    """The source of a transcript file, from its content: one of :data:`SOURCES`.

    Raises:
        InvalidInputError: unreadable, not UTF-8, empty, or not a known kind of transcript.
    """
    with open_transcript(path) as file:
        return _detect(file)


# -- reading and importing ----------------------------------------------------------------


def _resolve(format: str | None) -> tuple[str | None, str | None]:
    """(source, session format) named by a ``format`` argument: a source of
    :data:`SOURCES` or a message format (None: both detected)."""
    if format is None:
        return None, None
    if format in SOURCES:
        return format, None
    if format in FORMAT_NAMES:
        return None, format
    raise InvalidInputError(
        f"unknown import format {format!r} (expected a source: {', '.join(SOURCES)}; "
        f"or a message format: {', '.join(FORMAT_NAMES)})"
    )


def convert(
    file: TranscriptFile,
    format: str | None = None,
    progress: Progress | None = None,
    extension: BlockTypeExtension = NO_EXTENSION,
) -> tuple[str, str, Iterator[Item]]:
    """Start converting a transcript: (its source, its session format, the items).

    The items are produced as the file is read and checked (see :class:`TranscriptBuilder`);
    an error names the file's line. ``format`` as in :func:`read_transcript`; ``extension``:
    the block types the target store accepts beyond the format's lists (``allow_block_types``).
    """
    source, session_format = _resolve(format)
    found = source or _detect(file, plain=session_format is not None)
    produces = SOURCE_FORMATS[found]
    if session_format is not None and produces is not None and session_format != produces:
        raise InvalidInputError(
            f"{file.name} is a {found} transcript, which imports as format {produces!r}, "
            f"not {session_format!r}"
        )
    fmt, items = _converter(file, found, session_format, progress, extension)
    if source is not None:  # told, not detected: it may be the wrong one
        items = _told_the_wrong_source(file, source, items)
    return found, fmt, items


def _converter(
    file: TranscriptFile,
    found: str,
    session_format: str | None,
    progress: Progress | None,
    extension: BlockTypeExtension,
) -> tuple[str, Iterator[Item]]:
    """The session format and the items of a transcript of source ``found``."""
    if found == "claude-code":
        from compactstore.importers import claude_code

        return "anthropic", claude_code.convert(file, progress, extension)
    if found == "codex":
        from compactstore.importers import codex

        return "openai", codex.convert(file, progress, extension)
    if found == "swe-agent":
        from compactstore.importers import swe_agent

        return "openai", swe_agent.convert(file, progress, extension)
    if found == "openhands":
        from compactstore.importers import openhands

        return "openai", openhands.convert(file, progress, extension)
    if found == "mini-swe-agent":
        from compactstore.importers import mini_swe_agent

        return "openai", mini_swe_agent.convert(file, progress, extension)
    if found == "copilot-cli":
        from compactstore.importers import copilot

        return "openai", copilot.convert(file, progress, extension)
    from compactstore.importers import jsonl

    fmt = session_format or jsonl.detect_format(file)
    return fmt, jsonl.convert(file, fmt, progress, extension)


class _NoMessagesError(InvalidInputError):
    """A transcript in which the importer found no conversation message."""


def _told_the_wrong_source(
    file: TranscriptFile, told: str, items: Iterator[Item]
) -> Iterator[Item]:
    """``items``; when they are none at all, say which source the file looks like instead
    of the one it was given as (a Claude Code file read as codex has no codex records)."""
    try:
        yield from items
    except _NoMessagesError:
        try:
            looks = _detect(file)
        except InvalidInputError:
            raise _NoMessagesError(
                f"{file.name} holds no {told} messages to import, and it looks like no "
                f"known transcript"
            ) from None
        if looks == told:
            raise
        raise _NoMessagesError(
            f"{file.name} holds no {told} messages to import: it looks like "
            f"{_LOOKS_LIKE.get(looks, looks)}; import it as format {looks!r} (or leave the "
            f"format out to detect it)"
        ) from None


# How an error names each source (see _told_the_wrong_source).
_LOOKS_LIKE = {
    "claude-code": "a Claude Code transcript",
    "codex": "a Codex rollout",
    "swe-agent": "a SWE-agent trajectory",
    "openhands": "an OpenHands event stream",
    "mini-swe-agent": "a mini-swe-agent trajectory",
    "copilot-cli": "a GitHub Copilot CLI event log",
    "jsonl": "plain JSONL of messages",
}


def _warn_cut(file: TranscriptFile) -> None:
    if file.cut_line is not None:
        warnings.warn(
            f"{file.name} line {file.cut_line} is cut short (the file may still be being "
            f"written); the lines before it were read, that line was left out",
            CompactStoreWarning,
            stacklevel=3,
        )


def read_transcript(
    path: str | os.PathLike[str] | IO[bytes],
    *,
    format: str | None = None,
    progress: Progress | None = None,
    strict: bool = False,
) -> Transcript:
    """Read and convert a whole transcript, checking it fully; stores nothing.

    Args:
        path: the transcript file (plain or gzip), or a binary stream such as stdin.
        format: a source of :data:`SOURCES`, or the message format of plain JSONL (for
            the other sources it must be the one they produce); detected when None.
        progress: called as ``progress(lines read, lines in the file)``.
        strict: refuse a cut last line instead of leaving it out with a warning.

    Raises:
        InvalidInputError: the file is malformed; the message names the line.

    Warns:
        CompactStoreWarning: the last line was cut short and left out.
    """
    with open_transcript(path, strict=strict) as file:
        source, fmt, items = convert(file, format, progress)
        transcript = dataclasses.replace(collect(source, fmt, items), cwd=file.cwd)
        _warn_cut(file)
    return transcript


def import_file(
    store: CompactStore,
    path: str | os.PathLike[str] | IO[bytes],
    *,
    session_id: str | None = None,
    format: str | None = None,
    context_window: int | None = None,
    progress: Progress | None = None,
    strict: bool = False,
) -> Session:
    """Import a transcript as a new session: all of it or nothing.

    Args:
        path: the transcript file (plain or gzip), or a binary stream such as stdin.
        session_id: the new session's id; default: the file's name without its suffix
            (it must be given for a stream).
        format: as in :func:`read_transcript`.
        context_window: the new session's window (default: the store's default).
        progress: called as ``progress(lines read, lines in the file)``.
        strict: refuse a cut last line instead of leaving it out with a warning.

    Raises:
        InvalidInputError: the file is malformed (nothing is stored).
        ConflictError: the session already exists.

    Warns:
        CompactStoreWarning: the last line was cut short and left out.
    """
    _resolve(format)
    if session_id is None and not isinstance(path, str | os.PathLike):
        raise InvalidInputError("give the session id of a transcript read from a stream")
    with open_transcript(path, strict=strict) as file:
        sid = session_id if session_id is not None else file.stem
        with contextlib.suppress(NotFoundError):  # (checked again when copying)
            store.get_session(sid)
            raise ConflictError(f"session {sid!r} already exists; import into a new session id")
        source, fmt, items = convert(file, format, progress, store.allow_block_types)
        children = _children(file, path) if source == "claude-code" else []
        imported = (_imported(file.name, item) for item in items)
        # Staged in a temporary database (token counting happens there), then copied into
        # the store in one write transaction: the store is locked only for the copy.
        if not children:
            store.import_session(sid, imported, format=fmt, context_window=context_window)
        else:
            from compactstore.transfer import staging

            # The parent and its subagents' sessions are copied in the same transaction.
            with staging(store) as stage:
                stage.import_session(sid, imported, format=fmt, context_window=context_window)
                agents = {child.agent for child in children}
                for child in children:
                    # A subagent's subagent is linked to that subagent's session.
                    parent = sid
                    if child.parent_agent is not None and child.parent_agent in agents:
                        parent = f"{sid}/{child.parent_agent}"
                    _import_child(stage, sid, parent, child, context_window)
        _warn_cut(file)
    if file.cwd is not None:  # what the summary's file paths are relative to
        return store.session(sid, cwd=file.cwd)
    return store.get_session(sid)


@dataclass(frozen=True)
class _Child:
    """A subagent of a Claude Code transcript to import as a session of its own."""

    agent: str  # its agentId: the child session is "<parent>/<agentId>"
    tool_use_id: str | None  # the parent's tool call that started it, when known
    file: TranscriptFile  # the file holding its records
    own_file: bool  # a file of its own (else: the parent's, its records picked by agentId)
    parent_agent: str | None = None  # a subagent's subagent: the agentId that started it


def _children(file: TranscriptFile, path: str | os.PathLike[str] | IO[bytes]) -> list[_Child]:
    """The subagents of a Claude Code transcript: those whose records the file holds, and
    those with a file of their own beside it (``<session>/subagents/agent-<agentId>.jsonl``,
    Claude Code's layout; the file wins over records of the same subagent). A
    ``agent-<agentId>.meta.json`` beside the file names the spawning call (``toolUseId``)
    and, for a subagent's subagent, the agent that started it (``parentAgentId``). Claude
    Code's own compaction calls (``agent-acompact-*``) are not subagents."""
    from compactstore.importers import claude_code

    found = claude_code.subagents(file)
    children = {
        agent: _Child(agent, found.calls.get(agent), file, own_file=False) for agent in found.inline
    }
    if isinstance(path, str | os.PathLike):
        folder = Path(path).parent / file.stem / "subagents"
        if folder.is_dir():
            for own in sorted(folder.iterdir()):
                name = own.name.removesuffix(".gz")
                if not (name.startswith("agent-") and name.endswith(".jsonl")):
                    continue
                agent = name.removeprefix("agent-").removesuffix(".jsonl")
                if agent.startswith("acompact") or not own.is_file():
                    continue
                call, parent_agent = _subagent_meta(folder / f"agent-{agent}.meta.json")
                child_file = TranscriptFile(own, strict=file.strict)
                children[agent] = _Child(
                    agent,
                    call or found.calls.get(agent),
                    child_file,
                    own_file=True,
                    parent_agent=parent_agent,
                )
    return list(children.values())


def _subagent_meta(path: Path) -> tuple[str | None, str | None]:
    """(the spawning tool call, the parent agent) a subagent's ``.meta.json`` names; None
    for what it does not say (or when there is no such file, or it is not JSON)."""
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None, None
    if not isinstance(meta, dict):
        return None, None
    call, parent = meta.get("toolUseId"), meta.get("parentAgentId")
    return (
        call if isinstance(call, str) and call else None,
        parent if isinstance(parent, str) and parent else None,
    )


def _import_child(
    stage: CompactStore, session: str, parent: str, child: _Child, context_window: int | None
) -> None:
    """Import one subagent into the staging store as ``<session>/<agentId>``, linked to
    ``parent`` and the tool call that started it; a subagent with no conversation to import
    is left out."""
    from compactstore.db import repository as repo
    from compactstore.importers import claude_code

    sid = f"{session}/{child.agent}"
    agent = None if child.own_file else child.agent
    items = claude_code.convert(child.file, None, stage.allow_block_types, agent=agent)
    try:
        stage.import_session(
            sid,
            (_imported(child.file.name, item) for item in items),
            format="anthropic",
            context_window=context_window,
        )
    except _NoMessagesError:
        return
    stage.write(lambda connection: repo.link_subagent(connection, sid, parent, child.tool_use_id))


def _imported(name: str, item: Item) -> ImportedMessage | ImportedBoundary:
    if isinstance(item, BoundaryEntry):
        return item.boundary
    return ImportedMessage(
        item.message, item.timestamp, item.usage, f"{name} {item.where}", item.ledger
    )
