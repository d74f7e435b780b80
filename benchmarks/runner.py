"""Run the stores of benchmarks.peers on the same long coding-agent session, side by side.

    python -m benchmarks.runner --steps 200,1000,3000,10000 \\
        --adapters floor,compactstore,openai_agents,langgraph [--max-seconds 540] \\
        [--max-disk-gb 8] [--out /tmp/compactstore-bench] [--pipeline]
    python -m benchmarks.runner --profile --steps 3000 --adapters compactstore [--top 15]

A step appends one model call's new messages and builds the context for the next call
(for compactstore: extend(), process_request(), active_context()). Each (adapter, N) runs in
a subprocess of its own, so its peak RSS is its own; resume is timed in fresh processes
(open the file, rebuild the context; imports are done before the clock starts and reported
apart). Per run: median and p95 of the step time over the first and the last 10% of steps,
the median over all steps, total time, peak RSS, the store's files on disk (db + -wal + -shm,
before close) and resume time. Ratios are to ``floor`` at the same N in the same
invocation. Contexts are checked every --check-every steps, at the end and after resume
(untimed): equal to the reference trim for the plain stores, valid for compactstore.

Caps: a run stops when it passes --max-seconds or --max-disk-gb (its row says where); above
--project-above steps, a run whose smaller run hit a cap or projects past a cap is skipped
with the projection. Peers need their packages (the ``bench`` extra); a missing one is
reported and skipped. Results go to --out as results.json and results.md.
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import io
import json
import math
import os
import platform
import pstats
import resource
import shutil
import sqlite3
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.peers import ADAPTERS, Adapter, Unavailable, reference_context
from benchmarks.scenario import estimate, generate

ROOT = Path(__file__).resolve().parent.parent
CODE = ROOT  # where child processes import compactstore and benchmarks from (see snapshot())
DEFAULT_OUT = Path("/tmp/compactstore-bench")
TARGETS = {
    "flat": 1.5,  # compactstore last-10% / first-10% median at 10,000 steps
    "floor": 2.0,  # compactstore / floor per-step median at 3,000 steps
    "langgraph": 20.0,  # langgraph / compactstore at 3,000 steps, per step and on disk
    "compact_ms": 50.0,  # full compact of a 200k-token active context, median
    "resume_ms": 100.0,  # resume of a 10,000-step session
}


# -- measuring one run (child process) ------------------------------------------------------


def _maxrss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _files(adapter: Adapter, path: str) -> dict[str, int]:
    return {os.path.basename(p): os.path.getsize(p) for p in adapter.files(path)}


def _pct(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def _stats(ns: Sequence[int]) -> dict[str, float]:
    if not ns:
        return {"n": 0}
    ms = [x / 1e6 for x in ns]
    return {
        "n": len(ms),
        "median_ms": statistics.median(ms),
        "p95_ms": _pct(ms, 95),
        "mean_ms": statistics.fmean(ms),
        "max_ms": max(ms),
    }


def _digest(context: list[dict[str, Any]]) -> str:
    return hashlib.sha256(json.dumps(context, sort_keys=True).encode()).hexdigest()


def run_child(args: argparse.Namespace) -> dict[str, Any]:
    """One adapter, one N, in this process."""
    adapter = ADAPTERS[args.adapter]()
    result: dict[str, Any] = {
        "adapter": args.adapter,
        "n_steps": args.steps,
        "seed": args.seed,
        "durability": adapter.durability,
    }
    rss_start = _maxrss_mb()
    try:
        adapter.preload()
    except Unavailable as exc:
        return {**result, "unavailable": str(exc)}
    scenario = generate(args.steps, args.seed)
    messages = scenario.messages()
    tokens = [estimate(m) for m in messages]
    upto: list[int] = []  # messages persisted after each step
    for step in scenario.steps:
        upto.append((upto[-1] if upto else 0) + len(step.messages))
    result["messages"] = len(messages)
    result["rss_start_mb"] = rss_start
    result["rss_baseline_mb"] = _maxrss_mb()
    path = args.db
    for suffix in ("", "-wal", "-shm", "-journal"):
        if os.path.exists(path + suffix):
            os.remove(path + suffix)
    Path(path).parent.mkdir(parents=True, exist_ok=True)

    profiler = cProfile.Profile() if args.profile else None
    clock = time.perf_counter_ns
    latencies: list[int] = []
    phases: dict[str, list[int]] = {}
    checks: list[dict[str, Any]] = []
    disk_samples: list[tuple[int, int]] = []
    untimed_ns = 0  # checks and prepare(), left out of the total
    aborted = None
    began = clock()
    adapter.open(path)
    result["open_ms"] = (clock() - began) / 1e6
    context: list[Any] = []
    last_index = len(scenario.steps) - 1
    sample_every = max(1, args.steps // 20)
    for index, step in enumerate(scenario.steps):
        mark = clock()
        native = adapter.prepare(step)
        start = clock()
        untimed_ns += start - mark
        if profiler is not None:
            profiler.enable()
        context = adapter.step(native)
        if profiler is not None:
            profiler.disable()
        took = clock() - start
        if index == 0:
            result["first_call_ms"] = took / 1e6  # [system, request]: not a step
            continue
        latencies.append(took)
        for name, value in adapter.phases.items():
            phases.setdefault(name, []).append(value)
        mark = clock()
        if index % args.check_every == 0 or index == last_index:
            reference = reference_context(messages[: upto[index]], tokens.__getitem__)
            ok = adapter.check(context, reference)
            checks.append({"step": index, "ok": ok, "context_messages": len(context)})
        if index % sample_every == 0:
            disk_samples.append((index, sum(_files(adapter, path).values())))
        if index != last_index:
            elapsed = (clock() - began - untimed_ns) / 1e9
            if elapsed > args.max_seconds:
                aborted = f"time cap {args.max_seconds:g} s hit after step {index}"
            elif index % 10 == 0 and sum(_files(adapter, path).values()) > args.max_disk_gb * 1e9:
                aborted = f"disk cap {args.max_disk_gb:g} GB hit after step {index}"
            if aborted:
                reference = reference_context(messages[: upto[index]], tokens.__getitem__)
                ok = adapter.check(context, reference)
                checks.append({"step": index, "ok": ok, "context_messages": len(context)})
        untimed_ns += clock() - mark
        if aborted:
            break
    total_s = (clock() - began - untimed_ns) / 1e9
    done = len(latencies)
    k = max(1, done // 10)
    canonical = adapter.canonical(context)
    result.update(
        steps_done=done,
        aborted=aborted,
        total_s=total_s,
        first10=_stats(latencies[:k]),
        last10=_stats(latencies[-k:]),
        all=_stats(latencies),
        deciles_ms=[statistics.median(latencies[i : i + k]) / 1e6 for i in range(0, done, k)][:10],
        phases={
            name: {
                "first10": _stats(values[:k]),
                "last10": _stats(values[-k:]),
                "share_all": sum(values) / max(1, sum(latencies)),
                "share_last10": sum(values[-k:]) / max(1, sum(latencies[-k:])),
            }
            for name, values in phases.items()
        },
        checks=checks,
        context_ok=all(c["ok"] for c in checks),
        final_context_messages=len(canonical),
        final_context_tokens=sum(estimate(m) for m in canonical),
        final_context_sha256=_digest(canonical),
        disk_samples=disk_samples,
        files_before_close=_files(adapter, path),
    )
    result["disk_bytes"] = sum(result["files_before_close"].values())
    adapter.close()
    result["files_after_close"] = _files(adapter, path)
    result["details"] = adapter.summary(path)
    if "compactstore" in sys.modules:
        result["compactstore_file"] = sys.modules["compactstore"].__file__
    result["rss_peak_mb"] = _maxrss_mb()
    result["rss_delta_mb"] = result["rss_peak_mb"] - result["rss_baseline_mb"]
    result["latencies_us"] = [x // 1000 for x in latencies]
    if profiler is not None:
        result["profile"] = profile_report(profiler, args.top, done)
        profiler.dump_stats(args.profile)
    return result


def run_resume(args: argparse.Namespace) -> dict[str, Any]:
    """Reopen a store in this (fresh) process and rebuild the context."""
    adapter = ADAPTERS[args.adapter]()
    profiler = cProfile.Profile() if args.profile else None
    began = time.perf_counter_ns()
    adapter.preload()
    imported = time.perf_counter_ns()
    if profiler is not None:
        profiler.enable()
    context = adapter.resume(args.db)
    if profiler is not None:
        profiler.disable()
    done = time.perf_counter_ns()
    canonical = adapter.canonical(context)
    adapter.close()
    result: dict[str, Any] = {
        "import_ms": (imported - began) / 1e6,
        "resume_ms": (done - imported) / 1e6,
        "same_context": _digest(canonical) == args.expect,
        "context_messages": len(canonical),
    }
    if profiler is not None:
        profiler.dump_stats(args.profile)
        report = profile_report(profiler, args.top, 1)
        Path(args.profile).with_suffix(".md").write_text(
            format_profile(report, f"{args.adapter} resume() (one call)")
        )
    return result


# -- profile --------------------------------------------------------------------------------

_CATEGORIES = (
    (
        "compaction engines + ActiveContext",
        ("/compactstore/_engines/", "/compactstore/_context/active.py"),
    ),
    ("message formats (validate, tool calls)", ("/compactstore/formats/",)),
    ("store + repository glue", ("/compactstore/_store/store.py", "/compactstore/db/")),
    ("token estimate", ("/compactstore/_context/tokens.py",)),
    ("SQLAlchemy", ("/sqlalchemy/",)),
    ("sqlite3 driver (execute, commit)", ("sqlite3.",)),
    ("json encode/decode", ("/json/", "_json.")),
    ("pydantic", ("/pydantic", "pydantic_core")),
    ("benchmark adapter", ("/benchmarks/",)),
)
_MILESTONES = (
    ("store.py", "extend"),
    ("store.py", "_insert"),
    ("store.py", "process_request"),
    ("store.py", "_context"),
    ("store.py", "_inputs"),
    ("pipeline.py", "process"),
    ("store.py", "_record"),
    ("store.py", "_unrecorded"),
    ("store.py", "active_context"),
    ("context.py", "messages"),
    ("context.py", "answered"),
    ("repository.py", "get_session"),
    ("repository.py", "extend_context"),
    ("repository.py", "load_context"),
    ("store.py", "_prepare"),
)


def _category(filename: str, function: str) -> str:
    where = f"{filename}:{function}"
    for label, needles in _CATEGORIES:
        if any(needle in where for needle in needles):
            return label
    return "other Python" if filename != "~" else "other builtins"


def profile_report(profiler: cProfile.Profile, top: int, steps: int) -> dict[str, Any]:
    """Top functions by own time, own time by category, and cumulative time of the
    milestones of a compactstore step (all in ms per step)."""
    stats = pstats.Stats(profiler)
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    total = sum(entry[2] for entry in raw.values())
    rows = []
    categories: dict[str, float] = {}
    milestones: dict[str, float] = {}
    for (filename, line, function), (_cc, calls, own, cumulative, _callers) in raw.items():
        label = _category(filename, function)
        categories[label] = categories.get(label, 0.0) + own
        short = filename.split("site-packages/")[-1].split("/work/main/")[-1]
        rows.append((own, cumulative, calls, f"{short}:{line}({function})", label))
        for module, name in _MILESTONES:
            if filename.endswith(module) and function == name:
                key = f"{module}:{name}"
                milestones[key] = milestones.get(key, 0.0) + cumulative
    rows.sort(reverse=True)
    per_step = 1000 / max(1, steps)
    buffer = io.StringIO()
    pstats.Stats(profiler, stream=buffer).sort_stats("cumulative").print_stats(40)
    return {
        "steps": steps,
        "profiled_ms_per_step": total * per_step,
        "top": [
            {
                "own_ms_per_step": own * per_step,
                "cumulative_ms_per_step": cumulative * per_step,
                "calls_per_step": calls / max(1, steps),
                "function": name,
                "category": label,
            }
            for own, cumulative, calls, name, label in rows[:top]
        ],
        "categories_share": {
            label: own / total for label, own in sorted(categories.items(), key=lambda kv: -kv[1])
        },
        "milestones_ms_per_step": {k: v * per_step for k, v in milestones.items()},
        "pstats_cumulative": buffer.getvalue(),
    }


def format_profile(report: dict[str, Any], title: str) -> str:
    lines = [
        f"### cProfile of {title}: {report['profiled_ms_per_step']:.2f} ms per call under "
        "the profiler (figures per call)",
        "",
        "| # | own ms/step | cumulative ms/step | calls/step | function | category |",
        "|---|---|---|---|---|---|",
    ]
    for i, row in enumerate(report["top"], 1):
        lines.append(
            f"| {i} | {row['own_ms_per_step']:.3f} | {row['cumulative_ms_per_step']:.3f} | "
            f"{row['calls_per_step']:.1f} | `{row['function']}` | {row['category']} |"
        )
    lines += ["", "| own time by category | share |", "|---|---|"]
    lines += [f"| {k} | {v:.0%} |" for k, v in report["categories_share"].items()]
    if report["milestones_ms_per_step"]:
        lines += ["", "| milestone (cumulative, incl. callees) | ms/step |", "|---|---|"]
        lines += [
            f"| `{k}` | {v:.3f} |"
            for k, v in sorted(report["milestones_ms_per_step"].items(), key=lambda kv: -kv[1])
        ]
    return "\n".join(lines) + "\n"


# -- the suite (parent process) -------------------------------------------------------------


def snapshot(out: Path) -> Path:
    """Copy compactstore (its migrations as compactstore/_migrations, where the wheel puts
    them) and benchmarks/ to <out>/snapshot, so every process of one invocation runs the
    same code even while the working tree is being edited."""
    global CODE
    target = out / "snapshot"
    if target.exists():
        shutil.rmtree(target)
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "compactstore", target / "compactstore", ignore=skip)
    shutil.copytree(ROOT / "migrations", target / "compactstore" / "_migrations", ignore=skip)
    shutil.copytree(ROOT / "benchmarks", target / "benchmarks", ignore=skip)
    CODE = target
    return target


def _python_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(CODE), env.get("PYTHONPATH")]))
    return env


def _subprocess(argv: list[str], timeout: float) -> tuple[int | str, str, str]:
    try:
        done = subprocess.run(
            [sys.executable, "-m", "benchmarks.runner", *argv],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=CODE,
            env=_python_env(),
        )
    except subprocess.TimeoutExpired as exc:
        return "timeout", str(exc.stdout or ""), str(exc.stderr or "")
    return done.returncode, done.stdout, done.stderr


def _remove(path: str) -> None:
    for suffix in ("", "-wal", "-shm", "-journal"):
        if os.path.exists(path + suffix):
            os.remove(path + suffix)


def project(run: dict[str, Any], n: int) -> tuple[float, float]:
    """Seconds and bytes a run of n steps would take: per-step time linear in the history
    (fitted to the first and last 10% means), disk growing with the exponent the run's own
    samples show between its middle and its end (1 = linear, 2 = quadratic)."""
    done = max(1, run["steps_done"])
    first, last = run["first10"]["mean_ms"], run["last10"]["mean_ms"]
    slope = max(0.0, (last - first) / (0.9 * done))
    seconds = (n * first + slope * n * n / 2) / 1000
    samples = [s for s in run.get("disk_samples", []) if s[1] > 0]
    exponent = 1.0
    if len(samples) >= 4:
        (i1, d1), (i2, d2) = samples[len(samples) // 2], samples[-1]
        if i2 > i1 and d2 > d1:
            exponent = min(2.0, max(1.0, math.log(d2 / d1) / math.log(i2 / i1)))
    return seconds, run["disk_bytes"] * (n / done) ** exponent


def run_one(args: argparse.Namespace, adapter: str, n: int) -> dict[str, Any]:
    tag = f"{adapter}_n{n}_s{args.seed}"
    db = str(Path(args.workdir) / f"{tag}_{os.getpid()}.db")
    out = Path(args.out) / "runs" / f"{tag}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    argv = [
        "child",
        f"--adapter={adapter}",
        f"--steps={n}",
        f"--seed={args.seed}",
        f"--db={db}",
        f"--out={out}",
        f"--max-seconds={args.max_seconds}",
        f"--max-disk-gb={args.max_disk_gb}",
        f"--check-every={args.check_every}",
    ]
    began = time.perf_counter()
    code, stdout, stderr = _subprocess(argv, args.max_seconds * 1.5 + 600)
    if code != 0 or not out.exists():
        _remove(db)
        return {
            "adapter": adapter,
            "n_steps": n,
            "error": f"exit {code} after {time.perf_counter() - began:.0f} s: {stderr[-1500:]}",
        }
    result: dict[str, Any] = json.loads(out.read_text())
    if "unavailable" in result:
        return result
    resumes: list[dict[str, Any]] = []
    for _ in range(args.resume_runs):
        spawned = time.perf_counter()
        code, stdout, stderr = _subprocess(
            [
                "resume",
                f"--adapter={adapter}",
                f"--db={db}",
                f"--expect={result['final_context_sha256']}",
            ],
            600,
        )
        wall_ms = (time.perf_counter() - spawned) * 1000
        if code != 0:
            resumes.append({"error": f"exit {code}: {stderr[-800:]}"})
            continue
        resumes.append({**json.loads(stdout.strip().splitlines()[-1]), "process_wall_ms": wall_ms})
    good = [r for r in resumes if "resume_ms" in r]
    result["resumes"] = resumes
    if good:
        result["resume_ms"] = statistics.median(r["resume_ms"] for r in good)
        result["resume_import_ms"] = statistics.median(r["import_ms"] for r in good)
        result["resume_process_ms"] = statistics.median(r["process_wall_ms"] for r in good)
        result["resume_ok"] = all(r["same_context"] for r in good) and len(good) == len(resumes)
    else:
        result["resume_ok"] = False
    if not args.keep:
        _remove(db)
    out.write_text(json.dumps(result))
    return result


def _line(r: dict[str, Any]) -> str:
    head = f"{r['adapter']:<20} N={r['n_steps']:<6}"
    if "unavailable" in r:
        return f"{head} unavailable: {r['unavailable']}"
    if "error" in r:
        return f"{head} FAILED: {r['error'][:300]}"
    if "skipped" in r:
        return f"{head} skipped: {r['skipped']}"
    return (
        f"{head} steps={r['steps_done']:<6} total={r['total_s']:.1f}s "
        f"first10={r['first10']['median_ms']:.2f}ms last10={r['last10']['median_ms']:.2f}ms "
        f"disk={r['disk_bytes'] / 1e6:.1f}MB rss={r['rss_peak_mb']:.0f}MB "
        f"resume={r.get('resume_ms', float('nan')):.1f}ms ok={r['context_ok']}"
        f"/{r.get('resume_ok')}" + (f" ABORTED: {r['aborted']}" if r["aborted"] else "")
    )


def environment() -> dict[str, Any]:
    from importlib import metadata

    def version(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    def git(*argv: str) -> str:
        try:
            return subprocess.run(
                ["git", *argv], capture_output=True, text=True, cwd=ROOT, timeout=30
            ).stdout.strip()
        except OSError:
            return ""

    source = hashlib.sha256()
    for path in sorted((CODE / "compactstore").rglob("*.py")):
        source.update(path.read_bytes())
    return {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "packages": {
            name: version(name)
            for name in (
                "compactstore",
                "SQLAlchemy",
                "pydantic",
                "openai-agents",
                "langgraph",
                "langgraph-checkpoint-sqlite",
                "langchain-core",
            )
        },
        "git_head": git("rev-parse", "--short", "HEAD"),
        "git_dirty_files": len(git("status", "--porcelain").splitlines()),
        "compactstore_source_sha256": source.hexdigest()[:16],
        "code": str(CODE),
    }


def suite(args: argparse.Namespace) -> None:
    adapters = args.adapters.split(",")
    unknown = [a for a in adapters if a not in ADAPTERS]
    if unknown:
        raise SystemExit(f"unknown adapters {unknown}; known: {', '.join(ADAPTERS)}")
    sizes = sorted(int(x) for x in args.steps.split(","))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    limits = {k: int(v) for k, _, v in (x.partition("=") for x in args.limit.split(",") if x)}
    env = environment()
    results: list[dict[str, Any]] = []
    extra: dict[str, Any] = {}
    began = time.perf_counter()
    for n in sizes:
        for adapter in adapters:
            earlier = [
                r
                for r in results
                if r["adapter"] == adapter and r["n_steps"] < n and "steps_done" in r
            ]
            if earlier and n > args.project_above:
                base = earlier[-1]
                seconds, disk = project(base, n)
                if (
                    base.get("aborted")
                    or seconds > args.max_seconds
                    or disk > args.max_disk_gb * 1e9
                ):
                    why = (
                        f"projected from its N={base['n_steps']} run"
                        f"{' (stopped by a cap)' if base.get('aborted') else ''}: "
                        f"~{seconds:,.0f} s, ~{disk / 1e9:,.1f} GB "
                        f"(caps {args.max_seconds:g} s, {args.max_disk_gb:g} GB)"
                    )
                    results.append({"adapter": adapter, "n_steps": n, "skipped": why})
                    print(_line(results[-1]), flush=True)
                    continue
            if any(r["adapter"] == adapter and "unavailable" in r for r in results):
                continue
            if n > limits.get(adapter, n):
                continue
            result = run_one(args, adapter, n)
            if result.get("aborted"):
                seconds, disk = project(result, n)
                result["projection_full_run"] = {"seconds": seconds, "disk_bytes": disk}
            results.append(result)
            print(_line(result), flush=True)
            _save(out, env, results, extra, args)
    if args.pipeline:
        extra["pipeline"] = run_pipeline(args)
        print(extra["pipeline"]["stdout"], flush=True)
    extra["wall_s"] = time.perf_counter() - began
    text = _save(out, env, results, extra, args)
    print(text)
    print(f"results: {out / 'results.json'} and {out / 'results.md'}")


def run_pipeline(args: argparse.Namespace) -> dict[str, Any]:
    """benchmarks/pipeline.py: active_context(), a no-op process_request() and a full
    compact of a ~200k-token active context."""
    try:
        done = subprocess.run(
            [sys.executable, "-m", "benchmarks.pipeline", "--trials", str(args.pipeline_trials)],
            capture_output=True,
            text=True,
            timeout=1800,
            cwd=CODE,
            env=_python_env(),
        )
    except subprocess.TimeoutExpired:
        return {"stdout": "", "error": "timed out"}
    found: dict[str, float] = {}
    for line in done.stdout.splitlines():
        if "median" in line:
            label, _, rest = line.partition(" median ")
            try:
                found[label.strip()] = float(rest.split()[0])
            except (ValueError, IndexError):
                continue
    return {"stdout": done.stdout.strip(), "stderr": done.stderr[-800:], "medians_ms": found}


# -- report ---------------------------------------------------------------------------------


def _f(x: float | None, digits: int = 2) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.{digits}f}"


def _ratio(a: float | None, b: float | None) -> str:
    if not a or not b:
        return "-"
    return f"{a / b:.2f}x" if a / b < 10 else f"{a / b:,.0f}x"


def _ok(r: dict[str, Any]) -> str:
    return "yes" if r["context_ok"] and r.get("resume_ok") else "NO"


def render(
    env: dict[str, Any], results: list[dict[str, Any]], extra: dict[str, Any], args: Any
) -> str:
    lines = [
        "# compactstore vs peers: one long coding-agent session",
        "",
        f"{env['date']}; Python {env['python']}, SQLite {env['sqlite']}, {env['machine']}; "
        f"compactstore {env['git_head']} (+{env['git_dirty_files']} uncommitted files, source "
        f"{env['compactstore_source_sha256']}, run from {env['code']}); "
        + ", ".join(f"{k} {v}" for k, v in env["packages"].items() if v and k != "compactstore")
        + f". Seed {args.seed}; caps {args.max_seconds:g} s and {args.max_disk_gb:g} GB per run; "
        f"resume = median of {args.resume_runs} fresh processes (imports excluded, shown apart).",
        "",
    ]
    by_n: dict[int, list[dict[str, Any]]] = {}
    for r in results:
        by_n.setdefault(r["n_steps"], []).append(r)
    for n in sorted(by_n):
        rows = by_n[n]
        floor = next((r for r in rows if r["adapter"] == "floor" and "steps_done" in r), None)
        lines += [
            f"## N = {n:,} steps",
            "",
            "| adapter | steps done | first 10%: median / p95 ms | last 10%: median / p95 ms "
            "| median ms (all steps) | total s | disk MB | peak RSS MB (+over baseline) "
            "| resume ms (+imports) | context ok | vs floor: median all / last-10% / total / "
            "disk / resume |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in rows:
            name = r["adapter"]
            if "steps_done" not in r:
                note = r.get("unavailable") or r.get("skipped") or r.get("error", "")
                kind = next((k for k in ("unavailable", "skipped") if k in r), "FAILED")
                lines.append(f"| {name} | {kind} | {note[:300]} | | | | | | | | |")
                continue
            done = f"{r['steps_done']:,}"
            if r.get("aborted"):
                proj = r.get("projection_full_run", {})
                done += (
                    f" (stopped: {r['aborted']}; full run projected ~{proj.get('seconds', 0):,.0f}"
                    f" s, ~{proj.get('disk_bytes', 0) / 1e9:,.1f} GB)"
                )
            vs = "1 (baseline)"
            if floor is not None and r is not floor:
                vs = " / ".join(
                    (
                        _ratio(r["all"]["median_ms"], floor["all"]["median_ms"]),
                        _ratio(r["last10"]["median_ms"], floor["last10"]["median_ms"]),
                        _ratio(r["total_s"], floor["total_s"]),
                        _ratio(r["disk_bytes"], floor["disk_bytes"]),
                        _ratio(r.get("resume_ms"), floor.get("resume_ms")),
                    )
                )
            elif floor is None:
                vs = "-"
            lines.append(
                f"| {name} | {done} | {_f(r['first10']['median_ms'], 3)} / "
                f"{_f(r['first10']['p95_ms'], 3)} | {_f(r['last10']['median_ms'], 3)} / "
                f"{_f(r['last10']['p95_ms'], 3)} | {_f(r['all']['median_ms'], 3)} | "
                f"{_f(r['total_s'])} | {_f(r['disk_bytes'] / 1e6, 1)} | {_f(r['rss_peak_mb'], 0)} "
                f"(+{_f(r['rss_delta_mb'], 0)}) | {_f(r.get('resume_ms'), 1)} "
                f"(+{_f(r.get('resume_import_ms'), 0)}) | {_ok(r)} | {vs} |"
            )
        lines.append("")
    lines += _phase_table(results) + _compaction_table(results) + _targets(results, extra)
    pipeline = extra.get("pipeline")
    if pipeline:
        lines += ["", "## benchmarks/pipeline.py", "", "```", pipeline.get("stdout", ""), "```"]
    if "wall_s" in extra:
        lines += ["", f"Suite wall time: {extra['wall_s']:.0f} s."]
    return "\n".join(lines) + "\n"


def _phase_table(results: list[dict[str, Any]]) -> list[str]:
    lines = [
        "## Where a step's time goes (last 10% of steps: median ms of each phase, and its "
        "share of the step time)",
        "",
        "| adapter | N | phases |",
        "|---|---|---|",
    ]
    for r in results:
        if "phases" not in r:
            continue
        parts = [
            f"{name} {_f(p['last10']['median_ms'], 3)} ({p['share_last10']:.0%})"
            for name, p in r["phases"].items()
        ]
        lines.append(f"| {r['adapter']} | {r['n_steps']:,} | {'; '.join(parts)} |")
    return [*lines, ""]


def _compaction_table(results: list[dict[str, Any]]) -> list[str]:
    rows = [r for r in results if r["adapter"].startswith("compactstore") and "details" in r]
    if not rows:
        return []
    lines = [
        "## compactstore: what process_request() did",
        "",
        "| adapter | N | compactions by strategy | step ms with / without a compaction "
        "(median; max) | final context: messages, est. tokens | rows: messages / edits / "
        "boundaries; blob MB |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        d = r["details"]
        lat = r.get("latencies_us", [])
        hit = set(d.get("compaction_step_indexes", []))
        with_c = [lat[i] / 1000 for i in hit if i < len(lat)]
        without = [x / 1000 for i, x in enumerate(lat) if i not in hit]
        strategies = ", ".join(f"{k} {v}" for k, v in d.get("compactions_by_strategy", {}).items())
        lines.append(
            f"| {r['adapter']} | {r['n_steps']:,} | {strategies or 'none'} | "
            f"{_f(statistics.median(with_c) if with_c else None)} / "
            f"{_f(statistics.median(without) if without else None)}; "
            f"{_f(max(lat) / 1000 if lat else None)} | {r['final_context_messages']}, "
            f"{r['final_context_tokens']:,} | {d.get('rows_messages')} / "
            f"{d.get('rows_message_edits')} / {d.get('rows_compact_boundaries')}; "
            f"{_f((d.get('blob_bytes') or 0) / 1e6, 1)} |"
        )
    return [*lines, ""]


def _find(results: list[dict[str, Any]], adapter: str, n: int) -> dict[str, Any] | None:
    return next(
        (r for r in results if r["adapter"] == adapter and r["n_steps"] == n and "all" in r), None
    )


def _verdict(ok: bool | None) -> str:
    return "n/a (not measured in this run)" if ok is None else "MET" if ok else "MISSED"


def _targets(results: list[dict[str, Any]], extra: dict[str, Any]) -> list[str]:
    lines = ["## Targets (ratios from this run)", ""]
    cs10k, cs3k = _find(results, "compactstore", 10_000), _find(results, "compactstore", 3_000)
    floor3k, lg3k = _find(results, "floor", 3_000), _find(results, "langgraph", 3_000)
    if cs10k:
        ratio = cs10k["last10"]["median_ms"] / cs10k["first10"]["median_ms"]
        lines.append(
            f"- Flat per-step cost: last-10% / first-10% median at 10,000 steps = "
            f"{cs10k['last10']['median_ms']:.3f} / {cs10k['first10']['median_ms']:.3f} ms = "
            f"{ratio:.2f}x (target <= {TARGETS['flat']}x): {_verdict(ratio <= TARGETS['flat'])}"
        )
    else:
        lines.append(f"- Flat per-step cost: {_verdict(None)}")
    if cs3k and floor3k:
        whole = cs3k["all"]["median_ms"] / floor3k["all"]["median_ms"]
        tail = cs3k["last10"]["median_ms"] / floor3k["last10"]["median_ms"]
        share = cs3k["phases"].get("process_request", {}).get("share_all")
        lines.append(
            f"- Versus the raw-sqlite3 floor at 3,000 steps: median step "
            f"{cs3k['all']['median_ms']:.3f} vs {floor3k['all']['median_ms']:.3f} ms = "
            f"{whole:.2f}x (last 10%: {tail:.2f}x) (target <= {TARGETS['floor']}x): "
            f"{_verdict(whole <= TARGETS['floor'])}"
            + (
                f"; process_request() (the compaction pipeline) is {share:.0%} of compactstore's "
                f"step time"
                if share is not None
                else ""
            )
        )
    else:
        lines.append(f"- Versus the floor at 3,000 steps: {_verdict(None)}")
    if cs3k and lg3k:
        speed = lg3k["last10"]["median_ms"] / cs3k["last10"]["median_ms"]
        disk = lg3k["disk_bytes"] / cs3k["disk_bytes"]
        partial = (
            f" (LangGraph stopped at step {lg3k['steps_done']:,}: {lg3k['aborted']}; its "
            f"last 10% are steps ~{int(lg3k['steps_done'] * 0.9):,}-{lg3k['steps_done']:,} and "
            f"its disk is what it had then, so both ratios understate a full run)"
            if lg3k.get("aborted")
            else ""
        )
        lines.append(
            f"- Versus LangGraph SqliteSaver at 3,000 steps: last-10% median step "
            f"{speed:,.0f}x faster, {disk:,.0f}x smaller on disk (targets >= "
            f"{TARGETS['langgraph']:g}x each): "
            f"{_verdict(speed >= TARGETS['langgraph'] and disk >= TARGETS['langgraph'])}" + partial
        )
    else:
        lines.append(f"- Versus LangGraph at 3,000 steps: {_verdict(None)}")
    compact = (extra.get("pipeline") or {}).get("medians_ms", {}).get("compact() full compact")
    lines.append(
        "- Full compact of a ~200k-token active context (benchmarks/pipeline.py): "
        + (
            f"{compact:.1f} ms median (target <= {TARGETS['compact_ms']:g} ms): "
            f"{_verdict(compact <= TARGETS['compact_ms'])}"
            if compact is not None
            else _verdict(None)
        )
    )
    if cs10k and "resume_ms" in cs10k:
        lines.append(
            f"- Resume of the 10,000-step session in a fresh process: {cs10k['resume_ms']:.1f} ms "
            f"(+{cs10k['resume_import_ms']:.0f} ms of imports; whole process "
            f"{cs10k['resume_process_ms']:.0f} ms) (target <= {TARGETS['resume_ms']:g} ms): "
            f"{_verdict(cs10k['resume_ms'] <= TARGETS['resume_ms'])}"
        )
    else:
        lines.append(f"- Resume at 10,000 steps: {_verdict(None)}")
    return lines


def _save(
    out: Path,
    env: dict[str, Any],
    results: list[dict[str, Any]],
    extra: dict[str, Any],
    args: argparse.Namespace,
) -> str:
    slim = [{k: v for k, v in r.items() if k != "latencies_us"} for r in results]
    (out / "results.json").write_text(
        json.dumps({"environment": env, "args": vars(args), "results": slim, **extra}, indent=1)
    )
    text = render(env, results, extra, args)
    (out / "results.md").write_text(text)
    return text


def profile(args: argparse.Namespace) -> None:
    """cProfile of each adapter's step() for the first --steps value, in a child process."""
    n = int(args.steps.split(",")[0])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    for adapter in args.adapters.split(","):
        tag = f"{adapter}_n{n}_s{args.seed}_profile"
        db = str(Path(args.workdir) / f"{tag}.db")
        result_path = out / f"{tag}.json"
        code, _stdout, stderr = _subprocess(
            [
                "child",
                f"--adapter={adapter}",
                f"--steps={n}",
                f"--seed={args.seed}",
                f"--db={db}",
                f"--out={result_path}",
                f"--max-seconds={args.max_seconds}",
                f"--max-disk-gb={args.max_disk_gb}",
                f"--check-every={args.check_every}",
                f"--profile={out / (tag + '.pstats')}",
                f"--top={args.top}",
            ],
            args.max_seconds * 3 + 600,
        )
        if code != 0:
            _remove(db)
            print(f"{adapter}: profile run failed ({code}): {stderr[-1500:]}")
            continue
        result = json.loads(result_path.read_text())
        if "unavailable" in result:
            print(f"{adapter}: {result['unavailable']}")
            continue
        resume_stats = out / f"{tag}_resume.pstats"
        code, _stdout, stderr = _subprocess(
            [
                "resume",
                f"--adapter={adapter}",
                f"--db={db}",
                f"--profile={resume_stats}",
                f"--top={args.top}",
            ],
            600,
        )
        _remove(db)
        if code == 0:
            print(resume_stats.with_suffix(".md").read_text())
        else:
            print(f"{adapter}: resume profile failed ({code}): {stderr[-800:]}")
        text = format_profile(result["profile"], f"{adapter} step() over {n} steps")
        (out / f"{tag}.md").write_text(text + "\n" + result["profile"]["pstats_cumulative"])
        print(text)
        print(f"full pstats: {out / (tag + '.pstats')}; cumulative listing: {out / (tag + '.md')}")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.runner",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--steps", default="200,1000,3000,10000", help="comma-separated N")
    parser.add_argument(
        "--adapters",
        default="floor,compactstore,openai_agents,langgraph",
        help=f"comma-separated, from: {', '.join(ADAPTERS)}",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--max-seconds", type=float, default=540, help="time cap per run")
    parser.add_argument("--max-disk-gb", type=float, default=8, help="disk cap per run")
    parser.add_argument(
        "--project-above",
        type=int,
        default=3000,
        help="above this N, skip runs whose smaller run hit or projects past a cap",
    )
    parser.add_argument(
        "--limit", default="", help="largest N per adapter, e.g. compactstore_dedup=3000"
    )
    parser.add_argument("--check-every", type=int, default=100)
    parser.add_argument("--resume-runs", type=int, default=3, help="fresh processes per run")
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    parser.add_argument("--workdir", default=None, help="store files (default: <out>/scratch)")
    parser.add_argument("--keep", action="store_true", help="keep the store files")
    parser.add_argument(
        "--no-snapshot",
        action="store_true",
        help="run the working tree itself (default: a copy taken at start, see snapshot())",
    )
    parser.add_argument("--pipeline", action="store_true", help="also run benchmarks.pipeline")
    parser.add_argument("--pipeline-trials", type=int, default=15)
    parser.add_argument("--profile", action="store_true", help="cProfile step() instead")
    parser.add_argument("--top", type=int, default=15, help="functions listed by --profile")
    return parser


def _child_parser(kind: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"python -m benchmarks.runner {kind}")
    parser.add_argument("--adapter", required=True, choices=list(ADAPTERS))
    parser.add_argument("--db", required=True)
    parser.add_argument("--profile", default=None, help="write pstats here")
    parser.add_argument("--top", type=int, default=15)
    if kind == "resume":
        parser.add_argument("--expect", default="")
        return parser
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", required=True)
    parser.add_argument("--max-seconds", type=float, default=540)
    parser.add_argument("--max-disk-gb", type=float, default=8)
    parser.add_argument("--check-every", type=int, default=100)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["child"]:
        args = _child_parser("child").parse_args(argv[1:])
        result = run_child(args)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result))
        print(_line(result) if "steps_done" in result or "unavailable" in result else result)
        return
    if argv[:1] == ["resume"]:
        print(json.dumps(run_resume(_child_parser("resume").parse_args(argv[1:]))))
        return
    args = _parser().parse_args(argv)
    args.workdir = args.workdir or str(Path(args.out) / "scratch")
    if not args.no_snapshot:
        snapshot(Path(args.out))
    if args.profile:
        profile(args)
    else:
        suite(args)


if __name__ == "__main__":
    main()
