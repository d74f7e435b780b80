"""Step cost beside the raw-sqlite3 floor, on three workloads (issue 18).

    python -m benchmarks.stepcost                 # the full measurement (~15 min idle)
    python -m benchmarks.stepcost --quick         # for iteration (~3 min)
    python -m benchmarks.stepcost --profile toolloop --steps 3000   # cProfile of the loop

Workloads (benchmarks/scenario.py): ``coding`` is the runner's coding-agent session;
``toolloop`` is one tool call and its result per step (results 300-20,000 characters, most
2,500-3,000), steps 20 s apart, default config: auto-compact fires every ~150 steps, so the
context stays at 50-420 messages; ``toolloop_plain`` is the same with ``token_factor=1.0``
(the article's plain estimate): microcompact alone keeps usage under the threshold for
~1,000 steps, so the context holds up to ~2,500 small messages (calls and placeholders).

A compactstore step is the README's loop: ``extend()`` (the assistant's call and its
result), ``process_request(now=...)`` and ``request_params(cache_control=True)``, on a
200,000-token window with the default config (``--read view``: ``context_view()`` in place
of ``request_params()``, the loop of earlier rounds). The floor is
:class:`benchmarks.peers.FloorAdapter`. Every (store, workload, run) is a fresh process;
floor and compactstore runs alternate. Figures:

- loop: median step over the last 10% of ``--steps``, median of the runs (min-max spread);
- flat: compactstore's last-10% / first-10% median at ``--flat-steps``;
- size: a step on a context of 3,000 small messages / one of 300 (same loop);
- request_params(): the call alone on a context of 1,500 small messages, after each step
  of appends (its target: 1 ms);
- active_context(): timed after each of the last 10% of steps, in runs of their own (the
  copies it makes would otherwise be garbage the next steps of the loop figure collect,
  which the floor's steps never pay), against the floor's step + 2 us per message returned;
- resume (fresh process: open, session, read) and the memory one cached session holds
  (tracemalloc, in that process), for comparison across code versions.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WINDOW = 200_000
SESSION = "bench"
TARGETS = {"loop": 1.2, "flat": 1.2, "size": 1.3, "per_message_us": 2.0, "request_ms": 1.0}
READ = "request"  # what a step reads: "request" (request_params) or "view" (context_view)


def _scenario(workload: str, steps: int) -> Any:
    from benchmarks.scenario import generate, generate_tool_loop

    return (generate_tool_loop if workload.startswith("toolloop") else generate)(steps, 1)


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


class Compactstore:
    """The compactstore loop: extend, process_request, the cheap read."""

    def __init__(self, workload: str = "coding") -> None:
        self.workload = workload

    def open(self, path: str) -> None:
        from compactstore import CompactionConfig, CompactStore

        self.store = CompactStore.open(path)
        self.sess: Any = None
        # toolloop_plain: the article's plain estimate (factor 1.0): microcompact then keeps
        # usage below the auto-compact threshold for ~1,000 steps at a time, so the context
        # holds thousands of calls and cleared placeholders (issue 18's description).
        factor = 1.0 if self.workload == "toolloop_plain" else CompactionConfig().token_factor
        self.config = CompactionConfig(token_factor=factor)

    def read(self) -> Sequence[Any]:
        if READ == "request":
            return self.sess.request_params(cache_control=True)["messages"]  # type: ignore[no-any-return]
        view = getattr(self.sess, "context_view", None)
        return view() if view is not None else self.sess.active_context()  # type: ignore[no-any-return]

    def step(self, messages: list[dict[str, Any]], stamps: list[float]) -> Sequence[Any]:
        if self.sess is None:
            self.sess = self.store.session(
                SESSION,
                context_window=WINDOW,
                format="anthropic",
                config=self.config,
                now=stamps[0],
            )
        self.sess.extend(messages, timestamps=stamps)
        self.sess.process_request(now=stamps[-1])
        return self.read()

    def close(self) -> None:
        self.store.close()


class Floor:
    def open(self, path: str) -> None:
        from benchmarks.peers import FloorAdapter

        self.adapter = FloorAdapter()
        self.adapter.open(path)

    def step(self, messages: list[dict[str, Any]], stamps: list[float]) -> Sequence[Any]:
        from benchmarks.scenario import Step

        return self.adapter.step(Step(messages, stamps))

    def close(self) -> None:
        self.adapter.close()


def _valid(context: Sequence[Any]) -> bool:
    """Every tool result after its call; every call answered but the newest's."""
    open_calls: set[str] = set()
    for message in context:
        content = message.get("content")
        for block in content if isinstance(content, list | tuple) else ():
            if block.get("type") == "tool_use":
                open_calls.add(block["id"])
            elif block.get("type") == "tool_result":
                if block["tool_use_id"] not in open_calls:
                    return False
                open_calls.discard(block["tool_use_id"])
    return len(open_calls) <= 1


# -- child processes ------------------------------------------------------------------------


def child_loop(args: argparse.Namespace) -> dict[str, Any]:
    scenario = _scenario(args.workload, args.steps)
    store: Compactstore | Floor = (
        Compactstore(args.workload) if args.store == "compactstore" else Floor()
    )
    store.open(args.db)
    # CPU time of this thread (--clock cpu): what a step costs, without the time it waited
    # for a core on a shared machine (SQLite's fsync waits are left out too).
    clock = time.perf_counter_ns if args.clock == "wall" else time.thread_time_ns
    latencies: list[int] = []
    sizes: list[int] = []
    active: list[tuple[int, int]] = []  # (ns, messages) of active_context() in the last 10%
    tail_from = len(scenario.steps) - max(1, args.steps // 10)
    profiler = cProfile.Profile() if args.profile else None
    ok = True
    gc.collect()
    for index, step in enumerate(scenario.steps):
        if profiler is not None and index >= tail_from:
            profiler.enable()
        began = clock()
        context = store.step(step.messages, step.timestamps)
        took = clock() - began
        if profiler is not None:
            profiler.disable()
        if index == 0:
            continue
        latencies.append(took)
        sizes.append(len(context))
        if index % 1000 == 0 or index == len(scenario.steps) - 1:
            ok = ok and _valid(context)
        if args.active_context and isinstance(store, Compactstore) and index >= tail_from:
            began = clock()
            copies = store.sess.active_context()
            active.append((clock() - began, len(copies)))
    store.close()
    result: dict[str, Any] = {
        "latencies_us": [x // 1000 for x in latencies],
        "sizes": sizes,
        "valid": ok,
        "active_context": active,
        "code": sys.modules["compactstore"].__file__ if "compactstore" in sys.modules else None,
    }
    if profiler is not None:
        buffer = Path(args.profile)
        profiler.dump_stats(buffer)
        stats = pstats.Stats(profiler)
        stats.sort_stats("cumulative").print_stats(35)
        stats.sort_stats("tottime").print_stats(25)
    return result


def child_resume(args: argparse.Namespace) -> dict[str, Any]:
    """Open the store a loop run left, read the context; then the memory it holds."""
    import compactstore  # imports are not resume time

    del compactstore
    began = time.perf_counter_ns()
    store = Compactstore()
    store.open(args.db)
    store.sess = store.store.session(SESSION)
    context = store.read()
    resume_ms = (time.perf_counter_ns() - began) / 1e6
    count = len(context)
    del context
    store.close()
    # Memory one cached session holds: a new store, traced from before its first read.
    gc.collect()
    tracemalloc.start()
    store = Compactstore()
    store.open(args.db)
    store.sess = store.store.session(SESSION)
    gc.collect()
    before = tracemalloc.get_traced_memory()[0]
    context = store.read()
    del context
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    store.close()
    return {"resume_ms": resume_ms, "messages": count, "cached_mb": held / 1e6}


def _small_step(number: int) -> list[dict[str, Any]]:
    call = f"toolu_{number:08d}"
    return [
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": call, "name": "Grep", "input": {"pattern": "x"}}
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": call, "content": f"src/a.py:{number}: x"}
            ],
        },
    ]


def child_size(args: argparse.Namespace) -> dict[str, Any]:
    """Steps of small messages on a context that already holds --messages small ones."""
    store = Compactstore()
    store.open(args.db)
    start = 1_767_225_600.0
    store.sess = store.store.session(SESSION, context_window=WINDOW, format="anthropic", now=start)
    store.sess.append({"role": "system", "content": "You are a coding agent."}, timestamp=start)
    store.sess.append({"role": "user", "content": "Find the bug."}, timestamp=start)
    pairs = (args.messages - 2) // 2
    for first in range(0, pairs, 100):
        batch = [m for i in range(first, min(pairs, first + 100)) for m in _small_step(i)]
        store.sess.extend(batch, timestamps=[start + 0.01 * i for i in range(len(batch))])
    number = 10_000_000
    store.sess.process_request(now=start + 1)
    store.read()
    latencies, requests = [], []
    gc.collect()
    for i in range(args.steps):
        messages = _small_step(number + i)
        stamps = [start + 2 + i, start + 2.5 + i]
        began = time.perf_counter_ns()
        context = store.step(messages, stamps)
        latencies.append(time.perf_counter_ns() - began)
        # request_params() alone, after appends only since its last call.
        store.sess.extend(_small_step(20_000_000 + i), timestamps=stamps)
        began = time.perf_counter_ns()
        store.sess.request_params(cache_control=True)
        requests.append(time.perf_counter_ns() - began)
    count = len(store.sess.context().items)
    store.close()
    return {
        "latencies_us": [x // 1000 for x in latencies],
        "request_us": [x / 1000 for x in requests],
        "messages": count,
        "sent": len(context),
    }


# -- the parent -----------------------------------------------------------------------------


def _run(argv: list[str], code: str | None) -> dict[str, Any]:
    env = dict(os.environ)
    paths = [str(ROOT)] if code is None else [code, str(ROOT)]
    env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")])
    out = subprocess.run(
        [sys.executable, "-c", _BOOT, *argv],
        capture_output=True,
        text=True,
        env=env,
        cwd=tempfile.gettempdir(),
    )
    if out.returncode != 0:
        raise SystemExit(f"child {argv} failed:\n{out.stderr[-3000:]}")
    if "--profile" in " ".join(argv):
        print(out.stdout)
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


# The child imports compactstore from --code first (a checkout to compare with), and the
# benchmark modules from this tree.
_BOOT = (
    "import sys, runpy; sys.argv[0] = 'stepcost';"
    "import benchmarks.stepcost as m; m.child_main(sys.argv[1:])"
)


def child_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("kind", choices=("loop", "resume", "size"))
    parser.add_argument("--store", default="compactstore")
    parser.add_argument("--workload", default="toolloop")
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--messages", type=int, default=300)
    parser.add_argument("--db", required=True)
    parser.add_argument("--profile", default=None)
    parser.add_argument("--active-context", action="store_true")
    parser.add_argument("--read", choices=("request", "view"), default="request")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    args = parser.parse_args(argv)
    global READ  # one child process, one setting
    READ = args.read
    run: Callable[[argparse.Namespace], dict[str, Any]] = {
        "loop": child_loop,
        "resume": child_resume,
        "size": child_size,
    }[args.kind]
    print(json.dumps(run(args)))


def _tail(us: Sequence[int], first: bool = False) -> float:
    k = max(1, len(us) // 10)
    return _median(us[:k] if first else us[-k:]) / 1000


def _spread(values: Sequence[float]) -> str:
    return f"{_median(values):.2f} ms ({min(values):.2f}-{max(values):.2f})"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.stepcost",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="1,000 steps, 3 runs, flat at 2,000")
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--flat-steps", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--flat-runs", type=int, default=3)
    parser.add_argument("--workloads", default="coding,toolloop,toolloop_plain")
    parser.add_argument("--code", default=None, help="import compactstore from this checkout")
    parser.add_argument("--profile", default=None, metavar="WORKLOAD")
    parser.add_argument("--out", default="/tmp/compactstore-stepcost")
    parser.add_argument(
        "--read", choices=("request", "view"), default="request", help="what a step reads"
    )
    parser.add_argument("--skip-size", action="store_true", help="no context-size figures")
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="time steps by the wall clock or by the CPU time of the loop's thread",
    )
    parser.add_argument("--skip-copies", action="store_true", help="no active_context() runs")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.flat_steps, args.runs, args.flat_runs = 1000, 2000, 3, 1
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    db = str(out / "bench.db")

    def fresh() -> str:
        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(db + suffix):
                os.remove(db + suffix)
        return db

    if args.profile:
        _run(
            [
                "loop",
                f"--workload={args.profile}",
                f"--steps={args.steps}",
                f"--db={fresh()}",
                f"--profile={out / 'loop.pstats'}",
            ],
            args.code,
        )
        return
    report: dict[str, Any] = {"args": vars(args), "workloads": {}}
    lines = [
        f"# compactstore step cost beside the floor ({args.steps:,} steps, {args.runs} runs; "
        f"code: {args.code or ROOT})",
        "",
    ]
    for workload in args.workloads.split(","):
        floor_tail, cs_tail, cs_first, ac_ms, ac_n, floor_n, ratios = [], [], [], [], [], [], []
        resumes: list[dict[str, Any]] = []
        valid = True
        for _ in range(args.runs):
            common = [
                f"--workload={workload}",
                f"--steps={args.steps}",
                f"--read={args.read}",
                f"--clock={args.clock}",
            ]
            floor = _run(["loop", "--store=floor", *common, f"--db={fresh()}"], args.code)
            cs = _run(["loop", "--store=compactstore", *common, f"--db={fresh()}"], args.code)
            copies = (
                cs
                if args.skip_copies
                else _run(
                    [
                        "loop",
                        "--store=compactstore",
                        "--active-context",
                        *common,
                        f"--db={fresh()}",
                    ],
                    args.code,
                )
            )
            resumes.append(_run(["resume", f"--db={db}"], args.code))
            valid = valid and cs["valid"] and floor["valid"] and copies["valid"]
            floor_tail.append(_tail(floor["latencies_us"]))
            cs_tail.append(_tail(cs["latencies_us"]))
            cs_first.append(_tail(cs["latencies_us"], first=True))
            ratios.append(cs_tail[-1] / floor_tail[-1])
            ac_ms.append(_median([ns / 1e6 for ns, _ in copies["active_context"]]))
            ac_n.append(_median([n for _, n in copies["active_context"]]))
            k = max(1, len(cs["sizes"]) // 10)
            floor_n.append(_median(floor["sizes"][-k:]))
            cs_n = _median(cs["sizes"][-k:])
        loop_ratio = _median(cs_tail) / _median(floor_tail)
        allowance = _median(floor_tail) + TARGETS["per_message_us"] * _median(ac_n) / 1000
        flat: list[float] = []
        for _ in range(args.flat_runs):
            run = _run(
                [
                    "loop",
                    "--store=compactstore",
                    f"--workload={workload}",
                    f"--steps={args.flat_steps}",
                    f"--read={args.read}",
                    f"--clock={args.clock}",
                    f"--db={fresh()}",
                ],
                args.code,
            )
            flat.append(_tail(run["latencies_us"]) / _tail(run["latencies_us"], first=True))
        entry = {
            "floor_last10_ms": floor_tail,
            "compactstore_last10_ms": cs_tail,
            "compactstore_first10_ms": cs_first,
            "loop_ratio": loop_ratio,
            "per_run_ratios": ratios,
            "active_context_ms": ac_ms,
            "active_context_messages": ac_n,
            "active_context_allowance_ms": allowance,
            "floor_context_messages": floor_n,
            "flat_ratios": flat,
            "resumes": resumes,
            "valid": valid,
        }
        report["workloads"][workload] = entry
        lines += [
            f"## {workload}",
            "",
            f"- loop, last 10% of {args.steps:,} steps: compactstore {_spread(cs_tail)} vs floor "
            f"{_spread(floor_tail)} = **{loop_ratio:.2f}x** (per-run ratios "
            f"{min(ratios):.2f}-{max(ratios):.2f}; target <= {TARGETS['loop']}x); contexts: "
            f"{cs_n:.0f} messages vs the floor's {_median(floor_n):.0f}",
            f"- flat, last / first 10% at {args.flat_steps:,} steps: "
            + ", ".join(f"{x:.2f}x" for x in flat)
            + f" (target <= {TARGETS['flat']}x)",
            f"- active_context(): {_spread(ac_ms)} for {_median(ac_n):.0f} messages; allowance "
            f"(floor step + 2 us/message) {allowance:.2f} ms = "
            f"**{_median(ac_ms) / allowance:.2f}** of it",
            f"- resume (fresh process, open + read): "
            f"{_median([r['resume_ms'] for r in resumes]):.1f} ms; one cached session holds "
            f"{_median([r['cached_mb'] for r in resumes]):.2f} MB "
            f"({_median([r['messages'] for r in resumes]):.0f} messages)",
            f"- contexts valid (pairs, checked every 1,000 steps): {valid}",
            "",
        ]
        print("\n".join(lines[-9:]), flush=True)

    def size_run(messages: int, steps: int = 200) -> dict[str, Any]:
        argv = ["size", f"--messages={messages}", f"--steps={steps}", f"--db={fresh()}"]
        return _run([*argv, f"--read={args.read}"], args.code)

    small, large, request, sizes = [], [], [], []
    for _ in range(args.runs):
        if not args.skip_size:
            small.append(_median(size_run(300)["latencies_us"]) / 1000)
            large.append(_median(size_run(3000)["latencies_us"]) / 1000)
        run = size_run(1500, steps=50)
        request.append(_median(run["request_us"]) / 1000)
        sizes.append(run["messages"])
    lines += ["## context size", ""]
    if not args.skip_size:
        size_ratio = _median(large) / _median(small)
        report["size"] = {"300_ms": small, "3000_ms": large, "ratio": size_ratio}
        lines.append(
            f"- a step on 3,000 small messages {_spread(large)} vs on 300 {_spread(small)} = "
            f"**{size_ratio:.2f}x** (target <= {TARGETS['size']}x)"
        )
    report["request_params"] = {"ms": request, "messages": sizes}
    lines += [
        f"- request_params(cache_control=True) alone, appends only since its last call, on "
        f"{min(sizes):,}-{max(sizes):,} messages: {_spread(request)} "
        f"(target <= {TARGETS['request_ms']} ms)",
        "",
    ]
    print("\n".join(lines[-4:]), flush=True)
    (out / "results.json").write_text(json.dumps(report, indent=1))
    (out / "results.md").write_text("\n".join(lines))
    print(f"written: {out / 'results.md'}")


if __name__ == "__main__":
    main()
