"""Prompt caching as a cost decision (compactstore._context.caching): where request_params() puts
cache breakpoints and which lifetime their writes get, proven against the strict fake of
the Messages API; and the cost rule of in-place edits, as a pure function and through
process_request() (a deferral is a step of the history)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from compactstore import CompactionConfig, CompactStore
from compactstore._context.caching import (
    call_gap,
    choose_ttl,
    edit_cost,
    min_cacheable_tokens,
    plan_breakpoints,
)
from tests.fake_messages_api import FakeMessagesAPI, fake_client

anthropic = pytest.importorskip("anthropic")

MODEL = "claude-sonnet-4-5"
THINKING = {"type": "enabled", "budget_tokens": 2_000}
TOOLS = [{"name": "read_file", "description": "Read a file", "input_schema": {"type": "object"}}]


# -- the pure rules -------------------------------------------------------------------------


def test_breakpoints_best_first_within_the_limit_and_never_below_the_minimum() -> None:
    tokens = [600, 300, 900, 200, 200, 400, 100, 500]
    # system 0; stable marks 1 (pinned) and 2 (summary); previous tail 5; newest 7.
    assert plan_breakpoints(tokens, system=[0], stable=[1, 2], previous_tail=5, min_tokens=0) == [
        0,
        2,
        5,
        7,
    ]
    # The system prompt (600) and the pinned message (900 with it) are under 1,024.
    assert plan_breakpoints(
        tokens, system=[0], stable=[1, 2], previous_tail=5, min_tokens=1_024
    ) == [2, 5, 7]
    assert (
        plan_breakpoints(tokens, system=[0], stable=[], previous_tail=None, min_tokens=5_000) == []
    )
    assert plan_breakpoints([], system=[], stable=[], previous_tail=None, min_tokens=0) == []
    assert plan_breakpoints(
        tokens, system=[0], stable=[1, 2], previous_tail=5, min_tokens=0, limit=2
    ) == [0, 7]


def test_the_write_lifetime_follows_the_call_rhythm() -> None:
    assert call_gap([]) is None and call_gap([10.0]) is None
    assert call_gap([0.0, 20.0, 40.0, 400.0]) == 20.0
    assert choose_ttl(None) == "5m"
    assert choose_ttl(20.0) == "5m"
    assert choose_ttl(299.0) == "5m"
    assert choose_ttl(300.0) == "1h"  # a 5-minute entry is gone when the next call comes
    assert choose_ttl(3_599.0) == "1h"
    assert choose_ttl(3_600.0) == "5m"  # nothing survives: the cheaper write


def test_minimum_cacheable_length_by_model() -> None:
    assert min_cacheable_tokens("claude-sonnet-4-5") == 1_024
    assert min_cacheable_tokens("claude-sonnet-4-5-20250929") == 1_024
    assert min_cacheable_tokens("claude-opus-5") == 512
    assert min_cacheable_tokens("claude-opus-5-5") == 4_096  # not documented: the largest
    assert min_cacheable_tokens("claude-haiku-4-5") == 4_096
    assert min_cacheable_tokens("my-model") == 4_096  # unknown: the largest minimum
    assert min_cacheable_tokens(None) == 4_096


def test_edit_cost_break_even_on_both_sides() -> None:
    # One call expected (no rhythm): 0.1 x freed saved against (1.25 - 0.1) x rewritten.
    def cost(freed: int, ttl: float, gap: float | None, write: float) -> Any:
        return edit_cost(
            freed_tokens=freed,
            rewritten_tokens=1_000,
            ttl_seconds=ttl,
            gap_seconds=gap,
            cache_read=0.1,
            cache_write=write,
        )

    assert cost(11_500, 300, None, 1.25).calls == 1.0
    assert cost(11_500, 300, None, 1.25).pays
    assert not cost(11_499, 300, None, 1.25).pays
    assert cost(11_499, 300, None, 1.25).rewrite == pytest.approx(1_150)
    # Twelve calls within an hour's TTL, 300 s apart: 1.2 x freed against 1.9 x rewritten.
    hourly = cost(1_584, 3_600, 300, 2.0)
    assert hourly.calls == 12.0 and hourly.pays
    assert hourly.saved == pytest.approx(1_584 * 0.1 * 12)
    assert not cost(1_583, 3_600, 300, 2.0).pays
    # Calls further apart than the TTL: the next call still counts.
    assert cost(11_500, 300, 900, 1.25).calls == 1.0


# -- request_params() against the strict fake ------------------------------------------------


def _loop(
    tmp_path: Path,
    *,
    steps: int,
    step_seconds: float,
    config: CompactionConfig | None = None,
    window: int = 200_000,
) -> tuple[Any, FakeMessagesAPI, list[Any]]:
    client, api = fake_client(anthropic, default_window=200_000)
    store = CompactStore.open(str(tmp_path / "cache.db"))
    sess = store.session("s", context_window=window, now=api.now, model=MODEL, config=config)
    sess.append({"role": "system", "content": "You are a coding agent."}, timestamp=api.now)
    sess.append({"role": "user", "content": "Fix the failing tests."}, timestamp=api.now)
    replies = []
    for _ in range(steps):
        sess.process_request(now=api.now)
        reply = client.messages.create(
            model=MODEL,
            max_tokens=1_024,
            tools=TOOLS,
            **sess.request_params(cache_control=True, thinking=THINKING, now=api.now),
        )
        replies.append(reply)
        api.advance(step_seconds)
        sess.append_response(reply, timestamp=api.now, now=api.now)
        calls = [block for block in reply.content if block.type == "tool_use"]
        for block in calls:
            sess.append_tool_result(
                block.id, "line of code\n" * 150, tool_name=block.name, timestamp=api.now
            )
        if not calls:
            sess.append({"role": "user", "content": "Next task."}, timestamp=api.now)
    return sess, api, replies


def _marks(body: dict[str, Any]) -> list[dict[str, Any]]:
    found = [b["cache_control"] for b in body.get("system") or [] if "cache_control" in b]
    for message in body["messages"]:
        content = message["content"]
        if isinstance(content, list):
            found.extend(b["cache_control"] for b in content if "cache_control" in b)
    return found


@pytest.mark.slow
def test_the_next_call_reads_the_previous_request_from_the_cache(tmp_path: Path) -> None:
    sess, api, replies = _loop(tmp_path, steps=8, step_seconds=20)
    assert not api.errors
    prompts = [
        r.usage.input_tokens + r.usage.cache_read_input_tokens + r.usage.cache_creation_input_tokens
        for r in replies
    ]
    # Once a request's newest block is cached whole (read or written, none uncached), the
    # next request reads exactly that prefix and writes only what came after it.
    whole = [n for n, r in enumerate(replies[:-1]) if r.usage.input_tokens == 0 and prompts[n] > 0]
    assert len(whole) >= 4
    for n in whole:
        assert replies[n + 1].usage.cache_read_input_tokens == prompts[n]
        assert replies[n + 1].usage.input_tokens == 0
    marks = [_marks(body) for body in api.bodies]
    assert not marks[0]  # a first request under the minimum cacheable length: none
    assert all(len(m) <= 4 for m in marks) and len(marks[-1]) == 2  # newest, previous tail
    # Calls 20 s apart: 5-minute writes.
    assert all("ttl" not in mark for found in marks for mark in found)
    # The system prompt (a few tokens) is under the minimum: never a breakpoint of its own.
    assert all(isinstance(body["system"], str) for body in api.bodies)
    cost = sess.cost()
    assert cost.cache_read_tokens == sum(r.usage.cache_read_input_tokens for r in replies)
    assert cost.input_tokens == sum(r.usage.input_tokens for r in replies)


@pytest.mark.slow
def test_calls_minutes_apart_write_for_an_hour(tmp_path: Path) -> None:
    _, api, replies = _loop(tmp_path, steps=6, step_seconds=400)
    assert not api.errors
    assert [m.get("ttl") for m in _marks(api.bodies[-1])] == ["1h", "1h"]
    assert all(m.get("ttl") is None for m in _marks(api.bodies[1]))  # no rhythm yet
    last = replies[-1].usage
    assert last.cache_read_input_tokens > 0 and last.input_tokens == 0


# -- cache-aware microcompact ------------------------------------------------------------------


def _micro_steps(sess: Any) -> list[Any]:
    return [
        step
        for row in sess.compactions()
        for step in row.steps or ()
        if step.strategy == "microcompact"
    ]


@pytest.mark.slow
def test_a_clear_on_a_warm_cache_waits_until_it_pays(tmp_path: Path) -> None:
    config = CompactionConfig(edit_policy="rewrite", microcompact_interval_seconds=1_000)
    sess, api, _ = _loop(tmp_path, steps=8, step_seconds=300, config=config)
    assert not api.errors
    steps = _micro_steps(sess)
    assert steps and not any(step.success for step in steps)
    assert "deferred: clearing" in steps[0].detail and "write" in steps[0].detail
    assert "[Old tool result content cleared" not in str(sess.active_context())


@pytest.mark.slow
def test_without_cache_awareness_the_clear_goes_ahead(tmp_path: Path) -> None:
    config = CompactionConfig(
        edit_policy="rewrite", microcompact_interval_seconds=1_000, cache_aware=False
    )
    sess, api, _ = _loop(tmp_path, steps=8, step_seconds=300, config=config)
    assert not api.errors
    assert any(step.success for step in _micro_steps(sess))
    assert "[Old tool result content cleared" in str(sess.active_context())


@pytest.mark.slow
def test_the_window_needing_room_overrides_the_deferral(tmp_path: Path) -> None:
    config = CompactionConfig(
        edit_policy="rewrite",
        microcompact_interval_seconds=1_000,
    )
    # Usage reaches auto_compact_threshold (0.85 of 4,200) at the first time-based
    # microcompact (t = 1,200 s): the clear goes ahead though the cache is warm.
    sess, api, _ = _loop(tmp_path, steps=8, step_seconds=300, config=config, window=4_200)
    assert not api.errors
    steps = _micro_steps(sess)
    assert any(step.success for step in steps)
    assert not any("deferred" in step.detail for step in steps)


def test_edit_marks_come_before_the_previous_tail() -> None:
    tokens = [2_000] * 10
    marks = plan_breakpoints(
        tokens, system=[], stable=[0], previous_tail=8, min_tokens=1_024, edit_marks=[3, 4]
    )
    assert marks == [3, 4, 8, 9]
    assert plan_breakpoints(
        tokens, system=[0], stable=[], previous_tail=8, min_tokens=1_024, edit_marks=[3, 4]
    ) == [0, 3, 4, 9]


@pytest.mark.slow
def test_server_side_clears_still_read_the_prefix_before_them(tmp_path: Path) -> None:
    """append_only on a model with prefix checks: microcompact is the provider's
    clear_tool_uses edit, which clears one more result on each call once over its trigger;
    the breakpoints before its moving edit point keep the prefix before it cached."""
    client, api = fake_client(anthropic, default_window=30_000)
    store = CompactStore.open(str(tmp_path / "server.db"))
    model = "claude-opus-5-5"
    sess = store.session("s", context_window=30_000, now=api.now, model=model)
    sess.append({"role": "user", "content": "Fix the failing tests."}, timestamp=api.now)
    replies = []
    for _ in range(40):
        sess.process_request(now=api.now)
        reply = client.messages.create(
            model=model, max_tokens=1_024, tools=TOOLS, **sess.request_params(cache_control=True)
        )
        replies.append(reply)
        api.advance(20)
        sess.append_response(reply, timestamp=api.now, now=api.now)
        calls = [block for block in reply.content if block.type == "tool_use"]
        for block in calls:
            sess.append_tool_result(
                block.id, "line of code\n" * 150, tool_name=block.name, timestamp=api.now
            )
        if not calls:
            sess.append({"role": "user", "content": "Next task."}, timestamp=api.now)
    assert not api.errors
    cleared = [r for r in replies if (r.context_management or {}).get("applied_edits")]
    assert len(cleared) >= 5
    # Each clear after the first reads the prefix before its edit point from the cache.
    assert all(r.usage.cache_read_input_tokens > 0 for r in cleared[1:])
    assert sum(r.usage.cache_read_input_tokens for r in cleared[1:]) > sum(
        r.usage.cache_creation_input_tokens for r in cleared[1:]
    )
