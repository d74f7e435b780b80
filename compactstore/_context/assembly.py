"""Assembling the active context from what is stored: the pinned messages, the
live boundary's summary, and the kept part with each message's live edit."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import NamedTuple

from compactstore._context.active import BoundaryInfo, ContextMessage, MessageState
from compactstore.db.context import LoggedMessage
from compactstore.formats import MessageFormat

__all__ = ["LiveEdit", "LoggedMessage", "StoredSummary", "assemble", "logged_message"]


class LiveEdit(NamedTuple):
    """The latest live replacement a compaction gave a message of the kept part."""

    payload: str
    tokens: int
    state: MessageState  # persisted or cleared
    edited_ids: frozenset[str]  # tool-use ids of its results edited so far


class StoredSummary(NamedTuple):
    """The live boundary: where it cuts, and the summary message standing for the rest."""

    boundary: BoundaryInfo
    payload: str
    tokens: int


def logged_message(fmt: MessageFormat, row: LoggedMessage, edit: LiveEdit | None) -> ContextMessage:
    """A message of the kept part, with its live edit applied."""
    state: MessageState
    if edit is not None:
        payload, tokens, state, edited = edit
    else:
        payload, tokens, edited = row.payload, row.tokens, frozenset[str]()
        state = (
            "pinned"
            if row.pinned is not None
            else "deduplicated"
            if row.dedup_of_seq is not None
            else "original"
        )
    return ContextMessage.build(
        fmt,
        json.loads(payload),
        payload=payload,
        tokens=tokens,
        seq=row.seq,
        state=state,
        created_at=row.created_at,
        edited_ids=edited,
        context_version=row.context_version,
    )


def assemble(
    fmt: MessageFormat,
    rows: Sequence[LoggedMessage],
    edits: dict[int, LiveEdit],
    summary: StoredSummary | None,
) -> tuple[tuple[ContextMessage, ...], tuple[ContextMessage, ...]]:
    """The context's (head, kept) from the latest live boundary.

    ``rows`` are the pinned messages and every message from the boundary's first kept seq
    on, in log order. The head is the pinned messages that precede the kept part, then the
    boundary's summary; the kept part is the messages from the first kept seq on, each with
    its live edit. Crash-orphaned calls are not answered here (see ActiveContext.answered).
    """
    first_kept = summary.boundary.first_kept_seq if summary is not None else 0
    head: list[ContextMessage] = []
    kept: list[ContextMessage] = []
    for row in rows:
        edit = edits.get(row.seq)
        if edit is not None and edit.state == "removed":
            continue  # pop_item took it out of the context (the log keeps it)
        if row.seq < first_kept:  # only pinned messages are read before the kept part
            head.append(logged_message(fmt, row, None))
        else:
            kept.append(logged_message(fmt, row, edit))
    if summary is not None:
        head.append(
            ContextMessage.build(
                fmt,
                json.loads(summary.payload),
                payload=summary.payload,
                tokens=summary.tokens,
                seq=None,
                state="summary",
            )
        )
    return tuple(head), tuple(kept)
