"""Concurrency: several processes on one database, on SQLite and on PostgreSQL.

- Processes appending to different sessions while others run ``history``, ``show`` and
  ``rollback --yes`` from the command line: every append lands at the seq it returned, no
  ``database is locked`` escapes, every CLI call succeeds or fails with one ``Error:`` line.
- Processes appending to the same session: seqs are 0..n-1 with no gap and no repeat.
- Processes calling process_request on the same session at the same moment, over the
  auto-compact threshold: they serialize, and exactly one compaction is recorded.
- with_retry: a busy database is retried with a bounded, jittered backoff; other errors
  are not retried.

The worker processes are this module run as ``python -m tests.test_concurrency ROLE ...``.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy.exc import OperationalError

from compactstore import CompactStore, CompactStoreError, DatabaseError
from compactstore.db import engine as engine_module
from tests.conftest import fresh_database
from tests.crash_child import check_rows
from tests.helpers import pair_problems

ROOT = Path(__file__).resolve().parents[1]
T0 = 1_700_000_000.0
TIMEOUT = 120.0
WINDOW = 10_000


# -- worker processes --------------------------------------------------------------------------


def _arrive(barrier: Path, name: str, tag: str = "") -> None:
    """Say this worker is ready, then wait until the parent lets everyone go at once."""
    (barrier / f"{name}.ready{tag}").touch()
    go = barrier / f"go{tag}"
    deadline = time.monotonic() + TIMEOUT
    while not go.exists():
        if time.monotonic() > deadline:
            raise TimeoutError("the parent never released the barrier")
        time.sleep(0.0005)


def _text(name: str, i: int) -> str:
    return f"{name} message {i}: " + "lorem ipsum dolor sit amet " * 8


def _role_append(store: CompactStore, sid: str, barrier: Path, name: str, n: int) -> Any:
    """Append n messages to one session; returns the seqs the calls returned."""
    sess = store.session(sid, context_window=WINDOW, now=T0)
    _arrive(barrier, name)
    seqs = []
    for i in range(n):
        role = "user" if i % 2 == 0 else "assistant"
        seqs.append(sess.append({"role": role, "content": _text(name, i)}, timestamp=T0 + i))
    return {"seqs": seqs}


def _role_compactor(store: CompactStore, sid: str, barrier: Path, name: str, n: int) -> Any:
    """Append and run process_request after each message, so boundaries keep appearing."""
    sess = store.session(sid, context_window=WINDOW, now=T0)
    _arrive(barrier, name)
    seqs, compactions = [], 0
    for i in range(n):
        role = "user" if i % 2 == 0 else "assistant"
        text = _text(name, i) * 8
        seqs.append(sess.append({"role": role, "content": text}, timestamp=T0 + i))
        compactions += sess.process_request(now=T0 + i).id is not None
    return {"seqs": seqs, "compactions": compactions}


def _role_process(store: CompactStore, sids: str, barrier: Path, name: str, now: float) -> Any:
    """One process_request per session, each released together with the other workers."""
    out = []
    for round_, sid in enumerate(sids.split(",")):
        sess = store.get_session(sid)
        sess.active_context()  # warm up, so both calls start from the barrier equally
        _arrive(barrier, name, str(round_))
        result = sess.process_request(now=now)
        out.append({"sid": sid, "id": result.id, "success": result.success})
    return out


ROLES = {"append": _role_append, "compactor": _role_compactor, "process": _role_process}


def _worker(argv: list[str]) -> int:
    role, url, sid, barrier, name, out, arg = argv
    if role == "open":
        # Everyone opens (creates) each new database at the same moment.
        outcomes = []
        for trial, new in enumerate(json.loads(arg)):
            _arrive(Path(barrier), name, str(trial))
            try:
                with CompactStore.open(new) as store:
                    store.session(sid, now=T0)
                outcomes.append("opened")
            except CompactStoreError as exc:
                outcomes.append(f"{type(exc).__name__}: {exc}")
        Path(out).write_text(json.dumps({"ok": outcomes}))
        return 0
    store = CompactStore.open(url)
    try:
        found = ROLES[role](store, sid, Path(barrier), name, json.loads(arg))
        Path(out).write_text(json.dumps({"ok": found}))
    except BaseException as exc:
        Path(out).write_text(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
        raise
    finally:
        store.close()
    return 0


# -- the parent's side -------------------------------------------------------------------------


class Workers:
    """Worker processes released together through a barrier directory."""

    def __init__(self, url: str, tmp: Path) -> None:
        self.url, self.tmp = url, tmp
        self.barrier = tmp / "barrier"
        self.barrier.mkdir(exist_ok=True)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, role: str, sid: str, name: str, arg: Any) -> None:
        self.procs[name] = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.test_concurrency",
                role,
                self.url,
                sid,
                str(self.barrier),
                name,
                str(self.tmp / f"{name}.json"),
                json.dumps(arg),
            ],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )

    def release(self, tag: str = "") -> None:
        """Wait until every worker waits at the barrier, then let them all go."""
        deadline = time.monotonic() + TIMEOUT
        while not all((self.barrier / f"{n}.ready{tag}").exists() for n in self.procs):
            dead = [n for n, p in self.procs.items() if p.poll() is not None]
            assert not dead, f"workers {dead} exited early: {self.stderr(dead[0])}"
            assert time.monotonic() < deadline, "workers never reached the barrier"
            time.sleep(0.005)
        (self.barrier / f"go{tag}").touch()

    def stderr(self, name: str) -> str:
        proc = self.procs[name]
        assert proc.stderr is not None
        return proc.stderr.read().decode("utf-8", "replace")[-3000:]

    def results(self) -> dict[str, Any]:
        out = {}
        for name, proc in self.procs.items():
            proc.wait(timeout=TIMEOUT)
            err = self.stderr(name)
            assert proc.returncode == 0, f"worker {name} failed:\n{err}"
            assert "locked" not in err.lower(), err
            out[name] = json.loads((self.tmp / f"{name}.json").read_text())["ok"]
        return out

    def kill_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            if proc.stderr is not None:
                proc.stderr.close()


@pytest.fixture
def workers(db_url: str, tmp_path: Path) -> Iterator[Workers]:
    group = Workers(db_url, tmp_path)
    try:
        yield group
    finally:
        group.kill_all()


class CliLoop:
    """Threads running CLI commands over and over until stopped, recording every outcome."""

    def __init__(self, url: str, commands: list[list[str]]) -> None:
        self.url = url
        self.stop = threading.Event()
        self.outcomes: list[tuple[list[str], int, str, str]] = []
        self.threads = [
            threading.Thread(target=self._loop, args=(command,), daemon=True)
            for command in commands
        ]

    def _loop(self, command: list[str]) -> None:
        while not self.stop.is_set():
            done = subprocess.run(
                [sys.executable, "-m", "compactstore", *command, "--db", self.url],
                capture_output=True,
                text=True,
                timeout=TIMEOUT,
                cwd=ROOT,
            )
            self.outcomes.append((command, done.returncode, done.stdout, done.stderr))

    def __enter__(self) -> CliLoop:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=TIMEOUT)


def _assert_log(store: CompactStore, sid: str, expected: dict[int, str]) -> None:
    """The session's seqs are 0..n-1 and each holds the text its append returned for."""
    log = store.get_session(sid).messages()
    assert len(log) == len(expected)
    assert sorted(expected) == list(range(len(log))), "lost or duplicated seq"
    for seq, content in expected.items():
        assert log[seq]["content"] == content, f"{sid} seq {seq} holds another message"


# -- tests -------------------------------------------------------------------------------------


@pytest.mark.slow
def test_appenders_on_different_sessions_while_the_cli_reads_and_rolls_back(
    db_url: str, workers: Workers
) -> None:
    n = 30
    with CompactStore.open(db_url) as store:
        for sid in ("s0", "s1", "s2", "c"):
            store.session(sid, context_window=WINDOW, now=T0)
    for i in range(3):
        workers.start("append", f"s{i}", f"a{i}", n)
    workers.start("compactor", "c", "c0", 40)
    commands = [
        ["history", "c", "--json"],
        ["show", "s0", "--json"],
        ["rollback", "c", "--yes", "--json"],
    ]
    with CliLoop(db_url, commands) as cli:
        # The CLI runs on sessions that exist (they are created before the barrier).
        workers.release()
        found = workers.results()
        # Let the CLI loops finish at least one round against the final state.
        deadline = time.monotonic() + TIMEOUT
        while len(cli.outcomes) < 2 * len(commands) and time.monotonic() < deadline:
            time.sleep(0.05)
    with CompactStore.open(db_url) as store:
        for i in range(3):
            seqs = found[f"a{i}"]["seqs"]
            assert seqs == list(range(n))
            _assert_log(store, f"s{i}", {seq: _text(f"a{i}", k) for k, seq in enumerate(seqs)})
        compactor = found["c0"]
        assert compactor["seqs"] == list(range(40))
        assert compactor["compactions"] > 0, "the compactor never compacted"
        assert check_rows(store) == []
        for sid in ("c", "s0"):
            assert pair_problems("anthropic", store.get_session(sid).active_context()) == []
    rollbacks = 0
    for command, code, out, err in cli.outcomes:
        assert "Traceback" not in err and "locked" not in err.lower(), (command, err)
        if command[0] == "rollback":
            # Nothing to roll back (or a compactor raced it): a refusal, in one line.
            assert code in (0, 1), (command, code, err)
            if code == 1:
                # Under --json the refusal is one JSON line on stderr.
                assert err.count("\n") == 1, err
                refusal = json.loads(err)
                assert refusal["kind"] in ("NotFoundError", "ConflictError"), err
                message = refusal["error"]
                assert "no live boundary" in message or "already rolled back" in message, err
            else:
                rollbacks += 1
                assert json.loads(out)["rolled_back"], out
        else:
            assert code == 0, (command, code, err)
            if "--json" in command:
                json.loads(out)
    assert len(cli.outcomes) >= len(commands)
    print(f"\nconcurrency: {len(cli.outcomes)} CLI calls ({rollbacks} rollbacks) during 4 writers")


@pytest.mark.slow
def test_appenders_on_one_session_get_contiguous_seqs(db_url: str, workers: Workers) -> None:
    n, writers = 25, 4
    CompactStore.open(db_url).close()
    for i in range(writers):
        workers.start("append", "shared", f"w{i}", n)
    workers.release()
    found = workers.results()
    expected: dict[int, str] = {}
    for i in range(writers):
        seqs = found[f"w{i}"]["seqs"]
        assert seqs == sorted(seqs), "a writer's own appends must come back in order"
        for k, seq in enumerate(seqs):
            assert seq not in expected, f"seq {seq} returned to two appends"
            expected[seq] = _text(f"w{i}", k)
    with CompactStore.open(db_url) as store:
        _assert_log(store, "shared", expected)
        assert check_rows(store) == []


@pytest.fixture
def new_databases(db_url: str, tmp_path: Path) -> Iterator[list[str]]:
    """Six more empty databases on db_url's backend."""
    backend = "postgres" if "://" in db_url else "sqlite"
    directories = [tmp_path / f"new{t}" for t in range(6)]
    with contextlib.ExitStack() as stack:
        for directory in directories:
            directory.mkdir()
        yield [
            stack.enter_context(fresh_database(backend, d, "new", empty=True)) for d in directories
        ]


@pytest.mark.slow
def test_processes_opening_a_new_database_at_once_all_succeed(
    workers: Workers, new_databases: list[str]
) -> None:
    callers = 4
    for i in range(callers):
        workers.start("open", f"o{i}", f"o{i}", new_databases)
    for trial in range(len(new_databases)):
        workers.release(str(trial))
    found = workers.results()
    failed = [f"{new_databases[t]}: {found[name][t]}" for name in found for t in range(6)]
    failed = [line for line in failed if not line.endswith(": opened")]
    assert not failed, "\n".join(failed)
    for new in new_databases:
        with CompactStore.open(new) as store:
            assert sorted(info.id for info in store.sessions()) == ["o0", "o1", "o2", "o3"]


def _over_threshold(store: CompactStore, sid: str) -> None:
    """A session whose usage is just over 85% of its window (auto-compact must fire)."""
    sess = store.session(sid, context_window=WINDOW, now=T0)
    text = "lorem ipsum dolor sit amet consectetur " * 20  # 200 tokens
    count = 0
    while sess.token_usage() < 0.86 * WINDOW:
        batch = [
            {"role": "user" if (count + k) % 2 == 0 else "assistant", "content": f"{k} {text}"}
            for k in range(5)
        ]
        sess.extend(batch, timestamps=[T0 + count + k for k in range(5)])
        count += 5
    assert sess.token_usage() < 0.95 * WINDOW


@pytest.mark.slow
def test_two_processes_calling_process_request_at_once_record_one_compaction(
    db_url: str, workers: Workers
) -> None:
    rounds, callers = 3, 3
    sids = [f"p{r}" for r in range(rounds)]
    with CompactStore.open(db_url) as store:
        for sid in sids:
            _over_threshold(store, sid)
    now = T0 + 60  # well before the first time-based microcompact
    for i in range(callers):
        workers.start("process", ",".join(sids), f"p{i}", now)
    for r in range(rounds):
        workers.release(str(r))
    found = workers.results()
    with CompactStore.open(db_url) as store:
        for r, sid in enumerate(sids):
            recorded = store.get_session(sid).compactions()
            assert len(recorded) == 1, f"{sid}: {len(recorded)} compactions for one trigger"
            ids = [found[f"p{i}"][r]["id"] for i in range(callers)]
            assert sorted(ids, key=lambda x: x is None) == [recorded[0].id] + [None] * (
                callers - 1
            ), ids
            assert recorded[0].success
            sess = store.get_session(sid)
            assert sess.token_usage() < 0.85 * WINDOW
            assert pair_problems("anthropic", sess.active_context()) == []
        assert check_rows(store) == []
    print(f"\nconcurrency: {rounds} rounds x {callers} simultaneous process_request calls")


def test_a_writer_waits_for_a_lock_held_by_another_process_instead_of_failing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Event-driven, no timer: the holder lets go when the writer, having waited out the
    busy timeout, backs off to retry; the writer then goes through."""
    monkeypatch.setattr(engine_module, "BUSY_TIMEOUT_MS", 50)
    db = tmp_path / "locked.db"
    with CompactStore.open(db) as store:
        sess = store.session("s", now=T0)
        sess.append({"role": "user", "content": "hello"}, timestamp=T0)
        holder = sqlite3.connect(db, isolation_level=None, timeout=5)
        holder.execute("BEGIN IMMEDIATE")
        backoffs: list[float] = []

        def release_on_backoff(seconds: float) -> None:
            backoffs.append(seconds)
            if holder.in_transaction:
                holder.rollback()  # the writer is waiting now: let it in

        monkeypatch.setattr(engine_module, "time", SimpleNamespace(sleep=release_on_backoff))
        try:
            # Readers are not blocked by a writer in WAL mode.
            assert store.get_session("s").messages() == [{"role": "user", "content": "hello"}]
            seq = sess.append({"role": "assistant", "content": "hi"}, timestamp=T0 + 1)
        finally:
            holder.close()
        assert seq == 1
        assert len(backoffs) == 1, "the writer waited for the lock once, then got it"
        assert [m["content"] for m in store.get_session("s").messages()] == ["hello", "hi"]


@pytest.mark.slow
def test_a_lock_held_past_every_retry_gives_a_clear_busy_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bounded: after the busy timeout and the retries, one clear error, not a hang."""
    monkeypatch.setattr(engine_module, "BUSY_TIMEOUT_MS", 50)
    sleeps: list[float] = []
    monkeypatch.setattr(engine_module, "time", SimpleNamespace(sleep=sleeps.append))
    db = tmp_path / "held.db"
    with CompactStore.open(db) as store:
        sess = store.session("s", now=T0)
        holder = sqlite3.connect(db, isolation_level=None, timeout=5)
        holder.execute("BEGIN IMMEDIATE")
        try:
            with pytest.raises(DatabaseError) as caught:
                sess.append({"role": "user", "content": "hello"}, timestamp=T0)
        finally:
            holder.rollback()
            holder.close()
        assert len(sleeps) == 7, "8 attempts, 7 backoffs"
        assert all(0 < s <= 3.0 for s in sleeps) and sum(sleeps) < 10
        message = str(caught.value)
        assert str(db) in message and "another process kept it locked" in message, message
        assert "backup" not in message and "damaged" not in message, message
        assert sess.messages() == []


def _busy(times: int) -> tuple[list[int], Any]:
    calls: list[int] = []

    def fn() -> str:
        calls.append(1)
        if len(calls) <= times:
            raise OperationalError(
                "BEGIN IMMEDIATE", {}, sqlite3.OperationalError("database is locked")
            )
        return "done"

    return calls, fn


def test_with_retry_retries_busy_with_bounded_jittered_backoff(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sleeps: list[float] = []
    monkeypatch.setattr(engine_module, "time", SimpleNamespace(sleep=sleeps.append))
    calls, fn = _busy(5)
    assert engine_module.with_retry(fn) == "done"
    assert len(calls) == 6 and len(sleeps) == 5
    assert all(0 < s <= 3.0 for s in sleeps)
    calls, fn = _busy(100)
    with pytest.raises(OperationalError):
        engine_module.with_retry(fn)
    assert len(calls) == 8, "the number of attempts is bounded"


def test_with_retry_does_not_retry_other_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    never = SimpleNamespace(sleep=lambda _s: pytest.fail("slept"))
    monkeypatch.setattr(engine_module, "time", never)
    calls: list[int] = []

    def fn() -> None:
        calls.append(1)
        raise OperationalError("SELECT", {}, sqlite3.OperationalError("no such table: x"))

    with pytest.raises(OperationalError):
        engine_module.with_retry(fn)
    assert calls == [1]


def test_the_active_context_is_consistent_when_another_process_compacts(
    tmp_path: Path,
) -> None:
    """A store that cached a context must see another process's compaction and rollback."""
    db = tmp_path / "two.db"
    with CompactStore.open(db) as first, CompactStore.open(db) as second:
        _over_threshold(first, "s")
        a = first.get_session("s")
        b = second.get_session("s")
        before = a.active_context()
        assert b.active_context() == before
        result = b.process_request(now=T0 + 60)
        assert result.id is not None
        assert a.active_context() == b.active_context() != before
        b.rollback()
        assert a.active_context() == before
        a.append({"role": "user", "content": "more"}, timestamp=T0 + 70)
        assert b.active_context() == [*before, {"role": "user", "content": "more"}]


if __name__ == "__main__":
    raise SystemExit(_worker(sys.argv[1:]))


def test_a_pool_with_no_free_connection_is_a_busy_database_error(db_url: str) -> None:
    with CompactStore.open(db_url, pool_size=1, max_overflow=0, pool_timeout=0.1) as store:
        sess = store.session("s", now=T0)
        busy = pytest.raises(DatabaseError, match="is busy: no connection of the pool")
        with store.engine.connect(), busy:  # the pool's only connection, held
            sess.token_usage()
        assert sess.token_usage() == 0, "usable again once a connection is free"
    for bad in ({"pool_size": 0}, {"max_overflow": -1}, {"pool_timeout": 0}):
        with pytest.raises(CompactStoreError, match=next(iter(bad))):
            CompactStore.open(db_url, **bad)  # type: ignore[arg-type]
