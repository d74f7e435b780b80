"""The edit policy and thinking the provider accepts: the model capability table, the
session's model, request_params() merging what the session needs, append_only's cheap
stages and server-side microcompact, the drop_block binding, and loops against the strict
fake of the Messages API (tests/fake_messages_api.py) through the official SDK."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from compactstore import CompactionConfig, CompactStore
from compactstore.capabilities import (
    BINDING_BETA,
    CONTEXT_MANAGEMENT_BETA,
    ModelCapabilities,
    capabilities_for,
)
from compactstore.errors import InvalidInputError
from tests.fake_messages_api import FakeMessagesAPI, fake_client

anthropic = pytest.importorskip("anthropic")

NEW = "claude-opus-5-5"
OLD = "claude-sonnet-4-5"
T0 = 1_790_000_000.0
TOOLS = [{"name": "read_file", "description": "Read a file", "input_schema": {"type": "object"}}]
OLD_THINKING = {"type": "enabled", "budget_tokens": 2_000}


def _open(tmp_path: Path, **kwargs: Any) -> CompactStore:
    return CompactStore.open(str(tmp_path / "policy.db"), **kwargs)


def _call(
    sess: Any, client: Any, api: FakeMessagesAPI, model: str, *, next_task: bool = True
) -> Any:
    """One step of the README's loop: request, append the reply and the tool results (or,
    once the agent answers, the user's next task)."""
    thinking = None if model == NEW else OLD_THINKING
    reply = client.messages.create(
        model=model,
        max_tokens=1_024,
        tools=TOOLS,
        **sess.request_params(cache_control=True, thinking=thinking, now=api.now),
    )
    api.advance(20)
    sess.append_response(reply, timestamp=api.now, now=api.now)
    calls = [block for block in reply.content if block.type == "tool_use"]
    for block in calls:
        sess.append_tool_result(
            block.id, "line of code\n" * 150, tool_name=block.name, timestamp=api.now
        )
    if not calls and next_task:
        sess.append({"role": "user", "content": "Next task."}, timestamp=api.now)
    return reply


def _session(store: CompactStore, api: FakeMessagesAPI, model: str, **kwargs: Any) -> Any:
    sess = store.session("s", context_window=60_000, now=api.now, model=model, **kwargs)
    sess.append({"role": "system", "content": "You are a coding agent."}, timestamp=api.now)
    sess.append({"role": "user", "content": "Fix the failing tests."}, timestamp=api.now)
    return sess


# -- the capability table and the session's model ------------------------------------------


def test_capabilities_match_dated_ids_never_a_shorter_family() -> None:
    assert capabilities_for("claude-opus-5-5").prefix_checks
    assert capabilities_for("claude-opus-5-5-20261015").prefix_checks
    assert not capabilities_for("claude-opus-5").prefix_checks
    assert not capabilities_for("claude-opus-5-5x").prefix_checks
    assert not capabilities_for("claude-sonnet-4-5").prefix_checks
    assert capabilities_for("claude-sonnet-4-5").context_editing
    assert capabilities_for("my-model") == ModelCapabilities()
    assert capabilities_for(None) == ModelCapabilities()


@pytest.mark.slow
def test_auto_policy_follows_the_model(tmp_path: Path) -> None:
    store = _open(tmp_path)
    assert store.session("new", model=NEW).edit_policy() == ("append_only", True)
    assert store.session("old", model=OLD).edit_policy() == ("rewrite", False)
    assert store.session("none").edit_policy() == ("rewrite", False)
    forced = CompactionConfig(edit_policy="rewrite")
    assert store.session("forced", model=NEW, config=forced).edit_policy() == ("rewrite", True)
    appended = CompactionConfig(edit_policy="append_only")
    assert store.session("app", model=OLD, config=appended).edit_policy() == (
        "append_only",
        False,
    )
    store.close()


def test_model_capabilities_extend_the_table(tmp_path: Path) -> None:
    mine = {"house-model": ModelCapabilities(prefix_checks=True, context_editing=True)}
    store = _open(tmp_path, model_capabilities=mine)
    assert store.session("s", model="house-model").edit_policy() == ("append_only", True)
    store.close()
    with pytest.raises(InvalidInputError, match="model_capabilities"):
        _open(tmp_path, model_capabilities={"x": {"prefix_checks": True}})
    with pytest.raises(InvalidInputError, match="model"):
        _open(tmp_path).session("s", model="")


def test_append_response_records_the_model(db_url: str) -> None:
    client, api = fake_client(anthropic)
    store = CompactStore.open(db_url, auto_migrate=True)
    sess = _session(store, api, OLD)
    assert sess.edit_policy() == ("rewrite", False)
    _call(sess, client, api, NEW)  # the agent switched models
    assert store.get_session("s").model == NEW
    assert store.get_session("s").edit_policy() == ("append_only", True)
    store.close()


# -- request_params() ------------------------------------------------------------------------


def test_request_params_merge_what_the_session_needs(tmp_path: Path) -> None:
    _, api = fake_client(anthropic)
    store = _open(tmp_path)
    sess = _session(store, api, NEW)
    params = sess.request_params(
        thinking={"type": "adaptive", "display": "summarized"},
        extra_headers={"anthropic-beta": "files-api-2025-04-14", "x-trace": "1"},
    )
    assert params["thinking"] == {"type": "adaptive", "display": "summarized"}
    assert params["extra_headers"]["x-trace"] == "1"
    assert params["extra_headers"]["anthropic-beta"] == (
        f"files-api-2025-04-14,{CONTEXT_MANAGEMENT_BETA}"
    )
    edits = params["extra_body"]["context_management"]["edits"]
    assert edits == [
        {
            "type": "clear_tool_uses_20250919",
            "trigger": {"type": "input_tokens", "value": 42_000},  # background_threshold
            "keep": {"type": "tool_uses", "value": 5},  # microcompact_keep_recent
        }
    ]
    no_thinking = CompactionConfig(preserved_thinking=False)
    other = store.session("t", model=NEW, config=no_thinking)
    other.append({"role": "user", "content": "hi"})
    kinds = [e["type"] for e in other.request_params()["extra_body"]["context_management"]["edits"]]
    assert kinds == ["clear_thinking_20251015", "clear_tool_uses_20250919"]
    old = store.session("old", model=OLD)
    old.append({"role": "user", "content": "hi"})
    assert set(old.request_params(thinking=OLD_THINKING)) == {"messages", "thinking"}
    with pytest.raises(InvalidInputError, match="thinking"):
        old.request_params(thinking="adaptive")  # type: ignore[arg-type]
    store.close()


# -- append_only --------------------------------------------------------------------------


@pytest.mark.slow
def test_append_only_sends_microcompact_as_a_server_edit_and_records_it(tmp_path: Path) -> None:
    client, api = fake_client(anthropic, default_window=60_000)
    store = _open(tmp_path)
    config = CompactionConfig(background_threshold=0.05, microcompact_keep_recent=2)
    sess = _session(store, api, NEW, config=config)
    sent: list[Any] = []
    for _ in range(8):
        sess.process_request(now=api.now + 7_200)  # microcompact's time trigger is due
        sent.append(sess.active_context())
        _call(sess, client, api, NEW)
    assert api.errors == []
    assert api.applied_edits, "the fake cleared tool results server-side"
    # Nothing sent was edited in place: each request starts with the one before.
    for before, after in itertools.pairwise(sent):
        assert after[: len(before)] == before
    rows = [c for c in sess.compactions() if c.trigger is not None]
    assert {(c.strategy.value, c.trigger.value) for c in rows if c.strategy} == {
        ("clear", "server")
    }
    assert all(c.edit_policy == "append_only" and c.tokens_freed > 0 for c in rows)
    assert "clear_tool_uses_20250919" in rows[-1].steps[0].detail
    store.close()


@pytest.mark.slow
def test_rewrite_clears_in_place(tmp_path: Path) -> None:
    client, api = fake_client(anthropic, default_window=60_000)
    store = _open(tmp_path)
    config = CompactionConfig(edit_policy="rewrite", microcompact_keep_recent=2)
    sess = _session(store, api, OLD, config=config)
    for _ in range(5):
        _call(sess, client, api, OLD)
    result = sess.process_request(now=api.now + 7_200)
    assert result.strategy is not None and result.strategy.value == "microcompact"
    assert result.edit_policy == "rewrite"
    _call(sess, client, api, OLD)
    assert api.errors == []
    store.close()


def test_append_only_budget_acts_only_on_what_was_not_sent(tmp_path: Path) -> None:
    client, api = fake_client(anthropic)
    store = _open(tmp_path)
    config = CompactionConfig(edit_policy="append_only", tool_result_max_chars=1_000)
    sess = _session(store, api, OLD, config=config)
    sess.process_request(now=api.now, enable_tool_budget=False)
    reply = _call(sess, client, api, OLD)  # a 1,800-character result, sent below
    sess.process_request(now=api.now, enable_tool_budget=False)
    _call(sess, client, api, OLD)
    assert reply.content[-1].type == "tool_use"
    # The first result was sent: left as it is. The newest was not: persisted.
    result = sess.process_request(now=api.now)
    assert result.strategy is not None and result.strategy.value == "tool_budget"
    assert len(result.blob_ids) == 1
    texts = [str(m["content"]) for m in sess.active_context() if m["role"] == "user"]
    assert "line of code" in texts[1] and "Tool result persisted" not in texts[1]
    assert result.edit_policy == "append_only"
    store.close()


# -- thinking the provider accepts -----------------------------------------------------------


def _tasks(sess: Any) -> int:
    return sum(m["role"] == "user" and isinstance(m["content"], str) for m in sess.messages())


def _binding(store: CompactStore) -> tuple[str | None, float | None]:
    with store.engine.connect() as connection:
        row = connection.execute(
            text("SELECT thinking_binding, thinking_binding_at FROM sessions WHERE id = 's'")
        ).one()
    return row[0], row[1]


@pytest.mark.slow
def test_a_cut_inside_a_tool_loop_carries_drop_block_from_then_on(db_url: str) -> None:
    client, api = fake_client(anthropic)
    store = CompactStore.open(db_url, auto_migrate=True)
    config = CompactionConfig(edit_policy="rewrite", microcompact_keep_recent=1)
    sess = _session(store, api, NEW, config=config)
    _call(sess, client, api, NEW)
    # Into the second task's tool loop, so there is an earlier turn to summarise.
    while not (sess.context().continues_thinking and _tasks(sess) >= 2):
        _call(sess, client, api, NEW)
    assert _binding(store) == (None, None)
    # On a prefix-checking model even rewrite's microcompact waits for the loop to end.
    result = sess.process_request(now=api.now + 7_200)
    assert result.strategy is None
    assert "extra_headers" not in sess.request_params()
    # A compaction asked for in the middle of the loop: the loop's thinking, which the next
    # request must send, now has a changed prefix.
    result = sess.compact(now=api.now)
    assert result.strategy is not None and result.strategy.value == "full"
    assert result.removed_seqs and sess.context().continues_thinking
    params = sess.request_params(now=api.now)
    assert params["thinking"]["block_binding"] == {"prefix_mismatch_behavior": "drop_block"}
    assert BINDING_BETA in params["extra_headers"]["anthropic-beta"]
    assert _binding(store) == ("drop_block", api.now)
    reply = _call(sess, client, api, NEW)
    assert api.errors == [] and api.dropped > 0
    # The API says which blocks it dropped (a plain Message keeps the field as an extra).
    dropped = reply.model_extra["input_transformations"]
    assert len(dropped) == api.dropped
    assert {d["reason"] for d in dropped} == {"prefix_binding_mismatch"}
    # Every later request of the session carries it, in other handles too.
    sess.append({"role": "user", "content": "Next task."}, timestamp=api.now)
    later = store.get_session("s").request_params()
    assert later["thinking"]["block_binding"]["prefix_mismatch_behavior"] == "drop_block"
    store.close()


@pytest.mark.slow
def test_auto_compact_waits_for_the_end_of_a_tool_loop(tmp_path: Path) -> None:
    client, api = fake_client(anthropic)
    store = _open(tmp_path)
    config = CompactionConfig(auto_compact_threshold=0.1, auto_compact_wait_limit=0.95)
    sess = _session(store, api, NEW, config=config)
    sess.process_request(now=api.now)
    _call(sess, client, api, NEW)
    while not (sess.context().continues_thinking and sess.token_usage() >= 6_000):
        _call(sess, client, api, NEW)
    result = sess.process_request(now=api.now)  # over the threshold, inside a loop
    assert result.strategy is None or result.strategy.value == "tool_budget"
    while sess.context().continues_thinking:
        _call(sess, client, api, NEW, next_task=False)
    sess.append({"role": "user", "content": "Next task."}, timestamp=api.now)
    result = sess.process_request(now=api.now)
    assert result.strategy is not None and result.strategy.value == "full"
    _call(sess, client, api, NEW)
    assert api.errors == [] and api.dropped == 0
    assert _binding(store) == (None, None)
    store.close()


@pytest.mark.slow
def test_the_window_forces_a_cut_inside_a_loop_and_no_request_fails(tmp_path: Path) -> None:
    client, api = fake_client(anthropic)
    store = _open(tmp_path)
    config = CompactionConfig(auto_compact_threshold=0.2, auto_compact_wait_limit=0.2)
    sess = _session(store, api, NEW, config=config)
    sess.process_request(now=api.now)
    _call(sess, client, api, NEW)
    while sess.token_usage() < 0.2 * 60_000 or not sess.context().continues_thinking:
        _call(sess, client, api, NEW)
    result = sess.process_request(now=api.now)
    assert result.strategy is not None and result.strategy.value == "full"
    _call(sess, client, api, NEW)
    assert api.errors == []
    assert _binding(store)[0] == "drop_block"
    store.close()


@pytest.mark.slow
@pytest.mark.parametrize(("model", "thinking"), [(NEW, None), (OLD, OLD_THINKING)])
def test_a_long_coding_session_gets_no_api_error(
    tmp_path: Path, model: str, thinking: dict[str, Any] | None
) -> None:
    from benchmarks.providers import run

    figures = run(
        model=model, calls=120, window=30_000, db=str(tmp_path / "b.db"), thinking=thinking
    )
    assert figures["api_errors"] == 0, figures
    assert figures["steps_lost"] == 0
    assert figures["compactions"], figures


@pytest.mark.parametrize(("model", "policy"), [(NEW, "append_only"), (OLD, "rewrite")])
def test_read_dedup_compactions_record_the_edit_policy(
    tmp_path: Path, model: str, policy: str
) -> None:
    store = _open(tmp_path)
    sess = store.session("dedup", format="anthropic", model=model, now=T0)
    content = "def f():\n    return 1\n" * 40
    for n in (1, 2):
        sess.append(
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": f"r{n}", "name": "read_file", "input": {}}],
            }
        )
        sess.append_tool_result(f"r{n}", content, tool_name="read_file", file_path="src/f.py")
    [dedup] = [c for c in sess.compactions() if c.strategy == "read_dedup"]
    assert dedup.success and dedup.edit_policy == policy
    store.close()
