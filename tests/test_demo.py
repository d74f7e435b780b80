"""The demo session (compactstore._demo) on SQLite and PostgreSQL: every stage fires and is
recorded, the run is deterministic, its active context is a valid request, and the audit
queries it documents run and find rows.
"""

from __future__ import annotations

import dataclasses
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from compactstore import CompactStore, CompactStrategy, CompactTrigger, InvalidInputError
from compactstore._demo import (
    DEMO_CONTEXT_WINDOW,
    FIRED_KEYS,
    DemoReport,
    audit_queries,
    run_demo,
)
from compactstore._demo.agent import STAGE_KEYS
from compactstore._store.admin import store_stats
from tests.helpers import validate_with_sdk

# Enough turns to reach every stage (the default demo plays 300), small enough to be quick.
STEPS = 150
DEDUP_STUB = "[Read deduplicated: "

Message = dict[str, Any]


def blocks(message: Message) -> list[dict[str, Any]]:
    content = message["content"]
    return content if isinstance(content, list) else []


def tool_result_texts(message: Message) -> list[str]:
    return [
        block["content"]
        for block in blocks(message)
        if block["type"] == "tool_result" and isinstance(block.get("content"), str)
    ]


def pairing_problems(messages: list[Message]) -> list[str]:
    """Every tool result follows its call, once; only the newest turn may have open calls."""
    problems: list[str] = []
    calls: dict[str, int] = {}
    answered: set[str] = set()
    for index, message in enumerate(messages):
        for block in blocks(message):
            if block["type"] == "tool_result":
                call_id = block["tool_use_id"]
                if call_id not in calls:
                    problems.append(f"message {index}: result for {call_id} precedes its call")
                if call_id in answered:
                    problems.append(f"message {index}: second result for {call_id}")
                answered.add(call_id)
            elif block["type"] == "tool_use":
                calls[block["id"]] = index
    newest = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
    problems += [
        f"call {call_id} (message {index}) has no result"
        for call_id, index in calls.items()
        if call_id not in answered and index != newest
    ]
    return problems


def recorded(store: CompactStore, report: DemoReport) -> dict[str, Any]:
    """Everything a run leaves behind that must not depend on where or when it ran."""
    session = store.session(report.session_id)
    return {
        "report": dataclasses.replace(report, session_id=""),
        "active_context": session.active_context(),
        "log": session.messages(),
        "summaries": [b.summary_text for b in session.boundaries(include_rolled_back=True)],
        "compactions": [
            c.model_dump(exclude={"id": True, "boundary": {"id", "parent_id"}})
            for c in session.compactions()
        ],
        "memories": [m.model_dump(exclude={"id"}) for m in session.memories()],
    }


def check_audit_queries(store: CompactStore, report: DemoReport) -> None:
    """The three audit queries run on this backend (and in plain sqlite3) and find the demo."""
    queries = audit_queries()
    assert len(queries) == 3

    results: dict[str, list[Any]] = {}
    with store.engine.connect() as connection:
        for title, sql in queries:
            results[title] = [tuple(row) for row in connection.execute(text(sql))]
            assert results[title], f"{title!r} returned no rows"
            assert all(row[0] == report.session_id for row in results[title])

    per_stage, boundaries, blobs = results.values()
    # The first gives the figures of the demo's summary line.
    assert {row[1]: (row[2], row[3]) for row in per_stage} == {
        key: (report.fired[key], report.tokens_freed[key])
        for key in STAGE_KEYS
        if report.fired[key]
    }
    assert {row[1] for row in per_stage} >= {
        "tool_budget",
        "read_dedup",
        "microcompact",
        "session_memory",
        "full",
        "reactive",
    }
    assert "rolled back" in {row[-1] for row in boundaries}
    assert len(blobs) == 10 and all(row[3] > 4_000 for row in blobs)

    if store.engine.dialect.name == "sqlite":
        # What a person pasting into `sqlite3 compactstore.db` gets: the same rows.
        with sqlite3.connect(store.location) as plain:
            for title, sql in queries:
                assert [tuple(r) for r in plain.execute(sql)] == results[title]


@pytest.mark.slow
def test_the_demo_fires_every_stage_records_each_and_can_be_audited(
    store: CompactStore,
) -> None:
    seen: list[tuple[int, int]] = []
    report = run_demo(store, steps=STEPS, progress=lambda done, total: seen.append((done, total)))

    assert seen == [(i, STEPS) for i in range(1, STEPS + 1)]
    assert report.session_id == "demo"
    assert report.steps == STEPS
    assert report.context_window == DEMO_CONTEXT_WINDOW
    assert set(report.fired) == set(FIRED_KEYS)
    assert {key for key, count in report.fired.items() if count < 1} == set()
    assert report.peak_usage > DEMO_CONTEXT_WINDOW  # the burst that made the API refuse
    assert all(report.tokens_freed[key] > 0 for key in FIRED_KEYS if key != "rollback")

    session = store.session(report.session_id)
    assert len(session.messages()) == report.messages
    compactions = session.compactions()
    assert report.compactions == len(compactions)

    # Every stage left compactions rows, and the report counts exactly what they say: each
    # stage of each call (the manual compact among the full ones), as `stats` does.
    effective_steps = [
        (step.strategy, step.trigger) for c in compactions for step in c.steps if step.success
    ]
    for key in STAGE_KEYS:
        mine = [
            step.tokens_freed
            for c in compactions
            for step in c.steps
            if step.success and step.strategy == CompactStrategy(key)
        ]
        assert (report.fired[key], report.tokens_freed[key]) == (len(mine), sum(mine)), key
    assert store_stats(store).stages == {
        key: (report.fired[key], report.tokens_freed[key])
        for key in sorted(STAGE_KEYS)
        if report.fired[key]
    }
    assert {strategy for strategy, _ in effective_steps} >= {
        CompactStrategy.TOOL_BUDGET,
        CompactStrategy.MICROCOMPACT,
        CompactStrategy.SESSION_MEMORY,
        CompactStrategy.FULL,
        CompactStrategy.REACTIVE,
    }
    assert report.fired["full"] > report.fired["manual"]
    by_trigger = [c.trigger for c in compactions if c.effective]
    assert by_trigger.count(CompactTrigger.REACTIVE) == report.fired["reactive"]
    assert by_trigger.count(CompactTrigger.MANUAL) == report.fired["manual"]
    reactive = next(c for c in compactions if c.trigger == CompactTrigger.REACTIVE)
    assert reactive.strategy == CompactStrategy.REACTIVE  # the forced full compact was not enough
    assert reactive.error is not None and reactive.error.startswith("prompt is too long")

    # The manual compaction was rolled back, with everything recorded after it.
    rolled_back = [c for c in compactions if c.rolled_back_at is not None]
    assert rolled_back and rolled_back[0].trigger == CompactTrigger.MANUAL
    boundaries = session.boundaries(include_rolled_back=True)
    undone = [b for b in boundaries if b.rolled_back_at is not None]
    assert [b.trigger for b in undone] == [CompactTrigger.MANUAL]
    assert len(session.boundaries()) == len(boundaries) - 1

    # Unchanged re-reads were stored as dedup stubs, each a read_dedup row the report counts.
    stubs = [
        t for m in session.messages() for t in tool_result_texts(m) if t.startswith(DEDUP_STUB)
    ]
    dedups = [c for c in compactions if c.strategy == CompactStrategy.READ_DEDUP]
    assert len(stubs) == len(dedups) == report.fired["read_dedup"]
    assert all(c.effective and c.rolled_back_at is None for c in dedups)
    assert any(item.state == "deduplicated" for item in session.context().items) or stubs

    # What is left is a request the API accepts.
    messages = session.active_context()
    assert pairing_problems(messages) == []
    assert messages[0]["content"].startswith("Refactor the error handling of the payments")
    validate_with_sdk("anthropic", messages)
    assert session.token_usage() < DEMO_CONTEXT_WINDOW

    check_audit_queries(store, report)


@pytest.mark.slow
def test_the_demo_is_deterministic_and_runs_again_under_a_fresh_id(
    store: CompactStore, tmp_path: Path
) -> None:
    first = run_demo(store, steps=STEPS)
    with CompactStore.open(tmp_path / "other.db") as other:
        assert recorded(other, run_demo(other, steps=STEPS)) == recorded(store, first)

    again = run_demo(store, steps=STEPS)
    assert (first.session_id, again.session_id) == ("demo", "demo-2")
    assert recorded(store, again) == recorded(store, first)
    assert run_demo(store, steps=3).session_id == "demo-3"
    assert sorted(s.id for s in store.sessions()) == ["demo", "demo-2", "demo-3"]


def test_the_demo_needs_a_positive_number_of_steps(store: CompactStore) -> None:
    for steps in (0, -1, True):
        with pytest.raises(InvalidInputError, match="steps must be a positive whole number"):
            run_demo(store, steps=steps)
    assert store.sessions() == []


def test_a_short_demo_reports_every_key_even_when_stages_did_not_fire(
    store: CompactStore,
) -> None:
    report = run_demo(store, steps=3)
    assert set(report.fired) == set(FIRED_KEYS)
    assert report.fired["manual"] == report.fired["rollback"] == 0
    assert report.messages == len(store.session(report.session_id).messages())
