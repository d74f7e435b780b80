"""The values a context derives from its messages that an append extends instead of
computing again: each is ``of(scope, items)`` and ``advanced(scope, prev, added)`` with
``advanced(s, of(s, a), b) == of(s, a + b)`` (a property test checks every one in
:data:`REGISTRY`).

A context keeps the values it computed in its memo; :meth:`ActiveContext.extended` carries
each one over to the longer context through its ``advanced`` (one generic loop: a value added
here is carried without another line in the context). A value computed over the kept part
(``part="kept"``) indexes ``kept``; over the whole context (``"items"``), ``items``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Literal, NamedTuple, TypeVar

from compactstore._context.editable import OpenResults, open_media, open_results_of
from compactstore._context.pairs import advance_open_calls
from compactstore._context.thinking import ThinkingIndex, TurnState, sent_tokens

if TYPE_CHECKING:
    from compactstore._context.message import ContextMessage
    from compactstore.formats import MessageFormat

__all__ = [
    "CACHE_INDEX",
    "ITEMS",
    "NEWEST_ASSISTANT_AT",
    "OPEN_CALLS",
    "OPEN_MEDIA_BLOCKS",
    "OPEN_RESULTS",
    "REGISTRY",
    "SENT_TOKENS",
    "THINKING",
    "TURN",
    "CacheIndex",
    "Incremental",
    "OpenCalls",
    "Scope",
]

T = TypeVar("T")
Messages = Sequence["ContextMessage"]


class Scope(NamedTuple):
    """What a value may depend on besides the messages."""

    fmt: MessageFormat
    config: Any  # CompactionConfig


@dataclass(frozen=True, eq=False)
class Incremental(Generic[T]):
    """A value derived from a run of messages, extended message by message."""

    name: str
    part: Literal["items", "kept"]
    of: Callable[[Scope, Messages], T]
    advanced: Callable[[Scope, T, Messages], T]
    # Depends on the config: not carried over a config change (computed again).
    uses_config: bool = False


def _each(
    start: Callable[[], T], step: Callable[[Scope, T, Messages], T]
) -> Callable[[Scope, Messages], T]:
    """``of`` as ``advanced`` from the value of no messages."""
    return lambda scope, items: step(scope, start(), items)


ITEMS: Incremental[tuple[ContextMessage, ...]] = Incremental(
    "items", "items", lambda _, items: tuple(items), lambda _, prev, added: prev + tuple(added)
)

SENT_TOKENS: Incremental[int] = Incremental(
    "message_tokens_sum",
    "items",
    lambda scope, items: sent_tokens(scope.fmt, scope.config, items),
    lambda scope, prev, added: prev + sent_tokens(scope.fmt, scope.config, added),
    uses_config=True,
)

THINKING: Incremental[ThinkingIndex] = Incremental(
    "thinking_index",
    "items",
    _each(lambda: ThinkingIndex((), (), 0), lambda _, prev, added: prev.advanced(added)),
    lambda _, prev, added: prev.advanced(added),
)

TURN: Incremental[TurnState] = Incremental(
    "turn",
    "items",
    _each(lambda: TurnState(None, -1, -1, 0), lambda _, prev, added: prev.advanced(added)),
    lambda _, prev, added: prev.advanced(added),
)


class OpenCalls(NamedTuple):
    """Calls of a run of ``size`` messages no message of it answers: tool-use id -> the
    indexes of the messages that made them (:func:`compactstore._context.pairs.match_pairs`)."""

    size: int
    open: dict[str, tuple[int, ...]]

    def advanced(self, added: Messages) -> OpenCalls:
        calls = advance_open_calls(dict(self.open), enumerate(added, start=self.size))
        return OpenCalls(self.size + len(added), calls)


OPEN_CALLS: Incremental[OpenCalls] = Incremental(
    "unanswered",
    "kept",
    _each(lambda: OpenCalls(0, {}), lambda _, prev, added: prev.advanced(added)),
    lambda _, prev, added: prev.advanced(added),
)


def _newest_assistant_at(items: Messages) -> float | None:
    return max(
        (
            item.created_at
            for item in items
            if item.kind == "assistant" and item.created_at is not None
        ),
        default=None,
    )


def _later(prev: float | None, added: Messages) -> float | None:
    newest = _newest_assistant_at(added)
    return newest if prev is None or (newest is not None and newest > prev) else prev


NEWEST_ASSISTANT_AT: Incremental[float | None] = Incremental(
    "newest_assistant_at",
    "kept",
    lambda _, items: _newest_assistant_at(items),
    lambda _, prev, added: _later(prev, added),
)

OPEN_RESULTS: Incremental[OpenResults] = Incremental(
    "open_results",
    "kept",
    lambda _, items: open_results_of(items),
    lambda _, prev, added: prev.merged(open_results_of(added)),
)


def _media_blocks(items: Messages) -> int:
    return sum(found.blocks for found in open_media(items))


OPEN_MEDIA_BLOCKS: Incremental[int] = Incremental(
    "open_media_blocks",
    "kept",
    lambda _, items: _media_blocks(items),
    lambda _, prev, added: prev + _media_blocks(added),
)


class CacheIndex(NamedTuple):
    """What the cache breakpoints of a request are chosen from (see
    ``compactstore.formats.request``), over a run of ``size`` messages: the indexes of the
    system messages, of the last non-system message of the leading pinned run (while
    ``pinned_run`` every message so far is pinned), of the summaries, of the newest
    assistant message and of each tool result's message (once per result), and the running
    token total (``cumulative[i]``: messages 0..i, negative estimates counted as 0)."""

    size: int
    system: tuple[int, ...]
    pinned_run: bool
    last_pinned: int | None
    summaries: tuple[int, ...]
    last_assistant: int | None
    results: tuple[int, ...]
    cumulative: tuple[int, ...]

    def advanced(self, added: Messages) -> CacheIndex:
        size, pinned_run, last_pinned, last_assistant = (
            self.size,
            self.pinned_run,
            self.last_pinned,
            self.last_assistant,
        )
        system: list[int] = []
        summaries: list[int] = []
        results: list[int] = []
        cumulative: list[int] = []
        total = self.cumulative[-1] if self.cumulative else 0
        for index, item in enumerate(added, start=size):
            is_system = item.message.get("role") == "system"
            if is_system:
                system.append(index)
            if pinned_run and item.state != "pinned":
                pinned_run = False
            elif pinned_run and not is_system:
                last_pinned = index
            if item.state == "summary":
                summaries.append(index)
            if item.kind == "assistant":
                last_assistant = index
            results.extend(index for _ in item.results)
            total += max(0, item.tokens)
            cumulative.append(total)
        return CacheIndex(
            size + len(added),
            self.system + tuple(system),
            pinned_run,
            last_pinned,
            self.summaries + tuple(summaries),
            last_assistant,
            self.results + tuple(results),
            self.cumulative + tuple(cumulative),
        )


CACHE_INDEX: Incremental[CacheIndex] = Incremental(
    "cache_index",
    "items",
    _each(
        lambda: CacheIndex(0, (), True, None, (), None, (), ()),
        lambda _, prev, added: prev.advanced(added),
    ),
    lambda _, prev, added: prev.advanced(added),
)

REGISTRY: tuple[Incremental[Any], ...] = (
    ITEMS,
    SENT_TOKENS,
    THINKING,
    TURN,
    OPEN_CALLS,
    NEWEST_ASSISTANT_AT,
    OPEN_RESULTS,
    OPEN_MEDIA_BLOCKS,
    CACHE_INDEX,
)
