"""The cache-aware cost rule of in-place edits (compactstore._engines.cache_rule), as the
pure function it is: microcompact's clears and the tool-result budget's placeholders of
content already sent wait while the cache reads they save within the cache's lifetime are
worth less than writing the cached prefix from the edit point again; the window needing
the room overrides it; a deferral is the stage's detail (a step of the history)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from compactstore._context.active import ActiveContext
from compactstore._engines import cache_rule, microcompact, tool_budget
from compactstore._engines.base import EngineInputs, StageResult
from compactstore.models import CompactionConfig, CompactTrigger
from tests.engines.builder import ContextBuilder
from tests.helpers import words

NOW = 1_700_010_000.0
READ = 0.1  # cache read price, a multiple of input
WRITE = 1.25  # the 5-minute write
TTL = 300.0


def warm(context: ActiveContext, **kwargs: object) -> EngineInputs:
    """Inputs of a session whose newest call, 10 s ago, sent the whole context."""
    fields: dict[str, object] = {
        "now": NOW,
        "last_microcompact_at": NOW - 3_601,  # microcompact's interval trigger is due
        "edit_policy": "rewrite",
        "last_call_at": NOW - 10,
        "sent_seq": context.last_seq,
        "cache_read": READ,
    }
    fields.update(kwargs)
    return EngineInputs(**fields)  # type: ignore[arg-type]


def break_even_gap(before: ActiveContext, stage: StageResult) -> float:
    """The call gap at which the edit's saving equals its rewrite, from the edit itself:
    freed tokens x READ x (TTL / gap) = rewritten tokens x (WRITE - READ)."""
    after = stage.context
    edited = {edit.seq for edit in stage.edits}
    first = min(i for i, item in enumerate(before.kept) if item.seq in edited)
    rewritten = sum(item.tokens for item in after.kept[first:])
    freed = before.usage - after.usage
    calls = rewritten * (WRITE - READ) / (freed * READ)
    assert calls > 1.1, "the break-even must be within the TTL for this test to mean anything"
    return TTL / calls


def results_context(**config: object) -> ActiveContext:
    built = ContextBuilder(config=CompactionConfig(token_factor=1.0, **config))
    built.request("Investigate the failing build.")
    for i in range(8):
        built.tool("read_file", {"path": f"f{i}"}, words(800, f"f{i}"))
    return built.chatter(6, chars=2_000).build()


def test_a_clear_waits_below_the_break_even_and_goes_ahead_above_it() -> None:
    context = results_context()
    unpriced = microcompact.run(context, warm(context, last_call_at=None))  # no call: no rule
    assert unpriced.effective and len(unpriced.edits) == 3
    gap = break_even_gap(context, unpriced)

    fewer_calls = microcompact.run(context, warm(context, call_gap=gap * 1.05))
    assert not fewer_calls.applied and fewer_calls.attempted
    assert fewer_calls.context is context and fewer_calls.tokens_freed == 0
    assert fewer_calls.detail.startswith("deferred: clearing 3 tool results")

    more_calls = microcompact.run(context, warm(context, call_gap=gap * 0.95))
    assert more_calls.effective and more_calls.context == unpriced.context


def test_the_window_needing_the_room_overrides_the_deferral() -> None:
    context = results_context()
    gap = break_even_gap(context, microcompact.run(context, warm(context, last_call_at=None)))
    assert not microcompact.run(context, warm(context, call_gap=gap * 2)).applied

    full = replace(context, context_window=int(context.usage / 0.85))
    assert full.usage >= 0.85 * full.context_window
    stage = microcompact.run(full, warm(full, call_gap=gap * 2))
    assert stage.effective and "deferred" not in stage.detail


def test_a_cold_cache_a_policy_or_no_cache_awareness_lets_the_clear_through() -> None:
    context = results_context()
    slow = warm(context, call_gap=10_000.0)  # far beyond the break-even
    assert not microcompact.run(context, slow).applied
    assert microcompact.run(context, replace(slow, last_call_at=NOW - TTL)).effective  # cold
    assert microcompact.run(context, replace(slow, edit_policy="append_only")).effective
    unaware = results_context(cache_aware=False)
    assert microcompact.run(unaware, warm(unaware, call_gap=10_000.0)).effective


def budget_context(*, sent_big: int, unsent_big: int) -> tuple[ActiveContext, int]:
    """Oversized results (over the 4,000-char budget) the newest call sent, a long tail
    after them, then oversized results appended since; and the seq that call ended at."""
    built = ContextBuilder(config=CompactionConfig(token_factor=1.0))
    built.request("Read the logs.")
    for i in range(sent_big):
        built.tool("read_log", {"n": i}, words(6_000, f"log{i}"))
    built.chatter(10, chars=3_000)
    sent = len(built.items) - 1
    for i in range(unsent_big):
        built.tool("read_log", {"n": 100 + i}, words(6_000, f"new{i}"))
    return built.build(), sent


def test_a_placeholder_of_a_sent_result_follows_the_same_rule() -> None:
    context, sent = budget_context(sent_big=1, unsent_big=0)
    unpriced = tool_budget.run(context, warm(context, sent_seq=sent, last_call_at=None))
    assert unpriced.effective and len(unpriced.blobs) == 1
    gap = break_even_gap(context, unpriced)

    waits = tool_budget.run(context, warm(context, sent_seq=sent, call_gap=gap * 1.05))
    assert not waits.applied and waits.attempted and not waits.blobs
    assert waits.detail.startswith("deferred: placeholders for 1 tool results")

    goes = tool_budget.run(context, warm(context, sent_seq=sent, call_gap=gap * 0.95))
    assert goes.effective and goes.context == unpriced.context
    assert "deferred" not in goes.detail

    full = replace(context, context_window=int(context.usage / 0.85))
    overridden = tool_budget.run(full, warm(full, sent_seq=sent, call_gap=gap * 2))
    assert overridden.effective and "deferred" not in overridden.detail


def test_results_not_sent_yet_are_persisted_while_the_sent_one_waits() -> None:
    context, sent = budget_context(sent_big=1, unsent_big=2)
    stage = tool_budget.run(context, warm(context, sent_seq=sent, call_gap=10_000.0))
    assert stage.effective
    assert [edit.seq > sent for edit in stage.edits] == [True, True]
    assert "persisted 2 tool results; deferred: placeholders for 3 tool results" in stage.detail
    # No call recorded yet: everything over the budget goes.
    assert len(tool_budget.run(context, warm(context, last_call_at=None)).blobs) == 3


@pytest.mark.parametrize(
    ("configured", "gap", "expected"),
    [(300.0, None, 300.0), (300.0, 60.0, 300.0), (300.0, 600.0, 3_600.0), (None, 60.0, 300.0)],
)
def test_the_ttl_follows_the_cache_the_session_writes(
    configured: float | None, gap: float | None, expected: float
) -> None:
    """Calls 5 minutes to an hour apart write 1-hour entries: the cache stays warm an hour."""
    config = CompactionConfig(cache_ttl_seconds=configured)
    context = results_context()
    assert cache_rule.cache_ttl(config, warm(context, call_gap=gap)) == expected


def test_the_cache_trigger_counts_from_the_newest_call_the_ledger_recorded() -> None:
    context = results_context()  # its messages are hours old
    no_calls = EngineInputs(now=NOW, last_microcompact_at=NOW)
    assert microcompact.due(context, no_calls) == CompactTrigger.MICROCOMPACT_CACHED
    recent = replace(no_calls, last_call_at=NOW - TTL)
    assert cache_rule.cache_age(context, recent) == TTL
    assert microcompact.due(context, recent) is None
    assert microcompact.due(context, replace(recent, last_call_at=NOW - TTL - 1)) is not None
    # Calls ten minutes apart write for an hour: 11 minutes after the last one it is warm.
    hourly = replace(no_calls, last_call_at=NOW - 660, call_gap=600.0)
    assert microcompact.due(context, hourly) is None
    off = results_context(cache_ttl_seconds=None)
    assert microcompact.due(off, no_calls) is None
