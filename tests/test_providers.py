"""Provider compaction as boundaries: AnthropicCompactor against the strict fake of the
Messages API (tests/fake_messages_api.py) through the official SDK, as the decide step of
auto-compact and compact(), with its fallbacks, the wire view sending the block first, and
bad blocks refused."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from compactstore import CompactionConfig, CompactStore
from compactstore.capabilities import COMPACTION_BETA
from compactstore.errors import InvalidInputError
from compactstore.providers import AnthropicCompactor
from tests.fake_messages_api import FakeMessagesAPI, fake_client
from tests.mock_http import http_module

anthropic = pytest.importorskip("anthropic")

NEW = "claude-opus-5-5"
TOOLS = [{"name": "read_file", "description": "Read a file", "input_schema": {"type": "object"}}]
SYSTEM = "You are a careful coding agent."


def _session(
    store: CompactStore, api: FakeMessagesAPI, compactor: Any, window: int = 30_000
) -> Any:
    sess = store.session(
        "loop",
        context_window=window,
        format="anthropic",
        now=api.now,
        model=NEW,
        compactor=compactor,
    )
    sess.append({"role": "system", "content": SYSTEM}, timestamp=api.now)
    sess.append({"role": "user", "content": "Fix the failing tests."}, timestamp=api.now)
    return sess


def _step(sess: Any, client: Any, api: FakeMessagesAPI) -> Any:
    """One step of the README's loop (process_request, request, append the reply and its
    tool results, or the next task)."""
    sess.process_request(now=api.now)
    reply = client.messages.create(
        model=NEW, max_tokens=1_024, tools=TOOLS, **sess.request_params(now=api.now)
    )
    api.advance(30)
    sess.append_response(reply, timestamp=api.now, now=api.now)
    calls = [block for block in reply.content if block.type == "tool_use"]
    for block in calls:
        sess.append_tool_result(
            block.id, "line of code\n" * 200, tool_name=block.name, timestamp=api.now
        )
    if not calls:
        sess.append({"role": "user", "content": "Next task."}, timestamp=api.now)
    return reply


@pytest.fixture
def fake() -> Iterator[tuple[Any, FakeMessagesAPI]]:
    client, api = fake_client(anthropic, default_window=30_000)
    yield client, api


def _provider_boundaries(store: CompactStore) -> list[Any]:
    with store.engine.connect() as connection:
        return list(
            connection.execute(
                text(
                    "SELECT id, strategy, trigger, summary_text, summary_message, "
                    "rolled_back_at FROM compact_boundaries WHERE session_id = 'loop' "
                    "ORDER BY id"
                )
            )
        )


def _loop(store: CompactStore, client: Any, api: FakeMessagesAPI, steps: int, **kw: Any) -> Any:
    compactor = AnthropicCompactor(client, tools=TOOLS, sleep=lambda s: None, **kw)
    sess = _session(store, api, compactor)
    for _ in range(steps):
        _step(sess, client, api)
    return sess


@pytest.mark.slow
def test_tool_loop_with_thinking_compacts_on_the_provider(db_url: str, fake: Any) -> None:
    client, api = fake
    store = CompactStore.open(db_url)
    sess = _loop(store, client, api, 90)
    assert api.errors == []
    assert api.dropped == 0  # the API dropped no thinking block
    provider = [c for c in sess.compactions() if c.strategy == "provider" and c.success]
    assert len(provider) >= 2
    assert all(c.summary is not None and c.summary.source == "provider" for c in provider)
    # Each boundary keeps the provider's block as returned, its text as the summary.
    rows = [row for row in _provider_boundaries(store) if row.strategy == "provider"]
    issued = [i for i, body in enumerate(api.bodies) if "compaction" in body]
    assert len(rows) == len(issued) == len(api.compactions)
    for row, at in zip(rows, issued, strict=True):
        message = json.loads(row.summary_message)
        block = message["content"][0]
        assert message["role"] == "assistant" and block["type"] == "compaction"
        assert row.summary_text == block["content"]
        # Every later request sends that block first, unchanged, until the next one.
        later = [
            body
            for i, body in enumerate(api.bodies)
            if i > at
            and "compaction" not in body
            and (not issued or i < min([j for j in issued if j > at], default=len(api.bodies)))
        ]
        assert later
        for body in later:
            first = body["messages"][0]["content"][0]
            assert {k: v for k, v in first.items() if k != "cache_control"} == block
    # The compactions' own usage is in the ledger, priced.
    with store.engine.connect() as connection:
        calls = list(
            connection.execute(
                text(
                    "SELECT iterations, cost_usd, model FROM model_calls "
                    "WHERE session_id = 'loop' AND iterations LIKE '%compaction%'"
                )
            )
        )
    assert len(calls) == len(rows)
    assert all(call.model == NEW and call.cost_usd and call.cost_usd > 0 for call in calls)
    store.close()


def test_request_params_send_the_block_first_with_the_beta_header(
    tmp_path: Path, fake: Any
) -> None:
    client, api = fake
    store = CompactStore.open(str(tmp_path / "p.db"))
    compactor = AnthropicCompactor(client, tools=TOOLS, sleep=lambda s: None)
    sess = _session(store, api, compactor, window=200_000)
    for _ in range(6):
        _step(sess, client, api)
    result = sess.compact(now=api.now)
    assert result.strategy == "provider"
    params = sess.request_params(now=api.now)
    first = params["messages"][0]
    assert first["role"] == "assistant" and first["content"][0]["type"] == "compaction"
    assert COMPACTION_BETA in params["extra_headers"]["anthropic-beta"]
    # The block stands in place of everything it summarised (the pinned first request
    # too: the provider read it); the log keeps it all.
    sent = [m.get("content") for m in params["messages"]]
    assert "Fix the failing tests." not in sent
    assert "Fix the failing tests." in [m.get("content") for m in sess.messages()]
    assert len(params["messages"]) < len(sess.messages())
    assert params["system"] == SYSTEM
    client.messages.create(model=NEW, max_tokens=1_024, tools=TOOLS, **params)
    assert api.errors == []
    store.close()


def test_529_is_retried_then_compacts(tmp_path: Path, fake: Any) -> None:
    client, api = fake
    store = CompactStore.open(str(tmp_path / "p.db"))
    waits: list[float] = []
    compactor = AnthropicCompactor(client, tools=TOOLS, sleep=waits.append, backoff=0.5)
    sess = _session(store, api, compactor, window=200_000)
    for _ in range(6):
        _step(sess, client, api)
    api.unavailable = 2
    result = sess.compact(now=api.now)
    assert result.strategy == "provider"
    assert waits == [0.5, 1.0]
    assert [e["type"] for e in api.errors] == ["compaction_unavailable"] * 2
    store.close()


@pytest.mark.parametrize(
    ("setup", "reason"),
    [
        (lambda api: setattr(api, "unavailable", 5), "compaction_unavailable"),
        (lambda api: api.compaction_failures.append("refusal"), "no compaction"),
    ],
    ids=["529-past-the-retries", "typed-failure"],
)
def test_failures_fall_back_to_the_client_summary(
    tmp_path: Path, fake: Any, setup: Any, reason: str
) -> None:
    client, api = fake
    store = CompactStore.open(str(tmp_path / "p.db"))
    compactor = AnthropicCompactor(client, tools=TOOLS, sleep=lambda s: None)
    sess = _session(store, api, compactor, window=200_000)
    for _ in range(6):
        _step(sess, client, api)
    setup(api)
    result = sess.compact(now=api.now)
    assert result.success and result.strategy == "full"
    assert result.summary is not None and result.summary.fallback
    assert reason in (result.summary.reason or "")
    params = sess.request_params(now=api.now)
    client.messages.create(model=NEW, max_tokens=1_024, tools=TOOLS, **params)
    assert api.errors == [] or api.errors[-1]["type"] == "compaction_unavailable"
    store.close()


def test_a_timeout_falls_back(tmp_path: Path, fake: Any) -> None:
    client, api = fake
    store = CompactStore.open(str(tmp_path / "p.db"))

    release = threading.Event()

    def slow(seconds: float) -> None:  # the retry's wait lasts until the test ends it
        assert release.wait(10), "never released"

    compactor = AnthropicCompactor(client, tools=TOOLS, sleep=slow)
    sess = _session(store, api, compactor, window=200_000)
    sess = store.session(
        "loop",
        config=CompactionConfig(summarizer_timeout_seconds=0.1),
        compactor=compactor,
        now=api.now,
    )
    for _ in range(6):
        _step(sess, client, api)
    api.unavailable = 1  # the retry waits past the timeout
    result = sess.compact(now=api.now)
    release.set()
    assert result.strategy == "full" and result.summary is not None
    assert "timed out" in (result.summary.reason or "")
    store.close()


def test_compactor_checks_its_client() -> None:
    with pytest.raises(InvalidInputError, match="anthropic client"):
        AnthropicCompactor(object())
    with pytest.raises(InvalidInputError, match="compactor must be"):
        CompactStore.open(":memory:", compactor="not callable")


def _compacted(tmp_path: Path, client: Any, api: FakeMessagesAPI, name: str = "p.db") -> Any:
    store = CompactStore.open(str(tmp_path / name))
    compactor = AnthropicCompactor(client, tools=TOOLS, sleep=lambda s: None)
    sess = _session(store, api, compactor, window=200_000)
    for _ in range(8):
        _step(sess, client, api)
    assert sess.compact(now=api.now).strategy == "provider"
    return store, sess


def test_rollback_returns_the_readable_turns(tmp_path: Path, fake: Any) -> None:
    client, api = fake
    store, sess = _compacted(tmp_path, client, api)
    before = sess.messages()
    [undone] = sess.rollback(now=api.now)
    assert undone.strategy == "provider"
    params = sess.request_params(now=api.now)
    assert all(
        not isinstance(m["content"], list) or m["content"][0]["type"] != "compaction"
        for m in params["messages"]
    )
    assert "anthropic-beta" not in (params.get("extra_headers") or {}) or (
        COMPACTION_BETA not in params["extra_headers"]["anthropic-beta"]
    )
    assert params["messages"][0]["content"] == "Fix the failing tests."
    assert sess.messages() == before  # the log never lost them
    client.messages.create(model=NEW, max_tokens=1_024, tools=TOOLS, **params)
    assert api.errors == []
    store.close()


@pytest.mark.slow
def test_a_signature_edited_in_the_database_is_recovered(tmp_path: Path, fake: Any) -> None:
    client, api = fake
    store, sess = _compacted(tmp_path, client, api)
    with store.engine.begin() as connection:
        row = connection.execute(
            text("SELECT id, summary_message FROM compact_boundaries WHERE strategy = 'provider'")
        ).one()
        message = json.loads(row.summary_message)
        message["content"][0]["signature"] = message["content"][0]["signature"][:-3] + "xyz"
        connection.execute(
            text("UPDATE compact_boundaries SET summary_message = :m WHERE id = :id"),
            {"m": json.dumps(message), "id": row.id},
        )
    store.close()
    store = CompactStore.open(str(tmp_path / "p.db"))
    sess = store.session("loop")
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(
            model=NEW, max_tokens=1_024, tools=TOOLS, **sess.request_params(now=api.now)
        )
    assert api.errors[-1]["type"] == "compaction_signature_invalid"
    result = sess.reactive_recover(str(refused.value), now=api.now)
    assert result is not None and result.success
    assert result.strategy != "provider"
    assert "compaction_signature_invalid" in (result.error or "")
    live = sess.boundaries()
    assert live and live[-1].strategy != "provider"
    assert any(b.strategy == "provider" and b.rolled_back_at for b in sess.boundaries(True))
    client.messages.create(
        model=NEW, max_tokens=1_024, tools=TOOLS, **sess.request_params(now=api.now)
    )
    assert api.errors[-1]["type"] == "compaction_signature_invalid"  # no new error
    assert len(api.errors) == 1
    store.close()


@pytest.mark.slow
def test_the_block_survives_backup_and_restore_byte_for_byte(tmp_path: Path, fake: Any) -> None:
    from compactstore.transfer import backup, restore

    client, api = fake
    store, sess = _compacted(tmp_path, client, api)
    first = sess.request_params(now=api.now)["messages"][0]
    backup(store, tmp_path / "backup.db")
    other = CompactStore.open(str(tmp_path / "other.db"))
    restore(other, tmp_path / "backup.db")
    again = other.session("loop").request_params(now=api.now)["messages"][0]
    assert json.dumps(again, sort_keys=True) == json.dumps(first, sort_keys=True)
    client.messages.create(
        model=NEW,
        max_tokens=1_024,
        tools=TOOLS,
        **other.session("loop").request_params(now=api.now),
    )
    assert api.errors == []
    other.close()
    store.close()


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (lambda block: [block, dict(block)], "not one compaction block"),
        (lambda block: [{**block, "summary": "x"}], "unknown field"),
        (lambda block: [{**block, "content": ""}], "non-empty string"),
        (lambda block: [{"type": "compaction", "content": "no signature"}], "signature"),
    ],
    ids=["two-blocks", "unknown-field", "empty-content", "unsigned"],
)
def test_a_malformed_answer_never_becomes_a_boundary(
    tmp_path: Path, fake: Any, monkeypatch: pytest.MonkeyPatch, answer: Any, reason: str
) -> None:
    client, api = fake
    store = CompactStore.open(str(tmp_path / "p.db"))
    compactor = AnthropicCompactor(client, tools=TOOLS, sleep=lambda s: None)
    sess = _session(store, api, compactor, window=200_000)
    for _ in range(6):
        _step(sess, client, api)
    real = api._compacted

    def malformed(req: Any) -> dict[str, Any]:
        body: dict[str, Any] = real(req)
        body["content"] = answer(body["content"][0])
        return body

    monkeypatch.setattr(api, "_compacted", malformed)
    result = sess.compact(now=api.now)
    assert result.strategy == "full" and result.summary is not None
    assert result.summary.fallback and reason in (result.summary.reason or "")
    assert all(b.strategy != "provider" for b in sess.boundaries(True))
    client.messages.create(
        model=NEW, max_tokens=1_024, tools=TOOLS, **sess.request_params(now=api.now)
    )
    assert api.errors == []
    store.close()


def test_on_the_async_store(tmp_path: Path, fake: Any) -> None:
    import asyncio

    from compactstore import AsyncCompactStore

    client, api = fake
    http = http_module(anthropic)
    aclient = anthropic.AsyncAnthropic(
        api_key="x",
        http_client=http.AsyncClient(transport=http.MockTransport(api)),
        max_retries=0,
    )
    # An async client's compactor is awaited: the sync store refuses it, clearly.
    with pytest.raises(InvalidInputError, match="AsyncCompactStore"):
        CompactStore.open(str(tmp_path / "s.db"), compactor=AnthropicCompactor(aclient))

    async def main() -> Any:
        compactor = AnthropicCompactor(aclient, tools=TOOLS, backoff=0)
        api.unavailable = 1  # one 529 first: retried with asyncio.sleep
        store = await AsyncCompactStore.open(str(tmp_path / "a.db"), compactor=compactor)
        sess = await store.session("loop", format="anthropic", model=NEW, now=api.now)
        await sess.append({"role": "system", "content": SYSTEM}, timestamp=api.now)
        await sess.append({"role": "user", "content": "Fix the failing tests."}, timestamp=api.now)
        for _ in range(6):
            reply = client.messages.create(
                model=NEW, max_tokens=1_024, tools=TOOLS, **await sess.request_params()
            )
            await sess.append_response(reply, timestamp=api.now, now=api.now)
            for block in reply.content:
                if block.type == "tool_use":
                    await sess.append_tool_result(
                        block.id, "x = 1\n" * 200, tool_name=block.name, timestamp=api.now
                    )
            if reply.stop_reason != "tool_use":
                await sess.append({"role": "user", "content": "Next."}, timestamp=api.now)
        result = await sess.compact(now=api.now)
        params = await sess.request_params()
        await store.close()
        return result, params

    result, params = asyncio.run(main())
    assert result.strategy == "provider" and result.summary is not None
    assert result.summary.source == "provider" and not result.summary.fallback
    assert len(api.compactions) == 1
    client.messages.create(model=NEW, max_tokens=1_024, tools=TOOLS, **params)
    assert [error["type"] for error in api.errors] == ["compaction_unavailable"]


@pytest.mark.slow
def test_replay_of_a_provider_boundary(tmp_path: Path, fake: Any) -> None:
    client, api = fake
    store, sess = _compacted(tmp_path, client, api)
    boundary = sess.boundaries()[-1]
    recorded = sess.replay(boundary.id)
    assert recorded.summary is not None and recorded.summary.source == "recorded"
    assert recorded.summary_text == boundary.summary_text
    again = sess.replay(boundary.id, resummarize=True, apply=True, now=api.now)
    assert again.strategy == "provider" and again.summary is not None
    assert again.summary.source == "provider"
    assert len(api.compactions) == 2  # asked the provider again
    client.messages.create(
        model=NEW, max_tokens=1_024, tools=TOOLS, **sess.request_params(now=api.now)
    )
    assert api.errors == []
    store.close()


def test_a_threshold_compaction_in_a_reply_is_a_boundary(tmp_path: Path, fake: Any) -> None:
    from compactstore.errors import InvalidMessageError
    from tests.fake_messages_api import THRESHOLD_COMPACTION_BETA

    client, api = fake
    store = CompactStore.open(str(tmp_path / "p.db"))
    sess = _session(store, api, None, window=200_000)
    for _ in range(6):
        _step(sess, client, api)
    edit = {"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 2_000}}

    def call(edits: list[dict[str, Any]]) -> Any:
        params = sess.request_params(now=api.now)
        headers = dict(params.pop("extra_headers", {}))
        betas = headers.get("anthropic-beta", "").split(",")
        headers["anthropic-beta"] = ",".join([*filter(None, betas), THRESHOLD_COMPACTION_BETA])
        body = params.pop("extra_body", {})
        ours = body.get("context_management", {}).get("edits", [])
        return client.beta.messages.create(
            model=NEW,
            max_tokens=1_024,
            tools=TOOLS,
            extra_headers=headers,
            extra_body={"context_management": {"edits": [*ours, *edits]}},
            **params,
        )

    reply = call([edit])
    assert reply.content[0].type == "compaction"
    # A malformed block, or a second one, is refused and nothing is stored.
    count = len(sess.messages())
    for bad in ([reply.content[0], *reply.content], [reply.content[1], reply.content[0]]):
        with pytest.raises(InvalidMessageError):
            sess.append_response(reply.model_copy(update={"content": bad}), now=api.now)
    assert len(sess.messages()) == count
    sess.append_response(reply, timestamp=api.now, now=api.now)
    [boundary] = [b for b in sess.boundaries() if b.strategy == "provider"]
    assert boundary.trigger == "server"
    assert boundary.summary_text == reply.content[0].content
    for block in reply.content:
        if block.type == "tool_use":
            sess.append_tool_result(block.id, "ok", tool_name=block.name, timestamp=api.now)
    params = sess.request_params(now=api.now)
    assert params["messages"][0]["content"][0] == reply.content[0].model_dump(exclude_none=True)
    big = {**edit, "trigger": {"type": "input_tokens", "value": 150_000}}
    call([big])
    assert api.errors == []
    store.close()


def test_a_provider_summary_counts_its_tokens(tmp_path: Path, fake: Any) -> None:
    """The block's summary costs what it sends: replaying the boundary with its recorded
    text frees exactly what the provider compaction did."""
    client, api = fake
    store, sess = _compacted(tmp_path, client, api)
    boundary = sess.boundaries()[-1]
    [done] = [c for c in sess.compactions() if c.strategy == "provider"]
    assert done.tokens_after < done.tokens_before
    again = sess.replay(boundary.id)
    assert again.summary is not None and again.summary.source == "recorded"
    assert again.tokens_after == done.tokens_after
    store.close()
