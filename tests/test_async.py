"""The async API: AsyncCompactStore / AsyncSession run the sync core, each
transaction and each compute step in a worker thread, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import inspect
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from compactstore import (
    AsyncCompactStore,
    AsyncSession,
    CompactionConfig,
    CompactionResult,
    CompactStore,
    CompactStoreWarning,
    DatabaseError,
    InvalidInputError,
    MissingExtraError,
    Session,
    SummaryResult,
    aio,
)
from compactstore._core import driver
from compactstore.aio import STEP_THREADS
from tests.helpers import words

pytest.importorskip("greenlet", reason="the async extra (sqlalchemy[asyncio]) is not installed")

SMALL = CompactionConfig(summarizer_timeout_seconds=5)


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


def public_methods(cls: type) -> dict[str, Any]:
    return {
        name: member
        for name, member in inspect.getmembers(cls, inspect.isfunction)
        if not name.startswith("_")
    }


def test_every_public_session_method_is_a_coroutine_with_the_same_signature() -> None:
    sync, aio = public_methods(Session), public_methods(AsyncSession)
    assert set(sync) <= set(aio), f"missing on AsyncSession: {sorted(set(sync) - set(aio))}"
    for name, method in sync.items():
        twin = aio[name]
        if inspect.isgeneratorfunction(method):
            assert inspect.isasyncgenfunction(twin), name
        else:
            assert inspect.iscoroutinefunction(twin), name
        ours = inspect.signature(twin).replace(return_annotation=inspect.Signature.empty)
        theirs = inspect.signature(method).replace(return_annotation=inspect.Signature.empty)
        assert ours == theirs, name
    for name in ("session", "get_session", "import_session", "delete_session", "sessions"):
        method = getattr(CompactStore, name)
        twin = getattr(AsyncCompactStore, name)
        assert inspect.iscoroutinefunction(twin), name
        assert list(inspect.signature(twin).parameters) == list(
            inspect.signature(method).parameters
        ), name
    opened = inspect.signature(AsyncCompactStore.open).parameters
    assert list(opened) == list(inspect.signature(CompactStore.open).parameters)


def fill(n: int, size: int = 2_000) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        out += [user(f"step {i}: " + "words " * (size // 6)), assistant(f"done {i}")]
    return out


@pytest.mark.slow
def test_an_async_app_with_100_sessions_on_one_loop(db_url: str) -> None:
    async def agent(store: AsyncCompactStore, k: int) -> tuple[int, int, int]:
        sess = await store.session(f"a{k}", context_window=1_800, config=SMALL)
        compactions = 0
        for i, message in enumerate(fill(2)):
            await sess.append(message)
            if i % 2:
                result = await sess.process_request(now=1_000.0 + i)
                compactions += result.success and result.strategy == "full"
        context = await sess.active_context()
        assert context and await sess.token_usage() < 1_800
        full = [c for c in await sess.compactions() if c.strategy == "full"]
        return await sess.message_count(), compactions, len(full)

    async def main() -> list[tuple[int, int, int]]:
        async with await AsyncCompactStore.open(db_url, pool_size=5, max_overflow=5) as store:
            return await asyncio.gather(*(agent(store, k) for k in range(100)))

    results = asyncio.run(main())
    assert [count for count, _, _ in results] == [4] * 100
    assert all(made >= 1 and made == recorded for _, made, recorded in results)
    with CompactStore.open(db_url) as store:
        assert len(store.sessions()) == 100
        assert store.get_session("a57").message_count() == 4


def test_an_async_summarizer_is_awaited_on_the_loop(db_url: str) -> None:
    seen: list[tuple[int, bool]] = []

    async def summarize(
        messages: list[dict[str, Any]], previous: str | None, instructions: str | None
    ) -> SummaryResult:
        loop = asyncio.get_running_loop()
        seen.append((len(messages), loop is main_loop))
        await asyncio.sleep(0.05)
        return SummaryResult("the async summary", input_tokens=7, model="fake-async")

    main_loop: asyncio.AbstractEventLoop | None = None

    async def main() -> Any:
        nonlocal main_loop
        main_loop = asyncio.get_running_loop()
        async with await AsyncCompactStore.open(db_url, summarizer=summarize) as store:
            sess = await store.session("s", context_window=20_000, config=SMALL)
            await sess.extend(fill(10))
            result = await sess.compact(now=5.0)
            return result, await sess.active_context()

    result, context = asyncio.run(main())
    assert seen and seen[0][1], "awaited on the store's loop"
    assert result.summary.source == "summarizer" and result.summary.model == "fake-async"
    assert any("the async summary" in str(message) for message in context)


@pytest.mark.slow
def test_a_slow_async_summarizer_times_out_and_falls_back(tmp_path: Path) -> None:
    async def slow(*_: Any) -> str:
        await asyncio.sleep(1.0)
        return "too late"

    async def main() -> Any:
        store = await AsyncCompactStore.open(tmp_path / "a.db", summarizer=slow)
        try:
            sess = await store.session(
                "s", context_window=20_000, config=CompactionConfig(summarizer_timeout_seconds=0.2)
            )
            await sess.extend(fill(10))
            return await sess.compact(now=5.0), await sess.breaker()
        finally:
            await store.close()

    result, breaker = asyncio.run(main())
    assert result.success and result.summary.fallback
    assert "timed out" in (result.summary.reason or "")
    assert breaker.consecutive_fallbacks == 1


def test_a_sync_summarizer_runs_in_the_async_store_too(tmp_path: Path) -> None:
    async def main() -> Any:
        async with await AsyncCompactStore.open(
            tmp_path / "a.db", summarizer=lambda m, p, i: "sync text"
        ) as store:
            sess = await store.session("s", context_window=20_000)
            await sess.extend(fill(10))
            return await sess.compact(now=5.0)

    result = asyncio.run(main())
    assert result.summary.source == "summarizer" and not result.summary.fallback


def test_the_sync_store_refuses_an_async_summarizer(tmp_path: Path) -> None:
    async def summarize(*_: Any) -> str:
        return "x"

    with pytest.raises(InvalidInputError, match="AsyncCompactStore"):
        CompactStore.open(tmp_path / "a.db", summarizer=summarize)  # type: ignore[arg-type]


def test_sync_and_async_stores_on_one_database_see_each_others_commits(db_url: str) -> None:
    async def main() -> None:
        with CompactStore.open(db_url) as sync_store:
            async with await AsyncCompactStore.open(db_url) as async_store:
                sync_sess = sync_store.session("shared", context_window=20_000)
                sync_sess.append(user("from sync"))
                async_sess = await async_store.get_session("shared")
                assert await async_sess.messages() == [user("from sync")]
                await async_sess.append(assistant("from async"))
                assert sync_sess.messages() == [user("from sync"), assistant("from async")]
                sync_sess.extend(fill(10))
                compacted = sync_sess.compact(now=9.0)
                # The async handle's cache sees the other store's compaction.
                assert await async_sess.active_context() == sync_sess.active_context()
                assert compacted.boundary is not None
                assert [b.id for b in await async_sess.boundaries()] == [compacted.boundary.id]
                await async_sess.rollback()
                assert sync_sess.boundaries() == []
                assert len(sync_sess.active_context()) == 22

    asyncio.run(main())


def test_errors_come_from_the_error_tree_and_leave_nothing(tmp_path: Path) -> None:
    async def main() -> None:
        async with await AsyncCompactStore.open(tmp_path / "a.db") as store:
            sess = await store.session("s")
            with pytest.raises(InvalidInputError):
                await sess.append({"role": "nobody", "content": "x"})
            assert await sess.message_count() == 0
            with pytest.raises(InvalidInputError):
                await store.session("bad id\n")

    asyncio.run(main())


def test_compactstore_never_blocks_the_loop_on_a_slow_token_counter(tmp_path: Path) -> None:
    # A token counter is the caller's code: it runs off the loop's thread, so while it is
    # blocked (on an event only the test sets) the loop goes on running other tasks.
    armed, blocked, release = threading.Event(), threading.Event(), threading.Event()
    counted_on: set[int] = set()

    def blocking_counter(text: str) -> int:
        counted_on.add(threading.get_ident())
        if armed.is_set() and threading.get_ident() != loop_thread:  # (on the loop: a deadlock)
            blocked.set()
            assert release.wait(10), "never released"
        return len(text) // 4

    async def main() -> bool:
        async with await AsyncCompactStore.open(
            tmp_path / "a.db", token_counter=blocking_counter
        ) as store:
            sess = await store.session("s")
            armed.set()
            append = asyncio.create_task(sess.append(user("hello")))
            while not blocked.is_set() and not append.done():
                await asyncio.sleep(0.001)  # the loop runs this task while the counter waits
            pending = not append.done()
            release.set()
            await append
            assert await sess.message_count() == 1
            return pending

    loop_thread = threading.get_ident()  # asyncio.run runs the loop in this thread
    pending = asyncio.run(main())
    assert counted_on and loop_thread not in counted_on, "counted on the loop's thread"
    assert blocked.is_set() and pending, "the loop ran while the counter was blocked"


def test_process_request_runs_in_one_step_thread_until_a_summary_then_goes_on_on_the_loop(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    resumed: list[int] = []  # the threads a paused call went on in (the rest of its steps)
    resume = driver.committed

    def spy(*args: Any) -> Any:
        resumed.append(threading.get_ident())
        return resume(*args)

    monkeypatch.setattr(aio, "committed", spy)
    summarized_on: list[bool] = []

    async def summarize(messages: Any, previous: str | None, instructions: str | None) -> str:
        summarized_on.append(asyncio.get_running_loop() is main_loop)
        await asyncio.sleep(0.01)
        return "the async summary"

    main_loop: asyncio.AbstractEventLoop | None = None

    async def main() -> tuple[CompactionResult, CompactionResult, list[dict[str, Any]]]:
        nonlocal main_loop
        main_loop = asyncio.get_running_loop()
        async with await AsyncCompactStore.open(db_url, summarizer=summarize) as store:
            sess = await store.session("s", context_window=20_000, config=SMALL)
            await sess.extend(fill(2))
            cheap = await sess.process_request(now=5.0)  # far below the threshold
            assert resumed == [] and summarized_on == []
            await sess.extend(fill(20))
            cut = await sess.process_request(now=6.0)  # past it: the summarizer writes
            return cheap, cut, await sess.active_context()

    cheap, cut, context = asyncio.run(main())
    assert cheap.strategy is None and not cheap.success
    assert resumed == [threading.get_ident()], "the paused call went on on the loop"
    assert summarized_on == [True]
    assert cut.summary is not None and cut.summary.source == "summarizer"
    assert any("the async summary" in str(message) for message in context)


def test_an_async_on_compaction_may_use_the_store_and_is_awaited_before_the_call_returns(
    tmp_path: Path,
) -> None:
    # No summarizer: the compaction runs whole in the (only, on SQLite) step thread. The
    # callback is awaited on the loop once that call is done, so its own store calls find
    # the thread free; a failing one is a warning.
    seen: list[tuple[int | None, int, bool]] = []
    store: Any = None

    async def on_compaction(result: CompactionResult) -> None:
        sess = await store.get_session("s")
        loop_thread = threading.get_ident() == main_thread
        seen.append((result.id, await sess.message_count(), loop_thread))
        if len(seen) == 2:
            raise ValueError("the callback's own error")

    main_thread = threading.get_ident()

    async def main() -> list[CompactionResult]:
        nonlocal store
        store = await AsyncCompactStore.open(tmp_path / "a.db", on_compaction=on_compaction)
        async with store:
            sess = await store.session("s", context_window=18_000, config=SMALL)
            results = []
            for now in (5.0, 6.0):
                await sess.extend(fill(20))
                call = sess.process_request(now=now)
                results.append(await asyncio.wait_for(call, 10))
                assert len(seen) == len(results), "awaited before process_request returned"
            return results

    with pytest.warns(CompactStoreWarning, match="the callback's own error"):
        first, second = asyncio.run(main())
    assert first.id is not None and second.id is not None and first.strategy == "full"
    assert seen == [(first.id, 40, True), (second.id, 80, True)]


def test_a_compaction_runs_its_transactions_off_the_loop(db_url: str) -> None:
    # The memory provider runs in the plan step (a read transaction) of a call that may cut.
    # It waits until the loop answers: the loop can only answer while that step runs in
    # another thread.
    loop_answered = threading.Event()
    ran_in: list[int] = []

    async def main() -> CompactionResult:
        loop, planning = asyncio.get_running_loop(), asyncio.Event()

        def provider(session_id: str, entries: Any, max_tokens: int) -> str:
            ran_in.append(threading.get_ident())
            loop.call_soon_threadsafe(planning.set)
            assert loop_answered.wait(10), "the event loop was blocked by the plan step"
            return ""

        async with await AsyncCompactStore.open(db_url, memory_provider=provider) as store:
            sess = await store.session("s", context_window=20_000)
            await sess.append(user("hi"))
            # 12,000 tokens at the default factor 1.6: over the auto-compact threshold.
            await sess.extend([assistant(words(24_000)), user(words(24_000))])
            call = asyncio.create_task(sess.process_request(now=1.0))
            await planning.wait()
            loop_answered.set()
            return await call

    result = asyncio.run(main())
    assert result.trigger == "auto" and ran_in and threading.get_ident() not in ran_in


@pytest.mark.slow
def test_slow_async_summaries_hold_no_thread_the_other_sessions_need(tmp_path: Path) -> None:
    # More summaries in flight than the store has step threads (each ends when the test
    # says so); meanwhile the other sessions' transactions go on.
    slow_count = max(STEP_THREADS.values()) + 1
    release = asyncio.Event()
    all_summarizing = asyncio.Event()
    calls: list[int] = []

    async def summarize(messages: Any, *_: Any) -> str:
        calls.append(len(messages))
        if len(calls) == slow_count:
            all_summarizing.set()
        await release.wait()
        return "the summary"

    async def main() -> tuple[list[CompactionResult], list[int]]:
        async with await AsyncCompactStore.open(tmp_path / "a.db", summarizer=summarize) as s:
            slow = [
                await s.session(f"slow{k}", context_window=20_000, config=SMALL)
                for k in range(slow_count)
            ]
            for sess in slow:
                await sess.extend(fill(10))
            compactions = [asyncio.create_task(sess.compact(now=5.0)) for sess in slow]
            await asyncio.wait_for(all_summarizing.wait(), 10)
            others = [await s.session(f"o{k}") for k in range(8)]
            steps = asyncio.gather(*(o.extend(fill(2)) for o in others))
            counts = [len(seqs) for seqs in await asyncio.wait_for(steps, 10)]
            release.set()
            return list(await asyncio.gather(*compactions)), counts

    results, counts = asyncio.run(main())
    assert counts == [4] * 8
    assert all(r.summary is not None and r.summary.source == "summarizer" for r in results)


@pytest.mark.slow
def test_a_pool_timeout_is_a_database_error_saying_busy(tmp_path: Path) -> None:
    with CompactStore.open(tmp_path / "s.db", pool_size=1, max_overflow=0, pool_timeout=0.1) as s:
        sess = s.session("s")
        with s.engine.connect(), pytest.raises(DatabaseError, match="busy"):
            sess.append(user("waits for the only connection"))
        assert sess.message_count() == 0

    async def main() -> None:
        async with await AsyncCompactStore.open(
            tmp_path / "a.db", pool_size=1, max_overflow=0, pool_timeout=0.1
        ) as store:
            sess = await store.session("s")
            hold = store._core.engine.connect()
            try:
                with pytest.raises(DatabaseError, match="busy"):
                    await sess.append(user("waits"))
            finally:
                hold.close()
            assert await sess.message_count() == 0

    asyncio.run(main())


@pytest.mark.parametrize(
    "options",
    [{"pool_size": 0}, {"max_overflow": -1}, {"pool_timeout": 0}, {"cache_sessions": 0}],
)
def test_pool_and_cache_options_are_checked(tmp_path: Path, options: dict[str, Any]) -> None:
    with pytest.raises(InvalidInputError):
        CompactStore.open(tmp_path / "s.db", **options)
    with pytest.raises(InvalidInputError):
        asyncio.run(AsyncCompactStore.open(tmp_path / "s.db", **options))


def test_cache_sessions_bounds_the_context_cache(tmp_path: Path) -> None:
    with CompactStore.open(tmp_path / "s.db", cache_sessions=2) as store:
        for k in range(4):
            store.session(f"s{k}").append(user("hi"))
            store.get_session(f"s{k}").active_context()
        assert len(store.cache._entries) == 2


def test_a_session_whose_handle_lives_stays_cached_beyond_cache_sessions(
    tmp_path: Path,
) -> None:
    with CompactStore.open(tmp_path / "s.db", cache_sessions=2) as store:
        handles = [store.session(f"s{k}") for k in range(4)]
        for sess in handles:
            sess.append(user("hi"))
            sess.active_context()
        for sess in handles:  # each step of these agents finds its context cached
            assert store.cache.get(sess.id) is not None
        del handles, sess
        # Unreferenced, the four are idle: two of them stay, the least recently used out.
        assert list(store.cache._entries) == ["s2", "s3"]
        store.session("s4").active_context()
        assert list(store.cache._entries) == ["s3", "s4"]


def test_async_sessions_in_use_stay_cached(tmp_path: Path) -> None:
    async def main() -> list[bool]:
        async with await AsyncCompactStore.open(tmp_path / "a.db", cache_sessions=1) as store:
            sessions = [await store.session(f"a{k}") for k in range(3)]
            for sess in sessions:
                await sess.append(user("hi"))
                await sess.active_context()
            return [store._core.cache.get(sess.id) is not None for sess in sessions]

    assert asyncio.run(main()) == [True, True, True]


def test_without_the_async_extra_open_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "greenlet", None)  # as if greenlet were not installed
    with pytest.raises(MissingExtraError, match=r"compactstore\[async\]"):
        asyncio.run(AsyncCompactStore.open(tmp_path / "a.db"))


@pytest.mark.slow
def test_import_compactstore_needs_no_async_driver() -> None:
    code = (
        "import sys, compactstore; from compactstore import AsyncCompactStore; "
        "bad = {'aiosqlite', 'greenlet', 'sqlalchemy.ext.asyncio'} & set(sys.modules); "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
