"""How the tool calls and results of a run of context messages pair:
keyed by (id, call seq), in one pass; where a context may be cut without parting a pair;
what an API that pairs them would refuse."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from compactstore._context.message import ContextMessage

__all__ = [
    "Pairs",
    "advance_open_calls",
    "legal_cuts",
    "match_pairs",
    "newest_turn",
    "pairing_problems",
]


def newest_turn(kept: Sequence[ContextMessage]) -> int:
    """Index where the newest turn starts (-1 for none): the newest message that is not a
    tool result, or, where a turn is several assistant items (responses), the first of them.
    The calls of that turn may still be running."""
    index = next((i for i in range(len(kept) - 1, -1, -1) if kept[i].kind != "tool"), -1)
    while index > 0 and kept[index].joins_turn and kept[index - 1].joins_turn:
        index -= 1
    return index


class Pairs(NamedTuple):
    """How the results of a run of messages pair with its calls (see :func:`match_pairs`)."""

    # (index of a result's message, tool-use id) -> index of the message of the call it answers.
    answers: dict[tuple[int, str], int]
    # Calls no result answers: tool-use id -> indexes of the messages that made them.
    open: dict[str, tuple[int, ...]]
    # Results that answer no call (none is open with their id): (index, tool-use id).
    stray: list[tuple[int, str]]


def match_pairs(items: Sequence[ContextMessage]) -> Pairs:
    """Pair results with calls keyed by (id, call seq), as the store does on append: a
    result answers the newest unanswered call of its id before it (a
    message's results are read before its calls). One pass, O(n)."""
    answers: dict[tuple[int, str], int] = {}
    stray: list[tuple[int, str]] = []
    open_calls = advance_open_calls({}, enumerate(items), answers, stray)
    return Pairs(answers, open_calls, stray)


def advance_open_calls(
    open_calls: dict[str, tuple[int, ...]],
    items: Iterable[tuple[int, ContextMessage]],
    answers: dict[tuple[int, str], int] | None = None,
    stray: list[tuple[int, str]] | None = None,
) -> dict[str, tuple[int, ...]]:
    """``open_calls`` (changed in place, and returned) after the (index, message) pairs."""
    for index, item in items:
        for result in item.results:
            waiting = open_calls.get(result.tool_use_id)
            if waiting:
                if answers is not None:
                    answers[(index, result.tool_use_id)] = waiting[-1]
                if len(waiting) > 1:
                    open_calls[result.tool_use_id] = waiting[:-1]
                else:
                    del open_calls[result.tool_use_id]
            elif stray is not None:
                stray.append((index, result.tool_use_id))
        for call in item.calls:
            open_calls[call.id] = (*open_calls.get(call.id, ()), index)
    return open_calls


def pairing_problems(items: Sequence[ContextMessage]) -> list[str]:
    """Why these messages would be refused by an API that pairs tool calls with results.

    Every result must follow its call (the newest unanswered call of its id); every call
    must have a result, except those of the newest assistant turn while only tool results
    follow it (they may still be running). Empty when the context is valid.
    """
    problems: list[str] = []
    pairs = match_pairs(items)
    first_call: dict[str, int] = {}
    for index, item in enumerate(items):
        for call in item.calls:
            first_call.setdefault(call.id, index)
    for index, call_id in pairs.stray:
        if first_call.get(call_id, index) < index:
            problems.append(f"call {call_id!r} has two results")
        else:
            problems.append(f"result for {call_id!r} has no earlier call")
    newest = newest_turn(items)
    for call_id, indexes in pairs.open.items():
        late = [index for index in indexes if index < newest]
        problems.extend(f"call {call_id!r} (message {index}) has no result" for index in late)
    return problems


def legal_cuts(items: Sequence[ContextMessage]) -> list[bool]:
    """For each index i (0..len), whether starting a context at items[i] keeps pairs whole.

    A cut at i is legal when no tool call before i has its result at or after i (pairs
    keyed by (id, call seq): :func:`match_pairs`), and items[i - 1] is not glued to
    items[i]. Computed once in O(n) and shared by every stage that cuts.
    """
    # spans[i] counts the pairs open across the gap just before index i.
    delta = [0] * (len(items) + 2)
    for (index, _), start in match_pairs(items).answers.items():
        if start < index:
            delta[start + 1] += 1
            delta[index + 1] -= 1
    legal: list[bool] = []
    open_pairs = 0
    for index in range(len(items) + 1):
        open_pairs += delta[index]
        # A glued message (a reasoning item) is never cut from the one after it.
        legal.append(open_pairs == 0 and not (0 < index < len(items) and items[index - 1].glued))
    return legal
