"""simulate's cost: a prompt cache at message granularity on the replay's clock
(compactstore._simulate.cost), under the store's policy, with compaction off, and the
transcript's own recorded usage, priced with compactstore.pricing."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
from click.testing import CliRunner

from compactstore._cli import cli
from compactstore._simulate import simulate
from compactstore._simulate.cost import CacheMeter
from compactstore.errors import CompactStoreWarning
from compactstore.pricing import price_table
from tests.conftest import CORPUS_DEV
from tests.test_ledger import BY_HAND, MTOK, _transcript_usage
from tests.test_simulate import transcript, write_jsonl

SONNET_IN, SONNET_OUT = 3.0, 15.0  # claude-sonnet-4-5, per million tokens


def test_the_meter_reads_the_previous_prefix_and_writes_the_rest() -> None:
    meter = CacheMeter("claude-sonnet-4-5", price_table(None))
    first = [("overhead", 800), (0, 400)]
    meter.call(first, now=0.0, output=10)  # 1,200 >= 1,024: written
    meter.call([*first, (1, 300)], now=20.0, output=10)  # reads 1,200, writes 300
    meter.call([("overhead", 800), ("edited", 100)], now=40.0, output=10)  # 900: too short
    meter.call([*first, (1, 300), (2, 50)], now=400.0, output=10)  # 5 minutes on: cold
    assert meter.calls == 4
    assert meter.total.cache_read_tokens == 1_200
    assert meter.total.cache_write_5m_tokens == 1_200 + 300 + 1_550
    assert meter.total.input_tokens == 900
    assert meter.total.output_tokens == 40
    by_hand = (
        900 * SONNET_IN + 1_200 * SONNET_IN * 0.1 + 3_050 * SONNET_IN * 1.25 + 40 * SONNET_OUT
    ) / 1_000_000
    assert meter.cost_usd == pytest.approx(by_hand, rel=1e-12)
    assert meter.cache_read_share == pytest.approx(1_200 / 5_150)
    assert CacheMeter("my-model", price_table(None)).cost_usd == 0.0
    unpriced = CacheMeter("my-model", price_table(None))
    unpriced.call(first, now=0.0, output=1)
    assert unpriced.cost_usd is None


@pytest.mark.slow
def test_a_transcript_without_usage_is_priced_at_the_model_given(tmp_path: Path) -> None:
    file = write_jsonl(tmp_path / "a.jsonl", transcript("anthropic", huge=False))
    out = CliRunner().invoke(cli, ["simulate", str(file), "--window", "8000"])
    assert out.exit_code == 0, out.output
    assert "cost: no model known (the transcript records none): give --model" in out.output
    priced = simulate(file, window=8_000, model="claude-sonnet-4-5")
    assert priced.cost_model == "claude-sonnet-4-5"
    assert priced.cost_usd is not None and priced.cost_usd > 0
    assert priced.cache_read_share is not None and priced.cache_read_share > 0.5
    assert priced.off_peak_tokens > 8_000 and priced.cost_off_usd is None
    assert priced.transcript_cost_calls == 0 and priced.transcript_cost_usd is None
    wide = simulate(file, window=1_000_000, model="claude-sonnet-4-5")
    # Nothing to cut in a wide window: the policy's calls are the transcript's own.
    assert wide.cost_off_usd == pytest.approx(wide.cost_usd, rel=0.05)


PATH = CORPUS_DEV / "claude-code" / "agentcmd-full-session-four.jsonl"


@pytest.mark.corpus
@pytest.mark.slow
def test_a_claude_code_transcript_costs_what_its_usage_says(tmp_path: Path) -> None:
    if not PATH.is_file():
        pytest.skip(f"no {PATH}")
    calls = _transcript_usage(PATH)
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
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CompactStoreWarning)
        out = CliRunner().invoke(cli, ["simulate", str(PATH), "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert data["transcript_cost_calls"] == len(calls)
    assert data["transcript_cost_usd"] == pytest.approx(by_hand, rel=1e-9)
    models = {usage["model"] for usage in calls.values()}
    assert data["cost_model"] in models
    assert data["cost_usd"] > 0 and data["cost_off_usd"] > 0
    assert data["off_peak_tokens"] <= data["window"]
