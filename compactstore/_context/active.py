"""The active context: what the model is sent, rebuilt from rows, as engines see it.

An engine receives an :class:`ActiveContext` and returns an outcome; it never sees the
database. The context is ``head`` (pinned messages before the kept part, then the
boundary's summary) followed by ``kept`` (messages from the boundary's first kept seq on,
with live edits applied and synthetic error results for crash-orphaned tool calls).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Generic, TypeVar, cast

from compactstore._context.editable import OpenResults
from compactstore._context.frozen import freeze, thaw
from compactstore._context.incremental import (
    ITEMS,
    NEWEST_ASSISTANT_AT,
    OPEN_CALLS,
    OPEN_MEDIA_BLOCKS,
    OPEN_RESULTS,
    SENT_TOKENS,
    THINKING,
    TURN,
    Incremental,
    Scope,
)
from compactstore._context.message import ContextMessage, MessageState, json_copy
from compactstore._context.pairs import match_pairs, newest_turn
from compactstore._context.thinking import (
    ThinkingIndex,
    TurnState,
    merged_ranges,
    sent_ranges,
    within,
)
from compactstore._context.tokens import TokenCounter, message_tokens
from compactstore.capabilities import EditPolicy
from compactstore.formats import MessageFormat, ToolCall
from compactstore.formats.base import storable_text
from compactstore.models import CompactionConfig, SummaryState

__all__ = [
    "PENDING_VERSION",
    "SYNTHETIC_RESULT_TEXT",
    "ActiveContext",
    "BoundaryInfo",
    "ContextMessage",
    "MessageState",
    "json_copy",
]

# The context version of a change an engine made and no write has recorded yet: newer than
# every version a message answered (see ActiveContext.changes; settled() replaces it).
PENDING_VERSION = 1 << 62

SYNTHETIC_RESULT_TEXT = (
    "[Tool call interrupted: no result was recorded for this call. "
    "The tool may or may not have run.]"
)

T = TypeVar("T")


class Derived(Generic[T]):
    """A value a context computes from all of it (not by appends: see
    :mod:`compactstore._context.incremental`), kept in its memo; typed for the readers."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


_LINEAGE: Derived[object] = Derived("lineage")
_WIRE: Derived[tuple[Mapping[str, Any], ...]] = Derived("wire")
_CHANGED: Derived[tuple[int, ...]] = Derived("changed_thinking")
_RANGES: Derived[tuple[tuple[int, int], ...]] = Derived("thinking_ranges")
_USAGE: Derived[int] = Derived("usage")


@dataclass(frozen=True, slots=True)
class BoundaryInfo:
    """The live boundary the context was rebuilt from."""

    id: int
    first_kept_seq: int
    summary_text: str
    summary_state: SummaryState = field(default_factory=SummaryState)


@dataclass(frozen=True)
class ActiveContext:
    """The active context of one session at one moment."""

    session_id: str
    fmt: MessageFormat
    context_window: int
    config: CompactionConfig
    count_tokens: TokenCounter
    head: tuple[ContextMessage, ...]
    kept: tuple[ContextMessage, ...]
    boundary: BoundaryInfo | None = None
    last_seq: int = -1
    usage_offset: int = 0
    token_factor: float | None = None
    # Seq of the user's real request (the first user message that is not client
    # boilerplate), pinned at insert; None until one was appended.
    real_request_seq: int | None = None
    # The agent's working directory, when the session was given one.
    cwd: str | None = None
    # Changes to the context other than appends that may be newer than what one of its
    # assistant messages answered: (the context version the change produced, the seq after
    # which every message's prefix changed: an edited seq, or the seq before a cut's first
    # removed one). An engine's own edits and cuts are PENDING_VERSION.
    changes: tuple[tuple[int, int], ...] = ()
    # The edit policy the session's compactions run under (resolved: see
    # compactstore.capabilities.resolve_policy) and whether its model checks thinking
    # prefixes: together they choose the thinking rule.
    edit_policy: EditPolicy = "rewrite"
    prefix_checks: bool = False

    # Derived values are computed once per context and kept in its memo (typed keys: the
    # registry's incremental values, which extended() carries over, and Derived ones): a
    # context never changes, and engines and the store ask for its usage several times.
    memo: dict[object, Any] = field(
        init=False, default_factory=dict, repr=False, compare=False, hash=False
    )

    def _derived(self, key: Derived[T], compute: Callable[[], T]) -> T:
        memo = self.memo
        if key in memo:
            return cast("T", memo[key])
        value = memo[key] = compute()
        return value

    def value(self, key: Incremental[T]) -> T:
        """An incremental value of this context (computed once, carried by appends)."""
        memo = self.memo
        if key in memo:
            return cast("T", memo[key])
        part = self.head + self.kept if key.part == "items" else self.kept
        value = memo[key] = key.of(self.scope, part)
        return value

    @property
    def scope(self) -> Scope:
        return Scope(self.fmt, self.config)

    @property
    def items(self) -> tuple[ContextMessage, ...]:
        return self.value(ITEMS)

    @property
    def lineage(self) -> object:
        """A token this context shares with the contexts :meth:`extended` made from it, and
        with no other: while two contexts have the same lineage, the longer one is the
        shorter with messages appended (any other change makes a new context by
        ``replace``, which starts a lineage of its own) — though with thinking, an append
        may also change which earlier messages' thinking the wire view sends."""
        return self._derived(_LINEAGE, object)

    @property
    def wire(self) -> tuple[Mapping[str, Any], ...]:
        """The messages to send to the model, in order: the context's own read-only
        messages, shared by every reader (what ``Session.context_view()`` returns), with
        the thinking blocks the context leaves out removed (see
        :attr:`thinking_cutoff`)."""
        return self._derived(_WIRE, self._built_wire)

    def _built_wire(self) -> tuple[Mapping[str, Any], ...]:
        ranges = self.thinking_ranges
        return tuple(
            item.message
            if item.thinking_tokens is None or within(index, ranges)
            else self.stripped(item)
            for index, item in enumerate(self.items)
        )

    def stripped(self, item: ContextMessage) -> Mapping[str, Any]:
        """``item``'s message without its thinking blocks (read-only)."""
        stripped: Mapping[str, Any] = freeze(self.fmt.without_thinking(item.message))
        return stripped

    # -- thinking ---------------------------------------------------------------

    @property
    def thinking_cutoff(self) -> int | None:
        """Index in ``items`` of the first message with thinking whose prefix changed since
        the context version it answered: a change (an edit, a cut, a rollback) newer than
        that version at a seq before it. None when no such message."""
        changed = self.changed_thinking
        return changed[0] if changed else None

    @property
    def changed_thinking(self) -> tuple[int, ...]:
        """Indexes in ``items`` of the messages with thinking whose prefix changed since the
        context version each answered, in order."""
        return self._derived(_CHANGED, self._changed_thinking)

    def _changed_thinking(self) -> tuple[int, ...]:
        changes = sorted(self.changes, reverse=True)  # newest first
        if not changes:
            return ()
        versions = [-version for version, _ in changes]  # ascending, for bisect
        lowest: list[int] = []  # lowest seq changed by the k newest changes
        for _, seq in changes:
            lowest.append(seq if not lowest else min(lowest[-1], seq))
        items, found = self.items, []
        for index in self._thinking_index.at:
            item = items[index]
            if item.seq is None:
                continue
            answered = -1 if item.context_version is None else item.context_version
            newer = bisect_left(versions, -answered)  # changes with a version > answered
            if newer and lowest[newer - 1] < item.seq:  # changed after a seq before it
                found.append(index)
        return tuple(found)

    @property
    def _thinking_index(self) -> ThinkingIndex:
        return self.value(THINKING)

    @property
    def _turn(self) -> TurnState:
        return self.value(TURN)

    @property
    def thinking_ranges(self) -> tuple[tuple[int, int], ...]:
        """Index ranges of ``items`` whose thinking the wire view sends: the rule of
        :func:`compactstore._context.thinking.sent_ranges`, chosen by the context's
        ``edit_policy`` and ``prefix_checks`` (per turn, or none after the first change under
        rewrite on a model without prefix checks); the turn a request continues keeps its
        thinking."""
        return self._derived(_RANGES, self._ranges)

    def _ranges(self) -> tuple[tuple[int, int], ...]:
        return sent_ranges(
            self.items,
            self.changed_thinking,
            self._turn,
            preserved=self.config.preserved_thinking,
            policy=self.edit_policy,
            prefix_checks=self.prefix_checks,
        )

    @property
    def thinking_tokens(self) -> int:
        """Estimated tokens of the thinking blocks the wire view sends."""
        return sum(self._thinking_index.between(a, b) for a, b in self.thinking_ranges)

    @property
    def continues_thinking(self) -> bool:
        """Whether a request now continues a tool loop (tool results follow the newest
        assistant message) whose turn carries thinking: that thinking must be sent (the API
        refuses a tool-use continuation without it)."""
        turn = self._turn
        at = self._thinking_index.at
        return (
            turn.continuing
            and turn.start is not None
            and bool(at)
            and at[-1] >= turn.start
            and self.items[-1].kind == "tool"
        )

    @property
    def continued_thinking_changed(self) -> bool:
        """Whether the thinking of the turn a request continues is sent with a prefix that
        changed since it was produced: an API with prefix checks refuses it (or drops it
        when asked to)."""
        if not self.continues_thinking:
            return False
        start = self._turn.start
        assert start is not None
        return any(
            self._prefix_changed(index) for index in self._thinking_index.at if index >= start
        )

    def _prefix_changed(self, index: int) -> bool:
        """Whether a change newer than the version ``items[index]`` answered changed a seq
        before it."""
        item = self.items[index]
        if item.seq is None:
            return False
        answered = -1 if item.context_version is None else item.context_version
        return any(version > answered and seq < item.seq for version, seq in self.changes)

    @property
    def carries_thinking(self) -> bool:
        """Whether a message of the context has thinking blocks: then an append may change
        what the wire view sends of earlier messages (:attr:`thinking_ranges`)."""
        return bool(self._thinking_index.at)

    def sends_thinking(self, index: int) -> bool:
        """Whether the wire view sends the thinking of ``items[index]`` (if it has any)."""
        return within(index, self.thinking_ranges)

    def settled(self, version: int) -> ActiveContext:
        """This context with its engines' pending changes recorded at ``version``."""
        if not any(v == PENDING_VERSION for v, _ in self.changes):
            return self
        changes = tuple((version if v == PENDING_VERSION else v, s) for v, s in self.changes)
        new = replace(self, changes=changes)
        # Every pending change is newer than what any message answered, as is ``version``:
        # what was derived from them stands (but the lineage: a new context).
        new.memo.update((k, v) for k, v in self.memo.items() if k is not _LINEAGE)
        return new

    def _changed(self, seq: int | None) -> tuple[tuple[int, int], ...]:
        """The changes with one made by an engine at ``seq`` (None: nothing changed)."""
        if seq is None:
            return self.changes
        return (*self.changes, (PENDING_VERSION, seq))

    def messages(self) -> list[dict[str, Any]]:
        """The messages to send to the model, in order (fresh copies the caller may change)."""
        try:
            return [thaw(message) for message in self.wire]
        except RecursionError:  # one message nested very deep: copy_message() copes
            return [item.copy_message() for item in self.items]

    def answered(self) -> ActiveContext:
        """This context with a synthetic error result after every crash-orphaned tool call.

        A call with no result that a later user, assistant or system message follows (the
        agent crashed mid-tool) would make the API refuse the request; the calls of the
        newest assistant turn, followed by tool results only, may still be running.
        """
        newest = newest_turn(self.kept)
        if all(index >= newest for indexes in self.unanswered.values() for index in indexes):
            return self  # the usual case, seen without a pass over the whole context
        kept = [item for item in self.kept if item.state != "synthetic"]
        newest = newest_turn(kept)
        open_ids: dict[int, set[str]] = {}  # index of the calling message -> its open ids
        for call_id, indexes in match_pairs(kept).open.items():
            for index in indexes:
                if index < newest:
                    open_ids.setdefault(index, set()).add(call_id)
        orphaned: list[tuple[int, list[ToolCall]]] = [
            (index, [call for call in kept[index].calls if call.id in ids])
            for index, ids in sorted(open_ids.items())
        ]
        for index, orphans in reversed(orphaned):  # from the end, so indexes stay valid
            answers = self.fmt.answer_orphans(kept[index].message, orphans, SYNTHETIC_RESULT_TEXT)
            if answers is None:
                # No stand-in is possible: the call leaves the context, with what is glued
                # to it (the reasoning item before it).
                start = index
                while start > 0 and kept[start - 1].glued and kept[start - 1].seq is not None:
                    start -= 1
                del kept[start : index + 1]
                continue
            kept[index + 1 : index + 1] = [
                ContextMessage.build(
                    self.fmt,
                    message,
                    tokens=self.message_tokens(message),
                    seq=None,
                    state="synthetic",
                )
                for message in answers
            ]
        return replace(self, kept=tuple(kept))

    @property
    def factor(self) -> float:
        """Learnt correction factor, else the configured default."""
        return self.token_factor if self.token_factor is not None else self.config.token_factor

    @property
    def message_tokens_sum(self) -> int:
        """Sum of the stored estimates of every message the wire view sends (thinking
        blocks not included: see :attr:`thinking_tokens`)."""
        return self.value(SENT_TOKENS)

    @property
    def raw_tokens(self) -> int:
        """Sum of the stored estimates of every message and of the thinking blocks the wire
        view sends (before factor and offsets)."""
        return self.message_tokens_sum + self.thinking_tokens

    @property
    def usage(self) -> int:
        """Estimated prompt tokens of the context."""
        return self._derived(_USAGE, self._usage)

    def _usage(self) -> int:
        raw = round(self.factor * self.raw_tokens)
        return self.config.fixed_overhead_tokens + raw + self.usage_offset

    @property
    def unanswered(self) -> dict[str, tuple[int, ...]]:
        """Calls of the kept part that no message of it answers (a synthetic result counts),
        by tool-use id, with the indexes in ``kept`` of the messages that made them (an id
        may be used again once its earlier call is closed: calls are keyed by (id, seq))."""
        return self.value(OPEN_CALLS).open

    @property
    def newest_assistant_at(self) -> float | None:
        """The latest time of an assistant message of the kept part (None: none)."""
        return self.value(NEWEST_ASSISTANT_AT)

    @property
    def open_results(self) -> OpenResults:
        """How many tool results an engine may still persist or clear, and the length of the
        longest (see :class:`compactstore._context.editable.OpenResults`)."""
        return self.value(OPEN_RESULTS)

    @property
    def open_media_blocks(self) -> int:
        """Media blocks in the tool results and user messages still in the kept part whole
        (what ``max_media_in_context`` limits): see
        :func:`compactstore._context.editable.open_media`."""
        return self.value(OPEN_MEDIA_BLOCKS)

    def extended(
        self,
        added: Sequence[ContextMessage],
        *,
        last_seq: int,
        usage_offset: int,
        token_factor: float | None,
        config: CompactionConfig,
        real_request_seq: int | None = None,
        cwd: str | None = None,
        policy: tuple[EditPolicy, bool] | None = None,
    ) -> ActiveContext:
        """This context with messages appended to the kept part, and the session's values
        (``policy``: its edit policy and prefix checks; None: unchanged).

        A step appends a few messages to a context of hundreds, so what this context already
        derived is carried over instead of computed again over every message.
        """
        new = replace(
            self,
            kept=self.kept + tuple(added),
            last_seq=last_seq,
            usage_offset=usage_offset,
            token_factor=token_factor,
            config=config,
            real_request_seq=real_request_seq,
            cwd=cwd,
            edit_policy=self.edit_policy if policy is None else policy[0],
            prefix_checks=self.prefix_checks if policy is None else policy[1],
        )
        known, memo = self.memo, new.memo
        same_config = config is self.config or config == self.config
        if _WIRE in known:
            self.value(THINKING)  # the wire view is extended from the thinking index
        added = tuple(added)
        for key, value in known.items():
            if isinstance(key, Incremental) and (same_config or not key.uses_config):
                memo[key] = key.advanced(new.scope, value, added)
        memo[_LINEAGE] = self.lineage
        if _CHANGED in known:
            # A message appended answered the current version: no change is newer.
            memo[_CHANGED] = known[_CHANGED]
        if _WIRE in known:
            if not new.value(THINKING).at:  # no thinking anywhere: nothing to strip
                memo[_WIRE] = known[_WIRE] + tuple(item.message for item in added)
            else:
                memo[_WIRE] = _extended_wire(self, new, added, len(self.items))
        return new

    def message_tokens(self, message: dict[str, Any]) -> int:
        """Raw token estimate of one message, as stored with it."""
        return message_tokens(self.fmt, message, self.count_tokens)

    @property
    def summary(self) -> ContextMessage | None:
        return next((item for item in self.head if item.state == "summary"), None)

    def with_kept(self, kept: Sequence[ContextMessage]) -> ActiveContext:
        """The same context with the kept part replaced (edits applied by an engine): a
        message edited or taken out is a pending change at its seq."""
        now = {item.seq: item for item in kept if item.seq is not None}
        changed = [
            item.seq for item in self.kept if item.seq is not None and now.get(item.seq) is not item
        ]
        return replace(self, kept=tuple(kept), changes=self._changed(min(changed, default=None)))

    def cut(
        self, index: int, summary_text: str, message: Mapping[str, Any] | None = None
    ) -> ActiveContext:
        """The context after summarising kept[:index] into a new summary message.

        Pinned messages before the cut move to the head, in log order, before the summary.
        The summary is the text as stored (:func:`storable_text`, as :class:`Cut` keeps it),
        so a context rebuilt from the boundary row is this one. ``message`` is the summary
        message when the provider wrote it (its compaction block, kept as returned).
        """
        removed_part = self.kept[:index]
        pinned = [item for item in self.head if item.state != "summary"]
        pinned.extend(item for item in removed_part if item.pinned)
        provided = message is not None
        message = (
            self.fmt.summary_message(storable_text(summary_text))
            if message is None
            else dict(message)
        )
        summary = ContextMessage.build(
            self.fmt, message, tokens=self.message_tokens(message), seq=None, state="summary"
        )
        # The summary stands before every kept message: each one's prefix changed. Not so
        # for a provider's compaction block: it stands in place of what it summarised (the
        # provider checks prefixes against what was sent before it) -- unless the wire view
        # was leaving thinking out: later thinking was made without it, so none of the
        # kept thinking may come back.
        unchanged = provided and self.thinking_cutoff is None
        return replace(
            self,
            head=(*pinned, summary),
            kept=self.kept[index:],
            changes=self.changes if unchanged else self._changed(self.first_kept_seq - 1),
        )

    @property
    def first_kept_seq(self) -> int:
        """Seq where the kept part starts (one past the log when nothing is kept)."""
        return next((item.seq for item in self.kept if item.seq is not None), self.last_seq + 1)

    def cleared_calls(self, results: Iterable[tuple[int, Iterable[str]]]) -> list[tuple[str, int]]:
        """(tool-use id, call seq) of the calls whose results are named by (seq of the
        result's message, its tool-use ids), in that order: what a compaction records as
        lost. A result whose call is not in the context is left out."""
        results = [(seq, tuple(ids)) for seq, ids in results]
        if not any(ids for _, ids in results):
            return []  # nothing to pair: no walk over the context
        items = self.items
        index_of = {item.seq: i for i, item in enumerate(items) if item.seq is not None}
        answers = match_pairs(items).answers
        found: list[tuple[str, int]] = []
        for seq, ids in results:
            index = index_of.get(seq)
            for call_id in ids:
                call = None if index is None else answers.get((index, call_id))
                call_seq = None if call is None else items[call].seq
                if call_seq is not None:
                    found.append((call_id, call_seq))
        return found

    def call_names(self, results: Collection[tuple[int, str]]) -> dict[tuple[int, str], str]:
        """Tool name of the call each result answers, by (index in ``kept``, tool-use id):
        the newest call of that id before the result (calls are keyed by (id, seq); an id
        may be used again once its earlier call is closed). The context is read from the
        newest of those results back, only as far as the oldest call they answer."""
        offset = len(self.head)
        waiting: dict[str, list[int]] = {}
        for index, call_id in results:
            waiting.setdefault(call_id, []).append(index + offset)
        names: dict[tuple[int, str], str] = {}
        items = self.items
        start = max((i for indexes in waiting.values() for i in indexes), default=0)
        for position in range(start - 1, -1, -1):
            if not waiting:
                break
            for call in items[position].calls:
                indexes = waiting.get(call.id)
                if not indexes:
                    continue
                for index in indexes:
                    if index > position:
                        names[(index - offset, call.id)] = call.name
                rest = [index for index in indexes if index <= position]
                if rest:
                    waiting[call.id] = rest
                else:
                    del waiting[call.id]
        return names


def _extended_wire(
    old: ActiveContext, new: ActiveContext, added: Sequence[ContextMessage], start: int
) -> tuple[Mapping[str, Any], ...]:
    """``new``'s wire view from ``old``'s: the added messages, and the earlier messages whose
    thinking is sent or left out now where it was not before (the newest turn moved on)."""
    before, after = old.thinking_ranges, new.thinking_ranges
    wire = old.wire + tuple(
        item.message if item.thinking_tokens is None or within(index, after) else new.stripped(item)
        for index, item in enumerate(added, start=start)
    )
    if before == merged_ranges((a, min(b, start)) for a, b in after):
        return wire
    items, at = new.items, new.value(THINKING).at
    changed = list(wire)
    for index in at[: bisect_left(at, start)]:
        if within(index, before) != within(index, after):
            item = items[index]
            changed[index] = item.message if within(index, after) else new.stripped(item)
    return tuple(changed)
