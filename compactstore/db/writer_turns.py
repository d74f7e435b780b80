"""The turn SQLite writers of every process take before ``BEGIN IMMEDIATE``: an exclusive
``flock`` on a file beside the database (``<database>-writer``).

Between processes SQLite offers only its busy handler: a writer that finds the write lock
taken sleeps and tries again, so the lock stands free between one writer's commit and the
next one's try, and the writers that arrive meanwhile may take it first, again and again.
A writer waiting in ``flock`` is woken by the kernel the moment the holder lets go.

The turn is only about waiting well: SQLite's lock still decides who writes, so a writer
that gets no turn (the file cannot be opened, or the busy timeout passed) goes on to
``BEGIN IMMEDIATE`` as before, and a process that never takes turns (another program, an
older compactstore) is still excluded by SQLite. Nobody waits for a turn while holding
SQLite's lock: the turn is taken before ``BEGIN IMMEDIATE`` and given back after the commit.
"""

from __future__ import annotations

import os
import threading
import weakref
from pathlib import Path
from time import monotonic

try:
    import fcntl
except ImportError:  # Windows: SQLite's busy handler alone
    fcntl = None  # type: ignore[assignment]

__all__ = ["WriterTurns"]


class WriterTurns:
    """The turns of one engine's writers (one open file: ``flock`` excludes other open
    files of the same path, in this process or another). The threads of one process take
    turns on a lock of their own first (``db.engine.write_tx``): one asks here at a time."""

    def __init__(self, database: Path) -> None:
        self.path = database.with_name(database.name + "-writer")
        # Opened (created) by the first writer: a store that only reads, or whose database
        # turns out not to be one, leaves no file beside it.
        self._fd: int | None = None
        self._opened = False
        self._state = threading.Condition()
        self._waiting = False  # a thread of ours is blocked in flock()
        self._wanted = False  # a writer waits for what that thread gets
        self._granted = False
        self._holds = 0  # a transaction inside another one takes the turn it holds again

    def acquire(self, deadline: float) -> bool:
        """Wait for the turn until ``deadline`` (``time.monotonic()``); False: no turn was
        taken (no lock file, or the time ran out)."""
        with self._state:
            fd = self._open()
            if fd is None:
                return False
            if self._holds:
                self._holds += 1
                return True
            if not self._waiting:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    self._holds = 1
                    return True
                except BlockingIOError:
                    pass
                except OSError:
                    return False
                # Block in the kernel from a thread of its own, so that this writer can
                # still give up at the deadline.
                self._waiting = True
                threading.Thread(
                    target=self._wait, args=(fd,), name="compactstore-writer-turn", daemon=True
                ).start()
            self._wanted = True
            while self._waiting and not self._granted:
                left = deadline - monotonic()
                if left <= 0:
                    break
                self._state.wait(left)
            granted, self._granted, self._wanted = self._granted, False, False
            self._holds = int(granted)
            return granted

    def _open(self) -> int | None:
        """The lock file's descriptor, opened on the first call (None: no lock file)."""
        if not self._opened:
            self._opened = True
            if fcntl is not None:
                try:
                    # Private like the database (SQLite gives its -wal and -shm files its mode).
                    self._fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o600)
                except OSError:
                    pass  # a directory we may not write: SQLite's lock alone decides
                else:
                    weakref.finalize(self, os.close, self._fd)
        return self._fd

    def _wait(self, fd: int) -> None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            taken = True
        except OSError:
            taken = False
        with self._state:
            self._waiting = False
            if taken and self._wanted:
                self._granted = True
            elif taken:
                fcntl.flock(fd, fcntl.LOCK_UN)  # the writer gave up meanwhile
            self._state.notify_all()

    def release(self) -> None:
        """Give back a turn :meth:`acquire` took."""
        with self._state:
            self._holds -= 1
            if self._holds == 0 and self._fd is not None:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
