"""Stage 7, reactive recovery: after "prompt too long", attempt 1 forces a full
compact and succeeds below 87.3% of the window; otherwise attempts 1, 2, 3 truncate to the
newest 40%, 30%, 20% of the messages (never fewer than 3 or 15%), pairs intact, behind a
note; attempt 4 gives up. The attempt counter persists and record_usage() resets it.

The store's recovery is always rule-based; the engine tests give the full compact
a summary service whose output size they choose: a one-token summary shows where the cut
lands, a summary of a chosen size lands the usage on an exact token count, and an oversized
one makes the full compact fail, so truncation runs on the whole context.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import pytest

from compactstore import (
    CompactStore,
    CompactStoreWarning,
    CompactStrategy,
    CompactTrigger,
)
from compactstore._context.active import ActiveContext, ContextMessage
from compactstore._engines import pipeline
from compactstore._engines.base import EngineInputs, SummaryAnswer, SummaryRequest
from compactstore._engines.pipeline import Outcome
from compactstore.models import SummaryInfo, SummaryState
from tests.engines.builder import ContextBuilder, valid
from tests.helpers import (
    T0,
    Chat,
    assistant,
    call_id,
    new_session,
    opened,
    pair_problems,
    plain,
    result_map,
    text_of,
    user,
    words,
)

ERROR = "prompt is too long: 210000 tokens > 200000 maximum"
LIMIT = Fraction(873, 1000)  # 97% blocking limit x 0.9
BLOATED = -1  # summary size meaning "larger than anything it could replace"


class SizedSummarizer:
    """A summary service (the engines' side of a summarizer) writing summaries of
    ``tokens`` estimated tokens (ASCII, 4 characters a token). The store never gives one
    to reactive recovery (the documentation: always rule-based), so these tests run the engine."""

    def __init__(self) -> None:
        self.tokens = 1

    def __call__(self, request: SummaryRequest) -> SummaryAnswer:
        text = words(2_000_000, "bloated") if self.tokens == BLOATED else "s" * (4 * self.tokens)
        return SummaryAnswer(text, SummaryInfo(source="summarizer", summarizer="sized"))


def long_chat(store: CompactStore, sid: str, window: int) -> Chat:
    chat = new_session(store, "anthropic", context_window=window, sid=sid)
    chat.request("Migrate the billing service to the new queue")
    chat.chatter(30, chars=1_600)  # 30 messages of ~400 tokens
    return chat


def recover(
    context: ActiveContext, summarizer: SizedSummarizer, *, attempts: int = 0
) -> Outcome | None:
    """The next reactive attempt on ``context``, with the sized summary."""
    boundary = context.boundary
    inputs = EngineInputs(
        now=T0 + 100,
        summarizer=summarizer,
        reactive_attempts=attempts,
        summary_state=boundary.summary_state if boundary is not None else SummaryState(),
    )
    return pipeline.recover(context, inputs)


def long_context(window: int) -> ActiveContext:
    builder = ContextBuilder(context_window=window)
    builder.request("Migrate the billing service to the new queue")
    return builder.chatter(30, chars=1_600).build()  # 30 messages of ~400 tokens


def kept_of(context: ActiveContext) -> int:
    """How many log messages follow the cut (the verbatim part)."""
    return sum(1 for item in context.kept if item.seq is not None)


def head_texts(context: ActiveContext) -> list[str]:
    """Texts of the head: the pins and the summary / truncation note."""
    return [text_of(item.message) for item in context.head]


def more(context: ActiveContext, count: int, tag: str) -> ActiveContext:
    """``context`` with ``count`` more chatter messages of 100 tokens appended."""
    added = [
        ContextMessage.build(
            context.fmt,
            message,
            tokens=context.message_tokens(message),
            seq=context.last_seq + 1 + i,
            state="original",
        )
        for i, message in enumerate(
            assistant(words(400, f"{tag}{i}")) if i % 2 == 0 else user(words(400, f"{tag}{i}"))
            for i in range(count)
        )
    ]
    return context.extended(
        added,
        last_seq=context.last_seq + count,
        usage_offset=context.usage_offset,
        token_factor=context.token_factor,
        config=context.config,
    )


def landing_at(window: int, usage: int) -> Outcome:
    """Attempt 1 on a long context, its full compact leaving exactly ``usage`` tokens."""
    context = long_context(window)
    sized = SizedSummarizer()
    probe = recover(context, sized)
    assert probe is not None
    sized.tokens = 1 + usage - probe.stages[0].tokens_after
    outcome = recover(context, sized)
    assert outcome is not None
    full = outcome.stages[0]
    assert full.strategy == CompactStrategy.FULL and full.trigger == CompactTrigger.REACTIVE
    assert full.tokens_after == usage, "the full compact landed there"
    return outcome


def test_attempt_1_is_a_full_compact_that_succeeds_only_below_87_3_percent() -> None:
    limit = math.ceil(LIMIT * 10_000)  # 8,730: the first usage that is not below 87.3%

    below = landing_at(10_000, limit - 1)

    assert below.context.usage == limit - 1
    assert below.reactive_attempts == 0, "success resets the counter"
    assert below.success and below.strategy == CompactStrategy.FULL
    assert below.trigger == CompactTrigger.REACTIVE
    assert [s.strategy for s in below.stages] == [CompactStrategy.FULL]

    at = landing_at(10_000, limit)

    assert at.reactive_attempts == 1
    assert [s.strategy for s in at.stages] == [CompactStrategy.FULL, CompactStrategy.REACTIVE]
    assert at.strategy == CompactStrategy.REACTIVE
    assert at.context.usage < limit - 1

    # 87.3% of 10,010 is 8,738.73: 8,738 tokens are below it.
    odd = landing_at(10_010, math.ceil(LIMIT * 10_010) - 1)

    assert odd.reactive_attempts == 0
    assert odd.strategy == CompactStrategy.FULL


def test_attempts_truncate_to_40_30_20_percent_then_attempt_4_gives_up() -> None:
    bloated = SizedSummarizer()
    bloated.tokens = BLOATED  # the forced full compact cannot help
    builder = ContextBuilder(fmt="openai", context_window=2_000)
    builder.request("Keep the agent alive")
    context = builder.chatter(120, chars=400).build()  # 100 tokens each, far over the window
    before = len(context.kept)

    first = recover(context, bloated)

    assert first is not None and first.success
    assert first.strategy == CompactStrategy.REACTIVE
    assert first.trigger == CompactTrigger.REACTIVE
    full, truncation = first.stages
    assert full.strategy == CompactStrategy.FULL and not full.effective
    assert truncation.strategy == CompactStrategy.REACTIVE and truncation.effective
    assert kept_of(first.context) == math.floor(before * Fraction(4, 10)) == 48
    assert first.reactive_attempts == 1
    assert any("attempt 1" in note for note in head_texts(first.context)), "a note for the cut"
    assert valid(first.context)

    context = first.context
    for attempt, fraction in ((2, Fraction(3, 10)), (3, Fraction(2, 10))):
        context = more(context, 100 - kept_of(context), f"a{attempt}")
        assert kept_of(context) == 100
        result = recover(context, bloated, attempts=attempt - 1)
        assert result is not None and result.success
        assert result.strategy == CompactStrategy.REACTIVE
        assert [s.strategy for s in result.stages] == [CompactStrategy.REACTIVE]
        context = result.context
        assert kept_of(context) == 100 * fraction
        assert context.kept[-1].seq == context.last_seq, "the newest message is kept"
        assert result.reactive_attempts == attempt
        assert any(f"attempt {attempt}" in note for note in head_texts(context))

    assert recover(context, bloated, attempts=3) is None


def test_truncation_keeps_at_least_3_messages_and_15_percent() -> None:
    bloated = SizedSummarizer()
    bloated.tokens = BLOATED
    config = plain(reactive_keep_fractions=(0.02, 0.3, 0.1))
    builder = ContextBuilder(fmt="minicode", context_window=2_000, config=config)
    builder.request("Short")
    outcome = recover(builder.chatter(10, chars=1_000).build(), bloated)

    assert outcome is not None
    assert kept_of(outcome.context) == 3  # 2% (or 15%) of 11 is less than 3 messages

    builder = ContextBuilder(fmt="minicode", context_window=2_000, config=config)
    builder.request("Long")
    context = builder.chatter(99, chars=400).build()
    for attempts in (0, 1):
        outcome = recover(context, bloated, attempts=attempts)
        assert outcome is not None
        context = outcome.context
    context = more(context, 100 - kept_of(context), "more")
    assert kept_of(context) == 100

    outcome = recover(context, bloated, attempts=2)

    assert outcome is not None
    assert kept_of(outcome.context) == 15  # 10% asked, 15% kept


def test_truncation_never_goes_below_3_messages() -> None:
    sized = SizedSummarizer()
    builder = ContextBuilder(fmt="minicode", context_window=20_000)
    builder.request("Tiny")
    context = builder.chatter(9, chars=2_000).build()  # 500 tokens each
    compacted = pipeline.manual(
        context, EngineInputs(now=T0 + 1, summarizer=sized), up_to_seq=None
    ).context  # the newest third stays: 3 messages, 1,500 tokens
    assert kept_of(compacted) == 3
    sized.tokens = BLOATED

    outcome = recover(compacted, sized)

    assert outcome is not None
    assert kept_of(outcome.context) == 3


def test_the_store_recovers_with_the_rule_based_summary_even_with_a_summarizer(
    db_url: str,
) -> None:
    """the agent is blocked, so reactive recovery never calls a summarizer."""
    calls: list[int] = []

    def summarizer(messages: list[dict[str, Any]], previous: str | None, note: str | None) -> str:
        calls.append(len(messages))
        return "an LLM summary"

    with opened(db_url, summarizer=summarizer) as store:
        chat = long_chat(store, "s", 10_000)

        result = chat.sess.reactive_recover(ERROR, now=T0 + 1)

        assert result is not None and result.effective
        assert calls == []
        assert "Full Compact" in result.summary_text and "an LLM summary" not in result.summary_text
        assert result.summary is None, "no summarizer was asked"


@pytest.mark.slow_on_postgres
def test_the_attempt_counter_persists_and_record_usage_resets_it(
    store: CompactStore, reopen: Callable[[], CompactStore]
) -> None:
    chat = new_session(store, "anthropic", context_window=2_000)
    chat.request("Keep going")
    chat.chatter(120, chars=400)
    # A newest message larger than the window: attempt 1's full compact cannot get under the
    # limit, so the attempt is counted.
    chat.user(words(14_000, "big"))
    assert chat.sess.reactive_recover(ERROR, now=T0 + 1) is not None

    again = reopen().session("s")
    assert again.breaker().reactive_attempts == 1

    # Below half the (bloated) estimate: not used for calibration, but the call went through.
    with pytest.warns(CompactStoreWarning, match="not used for calibration"):
        assert again.record_usage(1_500) is False

    assert again.breaker().reactive_attempts == 0
    result = again.reactive_recover(ERROR, now=T0 + 2)
    assert result is not None and result.steps[0].strategy == CompactStrategy.FULL, "attempt 1"


def test_oversized_tool_results_in_the_kept_part_are_persisted(store: CompactStore) -> None:
    chat = new_session(store, "anthropic", context_window=1_000)  # limit: 873 tokens
    chat.request("Read the four reports")
    contents = [words(3_900, f"report{i}") for i in range(4)]  # under the 4,000-char budget
    chat.tool_turns(
        [("read_file", {"path": f"r{i}.txt"}, c, False) for i, c in enumerate(contents)]
    )
    original = dict(zip([call_id("anthropic", n) for n in range(1, 5)], contents, strict=True))

    result = chat.sess.reactive_recover(ERROR, now=T0 + 1)

    # Even the kept messages (the newest pair, ~975 tokens) exceed the limit, so their
    # results are persisted although each is under 4,000 characters.
    assert result is not None and result.effective
    shown = result_map("anthropic", chat.sess.active_context())
    assert shown, "the newest pair is kept"
    assert sorted(result.cleared_tool_use_ids) == sorted(shown)
    assert len(result.blob_ids) == len(shown)
    assert sorted(chat.sess.get_blob(b) for b in result.blob_ids) == sorted(
        original[i] for i in shown
    )
    assert all(len(stub) <= 500 for stub in shown.values())
    assert pair_problems("anthropic", chat.sess.active_context()) == []
    assert chat.sess.token_usage() < LIMIT * 1_000
