"""The converted form of a transcript, and the builder every importer fills.

An importer walks its file and adds messages (and the agent's own compactions, as
boundaries) to a :class:`TranscriptBuilder`, which checks them the way the store will and
hands them on as :data:`Item` s; :func:`collect` makes a whole :class:`Transcript` of them.
"""

from __future__ import annotations

import warnings
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from compactstore._context.media_checks import note_bad_media
from compactstore._core.checks import MAX_TIMESTAMP
from compactstore._core.pairing import Conversation
from compactstore._ledger import CallUsage
from compactstore.errors import CompactStoreWarning, InvalidInputError, InvalidMessageError
from compactstore.formats import get_format
from compactstore.formats.block_types import NO_EXTENSION, BlockTypeExtension, note_unlisted
from compactstore.models import ImportedBoundary, ImportedMessage

__all__ = [
    "BoundaryEntry",
    "Entry",
    "Item",
    "NoMessagesError",
    "Transcript",
    "TranscriptBuilder",
    "collect",
    "parse_timestamp",
    "to_imported",
]


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
            raise NoMessagesError(f"{self.name} holds no conversation messages to import")
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


class NoMessagesError(InvalidInputError):
    """A transcript in which the importer found no conversation message."""


def to_imported(name: str, item: Item) -> ImportedMessage | ImportedBoundary:
    """What the store imports for one converted item, naming its place in the file."""
    if isinstance(item, BoundaryEntry):
        return item.boundary
    return ImportedMessage(
        item.message, item.timestamp, item.usage, f"{name} {item.where}", item.ledger
    )
