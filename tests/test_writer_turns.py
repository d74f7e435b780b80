"""The writers' turn between processes (compactstore/db/writer_turns.py): a writer waits in
the kernel for the turn another process holds, goes the moment it is given back, and never
waits for it past the busy timeout (SQLite's own lock then decides)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from compactstore import CompactStore
from compactstore.db import engine as engine_module
from tests.helpers import T0

fcntl = pytest.importorskip("fcntl", reason="writer turns use flock (not on Windows)")


@contextmanager
def turn_held_elsewhere(db: Path) -> Iterator[None]:
    """The turn held through an open file of its own, as another process holds it (flock
    excludes every other open file of the path, in this process too)."""
    fd = os.open(db.with_name(db.name + "-writer"), os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _waiting_for_the_turn() -> bool:
    return any(t.name == "compactstore-writer-turn" for t in threading.enumerate())


def _until(check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


def test_a_writer_waits_for_the_turn_and_goes_the_moment_it_is_given_back(
    tmp_path: Path,
) -> None:
    db = tmp_path / "turns.db"
    with CompactStore.open(db) as store:
        sess = store.session("s", now=T0)
        assert (tmp_path / "turns.db-writer").exists()
        done = threading.Event()

        def append() -> None:
            sess.append({"role": "user", "content": "hello"}, timestamp=T0)
            done.set()

        with turn_held_elsewhere(db):
            writer = threading.Thread(target=append)
            writer.start()
            _until(_waiting_for_the_turn)
            assert not done.is_set(), "the append went on while another process had the turn"
        writer.join(10)
        assert done.is_set()
        assert [m["content"] for m in sess.messages()] == ["hello"]


def test_past_the_busy_timeout_a_writer_goes_on_and_sqlite_decides(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine_module, "BUSY_TIMEOUT_MS", 50)
    db = tmp_path / "turns.db"
    with CompactStore.open(db) as store:
        sess = store.session("s", now=T0)
        with turn_held_elsewhere(db):
            # Nobody holds SQLite's lock: after 50 ms without the turn, the write goes on.
            sess.append({"role": "user", "content": "hello"}, timestamp=T0)
        # The turn given back, the thread left waiting for it hands it to the next writer.
        sess.append({"role": "assistant", "content": "hi"}, timestamp=T0 + 1)
        _until(lambda: not _waiting_for_the_turn())
        sess.append({"role": "user", "content": "again"}, timestamp=T0 + 2)
        assert [m["content"] for m in sess.messages()] == ["hello", "hi", "again"]
        # No turn is left held: another open file takes it at once.
        fd = os.open(tmp_path / "turns.db-writer", os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)


def test_a_read_only_store_makes_no_lock_file(tmp_path: Path) -> None:
    db = tmp_path / "ro.db"
    with CompactStore.open(db) as store:
        store.session("s", now=T0)
    os.remove(tmp_path / "ro.db-writer")
    with CompactStore.open(db, read_only=True) as store:
        assert store.get_session("s").messages() == []
    assert not (tmp_path / "ro.db-writer").exists()
