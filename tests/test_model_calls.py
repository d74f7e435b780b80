"""The ``model_calls`` table: one row per model call, written by record_usage,
by import when the transcript carries usage, and by simulate."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from compactstore import CompactionConfig, CompactStore
from compactstore._importers import import_file, read_transcript
from compactstore._simulate import simulate_transcript
from compactstore.db.schema import model_calls
from tests.helpers import assistant, user


def rows(store: CompactStore, session_id: str) -> list[tuple[Any, ...]]:
    with store.engine.connect() as connection:
        found = connection.execute(
            select(
                model_calls.c.seq,
                model_calls.c.usage,
                model_calls.c.real_tokens,
                model_calls.c.created_at,
            )
            .where(model_calls.c.session_id == session_id)
            .order_by(model_calls.c.id)
        )
        return [tuple(row) for row in found]


def test_record_usage_records_the_call_with_the_usage_it_corrects(store: CompactStore) -> None:
    sess = store.session("s", now=0.0)
    sess.append(user("hello " * 400), timestamp=1.0)
    predicted = sess.token_usage()
    sess.record_usage(900, now=10.0)
    sess.append(assistant("done"), timestamp=11.0)
    sess.append(user("more " * 200), timestamp=12.0)
    second = sess.token_usage()
    sess.record_usage(1_300, now=20.0)
    assert rows(store, "s") == [(0, predicted, 900, 10.0), (2, second, 1_300, 20.0)]
    # The second prediction already followed the first real count.
    assert abs(second - 1_300) < abs(predicted - 900) + 400


def _claude_code(tmp_path: Path) -> Path:
    def record(kind: str, content: Any, n: int, **extra: Any) -> dict[str, Any]:
        message: dict[str, Any] = {"role": kind, "content": content}
        message.update(extra)
        return {
            "type": kind,
            "uuid": f"u{n}",
            "parentUuid": f"u{n - 1}" if n else None,
            "sessionId": "s",
            "isSidechain": False,
            "timestamp": f"2026-01-01T00:00:{n:02d}.000Z",
            "message": message,
        }

    usage = {
        "input_tokens": 10,
        "cache_creation_input_tokens": 200,
        "cache_read_input_tokens": 5000,
    }
    lines = [
        record("user", "Fix the parser in src/parse.py", 0),
        record("assistant", [{"type": "text", "text": "Looking."}], 1, id="m1", usage=usage),
        record("user", "go on " * 300, 2),
        record(
            "assistant",
            [{"type": "text", "text": "Done."}],
            3,
            id="m2",
            usage={**usage, "cache_read_input_tokens": 6000},
        ),
    ]
    path = tmp_path / "cc.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n", encoding="utf-8")
    return path


def test_import_records_a_call_per_reported_usage(store: CompactStore, tmp_path: Path) -> None:
    sess = import_file(store, _claude_code(tmp_path), session_id="cc")
    tokens = [item.tokens for item in sess.context().items]
    factor = CompactionConfig().token_factor
    assert rows(store, "cc") == [
        (0, round(factor * tokens[0]), 5_210, 1767225601.0),
        (2, round(factor * sum(tokens[:3])), 6_210, 1767225603.0),
    ]


@pytest.mark.slow
def test_simulate_records_every_model_call(tmp_path: Path) -> None:
    path = _claude_code(tmp_path)
    with CompactStore.open(tmp_path / "sim.db") as store:
        simulate_transcript(read_transcript(path), store=store)
        found = rows(store, "simulate-1")
        assert [(seq, real) for seq, _, real, _ in found] == [(0, 5_210), (2, 6_210)]
        assert all(usage > 0 for _, usage, _, _ in found)
        # Without the transcript's counts the calls are still recorded, with no real count.
        simulate_transcript(read_transcript(path), store=store, use_usage=False)
        assert [(seq, real) for seq, _, real, _ in rows(store, "simulate-2")] == [
            (0, None),
            (2, None),
        ]
