"""Compaction that never blocks: what a slow summary costs everyone else.

SQLite (``sqlite``): one session's compaction calls a summarizer that takes
``--summary-seconds`` (10 s); meanwhile ``--workers`` (20) other processes on the same file
each do one append + ``process_request()`` on a session of their own every 250 ms. Per
operation it reports, at p50/p99/max: the time waiting for SQLite's write lock (its
writers' ``BEGIN IMMEDIATE``, every try included), the CPU time of the operation, and its
wall time. Target: lock wait p99 <= 50 ms. The lock wait includes the wait for the writers'
turn between processes that comes before BEGIN IMMEDIATE (compactstore/db/writer_turns.py).
``--no-summary`` runs the same workers for the same time with no compaction at all: what the
summary in flight adds to their wait is the difference. (Started together, the workers stay
in step: every 250 ms all of them want the lock at once, on 2 cores here.)

PostgreSQL (``postgres``): ``--compactions`` (20) sessions compacted at once, each from its own
thread of one process through one store (its default pool: 5 + 10 overflow), with a summarizer
that takes ``--summary-seconds`` (35 s). Target: 0 errors, every compaction recorded.

    python -m benchmarks.nonblocking sqlite [--workers 20] [--summary-seconds 10] [--no-summary]
    python -m benchmarks.nonblocking postgres --db postgresql+psycopg://USER@HOST/DB \\
        [--compactions 20] [--summary-seconds 35]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from compactstore import CompactionConfig, CompactStore
from compactstore.db import engine as engine_module
from compactstore.db.writer_turns import WriterTurns

ROOT = Path(__file__).resolve().parent.parent
START = 1_767_225_600.0
WINDOW = 20_000
PERIOD = 0.25  # seconds between a worker's operations


def _pct(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)] if ordered else 0.0


def fill(store: CompactStore, session_id: str, ratio: float) -> None:
    """A session at ``ratio`` of a 20,000-token window (config: the plain estimate)."""
    sess = store.session(
        session_id,
        context_window=WINDOW,
        config=CompactionConfig(token_factor=1.0),
        now=START,
    )
    sess.append({"role": "user", "content": f"Task of {session_id}: port the parser"})
    step = 0
    while sess.token_usage() < ratio * WINDOW:
        sess.extend(
            [
                {"role": "assistant", "content": f"step {step}: " + "analysis " * 150},
                {"role": "user", "content": f"next {step}: " + "details " * 150},
            ],
            timestamps=[START + step, START + step + 0.5],
        )
        step += 1


# -- SQLite: workers appending while one summary is in flight --------------------------------


def worker(db: str, session_id: str, seconds: float, ready: str, go: str) -> None:
    """One agent: append + process_request() every 250 ms for ``seconds``; prints JSON."""
    store = CompactStore.open(db)
    waits: list[float] = []

    begin, take_turn = engine_module._begin_immediate, WriterTurns.acquire

    def timed_begin(connection: Any) -> None:
        # A writer's wait for the write lock: its BEGIN IMMEDIATE, every try included.
        started = time.perf_counter()
        try:
            begin(connection)
        finally:
            waits.append(time.perf_counter() - started)

    def timed_turn(turns: WriterTurns, deadline: float) -> bool:
        # ... and before it, its wait for the writers' turn between processes.
        started = time.perf_counter()
        try:
            return take_turn(turns, deadline)
        finally:
            waits.append(time.perf_counter() - started)

    engine_module._begin_immediate = timed_begin
    WriterTurns.acquire = timed_turn  # type: ignore[method-assign,assignment]

    sess = store.session(session_id)
    sess.token_usage()  # warm the cache and the pool before the clock starts
    Path(ready).touch()
    while not Path(go).exists():
        time.sleep(0.01)
    samples: list[dict[str, float]] = []
    end = time.monotonic() + seconds
    n = 0
    next_at = time.monotonic()
    while time.monotonic() < end:
        del waits[:]
        wall, cpu = time.perf_counter(), time.process_time()
        sess.append({"role": "assistant", "content": f"tick {n}"}, timestamp=START + 10_000 + n)
        sess.process_request(now=START + 10_000 + n)
        samples.append(
            {
                "wall": time.perf_counter() - wall,
                "cpu": time.process_time() - cpu,
                "lock": sum(waits),
            }
        )
        n += 1
        next_at += PERIOD
        time.sleep(max(0.0, next_at - time.monotonic()))
    store.close()
    print(json.dumps(samples))


def run_sqlite(workers: int, summary_seconds: float, summary: bool = True) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="cs-nonblocking-") as tmp:
        db = str(Path(tmp) / "bench.db")
        with CompactStore.open(db) as store:
            fill(store, "compacting", 0.9)
            for i in range(workers):
                fill(store, f"agent{i}", 0.3)
        go = Path(tmp) / "go"
        readies = [Path(tmp) / f"ready{i}" for i in range(workers)]
        seconds = summary_seconds + 2
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "benchmarks.nonblocking",
                    "worker",
                    db,
                    f"agent{i}",
                    str(seconds),
                    str(readies[i]),
                    str(go),
                ],
                cwd=ROOT,
                stdout=subprocess.PIPE,
            )
            for i in range(workers)
        ]
        while not all(path.exists() for path in readies):
            time.sleep(0.05)

        def summarize(messages: Any, previous: Any, instructions: Any) -> str:
            time.sleep(summary_seconds)
            return f"summary of {len(messages)} messages"

        compacted: dict[str, Any] = {}
        if summary:
            with CompactStore.open(db, summarizer=summarize) as store:
                sess = store.session("compacting")
                go.touch()
                time.sleep(0.5)  # the workers are running before the summary starts
                started = time.perf_counter()
                result = sess.process_request(now=START + 20_000)
                compacted = {
                    "seconds": round(time.perf_counter() - started, 2),
                    "effective": result.effective,
                    "summary_source": result.summary.source if result.summary else None,
                }
        else:
            go.touch()
        samples: list[dict[str, float]] = []
        for proc in procs:
            out, _ = proc.communicate(timeout=seconds + 120)
            samples.extend(json.loads(out))
    ms = {k: [s[k] * 1000 for s in samples] for k in ("lock", "cpu", "wall")}
    return {
        "workers": workers,
        "summary_seconds": summary_seconds if summary else None,
        "operations": len(samples),
        "compaction": compacted,
        **{
            f"{kind}_ms": {
                "p50": round(_pct(values, 50), 2),
                "p99": round(_pct(values, 99), 2),
                "max": round(max(values), 2),
            }
            for kind, values in ms.items()
        },
        "target_lock_p99_ms": 50,
    }


# -- PostgreSQL: many slow summaries at once --------------------------------------------------


def run_postgres(db: str, compactions: int, summary_seconds: float) -> dict[str, Any]:
    tag = f"bench{os.getpid()}"
    with CompactStore.open(db) as store:
        for i in range(compactions):
            fill(store, f"{tag}-{i}", 0.9)

    def summarize(messages: Any, previous: Any, instructions: Any) -> str:
        time.sleep(summary_seconds)
        return f"summary of {len(messages)} messages"

    errors: list[str] = []
    results: list[Any] = []
    with CompactStore.open(db, summarizer=summarize) as store:

        def compact(i: int) -> None:
            try:
                results.append(store.session(f"{tag}-{i}").process_request(now=START + 20_000))
            except Exception as exc:  # counted: the target is none
                errors.append(f"{type(exc).__name__}: {exc}")

        started = time.perf_counter()
        threads = [threading.Thread(target=compact, args=(i,)) for i in range(compactions)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        elapsed = time.perf_counter() - started
        for i in range(compactions):
            store.delete_session(f"{tag}-{i}")
    return {
        "compactions": compactions,
        "summary_seconds": summary_seconds,
        "seconds": round(elapsed, 1),
        "errors": errors,
        "recorded": sum(1 for r in results if r.id is not None),
        "by_summarizer": sum(
            1 for r in results if r.summary is not None and r.summary.source == "summarizer"
        ),
        "target_errors": 0,
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    lite = sub.add_parser("sqlite")
    lite.add_argument("--workers", type=int, default=20)
    lite.add_argument("--summary-seconds", type=float, default=10.0)
    lite.add_argument(
        "--no-summary", action="store_true", help="the same workers, nothing compacting"
    )
    pg = sub.add_parser("postgres")
    pg.add_argument("--db", required=True)
    pg.add_argument("--compactions", type=int, default=20)
    pg.add_argument("--summary-seconds", type=float, default=35.0)
    child = sub.add_parser("worker")
    for name in ("db", "session", "seconds", "ready", "go"):
        child.add_argument(name)
    args = parser.parse_args(argv)
    if args.mode == "worker":
        worker(args.db, args.session, float(args.seconds), args.ready, args.go)
        return
    if args.mode == "sqlite":
        found = run_sqlite(args.workers, args.summary_seconds, not args.no_summary)
    else:
        found = run_postgres(args.db, args.compactions, args.summary_seconds)
    print(json.dumps(found, indent=2))


if __name__ == "__main__":
    main()
