"""The async store's worker threads (compactstore._store.threads): started at open, results
handed back to the loop in batches, cancelled calls never run, errors reach the caller."""

from __future__ import annotations

import asyncio
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from compactstore import AsyncCompactStore
from compactstore._store.threads import Workers
from compactstore.aio import DECIDE_THREADS, STEP_THREADS

pytest.importorskip("greenlet", reason="the async extra (sqlalchemy[asyncio]) is not installed")


def compactstore_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("compactstore-")]


def test_the_threads_start_at_open_and_end_at_close(tmp_path: Path) -> None:
    async def main() -> tuple[list[str], list[str]]:
        store = await AsyncCompactStore.open(tmp_path / "a.db")
        # Before any call: a call never has to start a thread on the loop.
        started = compactstore_threads()
        await store.close()
        with pytest.raises(RuntimeError, match="closed"):
            await store._core.steps.run(lambda: None)
        return started, compactstore_threads()

    before = compactstore_threads()
    started, after = asyncio.run(main())
    new = [name for name in started if name not in before]
    assert sum(name.startswith("compactstore-step-") for name in new) == STEP_THREADS["sqlite"]
    assert sum(name.startswith("compactstore-decide-") for name in new) == DECIDE_THREADS
    assert not set(new) & set(after)


class CountingWorkers(Workers):
    collections = 0

    def _collect(self) -> None:
        self.collections += 1
        super()._collect()


def test_results_finished_while_the_loop_is_busy_are_collected_in_one_wake_up() -> None:
    async def main() -> tuple[list[int], int]:
        workers = CountingWorkers(asyncio.get_running_loop(), 2, "test-workers")
        await asyncio.to_thread(workers.start)
        finished = threading.Semaphore(0)

        def job(k: int) -> int:
            finished.release()
            return k

        futures = [workers.run(partial(job, k)) for k in range(6)]
        for _ in futures:  # the loop is busy (blocked here) until every call has finished
            assert finished.acquire(timeout=10)
        values = list(await asyncio.gather(*futures))
        await asyncio.to_thread(workers.stop)
        return values, workers.collections

    values, collections = asyncio.run(main())
    assert values == list(range(6))
    assert collections == 1


def test_a_cancelled_call_never_runs_and_errors_reach_the_caller() -> None:
    ran: list[str] = []

    async def main() -> None:
        workers = Workers(asyncio.get_running_loop(), 1, "test-workers")
        await asyncio.to_thread(workers.start)
        gate = threading.Event()

        def blocks() -> None:
            ran.append("first")
            gate.wait(10)

        first = workers.run(blocks)
        second = workers.run(lambda: ran.append("second"))
        second.cancel()
        gate.set()
        await first

        def fails() -> Any:
            raise ValueError("boom")

        with pytest.raises(ValueError, match="boom"):
            await workers.run(fails)
        with pytest.raises(RuntimeError, match="StopIteration"):
            await workers.run(lambda: next(iter(())))
        await asyncio.to_thread(workers.stop)

    asyncio.run(main())
    assert ran == ["first"]


def test_a_busy_thread_hands_its_results_over_when_its_queue_runs_empty() -> None:
    # Each call lets the GIL go (the loop is free to collect), yet the one thread wakes the
    # loop once: when it has no call left, not after each of the six.
    async def main() -> tuple[list[int], int]:
        workers = CountingWorkers(asyncio.get_running_loop(), 1, "test-workers")
        workers.hold_seconds = 60
        await asyncio.to_thread(workers.start)
        queued = threading.Event()

        def job(k: int) -> int:
            if k == 0:
                assert queued.wait(10)  # every call is queued before the first ends
            time.sleep(0.002)
            return k

        futures = [workers.run(partial(job, k)) for k in range(6)]
        queued.set()
        values = list(await asyncio.wait_for(asyncio.gather(*futures), 10))
        await asyncio.to_thread(workers.stop)
        return values, workers.collections

    values, collections = asyncio.run(main())
    assert values == list(range(6))
    assert collections == 1


def test_a_result_waits_for_the_loop_no_longer_than_the_hold() -> None:
    # The first call's result reaches the loop while the third call is still running: the
    # second call outlasted the hold. (Held until the queue ran empty, it would wait for the
    # third call, which waits for it: wait_for times out.)
    async def main() -> None:
        workers = Workers(asyncio.get_running_loop(), 1, "test-workers")
        workers.hold_seconds = 0.05
        await asyncio.to_thread(workers.start)
        first_seen = threading.Event()
        first = workers.run(lambda: "first")
        workers.run(lambda: time.sleep(0.2))
        third = workers.run(lambda: first_seen.wait(10))
        assert await asyncio.wait_for(first, 5) == "first"
        first_seen.set()
        assert await asyncio.wait_for(third, 5) is True
        await asyncio.to_thread(workers.stop)

    asyncio.run(main())


def test_a_lone_call_is_handed_over_at_once_whatever_the_hold() -> None:
    async def main() -> str:
        workers = Workers(asyncio.get_running_loop(), 1, "test-workers")
        workers.hold_seconds = 60
        await asyncio.to_thread(workers.start)
        value = await asyncio.wait_for(workers.run(lambda: "done"), 5)
        await asyncio.to_thread(workers.stop)
        return value

    assert asyncio.run(main()) == "done"
