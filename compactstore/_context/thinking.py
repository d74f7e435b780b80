"""What a context knows of its thinking blocks, kept step by step: which
messages carry thinking and how many tokens, and where the newest assistant turn starts;
and the rule of which thinking the wire view sends (:func:`sent_ranges`)."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from compactstore.capabilities import EditPolicy

if TYPE_CHECKING:
    from compactstore._context.message import ContextMessage
    from compactstore.formats import MessageFormat

__all__ = [
    "ThinkingIndex",
    "TurnState",
    "cut_turns",
    "merged_ranges",
    "sent_ranges",
    "sent_tokens",
    "within",
]


class ThinkingIndex(NamedTuple):
    """The messages of a context that carry thinking: their indexes in ``items`` and the
    running total of their thinking tokens (``cum[k]``: the first k + 1 of them), over a
    run of ``size`` messages."""

    at: tuple[int, ...]
    cum: tuple[int, ...]
    size: int = 0

    def advanced(self, added: Sequence[ContextMessage]) -> ThinkingIndex:
        """This index with ``added`` after the messages it covers."""
        at, cum = list(self.at), list(self.cum)
        for index, item in enumerate(added, start=self.size):
            if item.thinking_tokens is not None:
                at.append(index)
                cum.append((cum[-1] if cum else 0) + item.thinking_tokens)
        return ThinkingIndex(tuple(at), tuple(cum), self.size + len(added))

    def between(self, start: int, end: int) -> int:
        """Thinking tokens of the messages at indexes start <= i < end."""
        first, last = bisect_left(self.at, start), bisect_left(self.at, end)
        if last <= first:
            return 0
        return self.cum[last - 1] - (self.cum[first - 1] if first else 0)


class TurnState(NamedTuple):
    """Where the newest assistant turn starts (the first assistant message after the last
    user or system message before the newest assistant message; None: no assistant
    message yet), and the indexes of the last user-or-system and assistant messages, over a
    run of ``size`` messages."""

    start: int | None
    last_user: int
    last_assistant: int
    size: int = 0

    @property
    def continuing(self) -> bool:
        """Only tool results follow the newest assistant message: a request continues it."""
        return self.last_assistant > self.last_user

    def advanced(self, added: Sequence[ContextMessage]) -> TurnState:
        """This state with ``added`` after the messages it covers."""
        start, last_user, last_assistant, size = self
        for index, item in enumerate(added, start=size):
            if item.kind == "assistant":
                if start is None or last_user > last_assistant:
                    start = index
                last_assistant = index
            elif item.kind != "tool":
                last_user = index
        return TurnState(start, last_user, last_assistant, size + len(added))


def within(index: int, ranges: Sequence[tuple[int, int]]) -> bool:
    return any(a <= index < b for a, b in ranges)


def merged_ranges(ranges: Iterable[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    merged: list[tuple[int, int]] = []
    for a, b in sorted(r for r in ranges if r[0] < r[1]):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(b, merged[-1][1]))
        else:
            merged.append((a, b))
    return tuple(merged)


def sent_ranges(
    items: Sequence[ContextMessage],
    changed: Sequence[int],
    turn: TurnState,
    *,
    preserved: bool,
    policy: EditPolicy,
    prefix_checks: bool,
) -> tuple[tuple[int, int], ...]:
    """Index ranges of ``items`` whose thinking the wire view sends, given the indexes of the
    messages with thinking whose prefix changed since each was made (``changed``, in order).

    With preserved thinking: all but each changed message and the rest of its turn -- a
    later turn, made after the change, keeps its thinking: the bytes sent stay, and the
    prompt cache stays warm. But under ``rewrite`` on a model without prefix checks (its API
    keeps no earlier turn's thinking in the prompt, so sending it saves no cache write,
    while the usage counts it and edits in place go on all session long): none from the
    first changed message on. Without preserved thinking: the newest turn's, none after the
    first change. Always, a turn the request continues keeps its thinking: the API refuses a
    tool-use continuation not starting with it.
    """
    n = len(items)
    start = n if turn.start is None else turn.start
    cutoff = changed[0] if changed else n
    if not preserved:
        sent = [(start, max(start, cutoff))]
    elif policy == "rewrite" and not prefix_checks:
        sent = [(0, cutoff)]
    else:
        sent, begin = [], 0
        for cut, end in cut_turns(items, changed):
            sent.append((begin, cut))
            begin = end
        sent.append((begin, n))
    if turn.continuing:
        sent.append((start, n))
    return merged_ranges(sent)


def cut_turns(items: Sequence[ContextMessage], changed: Sequence[int]) -> list[tuple[int, int]]:
    """(first, end) index spans of ``items`` whose thinking the per-turn rule leaves out: from
    each message of ``changed`` to the end of its turn (the next user or system message)."""
    spans: list[tuple[int, int]] = []
    end = 0
    for index in changed:
        if index < end:
            continue
        end = index + 1
        while end < len(items) and items[end].kind in ("assistant", "tool"):
            end += 1
        spans.append((index, end))
    return spans


def sent_tokens(fmt: MessageFormat, config: Any, items: Iterable[ContextMessage]) -> int:
    """The stored estimates of the messages the wire view sends: a responses reasoning item
    it leaves out costs nothing, as thinking left out costs nothing."""
    if not fmt.leaves_messages_out:
        return sum(item.tokens for item in items)
    return sum(item.tokens for item in items if fmt.sent(item.message, config))
