"""The rows a compaction outcome writes, built as pure functions
(compactstore._core.outcome_rows): no database, the outcomes of the engines on in-memory
contexts. The writes themselves are checked through the public API elsewhere
(test_compaction_steps, test_replay, test_caching)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace

from compactstore._core.outcome_rows import (
    boundary_values,
    changed_after_seq,
    outcome_rows,
    recorded_result,
)
from compactstore._core.replay_inputs import EngineRun
from compactstore._engines import pipeline
from compactstore._engines.base import EngineInputs
from compactstore._engines.pipeline import Outcome
from compactstore.models import CompactStrategy, SummaryInfo
from tests.engines.builder import ContextBuilder
from tests.helpers import words

NOW = 1_700_010_000.0


def manual_outcome() -> tuple[Outcome, EngineRun]:
    context = ContextBuilder().request("Fix the flaky test.").chatter(30).build()
    inputs = EngineInputs(now=NOW)
    return pipeline.manual(context, inputs, up_to_seq=None), EngineRun.of(
        "manual", inputs, context, {}
    )


def with_summary(outcome: Outcome, info: SummaryInfo) -> Outcome:
    """The outcome with its cut's summary written by ``info`` (as a summarizer's is)."""
    stage = outcome.cut_stage
    assert stage is not None and stage.cut is not None
    stages = [
        replace(each, cut=replace(stage.cut, summary=info)) if each is stage else each
        for each in outcome.stages
    ]
    return replace(outcome, stages=stages)


def test_a_cut_writes_a_boundary_and_a_row_naming_what_it_removed() -> None:
    outcome, recorded = manual_outcome()
    cut = outcome.cut
    assert cut is not None
    rows = outcome_rows(outcome, recorded, at=NOW, instructions="keep the tests")
    assert rows.boundary is not None and rows.compaction is not None
    boundary = rows.boundary
    assert (boundary.id, boundary.strategy, boundary.trigger) == (0, "full", "manual")
    assert boundary.first_kept_seq == cut.first_kept_seq
    assert boundary.messages_removed == len(cut.removed_seqs)
    assert boundary.summary_text == cut.summary_text and boundary.parent_id is None
    assert (boundary.tokens_before, boundary.tokens_after) == (
        outcome.start.usage,
        outcome.context.usage,
    )
    assert "id" not in boundary_values(boundary) and "rolled_back_at" not in boundary_values(
        boundary
    )
    row = rows.compaction
    assert json.loads(row["removed_seqs"]) == list(cut.removed_seqs)
    assert row["boundary_id"] is None  # the write sets it
    assert row["tokens_freed"] == outcome.start.usage - outcome.context.usage > 0
    assert row["instructions"] == "keep the tests" and row["created_at"] == NOW
    assert json.loads(row["inputs"])["call"] == "manual"
    assert [step["strategy"] for step in json.loads(row["steps"])] == ["full"]
    # Every kept message's prefix changed: the cut is before the first one kept.
    assert row["changed_after_seq"] == outcome.start.first_kept_seq - 1
    assert rows.edits == [] and rows.blobs == []
    assert rows.session == {"real_tokens": None, "real_estimate": None}
    assert rows.breaker == {} and not rows.count_fallback


def test_a_tool_budget_writes_edits_and_blobs_with_their_digest() -> None:
    long = words(9_000, "long")
    context = (
        ContextBuilder()
        .request("Read the file.")
        .tool("read_file", {"path": "big.txt"}, long)
        .chatter(2)
        .build()
    )
    inputs = EngineInputs(now=NOW, next_blob_id=7, last_microcompact_at=NOW)
    outcome = pipeline.process(context, inputs)
    assert outcome.strategy == CompactStrategy.TOOL_BUDGET
    rows = outcome_rows(outcome, EngineRun.of("process", inputs, context, {}), at=NOW)
    assert rows.boundary is None
    assert [(row["seq"], row["kind"]) for row in rows.edits] == [(2, outcome.edits[0].state)]
    assert "compaction_id" not in rows.edits[0]  # the write sets it
    [blob] = rows.blobs
    assert (blob["id"], blob["seq"], blob["tool_name"]) == (7, 2, "read_file")
    assert blob["sha256"] == hashlib.sha256(long.encode()).hexdigest()
    assert blob["size"] == len(long.encode()) and blob["created_at"] == NOW
    assert rows.compaction is not None
    assert json.loads(rows.compaction["blob_ids"]) == [7]
    assert rows.compaction["changed_after_seq"] == 2  # the edited seq; no cut


def test_an_outcome_with_counters_only_writes_no_row() -> None:
    context = ContextBuilder().request("Hello.").build()
    outcome = Outcome(context, context, [], consecutive_failures=2, tripped=False)
    inputs = EngineInputs(now=NOW)
    rows = outcome_rows(outcome, EngineRun.of("process", inputs, context, {}), at=NOW)
    assert rows.compaction is None and rows.boundary is None
    assert rows.breaker == {"consecutive_failures": 2, "tripped": False}
    assert rows.breaker_only and changed_after_seq(outcome) is None


def test_a_summarizer_summary_resets_the_fallbacks_and_a_fallback_counts_one() -> None:
    outcome, recorded = manual_outcome()
    written = with_summary(outcome, SummaryInfo(source="summarizer", summarizer="mine"))
    rows = outcome_rows(written, recorded, at=NOW)
    assert rows.breaker == {"consecutive_fallbacks": 0} and not rows.count_fallback
    assert rows.compaction is not None
    assert (rows.compaction["summary_source"], rows.compaction["summarizer"]) == (
        "summarizer",
        "mine",
    )
    fallback = with_summary(outcome, SummaryInfo(source="rule", fallback=True, reason="timeout"))
    rows = outcome_rows(fallback, recorded, at=NOW)
    assert rows.breaker == {} and rows.count_fallback
    assert rows.compaction is not None and rows.compaction["summarizer_reason"] == "timeout"


def test_the_recorded_result_is_the_outcome_with_its_ids() -> None:
    outcome, _ = manual_outcome()
    result = recorded_result(outcome, 12, None, at=NOW, error="prompt is too long")
    assert (result.id, result.created_at, result.error) == (12, NOW, "prompt is too long")
    assert result.success and result.strategy == CompactStrategy.FULL
    assert result.tokens_freed == outcome.tokens_before - outcome.tokens_after
    assert tuple(result.messages) == tuple(outcome.context.wire)
