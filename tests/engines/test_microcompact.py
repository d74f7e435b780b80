"""Stage 4, microcompact: once 3,600 s have passed since the last time-based
microcompact (the clock starts at session creation) every tool result but the 5 newest is
replaced by a fixed placeholder; the cache-aware trigger does the same once the gap since
the last assistant message exceeds cache_ttl_seconds (300 s by default: the 5-minute cache).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from compactstore import CompactionConfig, CompactStore, CompactStrategy, CompactTrigger
from tests.helpers import CLEARED, FORMATS, T0, Chat, new_session, plain, result_map, words

HOUR = 3_600
# The interval trigger alone: these sessions sit idle for an hour, and their cache would
# be cold (so cleared by the cache trigger) 300 s after the last assistant message.
INTERVAL_ONLY = plain(cache_ttl_seconds=None)


def with_results(
    store: CompactStore, fmt: str, count: int, **kwargs: Any
) -> tuple[Chat, list[str]]:
    """A session created at T0 with ``count`` small tool results (oldest first)."""
    chat = new_session(store, fmt, **kwargs)
    chat.request("Investigate the failing build")
    ids = [chat.tool(words(400, f"r{i}"), args={"path": f"f{i}.py"})[2] for i in range(count)]
    return chat, ids


@pytest.mark.slow_on_postgres
def test_fires_at_3600_seconds_after_creation_and_keeps_the_5_newest_results(
    store: CompactStore,
) -> None:
    for fmt in FORMATS:
        check_time_based(store, fmt)


def check_time_based(store: CompactStore, fmt: str) -> None:
    chat, ids = with_results(store, fmt, 8, sid=fmt, config=INTERVAL_ONLY)
    before = result_map(fmt, chat.sess.active_context())

    early = chat.sess.process_request(now=T0 + HOUR - 1)
    assert not early.success and early.strategy is None and early.id is None
    assert chat.sess.compactions() == []
    assert chat.sess.breaker().last_microcompact_at == T0, "the clock starts at creation"

    result = chat.sess.process_request(now=T0 + HOUR)

    assert result.effective
    assert result.strategy == CompactStrategy.MICROCOMPACT
    assert result.trigger == CompactTrigger.MICROCOMPACT_TIME
    shown = result_map(fmt, chat.sess.active_context())
    for old in ids[:3]:
        assert shown[old] == CLEARED
    for recent in ids[3:]:
        assert shown[recent] == before[recent]
    assert sorted(result.cleared_tool_use_ids) == sorted(ids[:3])
    assert chat.sess.compactions()[-1].cleared_tool_use_ids == result.cleared_tool_use_ids
    states = {item.seq: item.state for item in chat.sess.context().items}
    cleared_states = [s for s in states.values() if s == "cleared"]
    assert len(cleared_states) == 3
    assert chat.sess.breaker().last_microcompact_at == T0 + HOUR
    assert result.tokens_after == chat.sess.token_usage() < result.tokens_before


def test_with_five_or_fewer_candidates_nothing_happens(store: CompactStore) -> None:
    chat, _ = with_results(store, "anthropic", 5)
    context = chat.sess.active_context()

    result = chat.sess.process_request(now=T0 + 2 * HOUR)

    assert not result.success and result.strategy is None and result.tokens_freed == 0
    assert chat.sess.compactions() == []
    assert chat.sess.active_context() == context
    assert chat.sess.breaker().last_microcompact_at == T0, "nothing ran, the clock did not restart"


def test_persisted_and_cleared_results_are_not_candidates(store: CompactStore) -> None:
    chat, ids = with_results(store, "openai", 4, sid="persisted")
    big = [chat.tool(words(5_000, f"big{i}"))[2] for i in range(2)]

    result = chat.sess.process_request(now=T0 + HOUR)

    # 6 results, but the budget persists 2 first: 4 candidates are left, so no clearing.
    assert result.strategy == CompactStrategy.TOOL_BUDGET
    assert [step.strategy for step in result.steps] == [CompactStrategy.TOOL_BUDGET]
    assert sorted(result.cleared_tool_use_ids) == sorted(big)
    shown = result_map("openai", chat.sess.active_context())
    assert CLEARED not in shown.values()
    assert all(shown[i] == words(400, f"r{n}") for n, i in enumerate(ids))

    chat, ids = with_results(store, "minicode", 8, sid="cleared")
    first = chat.sess.process_request(now=T0 + HOUR)
    assert sorted(first.cleared_tool_use_ids) == sorted(ids[:3])
    newer = [chat.tool(words(400, f"n{i}"))[2] for i in range(2)]

    second = chat.sess.process_request(now=T0 + 2 * HOUR)

    # Candidates: the 5 kept earlier plus 2 new ones; the 3 cleared ones do not count.
    assert sorted(second.cleared_tool_use_ids) == sorted(ids[3:5])
    shown = result_map("minicode", chat.sess.active_context())
    assert [shown[i] == CLEARED for i in ids + newer] == [True] * 5 + [False] * 5


def test_the_clock_restarts_from_the_last_time_based_microcompact(
    store: CompactStore, reopen: Callable[[], CompactStore]
) -> None:
    chat, _ = with_results(store, "minicode", 8, config=INTERVAL_ONLY)
    assert chat.sess.process_request(now=T0 + HOUR + 100).effective
    for i in range(4):
        chat.tool(words(400, f"later{i}"))

    again = reopen().session("s")
    assert again.breaker().last_microcompact_at == T0 + HOUR + 100
    assert not again.process_request(now=T0 + 2 * HOUR + 99).success

    result = again.process_request(now=T0 + 2 * HOUR + 100)

    assert result.trigger == CompactTrigger.MICROCOMPACT_TIME
    assert len(result.cleared_tool_use_ids) == 4
    assert again.breaker().last_microcompact_at == T0 + 2 * HOUR + 100


def cached_session(store: CompactStore, sid: str, config: CompactionConfig) -> tuple[Chat, float]:
    """8 results and a closing assistant message; returns that message's timestamp."""
    chat, _ = with_results(store, "anthropic", 8, config=config, sid=sid)
    chat.say("Here is what I found.")
    stamp = chat.clock
    chat.user("thanks, keep going")  # a later user message does not restart the gap
    return chat, stamp


def test_cache_aware_trigger_fires_when_the_gap_exceeds_the_ttl_and_is_on_by_default(
    store: CompactStore,
) -> None:
    chat, last_assistant = cached_session(store, "ttl", plain())
    assert plain().cache_ttl_seconds == 300

    at_ttl = chat.sess.process_request(now=last_assistant + 300)
    assert not at_ttl.success and chat.sess.compactions() == []

    result = chat.sess.process_request(now=last_assistant + 301)

    assert result.effective
    assert result.trigger == CompactTrigger.MICROCOMPACT_CACHED
    assert result.strategy == CompactStrategy.MICROCOMPACT
    assert len(result.cleared_tool_use_ids) == 3
    assert list(result_map("anthropic", chat.sess.active_context()).values()).count(CLEARED) == 3
    assert chat.sess.breaker().last_microcompact_at == T0, "only time-based runs move the clock"

    off, last_assistant = cached_session(store, "off", plain(cache_ttl_seconds=None))
    assert last_assistant + 1_000 < T0 + HOUR
    idle = off.sess.process_request(now=last_assistant + 1_000)
    assert not idle.success and idle.strategy is None
    assert off.sess.compactions() == []
