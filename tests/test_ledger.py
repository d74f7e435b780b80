"""The cost and cache ledger: what each model call was billed for (``model_calls``), its
cost at the store's prices, and a session's sum (``Session.cost``, ``compactstore cost``,
``compactstore stats``)."""

from __future__ import annotations

import asyncio
import json
import os
import warnings
from pathlib import Path
from typing import Any

import pytest
from anthropic.types import Message
from anthropic.types.beta import BetaMessage
from click.testing import CliRunner
from openai.types.chat import ChatCompletion
from openai.types.responses import Response
from sqlalchemy import inspect as sqlalchemy_inspect
from sqlalchemy import select

from compactstore import (
    AsyncCompactStore,
    CompactStore,
    CompactStoreWarning,
    InvalidInputError,
    Session,
)
from compactstore._cli import cli
from compactstore.db.schema import model_calls
from compactstore.pricing import PRICES, ModelPrice
from tests.conftest import CORPUS_DEV, corpus_params
from tests.helpers import T0, words
from tests.mock_http import anthropic_message, chat_completion

MTOK = 1_000_000

LEDGER = (
    "input_tokens",
    "cache_read_tokens",
    "cache_write_5m_tokens",
    "cache_write_1h_tokens",
    "output_tokens",
    "model",
    "cost_usd",
)


def ledger_rows(store: CompactStore, session_id: str) -> list[dict[str, Any]]:
    columns = [model_calls.c[name] for name in (*LEDGER, "real_tokens")]
    json_columns = ("iterations", "cache_miss_reason", "input_transformations")
    with store.engine.connect() as connection:
        found = connection.execute(
            select(*columns, *(model_calls.c[name] for name in json_columns))
            .where(model_calls.c.session_id == session_id)
            .order_by(model_calls.c.id)
        )
        rows = []
        for row in found:
            values = dict(row._mapping)
            for name in json_columns:
                values[name] = None if values[name] is None else json.loads(values[name])
            rows.append(values)
        return rows


def session(store: CompactStore, fmt: str = "anthropic", name: str = "s") -> Session:
    sess = store.session(name, format=fmt, context_window=200_000, now=T0)
    sess.append({"role": "user", "content": words(4_000)}, timestamp=T0)
    return sess


# -- append_response: the three SDKs ----------------------------------------------------------


def anthropic_reply() -> BetaMessage:
    body = anthropic_message([{"type": "text", "text": "Done."}], model="claude-opus-5-5")
    body["usage"] = {
        "input_tokens": 5,
        "cache_creation_input_tokens": 300,
        "cache_read_input_tokens": 2_000,
        "cache_creation": {"ephemeral_5m_input_tokens": 100, "ephemeral_1h_input_tokens": 200},
        "output_tokens": 80,
        "iterations": [
            {
                "type": "compaction",
                "input_tokens": 1_000,
                "output_tokens": 200,
                "cache_read_input_tokens": 0,
                "cache_creation_input_tokens": 0,
            },
            {
                "type": "message",
                "input_tokens": 5,
                "output_tokens": 80,
                "cache_read_input_tokens": 2_000,
                "cache_creation_input_tokens": 300,
            },
        ],
    }
    body["input_transformations"] = [
        {
            "type": "thinking_dropped",
            "path": "messages.1.content.0",
            "reason": "prefix_binding_mismatch",
        }
    ]
    body["diagnostics"] = {
        "cache_miss_reason": {"type": "messages_changed", "cache_missed_input_tokens": 1_800}
    }
    return BetaMessage.model_validate(body)


def test_an_anthropic_response_fills_every_ledger_field_and_its_cost(store: CompactStore) -> None:
    sess = session(store)
    sess.append_response(anthropic_reply(), now=T0 + 1)
    [row] = ledger_rows(store, "s")
    assert {name: row[name] for name in LEDGER[:-1]} == {
        "input_tokens": 5,
        "cache_read_tokens": 2_000,
        "cache_write_5m_tokens": 100,
        "cache_write_1h_tokens": 200,
        "output_tokens": 80,
        "model": "claude-opus-5-5",
    }
    assert row["real_tokens"] == 5 + 300 + 2_000
    assert [entry["type"] for entry in row["iterations"]] == ["compaction", "message"]
    assert row["input_transformations"] == [
        {
            "type": "thinking_dropped",
            "path": "messages.1.content.0",
            "reason": "prefix_binding_mismatch",
        }
    ]
    assert row["cache_miss_reason"] == {
        "type": "messages_changed",
        "cache_missed_input_tokens": 1_800,
    }
    # Claude Opus 5.5: $4 input, $20 output; cache read 0.05x, writes 1.25x (5m) and 2x (1h).
    top = 5 * 4 + 2_000 * 4 * 0.05 + 100 * 4 * 1.25 + 200 * 4 * 2 + 80 * 20
    compaction = 1_000 * 4 + 200 * 20  # billed in iterations, outside the top-level counts
    assert row["cost_usd"] == pytest.approx((top + compaction) / MTOK, abs=1e-12)


def test_an_anthropic_message_without_a_cache_split_writes_for_five_minutes(
    store: CompactStore,
) -> None:
    body = anthropic_message([{"type": "text", "text": "ok"}], cache_read=500)
    body["usage"]["cache_creation_input_tokens"] = 40
    session(store).append_response(Message.model_validate(body), now=T0 + 1)
    [row] = ledger_rows(store, "s")
    assert (row["cache_write_5m_tokens"], row["cache_write_1h_tokens"]) == (40, 0)
    assert row["iterations"] is None and row["cache_miss_reason"] is None


def test_a_chat_completion_splits_cached_and_written_tokens_out_of_the_prompt(
    store: CompactStore,
) -> None:
    body = chat_completion("ok", model="gpt-6-sol", prompt=1_000, completion=50)
    body["usage"]["prompt_tokens_details"] = {"cached_tokens": 600, "cache_write_tokens": 100}
    session(store, "openai").append_response(ChatCompletion.model_validate(body), now=T0 + 1)
    [row] = ledger_rows(store, "s")
    assert {name: row[name] for name in LEDGER[:-1]} == {
        "input_tokens": 300,
        "cache_read_tokens": 600,
        "cache_write_5m_tokens": 100,
        "cache_write_1h_tokens": 0,
        "output_tokens": 50,
        "model": "gpt-6-sol",
    }
    # GPT-6 Sol: $2 input, $10 output; cached 0.1x, cache write 1.25x.
    assert row["cost_usd"] == pytest.approx(
        (300 * 2 + 600 * 0.2 + 100 * 2.5 + 50 * 10) / MTOK, abs=1e-12
    )


RESPONSE: dict[str, Any] = {
    "id": "resp_1",
    "object": "response",
    "created_at": 1_741_569_952,
    "model": "gpt-6.2-sol",
    "status": "completed",
    "parallel_tool_calls": True,
    "tool_choice": "auto",
    "tools": [],
    "output": [
        {
            "type": "message",
            "id": "msg_1",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "ok", "annotations": []}],
        }
    ],
    "usage": {
        "input_tokens": 1_500,
        "input_tokens_details": {
            "cached_tokens": 1_000,
            "cache_write_tokens": 200,
            "cache_write_tokens_details": {"ttl_30m_tokens": 150, "ttl_12h_tokens": 50},
        },
        "output_tokens": 80,
        "output_tokens_details": {"reasoning_tokens": 40},
        "total_tokens": 1_580,
    },
    "prompt_cache_diagnostics": {
        "type": "cache_miss",
        "reason": "input_changed",
        "cache_missed_tokens": 300,
    },
    "input_transformations": [
        {"id": "rs_1", "action": "removed", "reason": "prefix_mismatch", "type": "reasoning"}
    ],
}


def test_a_responses_response_splits_writes_by_retention(store: CompactStore) -> None:
    session(store, "responses").append_response(Response.model_validate(RESPONSE), now=T0 + 1)
    [row] = ledger_rows(store, "s")
    assert {name: row[name] for name in LEDGER[:-1]} == {
        "input_tokens": 300,
        "cache_read_tokens": 1_000,
        "cache_write_5m_tokens": 150,
        "cache_write_1h_tokens": 50,
        "output_tokens": 80,
        "model": "gpt-6.2-sol",
    }
    assert row["cache_miss_reason"]["reason"] == "input_changed"
    assert row["input_transformations"][0]["reason"] == "prefix_mismatch"
    # GPT-6.2 Sol: $2 input, $10 output; cached $0.10, 30-minute write $2.50, 12-hour $5.
    assert row["cost_usd"] == pytest.approx(
        (300 * 2 + 1_000 * 0.1 + 150 * 2.5 + 50 * 5 + 80 * 10) / MTOK, abs=1e-12
    )


# -- prices --------------------------------------------------------------------------------------


def test_a_model_without_a_price_costs_null_and_is_counted_apart(store: CompactStore) -> None:
    sess = session(store)
    sess.record_usage(1_500, output_tokens=10, model="claude-unreleased-9", now=T0 + 1)
    sess.record_usage(1_500, output_tokens=10, model="claude-haiku-4-5-20251001", now=T0 + 2)
    rows = ledger_rows(store, "s")
    assert rows[0]["cost_usd"] is None
    # A dated id finds its model; Haiku 4.5: $1 input, $5 output.
    assert rows[1]["cost_usd"] == pytest.approx((1_500 * 1 + 10 * 5) / MTOK, abs=1e-12)
    cost = sess.cost()
    assert (cost.calls, cost.unpriced_calls) == (2, 1)
    assert cost.cost_usd == pytest.approx(rows[1]["cost_usd"])
    assert cost.input_tokens == 3_000 and cost.output_tokens == 20


def test_open_prices_add_and_replace_models(db_url: str) -> None:
    cheap = {"input_per_mtok": 1.0, "output_per_mtok": 2.0, "cache_read": 0.5}
    own = ModelPrice(input_per_mtok=3.0, output_per_mtok=4.0, cache_read=0.1)
    with CompactStore.open(db_url, prices={"claude-opus-5": cheap, "in-house-1": own}) as store:
        sess = session(store)
        sess.record_usage(1_000, cache_read_tokens=2_000, model="claude-opus-5", now=T0 + 1)
        sess.record_usage(1_000, output_tokens=100, model="in-house-1", now=T0 + 2)
        first, second = (row["cost_usd"] for row in ledger_rows(store, "s"))
    assert first == pytest.approx((1_000 * 1 + 2_000 * 0.5) / MTOK, abs=1e-12)
    assert second == pytest.approx((1_000 * 3 + 100 * 4) / MTOK, abs=1e-12)
    assert PRICES["claude-opus-5"].input_per_mtok == 5  # the shipped table is unchanged


@pytest.mark.parametrize(
    ("prices", "problem"),
    [
        ({"m": {"input_per_mtok": -1, "output_per_mtok": 1, "cache_read": 0.1}}, "input_per_mtok"),
        ({"m": {"input_per_mtok": 1, "output_per_mtok": 1}}, "cache_read"),
        ({"m": {"input_per_mtok": 1, "output_per_mtok": 1, "cache_read": 0, "x": 1}}, "x"),
        ({"m": 3.0}, "ModelPrice"),
        ([("m", 1)], "mapping"),
    ],
)
def test_bad_prices_are_refused_before_the_database_is_opened(
    tmp_path: Path, prices: Any, problem: str
) -> None:
    with pytest.raises(InvalidInputError, match=problem):
        CompactStore.open(tmp_path / "never.db", prices=prices)
    assert not (tmp_path / "never.db").exists()


def test_a_long_prompt_is_billed_at_the_long_rates(store: CompactStore) -> None:
    sess = session(store)
    sess.record_usage(100_000, output_tokens=10, model="claude-haiku-5-5", now=T0 + 1)
    sess.record_usage(100_001, output_tokens=10, model="claude-haiku-5-5", now=T0 + 2)
    short, long = (row["cost_usd"] for row in ledger_rows(store, "s"))
    # Haiku 5.5: $0.10 / $0.50 up to 100,000 prompt tokens, 5x over.
    assert short == pytest.approx((100_000 * 0.1 + 10 * 0.5) / MTOK, abs=1e-12)
    assert long == pytest.approx((100_001 * 0.5 + 10 * 2.5) / MTOK, abs=1e-12)


# -- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"cache_read_tokens": -1}, "cache_read_tokens"),
        ({"output_tokens": 1.5}, "output_tokens"),
        ({"cache_write_1h_tokens": True}, "cache_write_1h_tokens"),
        ({"cache_write_5m_tokens": "10"}, "cache_write_5m_tokens"),
        ({"iterations": {"type": "message"}}, "iterations"),
        ({"cache_miss_reason": {"type": {1, 2}}}, "cache_miss_reason is not JSON"),
    ],
)
def test_record_usage_refuses_bad_counts_and_records_nothing(
    store: CompactStore, fields: dict[str, Any], problem: str
) -> None:
    sess = session(store)
    with pytest.raises(InvalidInputError, match=problem):
        sess.record_usage(1_000, **fields, now=T0 + 1)
    with pytest.raises(InvalidInputError, match="input_tokens"):
        sess.record_usage(-5, now=T0 + 1)
    with pytest.raises(TypeError, match="cache_hits"):
        sess.record_usage(1_000, cache_hits=5, now=T0 + 1)  # type: ignore[call-arg]
    assert ledger_rows(store, "s") == []
    assert sess.cost().calls == 0


def test_a_usage_object_of_another_provider_is_refused_and_nothing_is_stored(
    store: CompactStore,
) -> None:
    sess = session(store)
    reply = Message.model_validate(anthropic_message([{"type": "text", "text": "ok"}]))
    # An Anthropic Message carrying a Chat Completions usage (a proxy that mixed them up).
    mixed = reply.model_copy(
        update={"usage": ChatCompletion.model_validate(chat_completion("x")).usage}
    )
    with pytest.raises(InvalidInputError, match=r"not an Anthropic usage.*Chat Completions"):
        sess.append_response(mixed, now=T0 + 1)
    negative = reply.model_copy(
        update={"usage": reply.usage.model_copy(update={"output_tokens": -3})}
    )
    with pytest.raises(InvalidInputError, match="output_tokens must be a whole number"):
        sess.append_response(negative, now=T0 + 1)
    body = chat_completion("ok", prompt=100)
    body["usage"]["prompt_tokens_details"] = {"cached_tokens": 150}
    openai_sess = session(store, "openai", "o")
    with pytest.raises(InvalidInputError, match="exceed prompt_tokens"):
        openai_sess.append_response(ChatCompletion.model_validate(body), now=T0 + 1)
    assert len(sess.messages()) == 1 and len(openai_sess.messages()) == 1
    assert ledger_rows(store, "s") == [] and ledger_rows(store, "o") == []


# -- Session.cost and what compaction wrote again -------------------------------------------------


def _compacting_session(store: CompactStore) -> Session:
    sess = store.session("c", context_window=60_000, now=T0)
    sess.append({"role": "user", "content": "Port the parser"}, timestamp=T0)
    for turn in range(8):
        sess.append({"role": "assistant", "content": words(4_000, f"a{turn}")}, timestamp=T0)
        sess.append({"role": "user", "content": words(4_000, f"u{turn}")}, timestamp=T0)
    return sess


@pytest.mark.slow
def test_cost_sums_the_calls_and_prices_the_cache_each_compaction_wrote_again(
    store: CompactStore,
) -> None:
    sess = _compacting_session(store)
    model = "claude-sonnet-4-5"  # $3 input, $15 output; read 0.1x, writes 1.25x and 2x

    def call(uncached: int, read: int, five: int, hour: int, output: int, at: float) -> None:
        sess.record_usage(
            uncached,
            cache_read_tokens=read,
            cache_write_5m_tokens=five,
            cache_write_1h_tokens=hour,
            output_tokens=output,
            model=model,
            now=at,
        )

    call(20, 9_000, 400, 0, 30, T0 + 1)
    first = sess.compact(now=T0 + 2)
    # The call after it: the whole compacted prefix is written to the cache again.
    call(15, 0, 8_000, 500, 40, T0 + 3)
    call(10, 8_500, 100, 0, 20, T0 + 4)
    sess.append({"role": "assistant", "content": words(4_000, "b")}, timestamp=T0 + 5)
    sess.append({"role": "user", "content": words(4_000, "c")}, timestamp=T0 + 5)
    second = sess.compact(now=T0 + 6)
    third = sess.compact(now=T0 + 7)  # two compactions before the next call
    call(12, 0, 9_000, 0, 5, T0 + 8)

    cost = sess.cost()
    assert cost.calls == 4 and cost.unpriced_calls == 0 and cost.calls_without_usage == 0
    assert (cost.input_tokens, cost.cache_read_tokens, cost.output_tokens) == (57, 17_500, 95)
    assert (cost.cache_write_5m_tokens, cost.cache_write_1h_tokens) == (17_500, 500)
    by_hand = (
        (20 * 3 + 9_000 * 0.3 + 400 * 3.75 + 30 * 15)
        + (15 * 3 + 8_000 * 3.75 + 500 * 6 + 40 * 15)
        + (10 * 3 + 8_500 * 0.3 + 100 * 3.75 + 20 * 15)
        + (12 * 3 + 9_000 * 3.75 + 5 * 15)
    ) / MTOK
    assert cost.cost_usd == pytest.approx(by_hand, abs=1e-12)
    assert first.success and second.success and third.success
    # The first call after the first compaction; the last call follows two compactions and
    # counts once, for the newest.
    assert [(r.compaction_id, r.call_seq, r.tokens) for r in cost.cache_rewrites] == [
        (first.id, 16, 8_500),
        (third.id, 18, 9_000),
    ]
    assert cost.cache_rewrites[0].cost_usd == pytest.approx((8_000 * 3.75 + 500 * 6) / MTOK)
    assert cost.cache_rewrite_tokens == 17_500
    assert cost.cache_rewrite_cost_usd == pytest.approx(
        (8_000 * 3.75 + 500 * 6 + 9_000 * 3.75) / MTOK
    )


@pytest.mark.slow
def test_the_async_session_reads_the_same_cost(db_url: str) -> None:
    async def run() -> tuple[float | None, int]:
        async with await AsyncCompactStore.open(
            db_url, prices={"m": {"input_per_mtok": 1, "output_per_mtok": 2, "cache_read": 0.1}}
        ) as store:
            sess = await store.session("a", now=T0)
            await sess.append({"role": "user", "content": words(2_000)}, timestamp=T0)
            await sess.record_usage(
                500, cache_read_tokens=1_000, output_tokens=7, model="m", now=T0 + 1
            )
            cost = await sess.cost()
            return cost.cost_usd, cost.cache_read_tokens

    cost_usd, read = asyncio.run(run())
    assert read == 1_000
    assert cost_usd == pytest.approx((500 * 1 + 1_000 * 0.1 + 7 * 2) / MTOK, abs=1e-12)


# -- the command line ---------------------------------------------------------------------------


@pytest.mark.slow
def test_compactstore_cost_and_stats_show_the_ledger(db_url: str) -> None:
    with CompactStore.open(db_url) as store:
        sess = session(store)
        sess.record_usage(
            100,
            cache_read_tokens=3_000,
            cache_write_1h_tokens=50,
            output_tokens=20,
            model="claude-opus-5",
            now=T0 + 1,
        )
        sess.record_usage(2_000, now=T0 + 2)  # no model: no price
    runner = CliRunner()
    shown = runner.invoke(cli, ["cost", "s", "--db", db_url, "--json"])
    assert shown.exit_code == 0, shown.output
    found = json.loads(shown.output)
    expected = (100 * 5 + 3_000 * 0.5 + 50 * 10 + 20 * 25) / MTOK  # Opus 5: $5 / $25
    assert found["session"] == "s" and found["calls"] == 2 and found["unpriced_calls"] == 1
    assert found["tokens"] == {
        "input": 2_100,
        "cache_read": 3_000,
        "cache_write_5m": 0,
        "cache_write_1h": 50,
        "output": 20,
    }
    assert found["cost_usd"] == pytest.approx(expected, abs=1e-12)
    assert found["cache_rewrite"] == {"tokens": 0, "cost_usd": None, "compactions": []}
    text = runner.invoke(cli, ["cost", "s", "--db", db_url])
    assert text.exit_code == 0, text.output
    assert f"${expected:,.4f} (+1 calls without a price)" in text.output
    assert "cache read 3,000" in text.output
    missing = runner.invoke(cli, ["cost", "nope", "--db", db_url])
    assert missing.exit_code == 1 and "nope" in missing.output
    stats = runner.invoke(cli, ["stats", "--db", db_url, "--json"])
    assert stats.exit_code == 0, stats.output
    ledger = json.loads(stats.output)["model_calls"]
    assert ledger["count"] == 2 and ledger["unpriced"] == 1
    assert ledger["tokens"]["cache_read"] == 3_000
    assert ledger["cost_usd"] == pytest.approx(expected, abs=1e-12)
    plain = runner.invoke(cli, ["stats", "--db", db_url])
    assert f"cost:           ${expected:,.4f}" in plain.output


_IMPORTED_BY_COST = """
import json, sys
from compactstore._cli import main
sys.argv = ["compactstore", "cost", "s", "--db", sys.argv[1], "--json"]
try:
    main()
except SystemExit:
    pass
print(json.dumps(sorted(sys.modules)))
"""


@pytest.mark.slow
def test_compactstore_cost_imports_only_what_it_needs(tmp_path: Path) -> None:
    """A fresh ``compactstore cost`` process imports neither the other commands' modules
    nor the async API, the summarizers, simulate or the report."""
    import subprocess
    import sys

    db = str(tmp_path / "cost.db")
    with CompactStore.open(db) as store:
        session(store).record_usage(1_000, output_tokens=20, model="claude-opus-5", now=T0 + 1)
    done = subprocess.run(
        [sys.executable, "-c", _IMPORTED_BY_COST, db],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
    )
    *document, modules = done.stdout.splitlines()
    assert json.loads("\n".join(document))["calls"] == 1
    loaded = set(json.loads(modules))
    assert "compactstore._cli.reading" in loaded and "compactstore._store.store" in loaded
    for heavy in (
        "compactstore.aio",
        "compactstore._cli.transcripts",
        "compactstore._cli.report",
        "compactstore.report",
        "compactstore._simulate",
        "compactstore.summarizers",
        "compactstore._importers",
        "jinja2",
    ):
        assert heavy not in loaded, heavy


# -- migration from the previous head -----------------------------------------------------------

PREVIOUS_HEAD = "6aa8b67dd6bf"


@pytest.mark.slow
def test_an_existing_database_with_model_calls_upgrades_keeping_its_rows(db_url: str) -> None:
    from alembic import command

    from compactstore.db.migrate import alembic_config, current_revision, head_revision

    with CompactStore.open(db_url) as store:
        sess = session(store)
        sess.record_usage(1_200, now=T0 + 1)
        sess.record_usage(1_300, now=T0 + 2)
        config = alembic_config()
        with store.engine.begin() as connection:
            config.attributes["connection"] = connection
            command.downgrade(config, PREVIOUS_HEAD)
        with store.engine.connect() as connection:
            columns = {c["name"] for c in sqlalchemy_inspect(connection).get_columns("model_calls")}
        assert "cost_usd" not in columns  # the previous head's shape

    with CompactStore.open(db_url, auto_migrate=True) as store:
        assert current_revision(store.engine) == head_revision()
        old = store.get_session("s")
        cost = old.cost()
        assert (cost.calls, cost.calls_without_usage, cost.unpriced_calls) == (2, 2, 2)
        assert cost.cost_usd is None and cost.input_tokens == 0
        with store.engine.connect() as connection:
            kept = connection.execute(
                select(model_calls.c.real_tokens, model_calls.c.model).order_by(model_calls.c.id)
            ).all()
        assert [tuple(row) for row in kept] == [(1_200, None), (1_300, None)]
        old.record_usage(1_400, output_tokens=9, model="claude-opus-5", now=T0 + 3)
        after = old.cost()
        assert (after.calls, after.calls_without_usage, after.unpriced_calls) == (3, 2, 2)
        assert after.cost_usd == pytest.approx((1_400 * 5 + 9 * 25) / MTOK, abs=1e-12)


# -- transcripts: the ledger equals the transcript's own usage ---------------------------------

CLAUDE_CODE = sorted((CORPUS_DEV / "claude-code").glob("*.jsonl"))
# The models of the dev transcripts at the published prices (dollars per million tokens:
# input, output); every one reads the cache at 0.1x, writes it at 1.25x (5 m) and 2x (1 h).
BY_HAND = {
    "claude-opus-4-6": (5.0, 25.0),
    "claude-opus-5": (5.0, 25.0),
    "claude-sonnet-4-5-20250929": (3.0, 15.0),
}


def _transcript_usage(path: Path) -> dict[str, dict[str, Any]]:
    """Each API message's usage, by message id: Claude Code writes one record per content
    block, each repeating the message's usage (the output count growing to the last)."""
    found: dict[str, dict[str, Any]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        message = record.get("message")
        if record.get("type") != "assistant" or not isinstance(message, dict):
            continue
        if record.get("isApiErrorMessage") or not isinstance(message.get("usage"), dict):
            continue
        found[message["id"]] = {"model": message.get("model"), **message["usage"]}
    return found


@pytest.mark.corpus
@pytest.mark.slow
@pytest.mark.parametrize(
    "path",
    corpus_params(CLAUDE_CODE, CORPUS_DEV / "claude-code", "Claude Code transcripts"),
    ids=lambda p: p.name,
)
def test_an_imported_claude_code_transcript_has_its_own_usage_sums(
    path: Path, tmp_path: Path
) -> None:
    from compactstore._importers import import_file

    calls = _transcript_usage(path)
    if not calls:
        pytest.skip(f"{path.name} records no usage")
    sums = {
        key: sum(int(usage.get(key) or 0) for usage in calls.values())
        for key in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
    }
    hour = sum(
        int((usage.get("cache_creation") or {}).get("ephemeral_1h_input_tokens") or 0)
        for usage in calls.values()
    )
    with CompactStore.open(tmp_path / "cc.db") as store, warnings.catch_warnings():
        # Notes about blocks a role may not carry: not what this test is about.
        warnings.simplefilter("ignore", CompactStoreWarning)
        cost = import_file(store, path, session_id="cc").cost()
    assert cost.calls == len(calls)
    assert cost.input_tokens == sums["input_tokens"]
    assert cost.cache_read_tokens == sums["cache_read_input_tokens"]
    assert cost.cache_write_tokens == sums["cache_creation_input_tokens"]
    assert cost.cache_write_1h_tokens == hour
    assert cost.output_tokens == sum(int(usage["output_tokens"]) for usage in calls.values())
    by_hand = 0.0
    for usage in calls.values():
        input_price, output_price = BY_HAND[usage["model"]]
        written = int(usage.get("cache_creation_input_tokens") or 0)
        long = int((usage.get("cache_creation") or {}).get("ephemeral_1h_input_tokens") or 0)
        by_hand += (
            int(usage["input_tokens"]) * input_price
            + int(usage.get("cache_read_input_tokens") or 0) * input_price * 0.1
            + (written - long) * input_price * 1.25
            + long * input_price * 2
            + int(usage["output_tokens"]) * output_price
        ) / MTOK
    assert cost.unpriced_calls == 0
    assert cost.cost_usd == pytest.approx(by_hand, rel=1e-9)


def _rollout(kind: str, payload: dict[str, Any], second: int) -> str:
    stamp = f"2026-09-25T14:02:{second:02d}.000Z"
    return json.dumps({"timestamp": stamp, "type": kind, "payload": payload})


def _token_count(uncached: int, cached: int, output: int, second: int) -> str:
    usage = {"input_tokens": uncached + cached, "cached_input_tokens": cached}
    usage["output_tokens"] = output
    return _rollout(
        "event_msg", {"type": "token_count", "info": {"last_token_usage": usage}}, second
    )


def _say(role: str, text: str, second: int) -> str:
    kind = "output_text" if role == "assistant" else "input_text"
    item = {"type": "message", "role": role, "content": [{"type": kind, "text": text}]}
    return _rollout("response_item", item, second)


def test_an_imported_codex_rollout_fills_the_ledger_from_its_token_counts(
    tmp_path: Path, store: CompactStore
) -> None:
    from compactstore._importers import import_file

    path = tmp_path / "rollout.jsonl"
    lines = [
        _rollout("session_meta", {"id": "1", "cwd": "/w"}, 0),
        _rollout("turn_context", {"cwd": "/w", "model": "gpt-6-sol"}, 1),
        _say("user", "fix the build " + words(3_000), 2),
        _token_count(1_200, 0, 90, 3),  # newer Codex: the count before the reply's items
        _say("assistant", "Fixed.", 4),
        _say("user", "and the tests " + words(3_000), 5),
        _say("assistant", "Done.", 6),
        _token_count(900, 1_024, 40, 7),  # older Codex: after them
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    cost = import_file(store, path, session_id="codex").cost()
    assert (cost.calls, cost.unpriced_calls) == (2, 0)
    # Codex's input_tokens includes the cached part: the ledger keeps them apart.
    assert (cost.input_tokens, cost.cache_read_tokens, cost.output_tokens) == (2_100, 1_024, 130)
    assert cost.cache_write_tokens == 0
    # GPT-6 Sol: $2 input, $10 output, cached input 0.1x.
    assert cost.cost_usd == pytest.approx((2_100 * 2 + 1_024 * 0.2 + 130 * 10) / MTOK, abs=1e-12)
    with store.engine.connect() as connection:
        models = connection.execute(
            select(model_calls.c.model).where(model_calls.c.session_id == "codex")
        ).scalars()
        assert list(models) == ["gpt-6-sol", "gpt-6-sol"]


def test_a_transcript_usage_with_a_bad_count_names_its_line(tmp_path: Path) -> None:
    from compactstore._importers import read_transcript

    record = {
        "type": "assistant",
        "uuid": "u1",
        "parentUuid": None,
        "sessionId": "s",
        "timestamp": "2026-01-01T00:00:01.000Z",
        "message": {
            "id": "m1",
            "role": "assistant",
            "model": "claude-opus-5",
            "content": [{"type": "text", "text": "hi"}],
            "usage": {"input_tokens": 3, "output_tokens": -1, "cache_read_input_tokens": 9},
        },
    }
    first = {**record, "type": "user", "uuid": "u0", "message": {"role": "user", "content": "x"}}
    path = tmp_path / "cc.jsonl"
    path.write_text(json.dumps(first) + "\n" + json.dumps(record) + "\n", encoding="utf-8")
    with pytest.raises(InvalidInputError, match=r"line 2: .*output_tokens must be a whole"):
        read_transcript(path)


def test_the_models_that_check_prefixes_have_dated_prices() -> None:
    from compactstore.pricing import price_table

    table = price_table(None)
    for model in (
        "claude-fable-5-1",
        "claude-fable-5-2",
        "claude-mythos-5-1",
        "claude-mythos-5-2",
        "claude-opus-5-5",
        "claude-sonnet-5-5",
        "claude-haiku-5-5",
        "gpt-6.2-sol",
    ):
        price = table.price(model)
        assert price is not None, model
        assert price.cache_read <= 0.1 and price.cache_write_5m == 1.25
    assert table.price("claude-sonnet-5-5-20261007") == table.price("claude-sonnet-5-5")
    # A name that only starts like a priced model is not that model.
    assert table.price("claude-fable-5-3") is None and table.price("gpt-6-sol-mini") is None


@pytest.mark.slow
def test_the_ledger_survives_a_backup_and_restore(db_url: str, tmp_path: Path) -> None:
    from compactstore.transfer import backup, restore

    with CompactStore.open(db_url) as store:
        sess = session(store)
        sess.append_response(anthropic_reply(), now=T0 + 1)
        before = sess.cost()
        rows = ledger_rows(store, "s")
        backup(store, tmp_path / "backup.db")
        store.delete_session("s")
        restore(store, tmp_path / "backup.db")
        assert store.get_session("s").cost() == before
        assert ledger_rows(store, "s") == rows
