"""The async store's worker threads (compactstore.aio_threads): started at open, results
handed back to the loop in batches, cancelled calls never run, errors reach the caller."""

from __future__ import annotations

import asyncio
import threading
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from compactstore import AsyncCompactStore
from compactstore.aio import DECIDE_THREADS, STEP_THREADS
from compactstore.aio_threads import Workers

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
