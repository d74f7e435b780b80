"""One message of the active context, with what engines need to know about it.

The lowest layer of the context model: the helpers that walk runs of messages (pairs,
thinking, what may still be edited) and the context itself build on it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from compactstore._context.frozen import freeze, thaw
from compactstore._context.tokens import estimate_tokens
from compactstore.formats import MessageFormat, ToolCall, ToolResult
from compactstore.formats.base import Kind, storage_json

__all__ = ["ContextMessage", "MessageState", "json_copy"]

MessageState = Literal[
    "original", "persisted", "cleared", "deduplicated", "summary", "pinned", "synthetic", "removed"
]


def json_copy(value: Any) -> Any:
    """A deep copy of a JSON value: new dicts and lists, the same immutable leaves.

    Equal to ``json.loads(json.dumps(value))`` for what a message holds, at a fraction of
    the cost: strings, the bulk of a message, are shared instead of decoded again. Read-only
    values (:mod:`compactstore._context.frozen`) come back as plain, mutable ones.
    """
    return thaw(value)


@dataclass(frozen=True, slots=True)
class ContextMessage:
    """One message of the active context, with what engines need to know about it."""

    seq: int | None  # None for the summary and synthetic results, which are not in the log
    # Parsed once and shared (cached), read-only (compactstore._context.frozen): callers get copies.
    message: dict[str, Any]
    payload: str  # the message as stored
    tokens: int
    kind: Kind
    state: MessageState
    calls: tuple[ToolCall, ...] = ()
    results: tuple[ToolResult, ...] = ()
    created_at: float | None = None
    # Tool-use ids of results in this message already persisted or cleared by a compaction.
    edited_ids: frozenset[str] = frozenset()
    # Belongs to the message after it (a responses reasoning item): never cut apart.
    glued: bool = False
    # An assistant item that continues the turn of the assistant item before it (responses).
    joins_turn: bool = False
    # An assistant message: the context version it answered; None
    # for other messages and for messages stored before versions were recorded.
    context_version: int | None = None
    # The estimate of its thinking blocks (counted only while the wire view sends them);
    # None when it carries none.
    thinking_tokens: int | None = None

    @property
    def pinned(self) -> bool:
        return self.state == "pinned"

    def copy_message(self) -> dict[str, Any]:
        """A fresh copy of the message, for a caller that may change it."""
        copy: dict[str, Any]
        try:
            copy = json_copy(self.message)
        except RecursionError:  # nested deeper than Python recursion goes; the C decoder copes
            copy = json.loads(self.payload)
        return copy

    @classmethod
    def build(
        cls,
        fmt: MessageFormat,
        message: dict[str, Any],
        *,
        tokens: int,
        seq: int | None,
        state: MessageState,
        payload: str | None = None,
        created_at: float | None = None,
        edited_ids: frozenset[str] = frozenset(),
        context_version: int | None = None,
    ) -> ContextMessage:
        kind = fmt.kind(message)
        thinking = fmt.thinking_text(message) if kind == "assistant" else None
        return cls(
            seq=seq,
            message=freeze(message),
            payload=storage_json(message) if payload is None else payload,
            tokens=tokens,
            kind=kind,
            state=state,
            calls=tuple(fmt.tool_calls(message)),
            results=tuple(fmt.tool_results(message)),
            created_at=created_at,
            edited_ids=edited_ids,
            glued=fmt.glued(message),
            joins_turn=fmt.groups_turns and kind == "assistant",
            context_version=context_version if kind == "assistant" else None,
            # The built-in estimate: the caller's token counter never runs on a read.
            thinking_tokens=None if thinking is None else estimate_tokens(thinking),
        )
