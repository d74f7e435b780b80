"""Stage 6b, full compact: a rule-based structured summary, no LLM needed.

The summary is the handoff of :mod:`compactstore._engines.summary` (request, later
instructions, pending tasks, current work, files, errors) and is cumulative: the previous
boundary's summary state is folded in, so it survives any number of compactions. The newest third
of the kept messages (at most ``full_compact_max_tail_messages``) stays verbatim; the cut
moves so no tool call is separated from its result. A summary service (the caller's
summarizer behind a timeout, or a recorded text) may write the text instead; when it gives
none, the rule-based summary is used and the step says why.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from compactstore._context.active import ActiveContext, ContextMessage
from compactstore._context.frozen import thaw
from compactstore._context.media import without_media
from compactstore._context.pairs import legal_cuts
from compactstore._engines import summary
from compactstore._engines.base import (
    Cut,
    EngineInputs,
    StageResult,
    SummaryAnswer,
    SummaryRequest,
    nearest_legal_cut,
)
from compactstore.formats.compaction import compaction_block, provided_note
from compactstore.models import CompactStrategy, CompactTrigger, SummaryInfo, SummaryState

__all__ = ["continuing", "header", "rule_summary", "run", "summarise"]

# Tokens a new summary is expected to add on top of the previous one.
_SUMMARY_ALLOWANCE = 1_000

CLOSING = "Continue from where we left off."


def continuing(state: SummaryState) -> SummaryState:
    """The state to fold into when a second cut continues the same compaction call."""
    return state.model_copy(update={"compactions": max(0, state.compactions - 1)})


def header(label: str, now: float) -> str:
    stamp = datetime.fromtimestamp(now, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return f"[Context compacted at {stamp} — {label}]"


def rule_summary(
    context: ActiveContext,
    state: SummaryState,
    label: str,
    now: float,
    *,
    note: str = "",
    replaces: int | None = None,
) -> tuple[str, SummaryState]:
    """The rule-based summary text of a cut (header, ``note``, the handoff sections, closing
    line) and the state as written. It stays within its budget (``summary_max_tokens``,
    and ``summary_max_window_share`` of the window) and, when ``replaces`` (the tokens of
    what it stands for) is given, below that too, so a cut always shrinks the context when
    it can."""
    top = header(label, now) + (f"\n{note}" if note else "")
    count = context.count_tokens
    budget = summary.budget_for(context)
    if replaces is not None:
        budget = min(budget, replaces - 1)
    sections, written = summary.render(
        state, context.config, count, budget - count(top) - count(CLOSING) - 2
    )
    return f"{top}\n\n{sections}\n\n{CLOSING}", written


def summarise(
    context: ActiveContext,
    inputs: EngineInputs,
    removed: Sequence[ContextMessage],
    state: SummaryState,
    label: str,
) -> tuple[str, str, SummaryState, SummaryInfo | None]:
    """Summary text for a cut, a note on how it was made (empty when rule-based), the
    summary state to record, and how the text was written (None: rule-based, no service)."""
    text, note, state, answer = summarise_answer(context, inputs, removed, state, label)
    return text, note, state, answer.info if answer is not None else None


def summarise_answer(
    context: ActiveContext,
    inputs: EngineInputs,
    removed: Sequence[ContextMessage],
    state: SummaryState,
    label: str,
    span: Sequence[ContextMessage] | None = None,
) -> tuple[str, str, SummaryState, SummaryAnswer | None]:
    """:func:`summarise` with the whole answer (a provider's message and usage with it).
    ``span`` is the kept part the cut summarises, pinned messages included (what the
    provider is sent); ``removed`` by default."""
    replaces = sum(item.tokens for item in removed) + (
        context.summary.tokens if context.summary is not None else 0
    )
    rule_text, state = rule_summary(context, state, label, inputs.now, replaces=replaces)
    if inputs.summarizer is None:
        return rule_text, "", state, None
    previous = context.boundary.summary_text if context.boundary is not None else None
    # What the wire view sent before the kept part, each message as it was sent (thinking
    # whose prefix changed left out): the block stands in its place, so the thinking of the
    # kept turns stays valid. After an earlier block that is the block and the range; else
    # the pinned messages and an earlier client summary too (the block summarises them on
    # the wire; the log keeps them).
    wire = _sent_span(context, removed if span is None else span)
    answer = inputs.summarizer(
        SummaryRequest(
            # Copies: a summarizer that changes what it is given must not change the context.
            # Images and documents become a text note each: no base64 leaves for a summary;
            # nor does thinking: each block or reasoning item becomes a note.
            messages=[
                without_media(context.fmt.thinking_noted(item.copy_message())) for item in removed
            ],
            previous_summary=previous,
            instructions=inputs.instructions,
            removed_seqs=tuple(item.seq for item in removed if item.seq is not None),
            wire=tuple(context.fmt.wire_view(wire, context.config)),
        )
    )
    text, note = _answer_text(answer, rule_text)
    return text, note, state, answer


def _sent_span(context: ActiveContext, span: Sequence[ContextMessage]) -> list[dict[str, Any]]:
    """The range as it went on the wire: a provider compactor summarises it, thinking and
    all, after the earlier provider summary when there is one.

    What the wire view sent before the kept part, each message as it was sent (thinking
    whose prefix changed left out): the block stands in its place, so the thinking of the
    kept turns stays valid. After an earlier block that is the block and the range; else
    the pinned messages and an earlier client summary too (the block summarises them on
    the wire; the log keeps them)."""
    sent = dict(zip(map(id, context.items), context.wire, strict=True))
    earlier = context.summary
    chained = earlier is not None and compaction_block(earlier.message) is not None
    before = [] if chained else list(context.head)
    wire = [
        thaw(sent[id(item)]) for item in [*before, *span] if item.message.get("role") != "system"
    ]
    if chained:
        assert earlier is not None
        wire.insert(0, earlier.copy_message())
    return wire


def _answer_text(answer: SummaryAnswer, rule_text: str) -> tuple[str, str]:
    """The summary text a summarizer's answer gives, and the note that says how it was
    written (the rule summary when it gave none)."""
    info = answer.info
    if answer.message is not None:
        return _provider_summary(answer, rule_text)
    if answer.text is None:
        reason = info.reason or "no summary text"
        note = f"{reason}; used the rule-based summary" if info.reason else ""
        return rule_text, note
    if info.source == "recorded":
        return answer.text, "reused the recorded summary text"
    return answer.text, "summary written by the summarizer"


def _target(context: ActiveContext, up_to_seq: int | None) -> int:
    """Where the cut would go before pairs are considered: a partial compact right after
    ``up_to_seq``; a full one before the newest ``full_compact_keep_fraction`` of the kept
    messages (up to ``full_compact_max_tail_messages``), moved later until the tail fits
    ``full_compact_target_share`` of the window."""
    config, kept = context.config, context.kept
    if up_to_seq is not None:
        return next(
            (i for i, item in enumerate(kept) if item.seq is not None and item.seq > up_to_seq),
            len(kept),
        )
    tail = max(
        1,
        min(
            config.full_compact_max_tail_messages,
            int(len(kept) * config.full_compact_keep_fraction),
        ),
    )
    target = len(kept) - tail
    kept_tokens = context.factor * sum(item.tokens for item in kept)
    # Everything that stays besides the tail: overhead, pins, and the summary (the
    # previous one, already in the head, plus what this compaction adds to it).
    fixed = context.usage - kept_tokens + _SUMMARY_ALLOWANCE
    budget = config.full_compact_target_share * context.context_window - fixed
    tail_tokens = context.factor * sum(item.tokens for item in kept[target:])
    while target < len(kept) - 1 and tail_tokens > budget:
        tail_tokens -= context.factor * kept[target].tokens
        target += 1
    return target


def _provider_summary(answer: SummaryAnswer, rule_text: str) -> tuple[str, str]:
    """(summary text, note) of a provider's compaction: its readable text, or for an opaque
    object a note naming it with the rule-based summary of the same range beside it."""
    assert answer.message is not None
    if answer.text is None:
        note = provided_note(answer.message)
        return f"[{note}]\n\n{rule_text}", note
    return answer.text, "summary written by the provider (compaction block)"


def run(
    context: ActiveContext,
    inputs: EngineInputs,
    *,
    trigger: CompactTrigger,
    up_to_seq: int | None = None,
) -> StageResult:
    """Summarise the older part of the kept messages (or those up to ``up_to_seq``)."""
    config = context.config
    kept = context.kept
    before = context.usage
    strategy = CompactStrategy.FULL if up_to_seq is None else CompactStrategy.PARTIAL
    target = _target(context, up_to_seq)
    # A full compact keeps at least the newest message and at most max_tail_messages unless
    # a pair forces more; a partial one may take all it names.
    highest = len(kept) - 1 if up_to_seq is None else len(kept)
    lowest = len(kept) - config.full_compact_max_tail_messages if up_to_seq is None else 1
    cut = nearest_legal_cut(legal_cuts(kept), target, highest=highest, lowest=lowest)
    removed = [item for item in kept[:cut] if not item.pinned] if cut else []
    if cut is None or not removed:
        return StageResult(
            strategy=strategy,
            trigger=trigger,
            applied=False,
            context=context,
            tokens_before=before,
            tokens_after=before,
            detail="nothing to compact: no legal cut removes a message",
        )
    state = summary.fold(inputs.summary_state, removed, context)
    label = "Full Compact" if up_to_seq is None else f"Partial Compact up to seq {up_to_seq}"
    text, note, state, answer = summarise_answer(
        context, inputs, removed, state, label, span=kept[:cut]
    )
    info = answer.info if answer is not None else None
    message = answer.message if answer is not None else None
    if message is not None:
        strategy = CompactStrategy.PROVIDER
    after = context.cut(cut, text, message)
    success = after.usage < before
    return StageResult(
        strategy=strategy,
        trigger=trigger,
        applied=success,
        context=after if success else context,
        tokens_before=before,
        tokens_after=after.usage if success else before,
        cut=Cut.of(after, removed, text, state, info, answer.iterations if answer else ())
        if success
        else None,
        detail=note if success else "the summary is not smaller than what it replaces",
    )
