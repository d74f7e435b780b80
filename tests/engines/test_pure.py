"""The engines on in-memory contexts: what each stage decides, with no database in sight.

The store-level tests beside this file check the same stages through the public API; these
check the decisions themselves, fast, over many shapes of context.
"""

from __future__ import annotations

import pytest

from compactstore._engines import full_compact, microcompact, pipeline, tool_budget
from compactstore._engines.base import EngineInputs
from compactstore.models import CompactionConfig, CompactStrategy, CompactTrigger
from tests.engines.builder import ContextBuilder, valid
from tests.helpers import words

NOW = 1_700_010_000.0
FORMATS = ["anthropic", "openai", "minicode"]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("tools", [0, 3, 12])
def test_full_compact_keeps_pairs_and_the_request_and_frees_tokens(fmt: str, tools: int) -> None:
    built = ContextBuilder(fmt).request("Port the parser to Rust.").chatter(20)
    for i in range(tools):
        built.tool("read_file", {"path": f"src/m{i}.py"}, words(600, f"r{i}"))
    built.chatter(6)
    context = built.build()
    stage = full_compact.run(context, EngineInputs(now=NOW), trigger=CompactTrigger.MANUAL)
    assert stage.effective and stage.cut is not None
    after = stage.context
    assert valid(after)
    assert after.usage < context.usage
    assert after.head[0].seq == 0  # the pinned request stays, verbatim
    assert "Port the parser to Rust." in stage.cut.summary_text
    assert set(stage.cut.removed_seqs).isdisjoint(i.seq for i in after.items)


def test_full_compact_is_deterministic() -> None:
    context = ContextBuilder().request("Fix the flaky test.").chatter(30).build()
    inputs = EngineInputs(now=NOW)
    first = full_compact.run(context, inputs, trigger=CompactTrigger.AUTO)
    second = full_compact.run(context, inputs, trigger=CompactTrigger.AUTO)
    assert first.cut == second.cut and first.context.messages() == second.context.messages()


def test_tool_budget_persists_long_results_only() -> None:
    long, short = words(9_000, "long"), words(1_000, "short")
    context = (
        ContextBuilder()
        .request("Read both files.")
        .tool("read_file", {"path": "big.txt"}, long)
        .tool("read_file", {"path": "small.txt"}, short)
        .chatter(2)
        .build()
    )
    stage = tool_budget.run(context, EngineInputs(now=NOW, next_blob_id=7))
    assert stage.effective
    assert [(blob.id, blob.content) for blob in stage.blobs] == [(7, long)]
    assert [edit.seq for edit in stage.edits] == [2]
    assert valid(stage.context)


def test_microcompact_clears_all_but_the_newest_results_once_the_interval_passed() -> None:
    # The interval trigger alone (the builder's messages are hours old: a cold cache).
    config = CompactionConfig(token_factor=1.0, microcompact_keep_recent=2, cache_ttl_seconds=None)
    built = ContextBuilder(config=config)
    built.request("Look around.")
    for i in range(5):
        built.tool("read_file", {"path": f"f{i}"}, words(800, f"f{i}"))
    context = built.build()
    early = microcompact.run(context, EngineInputs(now=NOW, last_microcompact_at=NOW - 10))
    assert not early.attempted
    stage = microcompact.run(context, EngineInputs(now=NOW, last_microcompact_at=NOW - 3_601))
    assert stage.effective and stage.trigger == CompactTrigger.MICROCOMPACT_TIME
    assert [edit.seq for edit in stage.edits] == [2, 4, 6]
    assert valid(stage.context)


def test_the_pipeline_compacts_over_the_threshold_and_not_under_it() -> None:
    built = ContextBuilder(context_window=20_000).request("Write the migration.").chatter(10)
    quiet = pipeline.process(built.build(), EngineInputs(now=NOW, last_microcompact_at=NOW))
    assert quiet.stages == [] and not quiet.success
    loud = pipeline.process(
        built.chatter(200).build(), EngineInputs(now=NOW, last_microcompact_at=NOW)
    )
    assert loud.success and loud.strategy == CompactStrategy.FULL
    assert loud.context.usage < 0.85 * 20_000
    assert valid(loud.context)
