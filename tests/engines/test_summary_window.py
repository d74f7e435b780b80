"""The summary's budget scales with the window: at most ``summary_max_window_share`` of it
(in the session's tokens, its factor applied), and never more than ``summary_max_tokens``.

With only ``summary_max_tokens`` (6,000), a small window's summary grew past what any
compaction could get under the auto-compact threshold: on an 8,192-token window the
breaker tripped and the context went on growing.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from compactstore._context.tokens import estimate_tokens
from compactstore._engines import full_compact, summary
from compactstore._engines.base import EngineInputs
from compactstore.models import (
    CompactionConfig,
    CompactTrigger,
    CurrentWork,
    ErrorEntry,
    FileEntry,
    Instruction,
    Plan,
    PlanItem,
    SummaryState,
)
from tests.engines.builder import ContextBuilder
from tests.helpers import words

NOW = 1_700_010_000.0
# From the smallest window a session accepts to the largest models'.
WINDOWS = [1_000, 2_048, 4_096, 8_192, 16_384, 32_768, 128_000, 200_000, 1_000_000]
# The range a learnt factor may take (0.5-4.0), the article's 1.0 and the default 1.6.
FACTORS = [0.5, 1.0, 1.6, 4.0]


def _crowded() -> SummaryState:
    """A state with more of everything than any budget holds."""
    return SummaryState(
        original_request=words(2_000, "request"),
        instructions=tuple(Instruction(seq=10 + i, text=words(300, f"i{i}")) for i in range(1_000)),
        plan=Plan(
            seq=5,
            tool="TodoWrite",
            items=tuple(PlanItem(text=words(80, f"p{i}")) for i in range(20)),
        ),
        current_work=CurrentWork(seq=4_000, text=words(2_000, "work"), next_step="Next I'll test."),
        files=tuple(
            FileEntry(path=f"src/pkg{i}/module_{i}.py", actions=("read",), seq=i) for i in range(80)
        ),
        errors=tuple(
            ErrorEntry(tool="Bash", key=f"k{i}", text=words(160, f"e{i}"), seq=i) for i in range(5)
        ),
        compactions=12,
        messages_removed=4_000,
        first_seq=1,
        last_seq=4_000,
    )


CROWDED = _crowded()


def context_of(window: int, factor: float, **config: object) -> ContextBuilder:
    built = ContextBuilder(
        context_window=window, config=CompactionConfig(token_factor=factor, **config)
    )
    return built.request("Port the parser.").chatter(6, chars=100)


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("factor", FACTORS)
def test_a_summary_takes_at_most_its_share_of_any_window(window: int, factor: float) -> None:
    context = context_of(window, factor).build()
    config = context.config

    text, written = full_compact.rule_summary(context, CROWDED, "Full Compact", NOW)

    tokens = estimate_tokens(text)
    assert tokens <= config.summary_max_tokens
    assert tokens * factor <= config.summary_max_window_share * window
    assert text.startswith("[Context compacted at") and text.endswith("left off.")
    assert len(written.instructions) < 400  # the oldest were folded to fit


@pytest.mark.slow
@pytest.mark.parametrize("factor", FACTORS)
def test_a_large_window_keeps_the_summary_max_tokens_budget(factor: float) -> None:
    """Where the window's share is more than summary_max_tokens, the budget is the one
    summaries always had, so their text is unchanged."""
    config = CompactionConfig(token_factor=factor)
    smallest = config.summary_max_tokens * factor / config.summary_max_window_share
    unbounded = context_of(10_000_000, factor).build()
    same, _ = full_compact.rule_summary(unbounded, CROWDED, "Full Compact", NOW)
    for window in (int(smallest) + 1, 2 * int(smallest)):
        context = context_of(window, factor).build()
        assert summary.budget_for(context) == config.summary_max_tokens
        text, _ = full_compact.rule_summary(context, CROWDED, "Full Compact", NOW)
        assert text == same


def test_the_share_is_configurable_and_the_smaller_bound_wins() -> None:
    shares = [0.02, 0.05, 0.1, 0.15]
    budgets = [
        summary.budget_for(context_of(32_768, 1.0, summary_max_window_share=s).build())
        for s in shares
    ]
    assert budgets == sorted(budgets) and len(set(budgets)) == len(budgets)
    assert all(b <= s * 32_768 for b, s in zip(budgets, shares, strict=True))
    small_cap = context_of(32_768, 1.0, summary_max_tokens=500).build()
    assert summary.budget_for(small_cap) == 500


def test_the_learnt_factor_shrinks_the_budget_in_counted_tokens() -> None:
    context = context_of(8_192, 1.6).build()
    learnt = replace(context, token_factor=3.2)
    assert summary.budget_for(learnt) * 2 <= summary.budget_for(context) + 1


def test_a_full_compact_on_a_small_window_gets_under_the_threshold_with_a_crowded_summary() -> None:
    """What tripped the breaker: the folded summary alone was larger than the window."""
    built = ContextBuilder(context_window=8_192, config=CompactionConfig())
    built.request("Port the parser.")
    for i in range(40):
        built.tool("Read", {"file_path": f"src/m{i}.py"}, words(600, f"r{i}"))
    context = built.build()
    inputs = EngineInputs(now=NOW, summary_state=CROWDED)

    stage = full_compact.run(context, inputs, trigger=CompactTrigger.AUTO)

    assert stage.effective
    assert stage.context.usage < 0.85 * context.context_window
