"""Every change to the active context is a recorded row, named by what it did: a read-dedup
stub is a ``read_dedup`` compaction, and ``compaction_steps`` holds one row per stage of each
compaction (with the tool results it cleared and persisted), so plain SQL says what each
stage did and freed, and ``stats`` counts the same."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from compactstore import (
    AsyncCompactStore,
    CompactionResult,
    CompactStore,
    CompactStrategy,
    CompactTrigger,
    ConflictError,
)
from compactstore._store.admin import store_stats
from compactstore.db.migrate import head_revision
from tests.conftest import Snapshot
from tests.helpers import T0, Chat, busy_log, every_stage, migrate_to, new_session, words

SOURCE = words(3_000, "module")  # an unchanged file (within the budget), read twice


def _rows(store: CompactStore, sql: str, **params: Any) -> list[tuple[Any, ...]]:
    with store.engine.connect() as connection:
        return [tuple(row) for row in connection.execute(text(sql), params)]


def _read(chat: Chat, path: str, content: str) -> int:
    _, (tool_use_id,) = chat.calls([("read_file", {"file_path": path})])
    return chat.result(tool_use_id, content, file_path=path)


def test_a_read_dedup_is_a_compaction_saying_what_the_stub_freed(store: CompactStore) -> None:
    chat = new_session(store)
    chat.request("Explain src/app.py")
    first = _read(chat, "src/app.py", SOURCE)
    usage = chat.sess.token_usage()
    stub = _read(chat, "src/app.py", SOURCE)

    (row,) = chat.sess.compactions()
    assert (row.strategy, row.trigger, row.success) == (
        CompactStrategy.READ_DEDUP,
        CompactTrigger.AUTO,
        True,
    )
    # Before and after are the re-read's own tokens, in full (as the first read took) and as
    # the stub (what the context grew by).
    full, stored = _rows(
        store, "SELECT tokens FROM messages WHERE seq IN (:a, :b) ORDER BY seq", a=first, b=stub
    )
    assert (row.tokens_before, row.tokens_after) == (full[0], stored[0])
    assert row.tokens_freed == full[0] - stored[0] > 500
    assert (row.removed_seqs, row.cleared_tool_calls, row.blob_ids) == ([], [], [])
    assert (row.results_cleared, row.results_persisted) == (0, 0)
    # The context grew by the stub alone, and holds it as a dedup of the first read.
    assert chat.sess.token_usage() - usage < row.tokens_freed
    assert [i.state for i in chat.sess.context().items if i.seq == stub] == ["deduplicated"]
    assert _rows(
        store,
        "SELECT strategy, trigger, success, tokens_freed, results_cleared, results_persisted, "
        "detail FROM compaction_steps WHERE compaction_id = :id",
        id=row.id,
    ) == [
        (
            "read_dedup",
            "auto",
            True,
            row.tokens_freed,
            0,
            0,
            f"seq {stub} re-read src/app.py unchanged: points at seq {first}",
        )
    ]


@pytest.mark.slow
def test_a_rollback_leaves_read_dedups_live_and_refuses_to_undo_one(
    store: CompactStore, db_snapshot: Snapshot
) -> None:
    chat = new_session(store)
    chat.request("Refactor the loader")
    _read(chat, "src/loader.py", SOURCE)
    chat.tool(words(9_000, "log"), name="bash")
    budget = chat.sess.process_request(
        now=T0 + 10, enable_microcompact=False, enable_auto_compact=False
    )
    assert budget.strategy == CompactStrategy.TOOL_BUDGET and budget.id is not None
    context = chat.sess.active_context()
    _read(chat, "src/loader.py", SOURCE)
    dedup = chat.sess.compactions()[-1]
    assert dedup.strategy == CompactStrategy.READ_DEDUP and dedup.id is not None
    with_stub = chat.sess.active_context()

    before = db_snapshot(store)
    with pytest.raises(ConflictError, match="is a read dedup"):
        chat.sess.rollback(compaction_id=dedup.id)
    assert db_snapshot(store) == before

    # Rolling back the budget (and everything after it) gives its results back; the stub
    # stays, and so does its row.
    chat.sess.rollback(compaction_id=budget.id, now=T0 + 20)
    rows = {c.id: c for c in chat.sess.compactions()}
    assert rows[budget.id].rolled_back_at == T0 + 20
    assert rows[dedup.id].rolled_back_at is None
    restored = chat.sess.active_context()
    assert restored != with_stub
    assert restored[: len(context)] != context  # the preview is the whole result again
    assert restored[len(context) :] == with_stub[len(context) :]


def _steps_of_rows(store: CompactStore, sid: str) -> list[tuple[Any, ...]]:
    """compaction_steps as compactions() has them (every step of every row, in order)."""
    return [
        (
            c.id,
            position,
            step.strategy.value,
            step.trigger.value,
            step.success,
            step.tokens_freed,
            step.results_cleared,
            step.results_persisted,
            step.detail,
        )
        for c in store.get_session(sid).compactions()
        for position, step in enumerate(c.steps)
    ]


_STEPS = (
    "SELECT compaction_id, position, strategy, trigger, success, tokens_freed, results_cleared, "
    "results_persisted, detail FROM compaction_steps WHERE session_id = :sid "
    "ORDER BY compaction_id, position"
)


@pytest.mark.slow
def test_every_stage_of_every_compaction_is_a_row_that_stats_counts(store: CompactStore) -> None:
    chat = new_session(store)
    busy_log(chat)
    for _ in every_stage(chat):
        pass
    _read(chat, "src/app.py", SOURCE)
    _read(chat, "src/app.py", SOURCE)
    chat.sess.pop(now=T0 + 9_000)

    steps = _steps_of_rows(store, "s")
    assert _rows(store, _STEPS, sid="s") == steps
    strategies = {row[2] for row in steps}
    assert strategies >= {
        "tool_budget",
        "microcompact",
        "full",
        "partial",
        "read_dedup",
        "pop",
    }
    # Every step knows how many results it cleared and persisted; together they are the
    # row's cleared_tool_calls, and the persisted ones its blobs.
    for c in store.get_session("s").compactions():
        assert c.results_cleared is not None and c.results_persisted is not None
        assert c.results_cleared + c.results_persisted >= len(c.cleared_tool_calls)
        assert c.results_persisted == len(c.blob_ids)

    # stats counts each stage that acted, as the steps say.
    expected: dict[str, tuple[int, int]] = {}
    for _, _, strategy, _, success, freed, *_ in steps:
        if success:
            count, total = expected.get(strategy, (0, 0))
            expected[strategy] = (count + 1, total + freed)
    assert store_stats(store).stages == dict(sorted(expected.items()))


@pytest.mark.slow
def test_the_revision_fills_the_steps_of_existing_compactions(db_url: str) -> None:
    with CompactStore.open(db_url) as store:
        chat = new_session(store)
        busy_log(chat)
        for _ in every_stage(chat):
            pass
        steps = _rows(store, _STEPS, sid="s")
        assert len(steps) > 5
    migrate_to(db_url, "f99d9de77ba8", down=True)  # the revision before compaction_steps
    migrate_to(db_url, head_revision(), down=False)
    with CompactStore.open(db_url, auto_migrate=True) as store:
        assert _rows(store, _STEPS, sid="s") == steps == _steps_of_rows(store, "s")


@pytest.mark.slow
def test_the_report_lists_a_read_dedup_but_draws_no_marker_at_its_own_tokens(
    store: CompactStore,
) -> None:
    from compactstore.report.data import collect
    from compactstore.report.svg import usage_chart

    chat = new_session(store)
    chat.request("Explain src/app.py")
    _read(chat, "src/app.py", SOURCE)
    chat.tool(words(9_000, "log"), name="bash")
    chat.sess.process_request(now=T0 + 10, enable_microcompact=False, enable_auto_compact=False)
    _read(chat, "src/app.py", SOURCE)

    data = collect(store, "s")
    budget, dedup = data.compactions
    assert (budget.strategy, dedup.strategy) == ("tool_budget", "read_dedup")
    assert (budget.on_chart, dedup.on_chart) == (True, False)
    assert dedup in data.others
    chart = usage_chart(data)
    assert f'href="#c{budget.id}"' in chart and f'href="#c{dedup.id}"' not in chart


def test_on_compaction_is_called_with_each_read_dedup(db_url: str) -> None:
    seen: list[CompactionResult] = []
    with CompactStore.open(db_url, on_compaction=seen.append) as store:
        chat = new_session(store)
        chat.request("Explain src/app.py")
        _read(chat, "src/app.py", SOURCE)
        assert seen == []
        _read(chat, "src/app.py", SOURCE)
        (recorded,) = chat.sess.compactions()
    (result,) = seen
    assert result.strategy == CompactStrategy.READ_DEDUP and result.id == recorded.id
    assert result.model_dump(exclude={"messages"}) == recorded.model_dump(exclude={"messages"})


@pytest.mark.slow
def test_an_async_on_compaction_is_awaited_for_a_read_dedup_and_may_use_the_store(
    tmp_path: Path,
) -> None:
    seen: list[tuple[int | None, int]] = []
    store: Any = None

    async def on_compaction(result: CompactionResult) -> None:
        sess = await store.get_session("s")
        seen.append((result.id, await sess.message_count()))

    async def main() -> int:
        nonlocal store
        store = await AsyncCompactStore.open(tmp_path / "a.db", on_compaction=on_compaction)
        async with store:
            sess = await store.session("s", now=T0)
            await sess.append({"role": "user", "content": "Explain src/app.py"}, timestamp=T0)
            for n in (1, 2):
                call = {
                    "role": "assistant",
                    "content": [
                        {
                            "type": "tool_use",
                            "id": f"t{n}",
                            "name": "read_file",
                            "input": {"file_path": "src/app.py"},
                        }
                    ],
                }
                await sess.append(call, timestamp=T0 + n)
                append = sess.append_tool_result(
                    f"t{n}", SOURCE, tool_name="read_file", file_path="src/app.py"
                )
                seq = await asyncio.wait_for(append, 10)
            (recorded,) = await sess.compactions()
            assert recorded.id is not None
            return recorded.id if seq == 4 else -1

    dedup_id = asyncio.run(main())
    assert seen == [(dedup_id, 5)]
