"""``compactstore cost`` on a long session: the ledger summed in SQL (issue 28's target: a
10,000-call session in at most 1 s).

    python -m benchmarks.cost                       # 10,000 calls, SQLite, 5 timed runs
    python -m benchmarks.cost --calls 2000 --runs 3
    python -m benchmarks.cost --db postgresql+psycopg://USER@HOST/DB   # an empty database

The session is built through the public API: per call, a user message and an assistant reply
appended and ``record_usage`` with the whole split (uncached input, cache read, 5-minute and
1-hour writes, output, model), a full ``compact()`` every ``--compact-every`` calls (so the
cache-rewrite query has compactions to attribute). Then, per run: ``compactstore cost SESSION
--json`` in a fresh process (interpreter start and imports included; wall time, and the
process's CPU time, which a loaded machine does not inflate), and the same
command in this process through click's runner (open, sums, render; the figure the target is
about), and ``Session.cost()`` alone.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from click.testing import CliRunner

from compactstore import CompactStore
from compactstore._cli import cli

SESSION = "cost-bench"
TARGET_SECONDS = 1.0


def build(db: str, calls: int, compact_every: int) -> float:
    """Write the session; returns the seconds it took."""
    started = time.perf_counter()
    with CompactStore.open(db) as store:
        sess = store.session(SESSION, context_window=200_000, now=0.0)
        sess.append({"role": "user", "content": "Port the parser to the new API."}, timestamp=0.0)
        for call in range(calls):
            at = 1.0 + call
            sess.append({"role": "assistant", "content": f"step {call}: " + "x " * 40}, at)
            sess.append({"role": "user", "content": f"result {call}: " + "y " * 60}, at)
            prompt = sess.token_usage()
            sess.record_usage(
                2,
                cache_read_tokens=max(prompt - 300, 0),
                cache_write_5m_tokens=200,
                cache_write_1h_tokens=98,
                output_tokens=60,
                model="claude-sonnet-5-5" if call % 10 else "an-unpriced-model",
                now=at + 0.5,
            )
            if compact_every and call % compact_every == compact_every - 1:
                sess.compact(now=at + 0.75)
    return time.perf_counter() - started


def _child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def time_cli_process(db: str) -> tuple[float, float, dict[str, object]]:
    """(wall seconds, CPU seconds, the JSON document) of the command in a new process. The
    CPU time is the process's own (user and system): on a shared machine the wall time
    also counts the time other processes held the cores."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    cpu = _child_cpu()
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "compactstore", "cost", SESSION, "--db", db, "--json"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return time.perf_counter() - started, _child_cpu() - cpu, json.loads(done.stdout)


def time_cli_in_process(db: str) -> float:
    runner = CliRunner()
    started = time.perf_counter()
    result = runner.invoke(cli, ["cost", SESSION, "--db", db, "--json"])
    elapsed = time.perf_counter() - started
    assert result.exit_code == 0, result.output
    return elapsed


def time_session_cost(db: str) -> float:
    with CompactStore.open(db) as store:
        sess = store.get_session(SESSION)
        started = time.perf_counter()
        sess.cost()
        return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=10_000)
    parser.add_argument("--compact-every", type=int, default=500)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--db", help="a database URL (default: a temporary SQLite file)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="compactstore-cost-") as tmp:
        db = args.db or str(Path(tmp) / "cost.db")
        built = build(db, args.calls, args.compact_every)
        print(f"built {args.calls:,} calls in {built:.1f} s ({db.split('://')[0]})")
        process, process_cpu, in_process, session = [], [], [], []
        found: dict[str, object] = {}
        for _ in range(args.runs):
            seconds, cpu, found = time_cli_process(db)
            process.append(seconds)
            process_cpu.append(cpu)
            in_process.append(time_cli_in_process(db))
            session.append(time_session_cost(db))
        print(
            f"calls {found['calls']:,}, unpriced {found['unpriced_calls']:,}, "
            f"cost ${found['cost_usd']:,.2f}, "
            f"compactions priced {len(found['cache_rewrite']['compactions']):,}"  # type: ignore[index]
        )
        for name, values in (
            ("compactstore cost (new process, wall)", process),
            ("compactstore cost (new process, CPU)", process_cpu),
            ("compactstore cost (in process)", in_process),
            ("Session.cost()", session),
        ):
            print(
                f"{name}: median {statistics.median(values) * 1000:,.0f} ms "
                f"({min(values) * 1000:,.0f}-{max(values) * 1000:,.0f}), "
                f"target {TARGET_SECONDS * 1000:,.0f} ms"
            )


if __name__ == "__main__":
    main()
