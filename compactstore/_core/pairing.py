"""The pairing and pin rules messages obey as they join a conversation.

One pure implementation used by every way messages come in: ``Session.append``/``extend``
(with what the database already holds as the starting state) and the importers (which check
a whole transcript before anything is stored, starting empty). Nothing here reads a
database: the caller passes what it knows and gets back what to store, or an
:class:`InvalidMessageError` whose text the caller prefixes with where the message came from.

Pairing: calls are keyed by (id, call seq). A tool result answers exactly one
earlier call: the newest call with its id, which must still be unanswered. A result must
come before the conversation moves on past its call (a later user, assistant or system
message means the call was abandoned and is answered as interrupted); a call cut away by a
compaction can no longer be answered. In formats whose API allows it
(``MessageFormat.reuses_call_ids``: openai, responses) an id may be used again once its
earlier call is closed — answered, abandoned (answered as interrupted: a message other than
a tool result came after it), or compacted away; the others (anthropic, minicode) refuse a
repeated id.

Pins, decided at insert and never changed: the leading system messages (``"system"``), the
first user message written by a person and the first one that is not client boilerplate
(``"request"``), and messages appended with ``pinned=True`` (``"user"``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from compactstore._context.boilerplate import is_boilerplate
from compactstore.errors import InvalidMessageError
from compactstore.formats import MessageFormat, ToolCall
from compactstore.formats.base import Kind

__all__ = ["Admitted", "Conversation", "Pin", "PinRules", "StoredCall"]

# Why a message stays in the active context whatever is compacted (the messages.pinned column).
Pin = Literal["system", "request", "user"]


@dataclass(frozen=True, slots=True)
class StoredCall:
    """A tool call already in the session's log (the newest one of its id)."""

    call_seq: int
    answered: bool


@dataclass
class PinRules:
    """Which messages are pinned, from the state the conversation so far leaves.

    Args:
        leading_system: no message but system ones came yet (a system message now is pinned).
        request_seq: seq of the first user message, None while there is none.
        real_request_seq: seq of the first user message that is not client boilerplate, None
            while there is none.
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
                adapter.text_parts(message), self.boilerplate_patterns
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
    answers: tuple[tuple[str, int], ...]  # (tool-use id, call seq) of the calls it answers


@dataclass
class Conversation:
    """A conversation's pairing and pin state, advanced one message at a time.

    Args:
        adapter: the session's message format.
        next_seq: seq the next message gets.
        stored: calls already in the log that the new messages mention, by tool-use id
            (the newest call of each id).
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
    _calls: dict[str, int] = field(default_factory=dict)  # newest call seen here: id -> seq
    _answered: set[tuple[str, int]] = field(default_factory=set)  # (id, call seq) seen here

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
        answers: list[tuple[str, int]] = []
        for result in adapter.tool_results(message):
            key = (result.tool_use_id, self._check_answer(result.tool_use_id))
            answers.append(key)
            self._answered.add(key)
        calls = tuple(adapter.tool_calls(message))
        for call in calls:
            self._check_call(call.id)
        for call in calls:
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

    def _newest(self, call_id: str) -> tuple[int, bool] | None:
        """(seq, answered) of the newest call with this id so far (None: there is none)."""
        if call_id in self._calls:
            call_seq = self._calls[call_id]
            return call_seq, (call_id, call_seq) in self._answered
        known = self.stored.get(call_id)
        if known is None:
            return None
        return known.call_seq, known.answered or (call_id, known.call_seq) in self._answered

    def _check_call(self, call_id: str) -> None:
        """Whether a new call may use ``call_id``: in a format that allows it, once the
        earlier call of that id is closed — answered, abandoned (the conversation moved on
        past it before this message), or compacted away."""
        newest = self._newest(call_id)
        if newest is None:
            return
        call_seq, answered = newest
        if not self.adapter.reuses_call_ids:
            raise InvalidMessageError(
                f"duplicate tool call id {call_id!r}{self._in_session}: the call at seq "
                f"{call_seq} has it already, and format {self.adapter.name} refuses a "
                f"repeated tool call id"
            )
        closed = answered or self.last_turn_seq > call_seq or call_seq < self.first_kept_seq
        if not closed:
            raise InvalidMessageError(
                f"duplicate tool call id {call_id!r}{self._in_session}: the call at seq "
                f"{call_seq} with that id is still unanswered (an id may be used again once "
                f"its earlier call is answered)"
            )

    @property
    def _in_session(self) -> str:
        return "" if self.session_id is None else f" in session {self.session_id!r}"

    def _check_answer(self, call_id: str) -> int:
        """The seq of the call a result for ``call_id`` answers now (the newest call of that
        id, which must be open)."""
        newest = self._newest(call_id)
        if newest is None:
            if self.session_id is None:
                raise InvalidMessageError(
                    f"tool result for {call_id!r}, but no earlier tool call has that id"
                )
            raise InvalidMessageError(
                f"tool result for {call_id!r}, but no tool call with that id was made "
                f"in session {self.session_id!r}"
            )
        call_seq, answered = newest
        if answered:
            raise InvalidMessageError(
                f"tool call {call_id!r} already has a result (the call at seq {call_seq})"
            )
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
        return call_seq
