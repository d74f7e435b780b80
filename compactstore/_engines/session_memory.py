"""Stage 6a, session-memory compact: summarise with memory the agent already has.

The summary is the stored memory (up to ``session_memory_max_tokens``, and no more than the
summary's share of the window; ``user_intent`` entries first, then the newest) plus counts,
then the handoff sections of a full compact (:mod:`compactstore._engines.summary`, within
the same budget), cumulative like them.
A verbatim tail is kept, built from the newest message backwards: at least
``session_memory_min_tail_messages`` messages and ``session_memory_min_tail_tokens``
tokens, growing up to ``session_memory_max_tail_tokens`` once those minimums are met.
The compaction fails when it does not get below ``session_memory_max_after_ratio`` of
the tokens before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Protocol

from compactstore._context.active import ActiveContext
from compactstore._context.pairs import legal_cuts
from compactstore._context.tokens import TokenCounter
from compactstore._engines import summary
from compactstore._engines.base import Cut, EngineInputs, StageResult, nearest_legal_cut
from compactstore._engines.full_compact import header
from compactstore.models import CompactStrategy, CompactTrigger, MemoryEntry

__all__ = ["MemoryProvider", "run", "select_memory"]


class MemoryProvider(Protocol):
    """Plug an application's own memory system into session-memory compact.

    Called when a compaction is planned, with the session id, the entries stored with
    ``remember()`` and the token budget; returns the memory text to summarise with (empty
    for none). Its answer is recorded with the compaction, and replay reuses it.
    """

    def __call__(self, session_id: str, entries: Sequence[MemoryEntry], max_tokens: int) -> str: ...


def select_memory(entries: Sequence[MemoryEntry], max_tokens: int, count: TokenCounter) -> str:
    """The default provider: user_intent entries first, then the newest, within budget."""
    ordered = [e for e in entries if e.kind == "user_intent"]
    ordered += sorted(
        (e for e in entries if e.kind != "user_intent"),
        key=lambda e: (e.created_at, e.id or 0),
        reverse=True,
    )
    lines: list[str] = []
    used = 0
    for entry in ordered:
        line = f"- [{entry.kind}] {entry.text}"
        cost = count(line)
        if used + cost > max_tokens:
            continue
        lines.append(line)
        used += cost
    return "\n".join(lines)


def _tail_bounds(context: ActiveContext) -> tuple[int, int]:
    """Where the verbatim tail may start: (earliest start within the token cap, latest
    start that still meets both minimums)."""
    config = context.config
    kept = context.kept
    tokens = 0
    start = latest = len(kept)
    for count, index in enumerate(range(len(kept) - 1, -1, -1)):
        cost = round(context.factor * kept[index].tokens)
        minimums_met = (
            count >= config.session_memory_min_tail_messages
            and tokens >= config.session_memory_min_tail_tokens
        )
        if minimums_met and tokens + cost > config.session_memory_max_tail_tokens:
            break
        if not minimums_met:
            latest = index
        tokens += cost
        start = index
    return start, latest


def run(
    context: ActiveContext, inputs: EngineInputs, *, trigger: CompactTrigger
) -> StageResult | None:
    """Compact with session memory; None when there is no memory to compact with."""
    if not inputs.memory_text.strip():
        return None
    before = context.usage
    kept = context.kept
    start, latest = _tail_bounds(context)
    # Prefer a cut between the cap and the minimums; past the cap only to keep a pair whole.
    cut = nearest_legal_cut(legal_cuts(kept), start, lowest=start, highest=latest)
    removed = [item for item in kept[:cut] if not item.pinned] if cut else []
    failed = StageResult(
        strategy=CompactStrategy.SESSION_MEMORY,
        trigger=trigger,
        applied=False,
        context=context,
        tokens_before=before,
        tokens_after=before,
        detail="the verbatim tail already holds the whole context",
    )
    if cut is None or not removed:
        return failed
    state = summary.fold(inputs.summary_state, removed, context)
    # The same handoff sections as a full compact's, after the memory.
    sections, state = summary.render(
        state, context.config, context.count_tokens, summary.budget_for(context)
    )
    text = "\n\n".join(
        [
            header("Session Memory", inputs.now),
            f"Messages removed: {len(removed)} ({state.messages_removed} in all). "
            f"Tokens before: ~{before}. Memory entries: {inputs.memory_count}.",
            "## Project memory\n" + inputs.memory_text.strip(),
            sections,
            "--- Recent conversation continues below ---",
        ]
    )
    after = context.cut(cut, text)
    if after.usage >= context.config.session_memory_max_after_ratio * before:
        return replace(
            failed,
            detail=f"would leave {after.usage} of {before} tokens (not below "
            f"{context.config.session_memory_max_after_ratio:.0%})",
        )
    return StageResult(
        strategy=CompactStrategy.SESSION_MEMORY,
        trigger=trigger,
        applied=True,
        context=after,
        tokens_before=before,
        tokens_after=after.usage,
        cut=Cut.of(after, removed, text, state),
    )
