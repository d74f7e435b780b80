"""A compaction the agent did itself, found in an imported transcript.

The agent (e.g. Claude Code) already cut its context and wrote the summary it continued
with; this engine turns that into the same outcome a full compact would give: everything
kept so far but the pins is removed, the agent's summary stands for it, and the summary
state is folded as usual so later compactions still carry the request and the files.
"""

from __future__ import annotations

from typing import Any

from compactstore._context.active import ActiveContext
from compactstore._engines import summary
from compactstore._engines.base import Cut, StageResult
from compactstore._engines.full_compact import rule_summary
from compactstore._engines.pipeline import Outcome
from compactstore.models import (
    CompactStrategy,
    CompactTrigger,
    ImportedBoundary,
    SummaryInfo,
    SummaryState,
)

__all__ = ["DETAIL", "cut_as_imported", "cut_by_provider"]

DETAIL = "imported from the transcript"


def cut_as_imported(context: ActiveContext, boundary: ImportedBoundary) -> Outcome:
    """The outcome of cutting ``context`` just before the next message, with the
    transcript's summary."""
    removed = [item for item in context.kept if not item.pinned]
    previous = context.boundary.summary_state if context.boundary is not None else SummaryState()
    state = summary.fold(previous, removed, context)
    after = context.cut(len(context.kept), boundary.summary_text)
    stage = StageResult(
        strategy=boundary.strategy,
        trigger=boundary.trigger,
        applied=True,
        context=after,
        tokens_before=context.usage,
        tokens_after=after.usage,
        cut=Cut.of(
            after,
            removed,
            boundary.summary_text,
            state,
            SummaryInfo(source="provider")
            if boundary.strategy is CompactStrategy.PROVIDER
            else None,
        ),
        detail=DETAIL,
    )
    return Outcome(start=context, context=after, stages=[stage])


def cut_by_provider(
    context: ActiveContext,
    message: dict[str, Any],
    text: str | None,
    *,
    now: float | None = None,
    note: str = "",
    info: SummaryInfo | None = None,
) -> Outcome:
    """The outcome of a compaction the provider did on its own (a threshold compaction a
    reply starts with, a server-side compaction item a response's output starts with):
    everything kept so far is summarised by ``message`` (the block or item as returned);
    ``text`` is its readable summary. An opaque one (``text`` None) is summarised by
    ``note`` (naming it) and the rule-based summary of the same range, written at ``now``,
    kept beside it for audit, recall and fallback."""
    removed = [item for item in context.kept if not item.pinned]
    previous = context.boundary.summary_state if context.boundary is not None else SummaryState()
    state = summary.fold(previous, removed, context)
    if text is None:
        replaces = sum(item.tokens for item in removed) + (
            context.summary.tokens if context.summary is not None else 0
        )
        rule_text, state = rule_summary(
            context, state, "Server-side compaction", now or 0.0, replaces=max(2, replaces)
        )
        named = note or "compaction by the provider: opaque, no readable summary"
        text = f"[{named}]\n\n{rule_text}"
    after = context.cut(len(context.kept), text, message)
    stage = StageResult(
        strategy=CompactStrategy.PROVIDER,
        trigger=CompactTrigger.SERVER,
        applied=True,
        context=after,
        tokens_before=context.usage,
        tokens_after=after.usage,
        cut=Cut.of(after, removed, text, state, info or SummaryInfo(source="provider")),
        detail="compacted by the provider at its threshold (a compaction "
        + ("block in the reply)" if "content" in message else "item in the response)"),
    )
    return Outcome(start=context, context=after, stages=[stage])
