"""The async store's worker threads (see :mod:`compactstore.aio`): a fixed set of threads,
started when the store opens, that run calls for the event loop and hand the results back;
and :class:`ThreadedStore`, the sync store whose driver hooks (``read``, ``write``,
``compute``, ``drive``, ``notify``: :class:`compactstore._core.driver.Driver`) run on them.

Lighter than ``loop.run_in_executor`` over a ``ThreadPoolExecutor``, because every
``AsyncSession`` call is at least one such hop and the loop shares the GIL with the
threads:

- the threads are started at ``open()``, in a thread: a pool that grows on demand starts
  its threads from the loop, which then waits (holding nothing, but not running either)
  until each new thread has taken the GIL once;
- a call is one ``asyncio.Future`` and one queue entry; no ``concurrent.futures.Future``
  (with its lock taken four times to copy its state over) between them;
- results reach the loop in batches: a thread that finishes a call while the loop has not
  yet collected the previous results adds its own without waking the loop again, so a busy
  loop gets one wake-up (a write to its self-pipe, and the loop's reads of it: each a
  system call that lets the GIL go) for several results;
- and a thread with more calls queued does not wake the loop for a result at once: it
  goes on with the next call and wakes the loop when it finds the queue empty, or after
  a call once the oldest result not yet collected has waited :attr:`Workers.hold_seconds`.
  Every wake-up of the loop while a thread is busy costs that thread the GIL, and the
  loop's next read of its self-pipe costs it again: measured with 100 sessions on one
  loop (benchmarks/asyncapi.py, no summary wait), 24 context switches per agent step
  and 499 steps/s with a wake-up per result, 8 and 567 with the 2 ms hold. While the
  thread is busy anyway, a result collected later does not make the caller's next call
  run later: it would queue behind the calls already queued.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Generator
from contextlib import suppress
from dataclasses import replace
from functools import partial
from queue import Empty, SimpleQueue
from time import monotonic
from typing import Any, ParamSpec, TypeVar

from sqlalchemy import Connection, Engine

from compactstore._core import compaction
from compactstore._core.plugins import warn_callback_failed
from compactstore._core.steps import Op, drive
from compactstore._store.store import CompactionCallback, CompactStore
from compactstore.models import CompactionResult

__all__ = ["DECIDE_THREADS", "STEP_THREADS", "ThreadedStore", "Workers", "glue"]

P = ParamSpec("P")
T = TypeVar("T")

_Job = tuple["asyncio.Future[Any]", Callable[[], Any]]


class Workers:
    """``count`` threads that run calls for ``loop``: :meth:`run` (on the loop) queues a
    call and returns the future of its result; :meth:`start` and :meth:`stop` run off the
    loop (they wait for threads)."""

    # How long a finished call's result may wait for the loop while its thread goes on
    # with the calls queued after it (see the module docstring); at most this plus the
    # call the thread runs next.
    hold_seconds = 0.002

    def __init__(self, loop: asyncio.AbstractEventLoop, count: int, name: str) -> None:
        self.loop = loop
        self._jobs: SimpleQueue[_Job | None] = SimpleQueue()
        self._done: deque[tuple[asyncio.Future[Any], bool, Any]] = deque()
        self._lock = threading.Lock()
        self._woken = False  # a _collect is scheduled on the loop and has not started
        self._since = 0.0  # when the oldest result in _done finished
        self._stopped = False
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}-{k}", daemon=True)
            for k in range(count)
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        """Let the calls queued so far finish, then end the threads."""
        self._stopped = True
        for _ in self._threads:
            self._jobs.put(None)
        for thread in self._threads:
            if thread.ident is not None:
                thread.join()

    def run(self, fn: Callable[[], T]) -> asyncio.Future[T]:
        """Queue ``fn`` (called on the loop); its value or exception is the future's. A
        future cancelled before a thread takes the call never runs it."""
        if self._stopped:
            raise RuntimeError("the store is closed")
        future: asyncio.Future[T] = self.loop.create_future()
        self._jobs.put((future, fn))
        return future

    def _work(self) -> None:
        jobs, done = self._jobs, self._done
        while True:
            try:
                job = jobs.get_nowait()
            except Empty:
                self._wake()  # about to wait: what is finished goes to the loop now
                job = jobs.get()
            if job is None:
                self._wake()
                return
            future, fn = job
            if future.cancelled():
                continue
            try:
                outcome = (future, True, fn())
            except BaseException as exc:  # handed to the awaiting task, which re-raises it
                outcome = (future, False, exc)
            with self._lock:
                if not done:
                    self._since = monotonic()
                done.append(outcome)
                late = monotonic() - self._since >= self.hold_seconds
            del job, future, fn, outcome
            if late:
                self._wake()

    def _wake(self) -> None:
        """Have the loop collect the finished calls (once until it has)."""
        with self._lock:
            if self._woken or not self._done:
                return
            self._woken = True
        with suppress(RuntimeError):  # the loop is closed: nobody is waiting any more
            self.loop.call_soon_threadsafe(self._collect)

    def _collect(self) -> None:
        """On the loop: hand every finished call's outcome to its future."""
        with self._lock:
            self._woken = False
        done = self._done
        while done:
            future, ok, value = done.popleft()
            if future.cancelled():
                continue
            if ok:
                future.set_result(value)
            elif isinstance(value, StopIteration):  # a future refuses it (as in asyncio)
                future.set_exception(RuntimeError(f"the call raised {value!r}"))
            else:
                future.set_exception(value)


# Threads that run transactions and whole simple calls off the event loop, by backend. Few
# on purpose: they share one GIL with the loop, and each thread busy with Python code adds
# up to a switch interval (5 ms) to how long the loop waits for it. SQLite writes one at a
# time anyway: one thread (measured: lower loop lag and more steps/s than two); PostgreSQL
# waits on the network, where a second thread overlaps the round trips.
STEP_THREADS = {"sqlite": 1, "postgresql": 2}
# Threads that run compaction decide steps (the engines, then waiting for the summary):
# mostly waiting, so more of them, apart from the step threads.
DECIDE_THREADS = 16


def _await(awaitable: Awaitable[T]) -> T:
    """Await from sync code running in a greenlet the async driver spawned."""
    from sqlalchemy.util import await_only

    return await_only(awaitable)


class ThreadedStore(CompactStore):
    """The sync store with the async driver's hooks. Called from a worker thread, a hook
    runs its work right there (the sync driver); called from the store's event loop (a
    compaction's driver code, in a greenlet), it hands the work to a thread and awaits it."""

    _async_summarizers = True

    def __init__(
        self, engine: Engine, location: str, loop: asyncio.AbstractEventLoop, **kw: Any
    ) -> None:
        super().__init__(engine, location, **kw)
        self.loop = loop
        self._loop_thread = threading.get_ident()
        # Started by open() (in a thread: starting one waits for it to take the GIL).
        self.steps = Workers(loop, STEP_THREADS.get(engine.dialect.name, 2), "compactstore-step")
        self.decides = Workers(loop, DECIDE_THREADS, "compactstore-decide")
        # Background compactions this store started: tasks on its loop (close() awaits them).
        self.tasks: set[asyncio.Task[None]] = set()
        self._pausing = threading.local()  # .on, .callbacks: see pausing()

    def start_threads(self) -> None:
        self.steps.start()
        self.decides.start()

    def on_loop(self) -> bool:
        return threading.get_ident() == self._loop_thread

    def pausing(
        self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs
    ) -> tuple[T, list[tuple[Awaitable[Any], int | None]]]:
        """Run ``fn`` (in a step thread) with its compaction driver pausing before a step
        that waits: :class:`~compactstore._core.steps.Paused` then reaches the caller.
        Also returned: the async ``on_compaction`` calls it made, for the caller to await
        on the loop (see :meth:`_call_back`)."""
        local = self._pausing
        local.on, local.callbacks = True, []
        try:
            return fn(*args, **kwargs), local.callbacks
        finally:
            local.on, local.callbacks = False, []

    async def called_back(self, callbacks: list[tuple[Awaitable[Any], int | None]]) -> None:
        """Await the async ``on_compaction`` calls :meth:`pausing` returned (on the loop);
        a failure is a warning, as in :meth:`CompactStore.notify`."""
        for awaitable, compaction_id in callbacks:
            try:
                await awaitable
            except Exception as exc:  # the compaction is recorded; the callback cannot undo it
                warn_callback_failed(exc, compaction_id, stacklevel=2)

    def drive(self, steps: Generator[Op, Any, T], first: Op | None = None) -> T:
        if self.on_loop() or not getattr(self._pausing, "on", False):
            return super().drive(steps, first)
        return drive(
            steps, self.read, self.write, self._sleep, self.compute, first=first, pause=True
        )

    def submit_job(
        self, job_id: int, plugins: compaction.Plugins, owner: str | None = None
    ) -> None:
        def start() -> None:
            task = self.loop.create_task(glue(self._run_job_quietly, job_id, plugins, owner))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

        if self.on_loop():
            start()
        else:
            self.loop.call_soon_threadsafe(start)

    @property
    def plugins(self) -> compaction.Plugins:
        return replace(super().plugins, loop=self.loop)

    def read(self, fn: Callable[[Connection], T]) -> T:
        if not self.on_loop():
            return super().read(fn)
        return _await(self.steps.run(partial(super().read, fn)))

    def write(self, fn: Callable[[Connection], T]) -> T:
        if not self.on_loop():
            return super().write(fn)
        return _await(self.steps.run(partial(super().write, fn)))

    def compute(self, fn: Callable[[], T]) -> T:
        if not self.on_loop():
            return fn()
        return _await(self.decides.run(fn))

    def _sleep(self, seconds: float) -> None:
        if not self.on_loop():
            time.sleep(seconds)
            return
        _await(asyncio.sleep(seconds))

    def _call_back(self, callback: CompactionCallback, result: CompactionResult) -> None:
        value = callback(result)
        if inspect.isawaitable(value):  # an async on_compaction is awaited on the loop
            if self.on_loop():
                _await(value)
            elif getattr(self._pausing, "on", False):
                # A whole call in a step thread: awaited by its caller on the loop once the
                # call is done, so the callback may use the store (it would wait for this
                # very thread if the thread waited for it).
                self._pausing.callbacks.append((value, result.id))
            else:
                asyncio.run_coroutine_threadsafe(_awaited(value), self.loop).result()


async def _awaited(awaitable: Awaitable[T]) -> T:
    return await awaitable


async def glue(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Run a compaction call's driver code on the loop, in a greenlet: the store's hooks
    await its steps (each in a thread) instead of blocking."""
    from sqlalchemy.util import greenlet_spawn

    return await greenlet_spawn(partial(fn, *args, **kwargs))
