"""Commit: what the engines decided, written as rows, and rows read back as models.

:func:`record_outcome` writes one outcome (boundary, compactions row, edits, blobs,
counters) with the connection of the caller's write transaction and returns the public
:class:`CompactionResult`; the mappers turn stored rows into the public models.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from sqlalchemy import Connection

from compactstore._context.active import ActiveContext, BoundaryInfo
from compactstore._core.cache import CachedContext
from compactstore._core.checks import PendingMessage
from compactstore._core.outcome_rows import (
    boundary_values,
    outcome_rows,
    recorded_result,
    summary_columns,
)
from compactstore._core.replay_inputs import DedupRun, ImportedRun, Recorded, ServerRun
from compactstore._engines.base import Cut
from compactstore._engines.imported import cut_as_imported, cut_by_provider
from compactstore._engines.pipeline import Outcome
from compactstore._ledger import call_usage, usage_cost
from compactstore.db import model_calls
from compactstore.db import repository as repo
from compactstore.db.context import BoundaryRow, CompactionRow
from compactstore.errors import InvalidInputError
from compactstore.formats.sdk_objects import cleared_tokens
from compactstore.models import (
    CompactBoundary,
    CompactionConfig,
    CompactionResult,
    CompactionStep,
    CompactStrategy,
    CompactTrigger,
    ImportedBoundary,
    SummaryInfo,
)
from compactstore.pricing import PriceTable

__all__ = [
    "boundary_model",
    "cache_entry_after",
    "compaction_model",
    "record_attempt",
    "record_imported",
    "record_outcome",
    "record_read_dedup",
    "record_server_edits",
    "running_result",
    "summary_columns",
    "superseded_result",
    "unrecorded_result",
]


def record_outcome(
    connection: Connection,
    session_id: str,
    outcome: Outcome,
    inputs: Recorded,
    *,
    at: float,
    instructions: str | None = None,
    error: str | None = None,
    replay_of: int | None = None,
    started_by: int | None = None,
    prices: PriceTable | None = None,
) -> CompactionResult:
    """Write what the engines decided (the rows of
    :func:`compactstore._core.outcome_rows.outcome_rows`): boundary, compaction row, edits,
    blobs, counters.
    A provider compaction's billed usage (its ``usage.iterations``) is a ``model_calls``
    row, costed at ``prices``.

    Args:
        connection: the caller's write transaction, with the session locked.
        outcome: what the engines decided.
        inputs: what the engines were given, recorded for replay.
        at: the time the rows are dated with.
    """
    rows = outcome_rows(
        outcome,
        inputs,
        at=at,
        instructions=instructions,
        error=error,
        replay_of=replay_of,
        started_by=started_by,
    )
    if rows.count_fallback:
        repo.count_fallback(connection, session_id)
    if rows.breaker:
        repo.set_breaker(connection, session_id, **rows.breaker)
    if rows.compaction is None:
        if rows.breaker:
            repo.update_session(connection, session_id)
        return unrecorded_result(outcome, at, instructions)
    boundary: CompactBoundary | None = None
    if rows.boundary is not None:
        boundary_id = repo.insert_boundary(connection, session_id, **boundary_values(rows.boundary))
        boundary = boundary_model(rows.boundary._replace(id=boundary_id))
        cut = outcome.cut
        if cut is not None and cut.iterations:
            _record_provider_call(connection, session_id, outcome, cut, at, prices)
    compaction_id = repo.insert_compaction(
        connection,
        session_id,
        **{**rows.compaction, "boundary_id": None if boundary is None else boundary.id},
    )
    owned = {"compaction_id": compaction_id}
    repo.insert_edits(connection, session_id, [{**row, **owned} for row in rows.edits])
    repo.insert_blobs(connection, session_id, [{**row, **owned} for row in rows.blobs])
    repo.update_session(connection, session_id, structural=True, **rows.session)
    return recorded_result(
        outcome,
        compaction_id,
        boundary,
        at=at,
        instructions=instructions,
        error=error,
        started_by=started_by,
        edit_policy=rows.compaction["edit_policy"],
    )


def record_read_dedup(
    connection: Connection,
    session: repo.SessionRow,
    seq: int,
    earlier: tuple[str, int],
    stub: PendingMessage,
    *,
    edit_policy: str | None = None,
) -> CompactionResult:
    """Record that the re-read stored at ``seq`` is a stub pointing at the earlier read
    ``earlier`` (path, seq): a read_dedup compaction freeing what the content would have
    taken. Its tokens before and after are the re-read's own, in full and as the stub (the
    rest of the context did not change). Nothing else changes: the stub is the logged
    message, so no edit is written and the context version stays (an append)."""
    path, earlier_seq = earlier
    before = stub.tokens if stub.tokens_in_full is None else stub.tokens_in_full
    # As for every stage, success means it freed something: the stub of a tiny file can be
    # longer than the file.
    freed = before - stub.tokens
    step = CompactionStep(
        strategy=CompactStrategy.READ_DEDUP,
        trigger=CompactTrigger.AUTO,
        tokens_freed=freed,
        success=freed > 0,
        detail=f"seq {seq} re-read {path} unchanged: points at seq {earlier_seq}",
        results_cleared=0,
        results_persisted=0,
    )
    compaction_id = repo.insert_compaction(
        connection,
        session.id,
        trigger=CompactTrigger.AUTO.value,
        strategy=CompactStrategy.READ_DEDUP.value,
        success=freed > 0,
        tokens_before=before,
        tokens_after=stub.tokens,
        tokens_freed=freed,
        summary_text="",
        boundary_id=None,
        created_at=stub.created_at,
        steps=repo.dumps([step.model_dump(mode="json")]),
        config=session.config.model_dump_json(),
        removed_seqs="[]",
        cleared_tool_calls="[]",
        blob_ids="[]",
        inputs=DedupRun(
            call="read_dedup",
            now=stub.created_at,
            last_seq=seq,
            file_path=path,
            dedup_of_seq=earlier_seq,
        ).model_dump_json(),
        edit_policy=edit_policy,
    )
    return CompactionResult(
        id=compaction_id,
        success=freed > 0,
        strategy=CompactStrategy.READ_DEDUP,
        trigger=CompactTrigger.AUTO,
        tokens_before=before,
        tokens_after=stub.tokens,
        tokens_freed=freed,
        steps=[step],
        created_at=stub.created_at,
        edit_policy=edit_policy,
    )


def superseded_result(outcome: Outcome | None, at: float) -> CompactionResult:
    """The result of a call whose compaction was superseded: another
    compaction, rollback, reactive recovery or config change landed while it was decided,
    or its lease was taken over. Nothing is recorded; not a breaker failure."""
    stage = None if outcome is None else (outcome.cut_stage or outcome.main_stage)
    steps = (
        []
        if stage is None
        else [
            CompactionStep(
                strategy=stage.strategy,
                trigger=stage.trigger,
                tokens_freed=0,
                success=False,
                detail="superseded",
            )
        ]
    )
    before = 0 if outcome is None else outcome.tokens_before
    return CompactionResult(
        success=False,
        strategy=None,
        trigger=None,
        tokens_before=before,
        tokens_after=before,
        steps=steps,
        created_at=at,
    )


def record_attempt(
    connection: Connection,
    session_id: str,
    *,
    trigger: CompactTrigger,
    reason: str | None,
    tokens: int,
    config: CompactionConfig,
    inputs: str,
    at: float,
) -> int:
    """Record a row that changed nothing (strategy null): an attempt that failed for
    ``reason``, or (reason None) the call that started a background compaction.
    ``inputs`` is the JSON recorded for replay."""
    return repo.insert_compaction(
        connection,
        session_id,
        trigger=trigger.value,
        strategy=None,
        success=False,
        tokens_before=tokens,
        tokens_after=tokens,
        tokens_freed=0,
        summary_text="",
        boundary_id=None,
        created_at=at,
        steps="[]",
        config=config.model_dump_json(),
        removed_seqs="[]",
        cleared_tool_calls="[]",
        blob_ids="[]",
        instructions=None,
        error=reason,
        inputs=inputs,
        replay_of=None,
    )


def cache_entry_after(
    connection: Connection, session_id: str, outcome: Outcome, result: CompactionResult
) -> CachedContext | None:
    """The cache entry for the context a compaction just recorded, taken from the
    outcome instead of read back and decoded again: exactly what load_context would
    rebuild from the rows written. None when the two could differ."""
    if any(stage.applied and not stage.effective for stage in outcome.stages):
        return None  # the stage moved the context on, but its edits were not recorded
    final = outcome.context
    cut = outcome.cut
    if cut is not None:
        assert result.boundary is not None and result.boundary.id is not None
        # As load_context reads it: the new boundary, its state decoded from storage.
        boundary = BoundaryInfo(
            result.boundary.id,
            cut.first_kept_seq,
            cut.summary_text,
            cut.summary_state,
        )
        final = replace(final, boundary=boundary)
    versions = repo.session_versions(connection, session_id)
    assert versions is not None, "the session is locked by this transaction"
    version, context_version = versions
    # The engines' changes happened at the version this transaction wrote.
    final = final.settled(context_version)
    base = final.with_kept([item for item in final.kept if item.state != "synthetic"])
    # The outcome's context already answers crash-orphaned calls (a cut never orphans one),
    # so nothing is counted again here: the token counter never runs in a write transaction.
    return CachedContext(context_version, version, base, final)


def unrecorded_result(outcome: Outcome, at: float, instructions: str | None) -> CompactionResult:
    """The result of a call that wrote no compactions row (nothing to do, or a dry replay)."""
    cut, stage = outcome.cut, outcome.cut_stage
    boundary = None
    if cut is not None and stage is not None:
        boundary = CompactBoundary(
            trigger=stage.trigger,
            strategy=stage.strategy,
            timestamp=at,
            tokens_before=outcome.tokens_before,
            tokens_after=outcome.tokens_after,
            messages_removed=len(cut.removed_seqs),
            preserved_segment=None
            if cut.last_kept_seq is None
            else (cut.first_kept_seq, cut.last_kept_seq),
            summary_text=cut.summary_text,
            parent_id=outcome.start.boundary.id if outcome.start.boundary is not None else None,
        )
    return CompactionResult(
        success=outcome.success,
        strategy=outcome.strategy,
        trigger=outcome.trigger,
        # A call that changed nothing does not decode the context again: the caller asks
        # active_context() for it anyway, and this is the hot path of every model turn.
        messages=outcome.context.wire if outcome.leaves_row else (),
        boundary=boundary,
        tokens_before=outcome.tokens_before,
        tokens_after=outcome.tokens_after,
        tokens_freed=outcome.tokens_before - outcome.tokens_after if outcome.leaves_row else 0,
        summary_text=cut.summary_text if cut is not None else "",
        steps=outcome.steps(),
        created_at=at,
        removed_seqs=list(cut.removed_seqs) if cut is not None else [],
        cleared_tool_calls=outcome.start.cleared_calls(
            (edit.seq, edit.tool_use_ids) for edit in outcome.edits
        ),
        blob_ids=[blob.id for blob in outcome.blobs],
        instructions=instructions,
        summary=cut.summary if cut is not None else None,
    )


def boundary_model(row: BoundaryRow) -> CompactBoundary:
    """A boundary row as the public model."""
    return CompactBoundary(
        id=row.id,
        trigger=CompactTrigger(row.trigger),
        strategy=CompactStrategy(row.strategy),
        timestamp=row.created_at,
        tokens_before=row.tokens_before,
        tokens_after=row.tokens_after,
        messages_removed=row.messages_removed,
        preserved_segment=(
            None if row.last_kept_seq is None else (row.first_kept_seq, row.last_kept_seq)
        ),
        summary_text=row.summary_text,
        parent_id=row.parent_id,
        rolled_back_at=row.rolled_back_at,
    )


def rolled_back_model(row: BoundaryRow, at: float) -> CompactBoundary:
    """A boundary row as the public model, marked rolled back at ``at``."""
    return boundary_model(row._replace(rolled_back_at=at))


def compaction_model(
    row: CompactionRow, boundaries: dict[int, CompactBoundary]
) -> CompactionResult:
    """A compactions row as the public model (messages are not stored with it)."""
    return CompactionResult(
        id=row.id,
        success=bool(row.success),
        strategy=None if row.strategy is None else CompactStrategy(row.strategy),
        trigger=None if row.trigger is None else CompactTrigger(row.trigger),
        boundary=boundaries.get(row.boundary_id) if row.boundary_id is not None else None,
        tokens_before=row.tokens_before,
        tokens_after=row.tokens_after,
        tokens_freed=row.tokens_freed,
        summary_text=row.summary_text,
        steps=[CompactionStep.model_validate(step) for step in json.loads(row.steps)],
        created_at=row.created_at,
        rolled_back_at=row.rolled_back_at,
        removed_seqs=json.loads(row.removed_seqs),
        cleared_tool_calls=[tuple(pair) for pair in json.loads(row.cleared_tool_calls)],
        blob_ids=json.loads(row.blob_ids),
        instructions=row.instructions,
        error=row.error,
        started_by=row.started_by,
        edit_policy=row.edit_policy,
        summary=None
        if row.summary_source is None
        else SummaryInfo.model_validate(
            {
                "source": row.summary_source,
                "summarizer": row.summarizer,
                "model": row.summarizer_model,
                "latency_ms": row.summarizer_latency_ms,
                "input_tokens": row.summarizer_input_tokens,
                "output_tokens": row.summarizer_output_tokens,
                "fallback": bool(row.summarizer_fallback),
                "reason": row.summarizer_reason,
            }
        ),
    )


def running_result(at: float, instructions: str | None) -> CompactionResult:
    """The result of a call that found another caller's summary in flight."""
    return CompactionResult(
        success=False,
        strategy=None,
        trigger=None,
        created_at=at,
        instructions=instructions,
        background="running",
    )


def record_imported(
    connection: Connection,
    session_id: str,
    context: ActiveContext,
    boundary: ImportedBoundary,
    at: float,
) -> None:
    """Record a compaction the agent did itself, cutting ``context`` before the next message."""
    recorded = ImportedRun(
        call="import", now=at, last_seq=context.last_seq, pre_tokens=boundary.tokens_before
    )
    record_outcome(connection, session_id, cut_as_imported(context, boundary), recorded, at=at)


def record_provider_compaction(
    connection: Connection,
    session_id: str,
    context: ActiveContext,
    message: dict[str, Any],
    text: str | None,
    at: float,
    *,
    note: str = "",
    info: SummaryInfo | None = None,
) -> None:
    """Record a compaction the provider did on its own (strategy provider, trigger server):
    a boundary at this point whose summary message is the reply's compaction block or the
    response's compaction item (``text`` None: opaque, see ``cut_by_provider``)."""
    recorded = ServerRun(call="server", now=at, last_seq=context.last_seq, applied_edits=[])
    outcome = cut_by_provider(context, message, text, now=at, note=note, info=info)
    record_outcome(connection, session_id, outcome, recorded, at=at)


def _record_provider_call(
    connection: Connection,
    session_id: str,
    outcome: Outcome,
    cut: Cut,
    at: float,
    prices: PriceTable | None,
) -> None:
    """The provider compaction's own call in the ledger: its billed tokens are the
    ``compaction`` iterations (none in the top-level counts), at its model's prices."""
    model = cut.summary.model if cut.summary is not None else None
    try:
        ledger = call_usage(model=model, iterations=[dict(i) for i in cut.iterations])
    except InvalidInputError:
        return  # a usage the ledger cannot read: the compaction still stands
    cost = usage_cost(prices, ledger) if prices is not None else None
    model_calls.insert_calls(
        connection,
        session_id,
        [
            model_calls.ModelCall(
                outcome.start.last_seq,
                outcome.tokens_before,
                None,
                at,
                ledger=ledger,
                cost_usd=cost,
            )
        ],
    )


def record_server_edits(
    connection: Connection,
    session_id: str,
    context: ActiveContext,
    edits: list[dict[str, Any]],
    *,
    edit_policy: str,
    at: float,
) -> int:
    """Record the server-side edits a response reports the provider applied to the request
    it answered (``context_management.applied_edits``) as a ``clear`` compaction with
    trigger ``server``. The provider edited its copy of the request, not the log nor the
    wire view: no message changes (so no thinking block's prefix does), nothing to undo or
    run again."""
    freed = cleared_tokens(edits)
    detail = "; ".join(_server_edit_note(edit) for edit in edits)
    step = CompactionStep(
        strategy=CompactStrategy.CLEAR,
        trigger=CompactTrigger.SERVER,
        tokens_freed=freed,
        detail=detail,
    )
    return repo.insert_compaction(
        connection,
        session_id,
        trigger=CompactTrigger.SERVER.value,
        strategy=CompactStrategy.CLEAR.value,
        success=True,
        tokens_before=context.usage,
        tokens_after=max(0, context.usage - freed),
        tokens_freed=freed,
        summary_text="",
        boundary_id=None,
        created_at=at,
        steps=repo.dumps([step.model_dump(mode="json")]),
        config=context.config.model_dump_json(),
        removed_seqs="[]",
        cleared_tool_calls="[]",
        blob_ids="[]",
        instructions=None,
        error=None,
        inputs=ServerRun(
            call="server", now=at, last_seq=context.last_seq, applied_edits=edits
        ).model_dump_json(),
        replay_of=None,
        edit_policy=edit_policy,
    )


def _server_edit_note(edit: dict[str, Any]) -> str:
    kind, tokens = str(edit.get("type", "?")), edit.get("cleared_input_tokens", 0)
    if "cleared_tool_uses" in edit:
        return f"{kind}: {edit['cleared_tool_uses']} tool uses, {tokens} tokens"
    if "cleared_thinking_turns" in edit:
        return f"{kind}: {edit['cleared_thinking_turns']} thinking turns, {tokens} tokens"
    return kind
