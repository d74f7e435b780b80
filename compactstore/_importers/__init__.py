"""Import agent transcripts written by other tools into a compactstore session.

These sources are understood, detected from the file's content:

- ``claude-code``: Claude Code transcript JSONL (session format ``anthropic``);
- ``codex``: Codex CLI rollout JSONL (session format ``openai``; ``responses`` when asked);
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
import os
import warnings
from collections.abc import Iterator
from typing import IO

from compactstore._importers import (
    claude_code,
    codex,
    codex_responses,
    copilot,
    jsonl,
    mini_swe_agent,
    openhands,
    swe_agent,
)
from compactstore._importers.builder import (
    BoundaryEntry,
    Entry,
    Item,
    NoMessagesError,
    Transcript,
    TranscriptBuilder,
    collect,
    parse_timestamp,
    to_imported,
)
from compactstore._importers.children import children, import_child
from compactstore._importers.detection import detect, detect_file, transcripts
from compactstore._importers.files import (
    Progress,
    Record,
    TranscriptFile,
    open_transcript,
    parse_json,
)
from compactstore._store.store import CompactStore, Session
from compactstore.errors import (
    CompactStoreWarning,
    ConflictError,
    InvalidInputError,
    NotFoundError,
)
from compactstore.formats import FORMAT_NAMES
from compactstore.formats.block_types import NO_EXTENSION, BlockTypeExtension
from compactstore.transfer import staging

__all__ = [
    "ALSO_IMPORTS_AS",
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
    "transcripts",
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

# The other session formats a source can import as, asked for with ``format``: a Codex
# rollout as Responses items (its reasoning and compaction items kept; see
# ``importers.codex_responses``). The default stays ``SOURCE_FORMATS``': Chat Completions
# messages lose only what only the provider can read (encrypted reasoning and compaction
# items), and sessions already imported from rollouts keep their format.
ALSO_IMPORTS_AS: dict[str, tuple[str, ...]] = {"codex": ("responses",)}


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
    found = source or detect_file(file, plain=session_format is not None)
    produces = SOURCE_FORMATS[found]
    also = ALSO_IMPORTS_AS.get(found, ())
    if session_format not in (None, produces, *also) and produces is not None:
        ways = " or ".join(repr(f) for f in (produces, *also))
        raise InvalidInputError(
            f"{file.name} is a {found} transcript, which imports as format {ways}, "
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
        return "anthropic", claude_code.convert(file, progress, extension)
    if found == "codex" and session_format == "responses":
        return "responses", codex_responses.convert(file, progress, extension)
    if found == "codex":
        return "openai", codex.convert(file, progress, extension)
    if found == "swe-agent":
        return "openai", swe_agent.convert(file, progress, extension)
    if found == "openhands":
        return "openai", openhands.convert(file, progress, extension)
    if found == "mini-swe-agent":
        return "openai", mini_swe_agent.convert(file, progress, extension)
    if found == "copilot-cli":
        return "openai", copilot.convert(file, progress, extension)
    fmt = session_format or jsonl.detect_format(file)
    return fmt, jsonl.convert(file, fmt, progress, extension)


def _told_the_wrong_source(
    file: TranscriptFile, told: str, items: Iterator[Item]
) -> Iterator[Item]:
    """``items``; when they are none at all, say which source the file looks like instead
    of the one it was given as (a Claude Code file read as codex has no codex records)."""
    try:
        yield from items
    except NoMessagesError:
        try:
            looks = detect_file(file)
        except InvalidInputError:
            raise NoMessagesError(
                f"{file.name} holds no {told} messages to import, and it looks like no "
                f"known transcript"
            ) from None
        if looks == told:
            raise
        raise NoMessagesError(
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
        found = children(file, path) if source == "claude-code" else []
        imported = (to_imported(file.name, item) for item in items)
        # Staged in a temporary database (token counting happens there), then copied into
        # the store in one write transaction: the store is locked only for the copy.
        if not found:
            store.import_session(sid, imported, format=fmt, context_window=context_window)
        else:
            # The parent and its subagents' sessions are copied in the same transaction.
            with staging(store) as stage:
                stage.import_session(sid, imported, format=fmt, context_window=context_window)
                agents = {child.agent for child in found}
                for child in found:
                    # A subagent's subagent is linked to that subagent's session.
                    parent = sid
                    if child.parent_agent is not None and child.parent_agent in agents:
                        parent = f"{sid}/{child.parent_agent}"
                    import_child(stage, sid, parent, child, context_window)
        _warn_cut(file)
    if file.cwd is not None:  # what the summary's file paths are relative to
        return store.session(sid, cwd=file.cwd)
    return store.get_session(sid)
