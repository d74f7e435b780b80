"""`history`, `show` and the report show the edit policy, the session's model and thinking
binding, the thinking blocks the API dropped, and provider compactions; the CLI rolls back
and replays a provider boundary (against the strict fake of the Messages API)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import text

from compactstore import CompactionConfig, CompactStore
from compactstore._cli import cli
from compactstore.providers import AnthropicCompactor
from tests.fake_messages_api import FakeMessagesAPI, fake_client
from tests.test_edit_policy import _call, _tasks
from tests.test_edit_policy import _session as _policy_session
from tests.test_providers import NEW, TOOLS, _step
from tests.test_providers import _session as _provider_session

anthropic = pytest.importorskip("anthropic")

DROPPED = [
    {"type": "thinking_block_dropped", "path": "messages[3].content[0]", "reason": "x"},
    {"type": "thinking_block_dropped", "path": "messages[5].content[0]", "reason": "x"},
]


def _invoke(*args: str) -> Any:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result


def _json(*args: str) -> Any:
    return json.loads(_invoke(*args, "--json").stdout)


@pytest.mark.slow
def test_history_and_show_name_the_model_policy_and_dropped_blocks(tmp_path: Path) -> None:
    db = str(tmp_path / "s.db")
    with CompactStore.open(db) as store:
        sess = store.session("s", context_window=20_000, format="anthropic", model=NEW, now=1_000.0)
        sess.append({"role": "user", "content": "Fix the failing tests."}, timestamp=1_000.0)
        sess.record_usage(900, model=NEW, input_transformations=DROPPED, now=1_010.0)
        sess.append({"role": "assistant", "content": "On it."}, timestamp=1_020.0)
        sess.record_usage(950, model=NEW, input_transformations=DROPPED[:1], now=1_030.0)
        sess.record_usage(960, model=NEW, now=1_040.0)  # nothing dropped
        sess.compact(now=1_050.0)
    found = _json("history", "s", "--db", db)
    state = found["edit_state"]
    assert state["model"] == NEW
    assert (state["edit_policy"], state["effective_policy"]) == ("auto", "append_only")
    assert state["prefix_checks"] is True
    assert state["thinking_binding"] is None and state["thinking_binding_at"] is None
    assert [(d["call_seq"], d["count"]) for d in state["dropped"]] == [(0, 2), (1, 1)]
    assert state["dropped"][0]["transformations"] == DROPPED
    assert state["dropped_total"] == 3
    assert all(c["edit_policy"] == "append_only" for c in found["compactions"])
    assert _json("show", "s", "--db", db)["edit_state"] == state
    out = _invoke("history", "s", "--db", db).output
    assert f"model: {NEW} · edit policy: auto → append_only" in out
    assert "thinking binding: none" in out
    assert "thinking blocks the API dropped: 3 in 2 model calls (seq 0: 2, seq 1: 1)" in out
    assert "policy" in out.splitlines()[3] and "append_only" in out
    out = _invoke("show", "s", "--db", db).output
    assert out.splitlines()[1].startswith(f"model: {NEW}")


@pytest.mark.slow
def test_the_drop_block_binding_and_its_time_are_shown(tmp_path: Path) -> None:
    client, api = fake_client(anthropic)
    db = str(tmp_path / "b.db")
    store = CompactStore.open(db)
    config = CompactionConfig(edit_policy="rewrite", microcompact_keep_recent=1)
    sess = _policy_session(store, api, NEW, config=config)
    _call(sess, client, api, NEW)
    while not (sess.context().continues_thinking and _tasks(sess) >= 2):
        _call(sess, client, api, NEW)
    sess.compact(now=api.now)  # a cut inside the tool loop: drop_block from now on
    bound_at = api.now
    _call(sess, client, api, NEW)
    assert api.errors == [] and api.dropped > 0
    store.close()
    state = _json("history", "s", "--db", db)["edit_state"]
    assert (state["thinking_binding"], state["thinking_binding_at"]) == ("drop_block", bound_at)
    assert state["edit_policy"] == state["effective_policy"] == "rewrite"
    assert state["dropped_total"] == api.dropped
    out = _invoke("history", "s", "--db", db).output
    assert "thinking binding: drop_block since" in out
    assert f"thinking blocks the API dropped: {api.dropped:,} in 1 model call" in out
    # The report shows the same.
    pytest.importorskip("jinja2")
    page = tmp_path / "b.html"
    _invoke("report", "s", "--db", db, "-o", str(page))
    html = page.read_text()
    assert '<b data-field="thinking_binding">drop_block</b>' in html
    assert f'<b data-field="dropped_total">{api.dropped:,}</b>' in html
    assert 'data-field="edit_policy">rewrite<' in html


def _provider_store(tmp_path: Path, client: Any, api: FakeMessagesAPI) -> str:
    db = str(tmp_path / "p.db")
    with CompactStore.open(db) as store:
        compactor = AnthropicCompactor(client, tools=TOOLS, sleep=lambda s: None)
        sess = _provider_session(store, api, compactor, window=200_000)
        for _ in range(8):
            _step(sess, client, api)
        assert sess.compact(now=api.now).strategy == "provider"
    return db


def _next_request_is_valid(db: str, client: Any, api: FakeMessagesAPI) -> dict[str, Any]:
    with CompactStore.open(db) as store:
        params = store.get_session("loop").request_params(now=api.now)
        client.messages.create(model=NEW, max_tokens=1_024, tools=TOOLS, **params)
    assert api.errors == []
    return params


@pytest.mark.slow
def test_the_cli_shows_rolls_back_and_replays_a_provider_boundary(tmp_path: Path) -> None:
    client, api = fake_client(anthropic, default_window=30_000)
    db = _provider_store(tmp_path, client, api)
    found = _json("history", "loop", "--db", db)
    [provider] = [c for c in found["compactions"] if c["strategy"] == "provider"]
    assert (provider["trigger"], provider["edit_policy"]) == ("manual", "append_only")
    assert provider["summary"]["source"] == "provider"
    boundary_id = provider["boundary"]["id"]
    out = _invoke("history", "loop", "--db", db).output
    assert any("provider" in line and "append_only" in line for line in out.splitlines())
    shown = _json("show", "loop", "--db", db, "--full")
    assert shown["boundary_id"] == boundary_id
    summary = next(m for m in shown["messages"] if m["state"] == "summary")
    assert summary["message"]["content"][0]["type"] == "compaction"
    assert summary["text"].startswith("[provider compaction] <summary>")
    out = _invoke("show", "loop", "--db", db).output
    assert "summary       [provider compaction] <summary>" in out
    pytest.importorskip("jinja2")
    page = tmp_path / "p.html"
    _invoke("report", "loop", "--db", db, "-o", str(page))
    html = page.read_text()
    card = f'<h3>#{provider["id"]} provider <span class="note">(manual, '
    assert card + '<span data-field="edit_policy">append_only</span>)' in html
    assert '<b data-field="effective_policy">append_only</b>' in html
    assert f'<b data-field="model">{NEW}</b>' in html
    # Replay reuses the recorded text of the provider's summary and cuts at the same place.
    replayed = _json("replay", "loop", "--boundary", str(boundary_id), "--db", db)
    assert replayed["summary_source"] == "recorded" and not replayed["applied"]
    recorded, again = replayed["recorded"], replayed["replayed"]
    for key in ("kept", "messages_removed", "tokens_before", "summary_text"):
        assert recorded[key] == again[key], key
    params = _next_request_is_valid(db, client, api)
    assert params["messages"][0]["content"][0]["type"] == "compaction"
    # Rollback returns the readable turns, and the next request is valid.
    undone = _json("rollback", "loop", "--yes", "--db", db)
    assert [c["strategy"] for c in undone["rolled_back"]] == ["provider"]
    after = _json("history", "loop", "--db", db)
    assert after["compactions"][-1]["rolled_back_at"] is not None
    params = _next_request_is_valid(db, client, api)
    assert params["messages"][0]["content"] == "Fix the failing tests."
    with CompactStore.open(db) as store, store.engine.connect() as connection:
        rolled = connection.execute(
            text("SELECT rolled_back_at FROM compact_boundaries WHERE id = :id"),
            {"id": boundary_id},
        ).scalar_one()
    assert rolled is not None


@pytest.mark.slow
def test_the_async_session_reads_the_same_edit_state(tmp_path: Path) -> None:
    import asyncio

    from compactstore import AsyncCompactStore

    async def main() -> Any:
        store = await AsyncCompactStore.open(str(tmp_path / "a.db"))
        sess = await store.session("a", format="anthropic", model=NEW, now=1_000.0)
        await sess.append({"role": "user", "content": "Fix it."}, timestamp=1_000.0)
        await sess.record_usage(500, model=NEW, input_transformations=DROPPED, now=1_010.0)
        state = await sess.edit_state()
        await store.close()
        return state

    state = asyncio.run(main())
    assert (state.model, state.effective_policy, state.dropped_total) == (NEW, "append_only", 2)
    assert state.dropped[0].transformations == DROPPED
