"""The first compaction of a long session: time and peak memory by message count.

A session of N messages that was never compacted (an imported transcript, or a client that
only now calls ``process_request``) is compacted in one call that summarises almost all of
it. That call must grow linearly with N. Two workloads, each in a fresh SQLite file:

- ``chat``: a user instruction and an assistant reply, alternating (each user message is an
  instruction the summary must list, cut or fold: the summary's own work grows fastest here);
- ``coding``: the coding-agent session of benchmarks/scenario.py (a tool call and its result
  per step, errors, files, a user message every 18-32 steps).

For each (workload, N), one process builds the session and a fresh one opens it, reads the
context (timed apart: ``load``), then times ``compact(now=...)``: the first compaction, a
full compact that summarises all but the newest messages (on the default 200,000-token
window, which the longer sessions exceed many times over). Peak memory is that process's
``ru_maxrss``, shown with its value before the call.

Usage::

    python -m benchmarks.first_compaction                       # 2,500 / 5,000 / 10,000 / 50,000
    python -m benchmarks.first_compaction --messages 2500,5000 --workloads chat
    python -m benchmarks.first_compaction --code /tmp/old       # another checkout's compactstore
    python -m benchmarks.first_compaction --profile chat --messages 50000   # cProfile
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WINDOW = 200_000
SESSION = "long"
START = 1_767_225_600.0
CHUNK = 1_000
WORKLOADS = ("chat", "coding")


def _chat(count: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in range(count):
        if i % 2 == 0:
            text = (
                f"Please change entry {i} of the ledger so that the totals match invoice batch "
                f"{i * 7} and keep the old CSV export working."
            )
            out.append({"role": "user", "content": text})
        else:
            text = f"Done with entry {i - 1}. Next I'll check the totals of batch {i * 7 - 7}."
            out.append({"role": "assistant", "content": text})
    return out


def _coding(count: int) -> list[dict[str, Any]]:
    from benchmarks.scenario import generate

    scenario = generate(count // 2 + 1, 1)
    return scenario.messages()[:count]


def child_build(db: str, workload: str, count: int) -> dict[str, Any]:
    from compactstore import CompactStore

    messages = _chat(count) if workload == "chat" else _coding(count)
    with CompactStore.open(db) as store:
        sess = store.session(SESSION, context_window=WINDOW, now=START)
        for first in range(0, len(messages), CHUNK):
            batch = messages[first : first + CHUNK]
            sess.extend(batch, timestamps=[START + first + i for i in range(len(batch))])
        return {"messages": len(messages), "tokens": sess.token_usage()}


def child_compact(db: str, profile: bool) -> dict[str, Any]:
    from compactstore import CompactStore

    began = time.perf_counter()
    with CompactStore.open(db) as store:
        sess = store.session(SESSION)
        before = sess.token_usage()
        load = time.perf_counter() - began
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        profiler = cProfile.Profile() if profile else None
        if profiler is not None:
            profiler.enable()
        began = time.perf_counter()
        result = sess.compact(now=START + 10**6)
        seconds = time.perf_counter() - began
        if profiler is not None:
            profiler.disable()
            stats = pstats.Stats(profiler, stream=sys.stderr)
            stats.sort_stats("cumulative").print_stats(30)
            stats.sort_stats("tottime").print_stats(20)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        return {
            "load_s": load,
            "seconds": seconds,
            "rss_before_mb": rss_before,
            "peak_mb": peak,
            "tokens_before": before,
            "tokens_after": sess.token_usage(),
            "strategy": str(result.strategy),
        }


# The child imports this module from this tree, then compactstore from --code when given (a
# checkout to compare with, whose own benchmarks/ may not have this module).
_BOOT = (
    "import sys; import benchmarks.first_compaction as m; "
    "sys.argv[1] and sys.path.insert(0, sys.argv[1]); m.child_main(sys.argv[2:])"
)


def child_main(argv: list[str]) -> None:
    kind, db, *rest = argv
    if kind == "build":
        workload, count = rest
        out = child_build(db, workload, int(count))
    else:
        out = child_compact(db, profile=rest == ["profile"])
    print(json.dumps(out))


def _run(argv: list[str], code: str | None, timeout: float) -> dict[str, Any] | None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    try:
        out = subprocess.run(
            [sys.executable, "-c", _BOOT, code or "", *argv],
            capture_output=True,
            text=True,
            env=env,
            cwd=tempfile.gettempdir(),
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return None
    if out.returncode != 0:
        raise SystemExit(f"child {argv} failed:\n{out.stderr[-3000:]}")
    if out.stderr:
        print(out.stderr, file=sys.stderr)
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.first_compaction",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--messages", default="2500,5000,10000,50000")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--code", default=None, help="import compactstore from this checkout")
    parser.add_argument(
        "--max-seconds", type=float, default=600, help="give up on a compaction after this long"
    )
    parser.add_argument("--profile", choices=WORKLOADS, help="cProfile this workload's call")
    args = parser.parse_args(argv)
    counts = [int(n) for n in args.messages.split(",")]
    workloads = [args.profile] if args.profile else args.workloads.split(",")
    print(f"code: {args.code or ROOT}; window {WINDOW:,}")
    print(
        "| workload | messages | tokens before | load s | first compaction s | us/message "
        "| RSS before / peak MB | after | strategy |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for workload in workloads:
        for count in counts:
            with tempfile.TemporaryDirectory(prefix="compactstore-bench-") as tmp:
                db = str(Path(tmp) / "long.db")
                built = _run(["build", db, workload, str(count)], args.code, timeout=3600)
                assert built is not None
                extra = ["profile"] if args.profile else []
                got = _run(["compact", db, *extra], args.code, timeout=args.max_seconds)
            if got is None:
                print(f"| {workload} | {count:,} | | | > {args.max_seconds:.0f} | | | | |")
                continue
            print(
                f"| {workload} | {built['messages']:,} | {got['tokens_before']:,} "
                f"| {got['load_s']:.2f} | {got['seconds']:.2f} "
                f"| {got['seconds'] / count * 1e6:.0f} "
                f"| {got['rss_before_mb']:.0f} / {got['peak_mb']:.0f} "
                f"| {got['tokens_after']:,} | {got['strategy']} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
