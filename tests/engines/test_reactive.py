"""Stage 7, reactive recovery (SPEC §5.7): after "prompt too long", attempt 1 forces a full
compact and succeeds below 87.3% of the window; otherwise attempts 1, 2, 3 truncate to the
newest 40%, 30%, 20% of the messages (never fewer than 3 or 15%), pairs intact, behind a
note; attempt 4 gives up. The attempt counter persists and record_usage() resets it.

The full compact's summary comes from a summarizer whose output size the tests choose: a
one-token summary shows where the cut lands, a summary of a chosen size lands the usage on
an exact token count, and an oversized one makes the full compact fail, so truncation runs
on the whole context.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from fractions import Fraction
from typing import Any

import pytest

from compactstore import (
    CompactStore,
    CompactStoreWarning,
    CompactStrategy,
    CompactTrigger,
)
from tests.helpers import (
    T0,
    Chat,
    call_id,
    new_session,
    opened,
    pair_problems,
    plain,
    result_map,
    text_of,
    words,
)

ERROR = "prompt is too long: 210000 tokens > 200000 maximum"
LIMIT = Fraction(873, 1000)  # 97% blocking limit x 0.9
BLOATED = -1  # summary size meaning "larger than anything it could replace"


class SizedSummarizer:
    """Writes summaries of ``tokens`` estimated tokens (ASCII, 4 characters a token)."""

    def __init__(self) -> None:
        self.tokens = 1

    def __call__(
        self, messages: list[dict[str, Any]], previous: str | None, note: str | None
    ) -> str:
        if self.tokens == BLOATED:
            return words(2_000_000, "bloated")
        return "s" * (4 * self.tokens)


@pytest.fixture
def sized(db_url: str) -> Iterator[tuple[CompactStore, SizedSummarizer]]:
    summarizer = SizedSummarizer()
    with opened(db_url, summarizer=summarizer) as store:
        yield store, summarizer


def long_chat(store: CompactStore, sid: str, window: int) -> Chat:
    chat = new_session(store, "anthropic", context_window=window, sid=sid)
    chat.request("Migrate the billing service to the new queue")
    chat.chatter(30, chars=1_600)  # 30 messages of ~400 tokens
    return chat


def kept_messages(chat: Chat) -> int:
    """How many log messages follow the boundary (the verbatim part)."""
    return sum(1 for item in chat.sess.context().kept if item.seq is not None)


def notes(chat: Chat) -> list[str]:
    """Texts of context messages that are not in the log: the summary / truncation note."""
    log = chat.sess.messages()
    return [text_of(m) for m in chat.sess.active_context() if m not in log]


def recover_landing_at(
    store: CompactStore, summarizer: SizedSummarizer, window: int, usage: int
) -> Chat:
    """A session whose attempt-1 full compact leaves exactly ``usage`` tokens."""
    now = T0 + 1_000
    summarizer.tokens = 1
    twin = long_chat(store, f"twin-w{window}-u{usage}", window)
    one_token = twin.sess.compact(now=now).tokens_after
    summarizer.tokens = 1 + usage - one_token
    chat = long_chat(store, f"w{window}-u{usage}", window)
    result = chat.sess.reactive_recover(ERROR, now=now)
    assert result is not None and result.trigger == CompactTrigger.REACTIVE
    full = result.steps[0]
    assert full.strategy == CompactStrategy.FULL
    assert result.tokens_before - full.tokens_freed == usage, "the full compact landed there"
    return chat


def test_attempt_1_is_a_full_compact_that_succeeds_only_below_87_3_percent(
    sized: tuple[CompactStore, SizedSummarizer],
) -> None:
    store, summarizer = sized
    limit = math.ceil(LIMIT * 10_000)  # 8,730: the first usage that is not below 87.3%

    below = recover_landing_at(store, summarizer, 10_000, limit - 1)

    assert below.sess.token_usage() == limit - 1
    assert below.sess.breaker().reactive_attempts == 0, "success resets the counter"
    (recorded,) = below.sess.compactions()
    assert recorded.strategy == CompactStrategy.FULL and recorded.success
    assert recorded.trigger == CompactTrigger.REACTIVE
    assert [s.strategy for s in recorded.steps] == [CompactStrategy.FULL]

    at = recover_landing_at(store, summarizer, 10_000, limit)

    assert at.sess.breaker().reactive_attempts == 1
    (recorded,) = at.sess.compactions()
    assert [s.strategy for s in recorded.steps] == [CompactStrategy.FULL, CompactStrategy.REACTIVE]
    assert recorded.strategy == CompactStrategy.REACTIVE
    assert at.sess.token_usage() < limit - 1

    # 87.3% of 10,010 is 8,738.73: 8,738 tokens are below it.
    odd = recover_landing_at(store, summarizer, 10_010, math.ceil(LIMIT * 10_010) - 1)

    assert odd.sess.breaker().reactive_attempts == 0
    assert odd.sess.compactions()[-1].strategy == CompactStrategy.FULL


def test_attempts_truncate_to_40_30_20_percent_then_attempt_4_gives_up(
    sized: tuple[CompactStore, SizedSummarizer],
) -> None:
    store, summarizer = sized
    summarizer.tokens = BLOATED  # the forced full compact cannot help
    chat = new_session(store, "openai", context_window=2_000)
    chat.request("Keep the agent alive")
    chat.chatter(120, chars=400)  # 100 tokens each, far over the window
    before = len(chat.sess.context().kept)

    first = chat.sess.reactive_recover(ERROR, now=T0 + 100)

    assert first is not None and first.effective
    assert first.strategy == CompactStrategy.REACTIVE and first.trigger == CompactTrigger.REACTIVE
    full, truncation = first.steps
    assert full.strategy == CompactStrategy.FULL and not full.success
    assert truncation.strategy == CompactStrategy.REACTIVE and truncation.success
    assert kept_messages(chat) == math.floor(before * Fraction(4, 10)) == 48
    assert chat.sess.breaker().reactive_attempts == 1
    assert any("attempt 1" in note for note in notes(chat)), "a note stands for the cut"
    assert pair_problems("openai", chat.sess.active_context()) == []

    for attempt, fraction in ((2, Fraction(3, 10)), (3, Fraction(2, 10))):
        chat.chatter(100 - kept_messages(chat), tag=f"a{attempt}", chars=400)
        assert kept_messages(chat) == 100
        result = chat.sess.reactive_recover(ERROR, now=T0 + 100 * attempt)
        assert result is not None and result.effective
        assert result.strategy == CompactStrategy.REACTIVE
        assert [s.strategy for s in result.steps] == [CompactStrategy.REACTIVE]
        assert kept_messages(chat) == 100 * fraction
        assert chat.sess.context().kept[-1].seq == len(chat.sess.messages()) - 1, "newest kept"
        assert chat.sess.breaker().reactive_attempts == attempt
        assert any(f"attempt {attempt}" in note for note in notes(chat))

    rows = len(chat.sess.compactions())
    assert chat.sess.reactive_recover(ERROR, now=T0 + 400) is None
    assert len(chat.sess.compactions()) == rows
    assert chat.sess.breaker().reactive_attempts == 3


def test_truncation_keeps_at_least_3_messages_and_15_percent(
    sized: tuple[CompactStore, SizedSummarizer],
) -> None:
    store, summarizer = sized
    summarizer.tokens = BLOATED
    config = plain(reactive_keep_fractions=(0.02, 0.3, 0.1))
    chat = new_session(store, "minicode", context_window=2_000, config=config, sid="three")
    chat.request("Short")
    chat.chatter(10, chars=1_000)

    chat.sess.reactive_recover(ERROR, now=T0 + 1)

    assert kept_messages(chat) == 3  # 2% (or 15%) of 11 is less than 3 messages

    chat = new_session(store, "minicode", context_window=2_000, config=config, sid="fifteen")
    chat.request("Long")
    chat.chatter(99, chars=400)
    chat.sess.reactive_recover(ERROR, now=T0 + 1)
    chat.sess.reactive_recover(ERROR, now=T0 + 2)
    chat.chatter(100 - kept_messages(chat), tag="more", chars=400)
    assert kept_messages(chat) == 100

    chat.sess.reactive_recover(ERROR, now=T0 + 3)

    assert kept_messages(chat) == 15  # 10% asked, 15% kept


def test_truncation_never_goes_below_3_messages(
    sized: tuple[CompactStore, SizedSummarizer],
) -> None:
    store, summarizer = sized
    chat = new_session(store, "minicode", context_window=20_000)
    chat.request("Tiny")
    chat.chatter(9, chars=2_000)  # 500 tokens each
    summarizer.tokens = 1
    chat.sess.compact(now=T0 + 1)  # the newest third stays: 3 messages, 1,500 tokens
    assert kept_messages(chat) == 3
    summarizer.tokens = BLOATED

    chat.sess.reactive_recover(ERROR, now=T0 + 2)

    assert kept_messages(chat) == 3


def test_the_attempt_counter_persists_and_record_usage_resets_it(
    sized: tuple[CompactStore, SizedSummarizer], reopen: Callable[[], CompactStore]
) -> None:
    store, summarizer = sized
    summarizer.tokens = BLOATED
    chat = new_session(store, "anthropic", context_window=2_000)
    chat.request("Keep going")
    chat.chatter(120, chars=400)
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
