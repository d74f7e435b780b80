"""A small window keeps working for as long as the session goes on: the summary takes at most
``summary_max_window_share`` of the window, so compaction always makes room.

With only ``summary_max_tokens`` (6,000) to bound it, an 8,192-token session's running
summary grew until no compaction got under the auto-compact threshold: the breaker tripped
near turn 90 and the context then grew without bound.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from click.testing import CliRunner
from pydantic import ValidationError
from sqlalchemy import create_engine, text

from compactstore import CompactionConfig, CompactStore
from compactstore._cli import cli
from tests.helpers import T0, opened

WINDOW = 8_192
_WORDS = ("ledger", "invoice", "batch", "total", "export", "retry", "gateway", "parse", "csv")


def _words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(count))


@pytest.mark.slow
def test_a_long_session_on_an_8192_token_window_stays_within_it(tmp_path: Path) -> None:
    """250 turns of a coding agent with the default config: a new instruction every turn
    (the summary's fastest-growing part), a file read, now and then a failing command."""
    rng = random.Random(7)
    with opened(tmp_path / "small.db") as store:
        sess = store.session("small", context_window=WINDOW, now=T0)
        sess.append({"role": "system", "content": "You are a coding agent. " + _words(rng, 100)})
        sess.append({"role": "user", "content": "Fix the ledger export: " + _words(rng, 40)})
        now = T0
        usage = []
        for turn in range(250):
            now += 30
            instruction = f"Instruction {turn}: " + _words(rng, rng.randint(10, 40))
            sess.append({"role": "user", "content": instruction}, timestamp=now)

            result = sess.process_request(now=now)

            usage.append(sess.token_usage())
            assert result.tokens_after <= WINDOW, turn
            assert not sess.breaker().tripped, turn
            call = f"toolu_{turn:05d}"
            failing = turn % 7 == 0
            tool = (
                {"name": "Bash", "input": {"command": f"pytest tests/test_{turn % 9}.py"}}
                if failing
                else {"name": "Read", "input": {"file_path": f"src/module_{turn % 70}.py"}}
            )
            sess.append(
                {
                    "role": "assistant",
                    "content": [
                        {"type": "text", "text": "I'll look. " + _words(rng, 20)},
                        {"type": "tool_use", "id": call, **tool},
                    ],
                },
                timestamp=now + 1,
            )
            output = "Error: 1 failed" if failing else _words(rng, rng.randint(50, 400))
            sess.append(
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": call, "content": output}],
                },
                timestamp=now + 2,
            )
        compactions = sess.compactions()
        breaker = sess.breaker()

    assert max(usage) <= WINDOW
    assert breaker.consecutive_failures == 0 and not breaker.tripped
    full = [c for c in compactions if c.strategy == "full"]
    assert len(full) >= 10  # the summary was folded into again and again
    assert all(c.success for c in full)


def test_the_share_must_be_a_fraction_of_the_window(tmp_path: Path) -> None:
    for wrong in (0, -0.1, 1.5):
        with pytest.raises(ValidationError, match="summary_max_window_share"):
            CompactionConfig(summary_max_window_share=wrong)
    assert CompactionConfig(summary_max_window_share=1).summary_max_window_share == 1
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"summary_max_window_share": 2}))
    transcript = tmp_path / "t.jsonl"
    transcript.write_text('{"role": "user", "content": "hi"}\n')

    result = CliRunner().invoke(
        cli, ["simulate", str(transcript), "--config", str(bad)], env={"COMPACTSTORE_DB": None}
    )

    assert result.exit_code == 1
    assert result.stderr.startswith("Error: invalid config in")
    assert "summary_max_window_share" in result.stderr
    assert result.stderr.count("\n") == 1


def test_the_share_is_stored_with_the_session_and_each_compaction(db_url: str) -> None:
    config = CompactionConfig(summary_max_window_share=0.35, token_factor=1.0)
    with CompactStore.open(db_url) as store:
        sess = store.session("shared", context_window=20_000, config=config, now=T0)
        for i in range(40):
            sess.append({"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i} " * 80})
        assert sess.compact(now=T0 + 100).effective
    with CompactStore.open(db_url) as store:
        assert store.session("shared").config == config
    engine = create_engine(db_url if "://" in db_url else f"sqlite:///{db_url}")
    try:
        with engine.connect() as connection:
            stored = (
                connection.execute(
                    text(
                        "SELECT k.config FROM compactions c JOIN compaction_configs k "
                        "ON k.session_id = c.session_id AND k.hash = c.config_hash"
                    )
                )
                .scalars()
                .all()
            )
    finally:
        engine.dispose()
    assert stored and all(CompactionConfig.model_validate_json(c) == config for c in stored)


def test_a_config_stored_before_the_share_existed_reads_with_the_default(db_url: str) -> None:
    with CompactStore.open(db_url) as store:
        store.session("old", context_window=20_000, now=T0)
    older = json.loads(CompactionConfig().model_dump_json())
    del older["summary_max_window_share"]
    engine = create_engine(db_url if "://" in db_url else f"sqlite:///{db_url}")
    try:
        with engine.begin() as connection:
            connection.execute(text("UPDATE sessions SET config = :c"), {"c": json.dumps(older)})
    finally:
        engine.dispose()

    with CompactStore.open(db_url) as store:
        config = store.session("old").config

    assert config == CompactionConfig()
    assert config.summary_max_window_share == 0.2


@pytest.mark.parametrize(("window", "asked"), [(8_192, 1_024), (200_000, 6_000)])
def test_the_memory_provider_is_asked_for_at_most_the_summarys_share(
    tmp_path: Path, window: int, asked: int
) -> None:
    """Session-memory compact's memory is part of its summary: on 8,192 tokens, at the
    default factor 1.6, a fifth of the window is 1,024 counted tokens."""
    budgets: list[int] = []

    def provider(session_id: str, entries: object, max_tokens: int) -> str:
        budgets.append(max_tokens)
        return "- [fact] the tests live in tests/"

    with opened(tmp_path / "memory.db", memory_provider=provider) as store:
        sess = store.session("m", context_window=window, now=T0)
        sess.remember("fact", "the tests live in tests/", now=T0)
        text = "word " * (window // 8)
        for i in range(12):
            role = "user" if i % 2 == 0 else "assistant"
            sess.append({"role": role, "content": f"{i} {text}"}, timestamp=T0 + i)
        assert sess.token_usage() > window

        sess.process_request(now=T0 + 100)

    assert budgets == [asked]
