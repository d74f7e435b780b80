"""The async store's worker threads (see :mod:`compactstore.aio`): a fixed set of threads,
started when the store opens, that run calls for the event loop and hand the results back.

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
import threading
from collections import deque
from collections.abc import Callable
from contextlib import suppress
from queue import Empty, SimpleQueue
from time import monotonic
from typing import Any, TypeVar

__all__ = ["Workers"]

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
