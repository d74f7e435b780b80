"""Stage 7, reactive recovery: after the API said the prompt is too long.

Attempt 1 forces a full compact and succeeds when usage gets below the blocking limit
times the target ratio (97% x 0.9 = 87.3% of the window). Otherwise, and on attempts 2
and 3, the kept messages are truncated to the newest 40%, 30%, 20% (never fewer than 3
messages or 15%), pairs intact, behind a note that still carries the cumulative summary.
When even what is kept exceeds the limit, its large tool results are persisted whatever
their length. Attempt 4 gives up.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from compactstore._context.active import ActiveContext, ContextMessage
from compactstore._context.pairs import legal_cuts
from compactstore._engines import full_compact, summary, tool_budget
from compactstore._engines.base import (
    Cut,
    Edit,
    EngineInputs,
    NewBlob,
    StageResult,
    nearest_legal_cut,
)
from compactstore._engines.full_compact import rule_summary
from compactstore.models import CompactStrategy, CompactTrigger

__all__ = ["Recovery", "limit", "recover", "truncate"]


@dataclass(frozen=True, slots=True)
class Recovery:
    stages: list[StageResult]
    attempts: int  # the counter to store: 0 when attempt 1 got below the limit


def limit(context: ActiveContext) -> float:
    """Usage reactive recovery must get strictly under (87.3% of the window)."""
    return round(context.context_window * context.config.reactive_limit_ratio, 6)


def truncate(context: ActiveContext, inputs: EngineInputs, attempt: int) -> StageResult:
    """Keep only the newest share of the kept messages, behind a note."""
    config = context.config
    kept = context.kept
    before = context.usage
    fraction = max(config.reactive_keep_fractions[attempt - 1], config.reactive_min_keep_fraction)
    keep = max(config.reactive_min_keep_messages, int(len(kept) * fraction))
    cut = nearest_legal_cut(legal_cuts(kept), len(kept) - keep, highest=len(kept) - keep)
    removed: Sequence[ContextMessage] = (
        [item for item in kept[:cut] if not item.pinned] if cut else []
    )
    after = context
    text = ""
    state = inputs.summary_state
    if removed and cut is not None:
        state = summary.fold(inputs.summary_state, removed, context)
        text, state = rule_summary(
            context,
            state,
            f"Reactive Recovery, attempt {attempt}",
            inputs.now,
            replaces=sum(item.tokens for item in removed)
            + (context.summary.tokens if context.summary is not None else 0),
            note=f"[Context aggressively truncated for recovery — attempt {attempt}] Earlier "
            "conversation was removed to fit context limits.",
        )
        after = context.cut(cut, text)
    edits: tuple[Edit, ...] = ()
    blobs: tuple[NewBlob, ...] = ()
    if after.usage >= limit(context):
        chooser = tool_budget.oversized(after, config.tool_result_preview_chars)
        new_kept, edit_list, blob_list = tool_budget.persist_results(after, inputs, chooser)
        if edit_list:
            after = after.with_kept(new_kept)
            edits, blobs = tuple(edit_list), tuple(blob_list)
    success = after.usage < before
    return StageResult(
        strategy=CompactStrategy.REACTIVE,
        trigger=CompactTrigger.REACTIVE,
        applied=success,
        context=after if success else context,
        tokens_before=before,
        tokens_after=after.usage if success else before,
        edits=edits if success else (),
        blobs=blobs if success else (),
        cut=Cut.of(after, removed, text, state) if success and removed else None,
        detail=f"kept the newest {len(after.kept)} messages ({fraction:.0%} target)"
        + (f", persisted {len(blobs)} large tool results" if blobs else ""),
    )


def recover(context: ActiveContext, inputs: EngineInputs) -> Recovery | None:
    """Run the next recovery attempt; None once every attempt has been used."""
    attempt = inputs.reactive_attempts + 1
    if attempt > len(context.config.reactive_keep_fractions):
        return None
    stages: list[StageResult] = []
    current = context
    if attempt == 1:
        full = full_compact.run(context, inputs, trigger=CompactTrigger.REACTIVE)
        stages.append(full)
        current = full.context
        if full.effective and current.usage < limit(context):
            return Recovery(stages, attempts=0)
        if full.cut is not None:
            inputs = replace(inputs, summary_state=full_compact.continuing(full.cut.summary_state))
    stages.append(truncate(current, inputs, attempt))
    return Recovery(stages, attempts=attempt)
