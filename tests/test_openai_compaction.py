"""Provider compaction on the Responses API: OpenAICompactor (``responses.compact``) as the
decide step, and server-side compaction items in responses, against the strict fake of the
Responses API (tests/fake_responses_api.py) through the official SDK, as the README's loop
runs them: the item sent in place, byte-identical, in every later request; what it replaced
left out of the wire view, never out of the log; bad items refused; an item the provider
no longer reads repaired by reactive_recover."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from compactstore import AsyncCompactStore, CompactStore
from compactstore.errors import InvalidInputError, InvalidMessageError
from compactstore.providers import OpenAICompactor
from tests.fake_responses_api import FakeResponsesAPI, fake_client
from tests.mock_http import http_module

openai = pytest.importorskip("openai")

MODEL = "gpt-5"
TOOLS = [
    {"type": "function", "name": name, "parameters": {"type": "object", "properties": {}}}
    for name in ("read_file", "grep", "run_tests", "edit_file")
]
SYSTEM = "You are a careful coding agent."
MANAGED = [{"type": "compaction", "compact_threshold": 12_000}]
PINNED = [
    {"role": "developer", "content": SYSTEM},
    {"role": "user", "content": "Fix the failing tests."},
]


def _session(store: CompactStore, api: FakeResponsesAPI, compactor: Any, name: str = "r") -> Any:
    sess = store.session(
        name,
        format="responses",
        context_window=api.window,
        model=MODEL,
        compactor=compactor,
        now=api.now,
    )
    sess.append({"role": "developer", "content": SYSTEM}, timestamp=api.now)
    sess.append({"role": "user", "content": "Fix the failing tests."}, timestamp=api.now)
    return sess


def _call(sess: Any, client: Any, api: FakeResponsesAPI, **extra: Any) -> Any:
    sess.process_request(now=api.now)
    return client.responses.create(
        model=MODEL,
        tools=TOOLS,
        include=["reasoning.encrypted_content"],
        store=False,
        **sess.request_params(now=api.now),
        **extra,
    )


def _step(sess: Any, client: Any, api: FakeResponsesAPI, **extra: Any) -> Any:
    """One step of the README's loop: request, append the response, answer its calls or
    give the next task."""
    response = _call(sess, client, api, **extra)
    api.advance(30)
    sess.append_response(response, timestamp=api.now, now=api.now)
    calls = [item for item in response.output if item.type == "function_call"]
    for call in calls:
        sess.append_tool_result(
            call.call_id, "line of code\n" * 150, tool_name=call.name, timestamp=api.now
        )
    if not calls:
        sess.append({"role": "user", "content": "Next task."}, timestamp=api.now)
    return response


def _boundary_rows(store: CompactStore, session: str = "r") -> list[Any]:
    with store.engine.connect() as connection:
        return list(
            connection.execute(
                text(
                    "SELECT id, strategy, trigger, summary_text, summary_message, "
                    "rolled_back_at FROM compact_boundaries WHERE session_id = :s ORDER BY id"
                ),
                {"s": session},
            )
        )


@pytest.fixture
def fake() -> tuple[Any, FakeResponsesAPI]:
    return fake_client(openai, window=20_000)


@pytest.mark.slow
def test_the_compactor_runs_a_tool_loop_with_no_error(tmp_path: Path, fake: Any) -> None:
    client, api = fake
    store = CompactStore.open(str(tmp_path / "r.db"))
    sess = _session(store, api, OpenAICompactor(client, model=MODEL, sleep=lambda s: None))
    for _ in range(60):
        _step(sess, client, api)
    assert api.errors == []
    done = [c for c in sess.compactions() if c.strategy == "provider"]
    assert len(done) >= 2 and len(done) == len(api.compactions)
    assert all(c.summary and c.summary.summarizer == "openai_compaction" for c in done)
    rows = [row for row in _boundary_rows(store) if row.strategy == "provider"]
    compact_calls = [i for i, path in enumerate(api.paths) if path.endswith("/compact")]
    for row, issued, at in zip(rows, api.compactions, compact_calls, strict=True):
        # The boundary keeps the item as issued; its summary is a note naming it and the
        # rule-based summary of the same range beside it.
        assert json.loads(row.summary_message) == issued
        assert row.summary_text.startswith(
            f"[compaction by the provider: opaque item {issued['id']}"
        )
        assert "[Context compacted at" in row.summary_text
        # Every later request sends it in place, byte for byte, until the next one.
        later = [
            body["input"]
            for i, body in enumerate(api.bodies)
            if i > at
            and api.paths[i].endswith("/responses")
            and not any(j > at and j < i for j in compact_calls)
        ]
        assert later
        for sent in later:
            # After the pinned items (the developer message, the first request: kept as
            # the API's own new window keeps user messages), what it replaced left out.
            assert [x for x in sent if x.get("type") == "compaction"] == [issued]
            assert sent[:3] == [*PINNED, issued]
            assert not any(x.get("type") == "function_call" for x in sent[:3])
    assert {"role": "user", "content": "Fix the failing tests."} in sess.messages()
    # The compactions' own usage is in the ledger.
    with store.engine.connect() as connection:
        calls = list(
            connection.execute(
                text(
                    "SELECT iterations, model FROM model_calls WHERE session_id = 'r' "
                    "AND iterations LIKE '%compaction%'"
                )
            )
        )
    assert len(calls) == len(rows)
    assert all(json.loads(call.iterations)[0]["input_tokens"] > 0 for call in calls)
    store.close()


@pytest.mark.slow
def test_compact_sends_the_item_in_place(tmp_path: Path, fake: Any) -> None:
    client, api = fake
    store = CompactStore.open(str(tmp_path / "r.db"))
    sess = _session(store, api, OpenAICompactor(client, model=MODEL))
    for _ in range(5):
        _step(sess, client, api)
    result = sess.compact(now=api.now)
    assert result.strategy == "provider" and result.summary is not None
    assert result.summary.source == "provider" and result.summary.model == MODEL
    [item] = api.compactions
    sent = sess.request_params(now=api.now)["input"]
    assert sent[:3] == [*PINNED, item]
    assert len(sent) < len(sess.messages())
    _step(sess, client, api)
    assert api.errors == []
    # Rollback returns the readable items; the next request is valid.
    sess.rollback(now=api.now)
    assert all(x.get("type") != "compaction" for x in sess.request_params(now=api.now)["input"])
    _step(sess, client, api)
    assert api.errors == []
    store.close()


@pytest.mark.slow
def test_server_side_compaction_is_a_boundary(tmp_path: Path, fake: Any) -> None:
    client, api = fake
    store = CompactStore.open(str(tmp_path / "r.db"))
    sess = _session(store, api, None)
    for _ in range(40):
        _step(sess, client, api, context_management=MANAGED)
    assert api.errors == [] and len(api.compactions) >= 2
    rows = [row for row in _boundary_rows(store) if row.strategy == "provider"]
    assert [row.trigger for row in rows] == ["server"] * len(api.compactions)
    # The request after the response that carried each item is the first to send it;
    # every request from there to the next item sends it in place, byte for byte.
    sent_from = [
        next((i for i, body in enumerate(api.bodies) if item["id"] in json.dumps(body)), None)
        for item in api.compactions
    ]
    assert all(first is not None for first in sent_from[:-1])
    bounds = [first for first in sent_from if first is not None] + [len(api.bodies)]
    for row, item in zip(rows, api.compactions, strict=True):
        assert json.loads(row.summary_message) == item
    for item, first, end in zip(api.compactions, bounds, bounds[1:], strict=False):
        assert first < end
        for body in api.bodies[first:end]:
            assert [x for x in body["input"] if x.get("type") == "compaction"] == [item]
            assert body["input"][:3] == [*PINNED, item]
    assert len(sess.messages()) > len(api.bodies[-1]["input"])  # the log keeps all
    store.close()


def test_bad_compaction_items_are_refused(db_url: str, fake: Any) -> None:
    client, api = fake
    store = CompactStore.open(db_url)
    sess = _session(store, api, None)
    other = _session(store, api, None, name="other")
    for _ in range(3):
        _step(sess, client, api)
    response = _call(
        sess, client, api, context_management=[{"type": "compaction", "compact_threshold": 1_000}]
    )
    item = response.output[0]
    assert item.type == "compaction"
    count = len(sess.messages())
    malformed = item.model_copy(update={"encrypted_content": ""})
    bad = [
        [malformed, *response.output[1:]],
        [item, item, *response.output[1:]],
        [*response.output[1:], item],
    ]
    for output in bad:
        with pytest.raises(InvalidMessageError, match="compaction item"):
            sess.append_response(response.model_copy(update={"output": output}), now=api.now)
    assert len(sess.messages()) == count and sess.boundaries() == []
    sess.append_response(response, timestamp=api.now, now=api.now)
    [boundary] = sess.boundaries()
    assert boundary.strategy == "provider" and boundary.trigger == "server"
    # The same item for another session, or again for this one: refused, nothing stored.
    for target in (other, sess):
        before = len(target.messages())
        with pytest.raises(InvalidMessageError, match="compaction object"):
            target.append_response(response, now=api.now)
        assert len(target.messages()) == before
    assert other.boundaries() == []
    store.close()


@pytest.mark.parametrize("how", ["revoked", "rotated key", "edited in the database"])
@pytest.mark.slow
def test_an_item_the_provider_no_longer_reads_is_repaired(
    tmp_path: Path, fake: Any, how: str
) -> None:
    client, api = fake
    store = CompactStore.open(str(tmp_path / "r.db"))
    sess = _session(store, api, OpenAICompactor(client, model=MODEL))
    for _ in range(5):
        _step(sess, client, api)
    assert sess.compact(now=api.now).strategy == "provider"
    logged = sess.messages()
    if how == "revoked":
        api.revoke(api.compactions[-1]["id"])
    elif how == "rotated key":
        # Every item sealed before stops decoding, the reasoning items' too: the repaired
        # request sends reasoning sealed under the old key, so only the recovery is checked.
        api.rotate_key()
    else:
        item = api.compactions[-1]
        edited = item["encrypted_content"][:-4] + "AAAA"
        with store.engine.begin() as connection:
            connection.execute(
                text("UPDATE compact_boundaries SET summary_message = :m WHERE session_id = 'r'"),
                {"m": json.dumps({**item, "encrypted_content": edited})},
            )
        store.close()
        store = CompactStore.open(str(tmp_path / "r.db"))
        sess = store.session("r", compactor=OpenAICompactor(client, model=MODEL))
    with pytest.raises(openai.BadRequestError) as refused:
        _call(sess, client, api)
    assert api.errors[-1]["code"] == "invalid_encrypted_content"
    result = sess.reactive_recover(str(refused.value), now=api.now)
    assert result is not None and result.success and result.strategy != "provider"
    assert result.error is not None and "could not be verified" in result.error
    [undone] = [b for b in sess.boundaries(True) if b.strategy == "provider"]
    assert undone.rolled_back_at is not None
    assert sess.messages() == logged  # nothing lost: the log keeps every item
    sent = sess.request_params(now=api.now)["input"]
    assert all(x.get("type") != "compaction" for x in sent)
    if how != "rotated key":
        _step(sess, client, api)
        assert api.errors[-1]["code"] == "invalid_encrypted_content" and len(api.errors) == 1
    store.close()


@pytest.mark.slow
def test_overload_is_retried_and_a_failure_falls_back(tmp_path: Path, fake: Any) -> None:
    client, api = fake
    store = CompactStore.open(str(tmp_path / "r.db"))
    compactor = OpenAICompactor(client, model=MODEL, retries=2, sleep=lambda s: None)
    sess = _session(store, api, compactor)
    for _ in range(5):
        _step(sess, client, api)
    api.unavailable = 2
    assert sess.compact(now=api.now).strategy == "provider"
    for _ in range(3):
        _step(sess, client, api)
    api.unavailable = 3  # more than the retries
    result = sess.compact(now=api.now)
    assert result.strategy == "full" and result.summary is not None
    assert result.summary.fallback and "compaction_unavailable" in str(result.summary.reason)
    _step(sess, client, api)
    assert [error["code"] for error in api.errors] == [None] * 5
    store.close()


def test_the_compactor_checks_its_client() -> None:
    with pytest.raises(InvalidInputError, match=r"client\.responses\.compact"):
        OpenAICompactor(object(), model=MODEL)
    with pytest.raises(InvalidInputError, match="model"):
        OpenAICompactor(openai.OpenAI(api_key="x"), model="")


def test_async_openai_on_the_async_store(tmp_path: Path, fake: Any) -> None:
    client, api = fake
    http = http_module(openai)
    aclient = openai.AsyncOpenAI(
        api_key="x",
        http_client=http.AsyncClient(transport=http.MockTransport(api)),
        max_retries=0,
    )
    compactor = OpenAICompactor(aclient, model=MODEL, backoff=0)
    # An async client's compactor is awaited: the sync store refuses it, clearly.
    with pytest.raises(InvalidInputError, match="AsyncCompactStore"):
        CompactStore.open(str(tmp_path / "s.db"), compactor=compactor)

    async def main() -> tuple[Any, list[dict[str, Any]]]:
        store = await AsyncCompactStore.open(str(tmp_path / "a.db"), compactor=compactor)
        sess = await store.session("r", format="responses", model=MODEL, now=api.now)
        await sess.append({"role": "user", "content": "Fix the failing tests."})
        for _ in range(4):
            response = await aclient.responses.create(
                model=MODEL,
                include=["reasoning.encrypted_content"],
                store=False,
                **await sess.request_params(),
            )
            await sess.append_response(response, now=api.now)
            for call in [o for o in response.output if o.type == "function_call"]:
                await sess.append_tool_result(call.call_id, "ok\n" * 100, tool_name=call.name)
        result = await sess.compact(now=api.now)
        sent = (await sess.request_params())["input"]
        await store.close()
        return result, sent

    api.unavailable = 1  # one 503 first: retried with asyncio.sleep
    result, sent = asyncio.run(main())
    assert result.strategy == "provider" and result.summary is not None
    assert not result.summary.fallback
    assert sent[:2] == [{"role": "user", "content": "Fix the failing tests."}, api.compactions[0]]
    client.responses.create(model=MODEL, input=sent, store=False)
    assert [error["code"] for error in api.errors] == [None]  # the one 503


def test_a_server_boundary_rolls_back_and_is_not_replayed(tmp_path: Path, fake: Any) -> None:
    from compactstore.errors import ConflictError

    client, api = fake
    store = CompactStore.open(str(tmp_path / "r.db"))
    sess = _session(store, api, None)
    for _ in range(3):
        _step(sess, client, api)
    _step(
        sess, client, api, context_management=[{"type": "compaction", "compact_threshold": 1_000}]
    )
    [boundary] = sess.boundaries()
    assert boundary.trigger == "server" and boundary.summary_text.startswith(
        f"[compaction by the provider: opaque item {api.compactions[0]['id']}"
    )
    with pytest.raises(ConflictError, match="the provider did on its own"):
        sess.replay(boundary.id)
    sess.rollback(now=api.now)
    sent = sess.request_params(now=api.now)["input"]
    assert all(item.get("type") != "compaction" for item in sent)
    assert sent[:2] == PINNED and len(sent) == len(sess.messages())
    _step(sess, client, api)
    assert api.errors == []
    store.close()


def test_the_capability_table_lists_both_openai_compactions() -> None:
    from compactstore.capabilities import capabilities_for, resolve_policy

    entry = capabilities_for("gpt-5-2025-08-07")
    assert entry.compaction == ("openai_compact", "openai_server")
    assert not entry.prefix_checks and resolve_policy("auto", "gpt-5") == ("rewrite", False)


@pytest.mark.slow
def test_the_item_survives_backup_and_restore_byte_for_byte(tmp_path: Path, fake: Any) -> None:
    from compactstore.transfer import backup, restore

    client, api = fake
    store = CompactStore.open(str(tmp_path / "r.db"))
    sess = _session(store, api, OpenAICompactor(client, model=MODEL))
    for _ in range(5):
        _step(sess, client, api)
    assert sess.compact(now=api.now).strategy == "provider"
    first = sess.request_params(now=api.now)["input"]
    backup(store, tmp_path / "backup.db")
    other = CompactStore.open(str(tmp_path / "other.db"))
    restore(other, tmp_path / "backup.db")
    again = other.session("r").request_params(now=api.now)["input"]
    assert json.dumps(again) == json.dumps(first) and api.compactions[0] in again
    client.responses.create(model=MODEL, input=again, store=False)
    assert api.errors == []
    other.close()
    store.close()


@pytest.mark.parametrize(
    ("output", "reason"),
    [
        (lambda item: [item, dict(item)], "2 compaction items"),
        (lambda item: [item, {"role": "user", "content": "after"}], "not one last item"),
        (lambda item: [{**item, "summary": "x"}], "unknown field"),
        (lambda item: [{**item, "encrypted_content": ""}], "non-empty string"),
        (lambda item: [{"role": "user", "content": "no item"}], "0 compaction items"),
    ],
    ids=["two-items", "not-last", "unknown-field", "empty-content", "no-item"],
)
@pytest.mark.slow
def test_a_malformed_answer_never_becomes_a_boundary(
    tmp_path: Path, fake: Any, output: Any, reason: str
) -> None:
    client, api = fake
    store = CompactStore.open(str(tmp_path / "r.db"))
    sess = _session(store, api, OpenAICompactor(client, model=MODEL))
    for _ in range(5):
        _step(sess, client, api)
    api.rewrite_compact = lambda body: {**body, "output": output(body["output"][-1])}
    result = sess.compact(now=api.now)
    assert result.strategy == "full" and result.summary is not None
    assert result.summary.fallback and reason in str(result.summary.reason)
    assert all(b.strategy != "provider" for b in sess.boundaries(True))
    _step(sess, client, api)
    assert api.errors == []
    store.close()


@pytest.mark.slow
def test_an_async_compaction_that_times_out_falls_back(tmp_path: Path, fake: Any) -> None:
    from compactstore import CompactionConfig

    _, api = fake
    http = http_module(openai)
    aclient = openai.AsyncOpenAI(
        api_key="x",
        http_client=http.AsyncClient(transport=http.MockTransport(api)),
        max_retries=0,
    )
    # The retry after a 503 waits 0.5 s on the event loop, past the 0.1 s timeout.
    compactor = OpenAICompactor(aclient, model=MODEL, backoff=0.5)

    async def main() -> Any:
        store = await AsyncCompactStore.open(str(tmp_path / "a.db"), compactor=compactor)
        sess = await store.session(
            "r",
            format="responses",
            model=MODEL,
            now=api.now,
            config=CompactionConfig(summarizer_timeout_seconds=0.1),
        )
        await sess.append({"role": "user", "content": "Fix the failing tests."})
        for n in range(3):
            await sess.append({"role": "user", "content": f"step {n} " * 200})
            await sess.append({"role": "assistant", "content": f"done {n}"})
        api.unavailable = 1
        result = await sess.compact(now=api.now)
        sent = (await sess.request_params())["input"]
        await store.close()
        return result, sent

    result, sent = asyncio.run(main())
    assert result.strategy == "full" and result.summary is not None
    assert result.summary.fallback and "timed out" in str(result.summary.reason)
    assert api.compactions == [] and all(x.get("type") != "compaction" for x in sent)
