"""The pipeline that chains the stages, and the outcome the store records.

process_request: the registered stages (:mod:`compactstore._engines.stages`): tool-result
budget -> microcompact -> auto-compact check -> session memory / full compact. Read dedup
already happened when each tool result was appended. reactive_recover and manual compact
are pipelines of their own. Each returns an Outcome: the stages that attempted, the final
context and the counters to store — nothing is written.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from compactstore._context.active import ActiveContext
from compactstore._engines import auto_compact, full_compact, reactive
from compactstore._engines.base import Cut, Edit, EngineInputs, NewBlob, StageResult
from compactstore._engines.stages import PROCESS_STAGES, weight_of
from compactstore.models import CompactionStep, CompactStrategy, CompactTrigger

__all__ = ["Outcome", "manual", "process", "recover"]


@dataclass(frozen=True)
class Outcome:
    """Everything one call decided. The store writes it in one transaction."""

    start: ActiveContext
    context: ActiveContext
    stages: list[StageResult]
    consecutive_failures: int | None = None
    tripped: bool | None = None
    reactive_attempts: int | None = None
    last_microcompact_at: float | None = None

    @property
    def leaves_row(self) -> bool:
        """Whether the call leaves a compactions row: something changed or an attempt failed."""
        return bool(self.stages)

    @property
    def writes(self) -> bool:
        """Whether the call leaves anything to write: a row, or breaker counters."""
        return self.leaves_row or any(
            value is not None
            for value in (
                self.consecutive_failures,
                self.reactive_attempts,
                self.last_microcompact_at,
            )
        )

    @property
    def success(self) -> bool:
        return any(stage.effective for stage in self.stages)

    @property
    def tokens_before(self) -> int:
        return self.start.usage

    @property
    def tokens_after(self) -> int:
        return self.context.usage

    @property
    def main_stage(self) -> StageResult | None:
        """The heaviest stage that freed tokens, else the heaviest attempt."""
        effective = [stage for stage in self.stages if stage.effective] or self.stages
        if not effective:
            return None
        return max(effective, key=lambda stage: weight_of(stage.strategy))

    @property
    def strategy(self) -> CompactStrategy | None:
        stage = self.main_stage
        return None if stage is None else stage.strategy

    @property
    def trigger(self) -> CompactTrigger | None:
        stage = self.main_stage
        return None if stage is None else stage.trigger

    @property
    def cut(self) -> Cut | None:
        """The boundary to record: the last effective cut, covering every cut of the call."""
        cuts = [stage.cut for stage in self.stages if stage.effective and stage.cut is not None]
        if not cuts:
            return None
        removed = sorted({seq for cut in cuts for seq in cut.removed_seqs})
        return replace(cuts[-1], removed_seqs=tuple(removed))

    @property
    def cut_stage(self) -> StageResult | None:
        cutting = [stage for stage in self.stages if stage.effective and stage.cut is not None]
        return cutting[-1] if cutting else None

    @property
    def edits(self) -> list[Edit]:
        return [edit for stage in self.stages if stage.effective for edit in stage.edits]

    @property
    def blobs(self) -> list[NewBlob]:
        return [blob for stage in self.stages if stage.effective for blob in stage.blobs]

    def steps(self) -> list[CompactionStep]:
        return [
            CompactionStep(
                strategy=stage.strategy,
                trigger=stage.trigger,
                tokens_freed=stage.tokens_freed if stage.effective else 0,
                success=stage.effective,
                detail=stage.detail,
                **_results_out(stage),
            )
            for stage in self.stages
        ]


def _results_out(stage: StageResult) -> dict[str, int]:
    """How many tool results a stage cleared and persisted (none when it freed nothing:
    its edits are not recorded)."""
    if not stage.effective:
        return {"results_cleared": 0, "results_persisted": 0}
    edited = sum(len(edit.tool_use_ids) for edit in stage.edits)
    persisted = {(blob.seq, blob.tool_use_id) for blob in stage.blobs}
    in_edits = sum(
        1 for edit in stage.edits for i in edit.tool_use_ids if (edit.seq, i) in persisted
    )
    return {"results_cleared": edited - in_edits, "results_persisted": len(persisted)}


def process(context: ActiveContext, inputs: EngineInputs, **switches: bool) -> Outcome:
    """The pre-call pipeline of process_request(): the registered stages
    (:data:`compactstore._engines.stages.PROCESS_STAGES`) in order, each unless its
    ``enable_<name>`` switch is False."""
    known = {stage.switch for stage in PROCESS_STAGES}
    if unknown := sorted(set(switches) - known):
        raise TypeError(f"no stage has the switch {', '.join(unknown)}")
    start = context
    results: list[StageResult] = []
    counters: dict[str, Any] = {}
    for stage in PROCESS_STAGES:
        ran = stage.run(context, inputs) if switches.get(stage.switch, True) else None
        if ran is None:
            continue
        results.extend(ran.results)
        context = ran.context
        counters.update(ran.counters)
        if ran.blobs:
            inputs = replace(inputs, next_blob_id=inputs.next_blob_id + ran.blobs)
    return Outcome(start=start, context=context, stages=results, **counters)


def background(context: ActiveContext, inputs: EngineInputs) -> Outcome:
    """A background compaction: auto-compact (session memory, then full) aimed
    below ``background_threshold``; leaving usage at or above it is a breaker failure.
    Nothing when the breaker is tripped or usage is already below the threshold."""
    if inputs.tripped or context.usage < auto_compact.background_threshold(context):
        return Outcome(start=context, context=context, stages=[])
    result = auto_compact.dispatch(
        context, inputs, limit=auto_compact.background_threshold(context)
    )
    return Outcome(
        start=context,
        context=result.context,
        stages=result.stages,
        consecutive_failures=result.consecutive_failures,
        tripped=result.tripped,
    )


def recover(context: ActiveContext, inputs: EngineInputs) -> Outcome | None:
    """reactive_recover(): the next recovery attempt, or None when they are used up."""
    result = reactive.recover(context, inputs)
    if result is None:
        return None
    # Each stage starts from the one before and returns its input unchanged when it fails.
    final = result.stages[-1].context
    return Outcome(
        start=context, context=final, stages=result.stages, reactive_attempts=result.attempts
    )


def manual(context: ActiveContext, inputs: EngineInputs, *, up_to_seq: int | None) -> Outcome:
    """compact(): a full compact now, or a partial one up to a seq."""
    stage = full_compact.run(context, inputs, trigger=CompactTrigger.MANUAL, up_to_seq=up_to_seq)
    return Outcome(start=context, context=stage.context, stages=[stage])
