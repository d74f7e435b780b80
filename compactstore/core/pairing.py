"""The pairing and pin rules messages obey as they join a conversation (SPEC §4, §5).

One pure implementation used by every way messages come in: ``Session.append``/``extend``
(with what the database already holds as the starting state) and the importers (which check
a whole transcript before anything is stored, starting empty). Nothing here reads a
database: the caller passes what it knows and gets back what to store, or an
:class:`InvalidMessageError` whose text the caller prefixes with where the message came from.

Pairing: a tool result answers exactly one earlier call, matched by id; a call id is used
once; a result must come before the conversation moves on past its call (a later user,
assistant or system message means the call was abandoned and is answered as interrupted);
a call cut away by a compaction can no longer be answered.

Pins, decided at insert and never changed: the leading system messages (``"system"``), the
first user message written by a person and the first one that is not client boilerplate
(``"request"``), and messages appended with ``pinned=True`` (``"user"``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from compactstore.boilerplate import is_boilerplate
from compactstore.errors import InvalidMessageError
from compactstore.formats import MessageFormat, ToolCall
from compactstore.formats.base import Kind

__all__ = ["Admitted", "Conversation", "Pin", "PinRules", "StoredCall"]

# Why a message stays in the active context whatever is compacted (the messages.pinned column).
Pin = Literal["system", "request", "user"]


@dataclass(frozen=True, slots=True)
class StoredCall:
    """A tool call already in the session's log."""

    call_seq: int
    answered: bool


@dataclass
class PinRules:
    """Which messages are pinned, from the state the conversation so far leaves.

    Args:
        leading_system: no message but system ones came yet (a system message now is pinned).
        request_seq: seq of the first user message, None while there is none.
        real_request_seq: seq of the first user message that is not client boilerplate
            (SPEC §9.0), None while there is none.
        boilerplate_patterns: what client boilerplate looks like
            (``CompactionConfig.boilerplate_patterns``).
    """

    leading_system: bool = True
    request_seq: int | None = None
    real_request_seq: int | None = None
    boilerplate_patterns: tuple[str, ...] = ()

    def pin(
        self, adapter: MessageFormat, message: dict[str, Any], kind: Kind, seq: int, pinned: bool
    ) -> Pin | None:
        """The pin of the message at ``seq`` (None: not pinned), updating the state."""
        if kind == "system" and self.leading_system:
            return "system"
        self.leading_system = False
        pin: Pin | None = None
        # The first user message and the first that is not client boilerplate: decided
        # here, once.
        if adapter.is_request(message):
            if self.request_seq is None:
                pin, self.request_seq = "request", seq
            if self.real_request_seq is None and not is_boilerplate(
                adapter.text(message), self.boilerplate_patterns
            ):
                pin, self.real_request_seq = "request", seq
        if pin is None and pinned:
            pin = "user"
        return pin


@dataclass(frozen=True, slots=True)
class Admitted:
    """A message that passed the rules: its seq, kind, pin, and the pairs it opens or closes."""

    seq: int
    kind: Kind
    pin: Pin | None
    calls: tuple[ToolCall, ...]
    answers: tuple[str, ...]  # tool-use ids of the calls its results answer


@dataclass
class Conversation:
    """A conversation's pairing and pin state, advanced one message at a time.

    Args:
        adapter: the session's message format.
        next_seq: seq the next message gets.
        stored: calls already in the log that the new messages mention, by tool-use id.
        last_turn_seq: seq where the newest turn starts (-1: none): the newest message that
            is not a tool result, or the first of the assistant items ending there when the
            format groups them (responses).
        in_turn: the newest message is an assistant item the next one may continue.
        first_kept_seq: calls before this seq were compacted away.
        session_id: named in errors when given.
    """

    adapter: MessageFormat
    next_seq: int = 0
    stored: Mapping[str, StoredCall] = field(default_factory=dict)
    last_turn_seq: int = -1
    in_turn: bool = False
    first_kept_seq: int = 0
    pins: PinRules = field(default_factory=PinRules)
    session_id: str | None = None
    _calls: dict[str, int] = field(default_factory=dict)  # calls seen here, by id -> seq
    _answered: set[str] = field(default_factory=set)

    def cut(self) -> None:
        """A compaction before the next message: every call so far is compacted away."""
        self.first_kept_seq = self.next_seq

    def admit(self, message: dict[str, Any], *, pinned: bool = False) -> Admitted:
        """Check one message against the conversation so far and take it in.

        Raises:
            InvalidMessageError: a result without its call, a second result, a result after
                the conversation moved on or after its call was compacted, a repeated call id.
        """
        adapter, seq = self.adapter, self.next_seq
        answers: list[str] = []
        for result in adapter.tool_results(message):
            self._check_answer(result.tool_use_id)
            answers.append(result.tool_use_id)
            self._answered.add(result.tool_use_id)
        calls = tuple(adapter.tool_calls(message))
        for call in calls:
            if call.id in self.stored or call.id in self._calls:
                raise InvalidMessageError(f"duplicate tool call id {call.id!r}{self._in_session}")
            self._calls[call.id] = seq
        kind = adapter.kind(message)
        if kind != "tool":
            joins = adapter.groups_turns and kind == "assistant"
            if not (joins and self.in_turn):
                self.last_turn_seq = seq
            self.in_turn = joins
        else:
            self.in_turn = False
        pin = self.pins.pin(adapter, message, kind, seq, pinned)
        self.next_seq += 1
        return Admitted(seq, kind, pin, calls, tuple(answers))

    @property
    def _in_session(self) -> str:
        return "" if self.session_id is None else f" in session {self.session_id!r}"

    def _check_answer(self, call_id: str) -> None:
        """Whether a result may answer the call ``call_id`` now."""
        known = self.stored.get(call_id)
        if call_id in self._answered or (known is not None and known.answered):
            raise InvalidMessageError(f"tool call {call_id!r} already has a result")
        if known is None and call_id not in self._calls:
            if self.session_id is None:
                raise InvalidMessageError(
                    f"tool result for {call_id!r}, but no earlier tool call has that id"
                )
            raise InvalidMessageError(
                f"tool result for {call_id!r}, but no tool call with that id was made "
                f"in session {self.session_id!r}"
            )
        call_seq = known.call_seq if known is not None else self._calls[call_id]
        if self.last_turn_seq > call_seq:
            raise InvalidMessageError(
                f"tool result for {call_id!r} arrives after the conversation moved on past "
                f"its call (seq {call_seq}); the call was already answered as interrupted, "
                f"so this result can no longer be paired"
            )
        if call_seq < self.first_kept_seq:
            raise InvalidMessageError(
                f"tool call {call_id!r} (seq {call_seq}) was compacted out of the active "
                f"context; its result can no longer be paired with it"
            )
