"""Crash safety: kill -9 a process driving sessions at random moments, then check the database.

A child process (tests/crash_child.py) appends messages and tool results and calls
process_request, reactive_recover, compact, rollback, record_usage and remember on three
sessions (one per format) with a small context window, so compactions really happen; after
each call returns it appends an acknowledgement to a side file (fsynced). The parent kills
it with SIGKILL after a random delay, then a fresh process checks:

- ``PRAGMA integrity_check`` is ok and ``PRAGMA foreign_key_check`` is empty (SQLite);
- every acknowledged message is present, byte-exact, at its acknowledged seq, and every
  acknowledged compaction, boundary, rollback and memory entry is recorded;
- nothing is half-recorded: a boundary has exactly one compactions row; edits, blobs and
  the compaction's lists of what was lost agree; seqs are 0..n-1; session and breaker
  counters agree with the rows;
- the active context pairs every tool result with its call by id, the official SDKs accept
  it, and process_request works.

The next driver continues on the same database, so state accumulates across kills.

Counts: ``COMPACTSTORE_CRASH_KILLS`` kills on SQLite (default 60) and
``COMPACTSTORE_CRASH_KILLS_PG`` on PostgreSQL (default: a tenth of that, at least 8). The
full run the issue asks for (200 on SQLite, 20 on PostgreSQL)::

    COMPACTSTORE_CRASH_KILLS=200 COMPACTSTORE_TEST_PG_URL=postgresql+psycopg://... \
        python -m pytest -m slow tests/test_crash.py -s

Each test prints its counts of kills and violations (shown even without ``-s``).
"""

from __future__ import annotations

import json
import os
import random
import select
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from compactstore import CompactStore

pytestmark = pytest.mark.slow

CHILD = "tests.crash_child"  # run with -m from the repository root
ROOT = Path(__file__).parent.parent
KILLS = int(os.environ.get("COMPACTSTORE_CRASH_KILLS", "60"))
KILLS_PG = int(os.environ.get("COMPACTSTORE_CRASH_KILLS_PG", str(max(8, KILLS // 10))))
# Kills while a brand-new database file is being created and migrated.
FRESH_KILLS = int(os.environ.get("COMPACTSTORE_CRASH_FRESH_KILLS", str(max(10, KILLS // 6))))
T0 = 1_700_000_000.0
CLOCK_STRIDE = 1_000_000.0  # each driver's clock starts here past the previous one's
TIMEOUT = 60.0

# Exceptions a driver may meet that are library bugs unrelated to crashing, each with the
# regression test that reproduces it on its own: (function the exception came from, the
# exception's type) -> where it is tested. Anything else a driver meets fails the harness.
KNOWN_BUGS: dict[tuple[str, str], str] = {
    # Found by this harness and fixed since (kept as a regression test):
    # ("base.py:nearest_legal_cut", "IndexError") ->
    #     tests/test_hostile.py::test_a_full_compact_after_a_partial_compact_took_everything
}


class Zygote:
    """A process that imported compactstore once and forks drivers and checkers on demand."""

    def __init__(self, workdir: Path) -> None:
        self.stderr = (workdir / "zygote.stderr").open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", CHILD, "zygote"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            cwd=ROOT,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.stdin, self.stdout = self.proc.stdin, self.proc.stdout
        self.buffer = b""
        self.ready: set[int] = set()
        self.deaths: list[str] = []
        assert self.line() == "zygote ready"

    def line(self, timeout: float = TIMEOUT) -> str:
        deadline = time.monotonic() + timeout
        fd = self.stdout.fileno()
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([fd], [], [], max(0.0, left))
            if not ready:
                raise TimeoutError("the crash harness child did not answer in time")
            chunk = os.read(fd, 65536)
            if not chunk:
                raise EOFError("the zygote exited: see zygote.stderr")
            self.buffer += chunk
        head, _, self.buffer = self.buffer.partition(b"\n")
        return head.decode("utf-8")

    def send(self, *words: object) -> int:
        """Send a command; returns the pid of the process forked for it."""
        self.stdin.write((" ".join(str(w) for w in words) + "\n").encode("utf-8"))
        self.stdin.flush()
        return int(self.expect("forked"))

    def expect(self, kind: str) -> str:
        """The rest of the next line of the given kind; other lines are filed."""
        while True:
            head, _, rest = self.line().partition(" ")
            if head == kind:
                return rest
            if head == "ready":
                self.ready.add(int(rest))
            elif head == "died":
                self.deaths.append(json.loads(rest)["error"])
            else:
                raise AssertionError(f"unexpected line from the harness: {head} {rest[:200]}")

    def wait_ready(self, pid: int) -> None:
        while pid not in self.ready:
            self.ready.add(int(self.expect("ready")))

    def close(self) -> None:
        self.stdin.close()
        self.stdout.close()
        self.proc.wait(timeout=TIMEOUT)
        self.stderr.close()


def _kill(pid: int) -> None:
    """SIGKILL a driver and wait until it is gone (its parent reaps it)."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.002)
    raise TimeoutError(f"driver {pid} survived SIGKILL")


@dataclass
class Tally:
    backend: str
    kills: int = 0
    during_startup: int = 0
    acks: int = 0
    compactions: int = 0
    violations: list[str] = field(default_factory=list)
    known_bugs: dict[str, int] = field(default_factory=dict)

    def line(self) -> str:
        return (
            f"crash harness ({self.backend}): {self.kills} kills "
            f"({self.during_startup} before the store was open), "
            f"{len(self.violations)} violations, "
            f"{self.acks} acknowledged calls checked, {self.compactions} compactions recorded"
            + "".join(f"; known bug hit {n}x: {where}" for where, n in self.known_bugs.items())
        )

    def errors(self, ack: Path) -> None:
        """File the unexpected exceptions drivers recorded: known bugs, or violations."""
        for line in ack.read_text(encoding="utf-8").split("\n")[:-1]:
            entry = json.loads(line)
            if entry["op"] != "error":
                continue
            key = (entry["where"], entry["error"].split(":", 1)[0])
            if key in KNOWN_BUGS:
                test = KNOWN_BUGS[key]
                self.known_bugs[test] = self.known_bugs.get(test, 0) + 1
            else:
                self.violations.append(f"{entry['call']}() raised {entry['error']} in {key[0]}")


def _report(request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str], t: Tally) -> None:
    request.node.add_report_section("call", "crash harness", t.line())
    with capsys.disabled():
        print("\n" + t.line())


def _harness(url: str, workdir: Path, kills: int, seed: int, backend: str) -> Tally:
    rng = random.Random(seed)
    ack = workdir / "acks.jsonl"
    tally = Tally(backend)
    zygote = Zygote(workdir)
    checked_acks = 0
    try:
        for i in range(kills):
            clock = T0 + i * CLOCK_STRIDE
            pid = zygote.send("run", url, seed * 10_000 + i, ack, clock)
            if rng.random() < 0.15:
                # Kill it while it opens the store and the sessions.
                time.sleep(rng.uniform(0.0, 0.05))
            else:
                zygote.wait_ready(pid)
                time.sleep(rng.uniform(0.05, 0.6))
            _kill(pid)
            tally.kills += 1
            # Re-verify every acknowledgement now and then; otherwise only the new ones.
            skip = 0 if i % 10 == 9 or i == kills - 1 else checked_acks
            zygote.send("check", url, ack, clock + CLOCK_STRIDE - 10, skip)
            found: dict[str, Any] = json.loads(zygote.expect("checked"))
            # Its 'ready' line, if any, came before the checker's output: all read by now.
            tally.during_startup += pid not in zygote.ready
            checked_acks = found["acks"]
            tally.compactions = found["compactions"]
            tally.violations += [f"after kill {i + 1}: {p}" for p in found["problems"]]
            tally.violations += [f"driver died by itself: {d}" for d in zygote.deaths]
            zygote.deaths.clear()
        tally.acks = checked_acks
        tally.errors(ack)
    finally:
        zygote.close()
    return tally


def test_kill_9_at_random_moments_never_breaks_the_database(
    db_url: str, tmp_path: Path, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    backend = "postgres" if "://" in db_url else "sqlite"
    kills = KILLS_PG if backend == "postgres" else KILLS
    tally = _harness(db_url, tmp_path, kills, seed=7, backend=backend)
    _report(request, capsys, tally)
    assert tally.kills == kills
    assert tally.acks > kills, "the drivers acknowledged almost nothing: the harness is broken"
    assert tally.compactions > 0, "no compaction happened: the harness does not exercise them"
    assert not tally.violations, "\n".join(tally.violations[:20])


def test_a_kill_while_a_new_database_is_created_leaves_it_usable(
    tmp_path: Path, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    """SIGKILL during CompactStore.open of a brand-new file (schema creation, migration):
    the next open must work, never refuse a half-created schema."""
    rng = random.Random(11)
    tally = Tally("sqlite, new files")
    uncommitted = 0  # kills that left no committed schema behind
    zygote = Zygote(tmp_path)
    try:
        for i in range(FRESH_KILLS):
            db = tmp_path / f"fresh{i}.db"
            pid = zygote.send("run", db, i, tmp_path / f"acks{i}.jsonl", T0)
            time.sleep(rng.uniform(0.0, 0.12))
            _kill(pid)
            tally.kills += 1
            uncommitted += not _has_schema(db)
            try:
                CompactStore.open(db).close()
            except Exception as exc:
                tally.violations.append(f"{db.name}: reopening failed: {exc!r}")
                continue
            zygote.send("check", db, tmp_path / f"acks{i}.jsonl", T0 + CLOCK_STRIDE, 0)
            found = json.loads(zygote.expect("checked"))
            tally.during_startup += pid not in zygote.ready
            tally.acks += found["acks"]
            tally.violations += [f"{db.name}: {p}" for p in found["problems"]]
            if (tmp_path / f"acks{i}.jsonl").exists():
                tally.errors(tmp_path / f"acks{i}.jsonl")
            tally.violations += [f"driver died by itself: {d}" for d in zygote.deaths]
            zygote.deaths.clear()
    finally:
        zygote.close()
    tally.backend += f", {uncommitted} killed before the schema was committed"
    _report(request, capsys, tally)
    assert not tally.violations, "\n".join(tally.violations[:20])


def _has_schema(db: Path) -> bool:
    """Whether a committed schema revision is in the file (read without changing it)."""
    if not db.exists():
        return False
    connection = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return bool(
            connection.execute(
                "SELECT count(*) FROM sqlite_master WHERE name = 'alembic_version'"
            ).fetchone()[0]
        )
    except sqlite3.DatabaseError:
        return False
    finally:
        connection.close()


def test_a_kill_during_interpreter_start_up_and_open(
    tmp_path: Path, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    """The plain way too: a fresh interpreter (no fork) killed while it imports, opens
    and starts driving; then a fresh interpreter checks."""
    rng = random.Random(5)
    db, ack = tmp_path / "plain.db", tmp_path / "acks.jsonl"
    tally = Tally("sqlite, fresh interpreters")
    for i in range(3):
        proc = subprocess.Popen(
            [sys.executable, "-m", CHILD, str(db), str(i), str(ack), str(T0 + i * CLOCK_STRIDE)],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        time.sleep(rng.uniform(0.5, 3.0))
        proc.send_signal(signal.SIGKILL)
        _, err = proc.communicate(timeout=TIMEOUT)
        if proc.returncode != -signal.SIGKILL:
            tally.violations.append(f"driver exited by itself ({proc.returncode}): {err[-2000:]!r}")
        tally.kills += 1
    out = subprocess.run(
        [sys.executable, "-m", CHILD, "check", str(db), str(ack), str(T0 + 10 * CLOCK_STRIDE)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT * 2,
        check=True,
    )
    found = json.loads(out.stdout)
    tally.acks, tally.compactions = found["acks"], found["compactions"]
    tally.violations += found["problems"]
    if ack.exists():
        tally.errors(ack)
    _report(request, capsys, tally)
    assert not tally.violations, "\n".join(tally.violations[:20])
