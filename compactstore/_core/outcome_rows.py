"""What an outcome writes, as rows: pure builders, no connection.

:func:`outcome_rows` turns what the engines decided into the rows one commit writes (the
breaker counters, the boundary, the compactions row, the edits and blobs, the session's
changed columns); :func:`compactstore._core.recording.record_outcome` writes them in the
caller's transaction, filling in the ids the inserts give. :func:`recorded_result` is the
public result of the rows written.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from compactstore._core.replay_inputs import Recorded
from compactstore._engines.pipeline import Outcome
from compactstore.db import repository as repo
from compactstore.db.context import BoundaryRow
from compactstore.models import (
    CompactBoundary,
    CompactionResult,
    CompactStrategy,
    SummaryInfo,
)

__all__ = [
    "OutcomeRows",
    "blob_rows",
    "boundary_row",
    "boundary_values",
    "breaker_values",
    "changed_after_seq",
    "cleared_calls",
    "compaction_columns",
    "edit_rows",
    "outcome_rows",
    "recorded_result",
    "summary_columns",
]


@dataclass(frozen=True, slots=True)
class OutcomeRows:
    """The rows of one outcome. The ids the inserts give are not in them: the boundary's
    (0 here), the compactions row's ``boundary_id`` and the edits' and blobs'
    ``compaction_id`` are filled in as they are written."""

    breaker: dict[str, Any]  # the breaker columns to set (none: leave them)
    count_fallback: bool  # a summarizer failed and the rule summary stood in
    boundary: BoundaryRow | None
    compaction: dict[str, Any] | None  # the compactions row; None: the call leaves no row
    edits: list[dict[str, Any]]
    blobs: list[dict[str, Any]]
    session: dict[str, Any]  # the session's columns the outcome changes

    @property
    def breaker_only(self) -> bool:
        """Only breaker counters to write: the session row is touched, not its structure."""
        return self.compaction is None and bool(self.breaker)


def breaker_values(outcome: Outcome) -> dict[str, Any]:
    """The breaker columns the outcome sets: its counters, and ``consecutive_fallbacks``
    back to 0 once a summarizer wrote the summary."""
    breaker: dict[str, Any] = {}
    if outcome.consecutive_failures is not None:
        breaker["consecutive_failures"] = outcome.consecutive_failures
        breaker["tripped"] = bool(outcome.tripped)
    if outcome.reactive_attempts is not None:
        breaker["reactive_attempts"] = outcome.reactive_attempts
    if outcome.last_microcompact_at is not None:
        breaker["last_microcompact_at"] = outcome.last_microcompact_at
    cut = outcome.cut
    info = None if cut is None else cut.summary
    if info is not None and not info.fallback and info.source == "summarizer":
        breaker["consecutive_fallbacks"] = 0
    return breaker


def boundary_row(outcome: Outcome, at: float) -> BoundaryRow | None:
    """The boundary a cut writes (id 0: given by the insert); None without a cut."""
    cut, stage = outcome.cut, outcome.cut_stage
    if cut is None or stage is None:
        return None
    summary = outcome.context.summary
    assert summary is not None, "a cut's context starts with its summary"
    start = outcome.start
    return BoundaryRow(
        id=0,
        trigger=stage.trigger.value,
        strategy=stage.strategy.value,
        created_at=at,
        tokens_before=outcome.tokens_before,
        tokens_after=outcome.tokens_after,
        messages_removed=len(cut.removed_seqs),
        first_kept_seq=cut.first_kept_seq,
        last_kept_seq=cut.last_kept_seq,
        summary_text=cut.summary_text,
        summary_message=repo.dumps(summary.message),
        summary_tokens=summary.tokens,
        summary_state=cut.summary_state.model_dump_json(),
        parent_id=start.boundary.id if start.boundary is not None else None,
        rolled_back_at=None,
    )


def boundary_values(row: BoundaryRow) -> dict[str, Any]:
    """The columns a boundary row inserts (its id and rollback are not set by a commit)."""
    return {k: v for k, v in row._asdict().items() if k not in ("id", "rolled_back_at")}


def changed_after_seq(outcome: Outcome) -> int | None:
    """The seq after which the prefixes of later messages changed: an edited seq or, for a
    cut, every kept message (as ActiveContext.cut() has it). A provider's compaction block
    changes no later prefix."""
    cut, stage, start = outcome.cut, outcome.cut_stage, outcome.start
    provided = False
    if stage is not None and stage.strategy == CompactStrategy.PROVIDER:
        place = next(i for i, each in enumerate(outcome.stages) if each is stage)
        before = outcome.stages[place - 1].context if place else start
        provided = stage.context.changes == before.changes  # as ActiveContext.cut() had it
    cut_after = [start.first_kept_seq - 1] if cut is not None and not provided else []
    return min([edit.seq for edit in outcome.edits] + cut_after, default=None)


def summary_columns(summary: SummaryInfo | None) -> dict[str, Any]:
    """The compactions columns that say how a cut's summary was written."""
    if summary is None:
        return {}
    return {
        "summary_source": summary.source,
        "summarizer": summary.summarizer,
        "summarizer_model": summary.model,
        "summarizer_latency_ms": summary.latency_ms,
        "summarizer_input_tokens": summary.input_tokens,
        "summarizer_output_tokens": summary.output_tokens,
        "summarizer_fallback": summary.fallback,
        "summarizer_reason": summary.reason,
    }


def compaction_columns(
    outcome: Outcome,
    inputs: Recorded,
    *,
    at: float,
    instructions: str | None = None,
    error: str | None = None,
    replay_of: int | None = None,
    started_by: int | None = None,
) -> dict[str, Any]:
    """The compactions row of an outcome that leaves one (``boundary_id`` None: the write
    sets it)."""
    cut = outcome.cut
    strategy, trigger = outcome.strategy, outcome.trigger
    return {
        "trigger": None if trigger is None else trigger.value,
        "strategy": None if strategy is None else strategy.value,
        "success": outcome.success,
        "tokens_before": outcome.tokens_before,
        "tokens_after": outcome.tokens_after,
        "tokens_freed": outcome.tokens_before - outcome.tokens_after,
        "summary_text": cut.summary_text if cut is not None else "",
        "boundary_id": None,
        "created_at": at,
        "steps": repo.dumps([step.model_dump(mode="json") for step in outcome.steps()]),
        "config": outcome.context.config.model_dump_json(),
        "removed_seqs": repo.dumps(list(cut.removed_seqs) if cut is not None else []),
        "cleared_tool_calls": repo.dumps(cleared_calls(outcome)),
        "blob_ids": repo.dumps([blob.id for blob in outcome.blobs]),
        "instructions": instructions,
        "error": error,
        "inputs": inputs.model_dump_json(),
        "replay_of": replay_of,
        "started_by": started_by,
        "changed_after_seq": changed_after_seq(outcome),
        "edit_policy": getattr(inputs, "edit_policy", None),
        **summary_columns(None if cut is None else cut.summary),
    }


def cleared_calls(outcome: Outcome) -> list[tuple[str, int]]:
    """(tool-use id, call seq) of the calls whose results the outcome's edits cleared."""
    return outcome.start.cleared_calls((edit.seq, edit.tool_use_ids) for edit in outcome.edits)


def edit_rows(outcome: Outcome) -> list[dict[str, Any]]:
    """The message_edits rows (``compaction_id`` set by the write)."""
    return [
        {
            "seq": edit.seq,
            "kind": edit.state,  # the message_edits column
            "tool_use_ids": repo.dumps(list(edit.tool_use_ids)),
            "payload": repo.dumps(edit.message),
            "tokens": edit.tokens,
        }
        for edit in outcome.edits
    ]


def blob_rows(outcome: Outcome, at: float) -> list[dict[str, Any]]:
    """The blobs rows of the tool results the outcome persisted (``compaction_id`` set by
    the write)."""
    return [
        {
            "id": blob.id,
            "seq": blob.seq,
            "tool_use_id": blob.tool_use_id,
            "tool_name": blob.tool_name,
            "sha256": hashlib.sha256(data).hexdigest(),
            "size": len(data),
            "content": data,
            "created_at": at,
        }
        for blob in outcome.blobs
        for data in [blob.content.encode("utf-8")]
    ]


def outcome_rows(
    outcome: Outcome,
    inputs: Recorded,
    *,
    at: float,
    instructions: str | None = None,
    error: str | None = None,
    replay_of: int | None = None,
    started_by: int | None = None,
) -> OutcomeRows:
    """Every row one outcome writes."""
    cut = outcome.cut
    info = None if cut is None else cut.summary
    breaker = breaker_values(outcome)
    fallback = info is not None and info.fallback
    if not outcome.leaves_row:
        return OutcomeRows(breaker, fallback, None, None, [], [], {})
    columns = compaction_columns(
        outcome,
        inputs,
        at=at,
        instructions=instructions,
        error=error,
        replay_of=replay_of,
        started_by=started_by,
    )
    # The context changed, so the last real count no longer describes it.
    session = {"real_tokens": None, "real_estimate": None} if outcome.success else {}
    return OutcomeRows(
        breaker,
        fallback,
        boundary_row(outcome, at),
        columns,
        edit_rows(outcome),
        blob_rows(outcome, at),
        session,
    )


def recorded_result(
    outcome: Outcome,
    compaction_id: int,
    boundary: CompactBoundary | None,
    *,
    at: float,
    instructions: str | None = None,
    error: str | None = None,
    started_by: int | None = None,
    edit_policy: str | None = None,
) -> CompactionResult:
    """The public result of an outcome written as compactions row ``compaction_id``."""
    cut = outcome.cut
    return CompactionResult(
        id=compaction_id,
        success=outcome.success,
        strategy=outcome.strategy,
        trigger=outcome.trigger,
        messages=outcome.context.wire,
        boundary=boundary,
        tokens_before=outcome.tokens_before,
        tokens_after=outcome.tokens_after,
        tokens_freed=outcome.tokens_before - outcome.tokens_after,
        summary_text=cut.summary_text if cut is not None else "",
        steps=outcome.steps(),
        created_at=at,
        removed_seqs=list(cut.removed_seqs) if cut is not None else [],
        cleared_tool_calls=cleared_calls(outcome),
        blob_ids=[blob.id for blob in outcome.blobs],
        instructions=instructions,
        error=error,
        summary=None if cut is None else cut.summary,
        started_by=started_by,
        edit_policy=edit_policy,
    )
