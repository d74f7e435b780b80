"""Stage 5, the auto-compact check and its circuit breaker: auto-compact fires at
estimated usage >= 85% of the window; 3 consecutive failed auto-compactions trip the breaker;
a success resets the count; the counters persist; reset_breaker() clears them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import pytest

from compactstore import CompactStore, CompactStrategy, CompactTrigger
from tests.helpers import T0, Chat, new_session, opened, words

ONLY_AUTO = {"enable_tool_budget": False, "enable_microcompact": False}


def fill_to(chat: Chat, tokens: int) -> None:
    """Append alternating text messages until the estimated usage is exactly ``tokens``."""
    chat.request(words(400, "request"))  # 100 tokens
    turn = 0
    while (usage := chat.sess.token_usage()) < tokens:
        size = min(1_000, tokens - usage) * 4  # every 4 ASCII chars are one token
        text = words(size, f"m{turn}")
        if turn % 2 == 0:
            chat.say(text)
        else:
            chat.user(text)
        turn += 1
    assert chat.sess.token_usage() == tokens


@pytest.mark.slow_on_postgres
def test_fires_at_85_percent_of_the_window_and_not_one_token_below(store: CompactStore) -> None:
    # 10,010 is not a multiple of 20: 85% of it (8,508.5) is not a whole number of tokens.
    for window in (10_000, 10_010):
        check_the_threshold(store, window)


def check_the_threshold(store: CompactStore, window: int) -> None:
    at = math.ceil(Fraction(85, 100) * window)  # the first usage that is >= 85%
    chat = new_session(store, "anthropic", context_window=window, sid=f"w{window}")
    fill_to(chat, at - 1)

    below = chat.sess.process_request(now=T0 + 100, **ONLY_AUTO)

    assert not below.success and below.strategy is None and below.id is None
    assert chat.sess.compactions() == []
    chat.say("ok")  # one more token
    assert chat.sess.token_usage() == at

    result = chat.sess.process_request(now=T0 + 101, **ONLY_AUTO)

    assert result.effective
    assert result.trigger == CompactTrigger.AUTO
    assert result.strategy == CompactStrategy.FULL
    assert result.tokens_before == at
    assert chat.sess.token_usage() == result.tokens_after < Fraction(85, 100) * window
    assert chat.sess.breaker().consecutive_failures == 0
    assert result.boundary is not None and chat.sess.boundaries() == [result.boundary]


def pinned_full(store: CompactStore) -> Chat:
    """Pinned messages alone fill more than 85% of a 2,000-token window."""
    chat = new_session(store, "openai", context_window=2_000)
    chat.request("Keep all of these notes in view")
    chat.user(words(3_600, "pinned-a"), pinned=True)  # 900 tokens
    chat.user(words(3_600, "pinned-b"), pinned=True)  # 900 tokens
    chat.say("Noted.")
    assert chat.sess.token_usage() >= 1_700
    return chat


def test_a_context_that_cannot_get_below_the_threshold_trips_the_breaker_on_the_third_failure(
    store: CompactStore, reopen: Callable[[], CompactStore]
) -> None:
    chat = pinned_full(store)
    context = chat.sess.active_context()
    disabled = chat.sess.process_request(now=T0 + 10, enable_auto_compact=False)
    assert disabled.id is None and chat.sess.breaker().consecutive_failures == 0

    for failures in (1, 2, 3):
        result = chat.sess.process_request(now=T0 + 100 * failures, **ONLY_AUTO)
        assert not result.success
        assert result.id is not None, "a failed attempt is recorded"
        breaker = chat.sess.breaker()
        assert breaker.consecutive_failures == failures
        assert breaker.tripped is (failures == 3)
    assert len(chat.sess.compactions()) == 3
    assert all(not c.success for c in chat.sess.compactions())
    assert chat.sess.boundaries() == [], "a compaction that frees nothing is not a boundary"
    assert chat.sess.active_context() == context

    tripped = chat.sess.process_request(now=T0 + 400, **ONLY_AUTO)

    assert not tripped.success and tripped.id is None and tripped.steps == []
    assert len(chat.sess.compactions()) == 3, "a tripped breaker stops trying"
    later = reopen().session("s")
    assert later.breaker().tripped and later.breaker().consecutive_failures == 3
    assert later.process_request(now=T0 + 500, **ONLY_AUTO).id is None

    later.reset_breaker()

    assert later.breaker().consecutive_failures == 0 and not later.breaker().tripped
    retried = later.process_request(now=T0 + 600, **ONLY_AUTO)
    assert retried.id is not None and not retried.success
    assert later.breaker().consecutive_failures == 1


def test_an_auto_compact_that_frees_tokens_but_stays_above_the_threshold_is_a_failure(
    store: CompactStore,
) -> None:
    chat = new_session(store, "minicode", context_window=2_000)
    chat.request("Keep the notes")
    chat.user(words(6_800, "pinned"), pinned=True)  # 1,700 tokens: over 85% on its own
    for i in range(6):
        chat.say(words(200, f"reply{i}"))

    result = chat.sess.process_request(now=T0 + 10, **ONLY_AUTO)

    assert result.tokens_freed > 0, "the full compact did remove the replies"
    assert chat.sess.token_usage() >= 1_700
    assert chat.sess.breaker().consecutive_failures == 1


def test_a_success_resets_the_failure_count(db_url: str) -> None:
    bloat = {"on": True}

    def summarizer(messages: list[dict[str, Any]], previous: str | None, note: str | None) -> str:
        # While "on", the summary is larger than what it replaces, so the compaction fails.
        return words(40_000, "bloated") if bloat["on"] else "Short summary."

    with opened(db_url, summarizer=summarizer) as store:
        chat = new_session(store, "anthropic", context_window=2_000)
        chat.request("Build the thing")
        for i in range(12):
            chat.add({"role": "assistant" if i % 2 == 0 else "user", "content": words(600, str(i))})
        assert chat.sess.token_usage() >= 1_700

        for failures in (1, 2):
            assert not chat.sess.process_request(now=T0 + failures, **ONLY_AUTO).success
            assert chat.sess.breaker().consecutive_failures == failures
        bloat["on"] = False

        result = chat.sess.process_request(now=T0 + 10, **ONLY_AUTO)

        assert result.effective and result.strategy == CompactStrategy.FULL
        assert chat.sess.breaker().consecutive_failures == 0
        assert not chat.sess.breaker().tripped
        assert chat.sess.token_usage() < 1_700
