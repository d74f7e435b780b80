"""The async API under load (issue 14): N agent sessions on one event loop.

Each session runs ``--steps`` steps of an agent loop: append an assistant message with a tool
call and its result, ``process_request()`` (which compacts, with a summarizer that takes
``--summary-ms``, once the context passes the window's threshold), then
``active_context()``. A ticker task wakes every 5 ms and records how late it woke: that is
the event loop's lag, i.e. the longest time compactstore kept the loop busy. The same work
is then run through the sync API with one thread per session (``--threads`` at a time), and
the throughput (steps per second) of both is printed.

    python -m benchmarks.asyncapi --sessions 100 --steps 20
    python -m benchmarks.asyncapi --sessions 100 --steps 20 --db postgresql+psycopg://...

Target: the loop never lags more than 20 ms because of compactstore; async throughput >= sync
with threads. Also reported: the longest garbage collection during the async run (a full
collection walks every object the interpreter tracks, ~86,000 after the imports alone, and
holds the GIL for tens of ms whichever thread started it, so it shows as loop lag); the
longest lag of the ticks that overlapped no collection (``lag_ms_max_outside_gc``: what
compactstore's own code caused). ``--gc-freeze`` runs the async part after ``gc.freeze()``,
as a latency-sensitive service does once started. ``--cache-sessions`` sets both stores'
``cache_sessions``: below the number of sessions, interleaved steps evict each other's
contexts, and each step rebuilds its context from the rows. ``--stalls MS`` also runs a
sampler thread that, every millisecond the loop is more than MS late, records where the
loop's thread is (its innermost frames; ``[gc]`` while a collection runs), and prints the
most frequent places: ``select``/``_read_from_self`` means the loop was waiting for the GIL
after a system call, anything else is code that ran on the loop. (The sampler takes the GIL
too: figures of such a run are not the benchmark's.)
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import FrameType
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from compactstore import AsyncCompactStore, CompactionConfig, CompactStore

WINDOW = 12_000
CONFIG = CompactionConfig(summarizer_timeout_seconds=30)


def step_messages(k: int, i: int) -> list[dict[str, Any]]:
    call = f"toolu_{k}_{i}"
    return [
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": f"Step {i}: reading the next file."},
                {"type": "tool_use", "id": call, "name": "Read", "input": {"path": f"f{i}.py"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": call,
                    "content": f"# file {i}\n" + "def f(x):\n    return x * 2\n" * 60,
                }
            ],
        },
    ]


async def async_summary(messages: list[Any], previous: str | None, instructions: Any) -> str:
    await asyncio.sleep(SUMMARY_SECONDS)
    return f"An LLM-style summary of {len(messages)} messages."


def sync_summary(messages: list[Any], previous: str | None, instructions: Any) -> str:
    time.sleep(SUMMARY_SECONDS)
    return f"An LLM-style summary of {len(messages)} messages."


SUMMARY_SECONDS = 0.2


def where(frame: FrameType | None, depth: int = 4) -> str:
    """The innermost ``depth`` frames, innermost first."""
    places: list[str] = []
    while frame is not None and len(places) < depth:
        code = frame.f_code
        places.append(f"{os.path.basename(code.co_filename)}:{frame.f_lineno} {code.co_name}")
        frame = frame.f_back
    return " < ".join(places)


def sample_stalls(
    state: dict[str, Any], loop_thread: int, threshold: float, found: Counter[str]
) -> None:
    """Every millisecond the loop is more than ``threshold`` s late: where its thread is."""
    while not state["done"]:
        time.sleep(0.001)
        if time.perf_counter() - state["due"] > threshold:
            frame = sys._current_frames().get(loop_thread)
            found[("[gc] " if state["gc"] else "") + where(frame)] += 1


async def run_async(
    url: str,
    sessions: int,
    steps: int,
    pool: int,
    cache_sessions: int = 64,
    gc_freeze: bool = False,
    stalls: float | None = None,
) -> dict[str, Any]:
    lags: list[tuple[float, float]] = []  # (woke, lag) of each tick
    pauses: list[tuple[int, float, float]] = []  # (generation, start, end) of each collection
    done = False
    state = {"done": False, "due": time.perf_counter(), "gc": False}  # for the sampler
    found: Counter[str] = Counter()

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        # A collection holds the GIL: the loop cannot run meanwhile, whatever thread ran it.
        state["gc"] = phase == "start"
        if phase == "start":
            on_gc.started = time.perf_counter()  # type: ignore[attr-defined]
        else:
            pauses.append((info["generation"], on_gc.started, time.perf_counter()))  # type: ignore[attr-defined]

    async def ticker() -> None:
        interval = 0.005
        while not done:
            before = time.perf_counter()
            state["due"] = before + interval
            await asyncio.sleep(interval)
            woke = time.perf_counter()
            lags.append((woke, woke - before - interval))

    async def agent(store: AsyncCompactStore, k: int) -> int:
        sess = await store.session(f"async-{k}", context_window=WINDOW, config=CONFIG)
        await sess.append({"role": "user", "content": f"Task {k}: refactor the module."})
        compactions = 0
        for i in range(steps):
            await sess.extend(step_messages(k, i))
            result = await sess.process_request()
            compactions += result.strategy is not None and result.success
            await sess.active_context()
        return compactions

    store = await AsyncCompactStore.open(
        url,
        summarizer=async_summary,
        pool_size=pool,
        max_overflow=pool,
        cache_sessions=cache_sessions,
    )
    if gc_freeze:
        # What a latency-sensitive service does once its imports are done: the modules'
        # objects (~86,000 here) leave the collector's view, so a full collection walks
        # only what was made since.
        gc.collect()
        gc.freeze()
    tick = asyncio.create_task(ticker())
    sampler = None
    if stalls is not None:
        sampler = threading.Thread(
            target=sample_stalls, args=(state, threading.get_ident(), stalls / 1000, found)
        )
        sampler.start()
    gc.callbacks.append(on_gc)
    started = time.perf_counter()
    try:
        counts = await asyncio.gather(*(agent(store, k) for k in range(sessions)))
    finally:
        gc.callbacks.remove(on_gc)
        state["done"] = True
        if sampler is not None:
            sampler.join()
    elapsed = time.perf_counter() - started
    done = True
    await tick
    await store.close()
    if gc_freeze:
        gc.unfreeze()
    ordered = sorted(lag for _, lag in lags)
    # Ticks whose wait overlapped no collection: the lag compactstore's own code caused.
    outside = [
        lag
        for woke, lag in lags
        if not any(start < woke and end > woke - lag - 0.005 for _, start, end in pauses)
    ]
    full = [(end - start) * 1000 for generation, start, end in pauses if generation == 2]
    more = {}
    if stalls is not None:
        more["stalls"] = [{"ms": n, "loop_was_in": at} for at, n in found.most_common(12)]
    return {
        "seconds": elapsed,
        "steps_per_s": sessions * steps / elapsed,
        "compactions": sum(counts),
        "lag_ms_p50": statistics.median(ordered) * 1000,
        "lag_ms_p99": ordered[int(len(ordered) * 0.99)] * 1000,
        "lag_ms_max": ordered[-1] * 1000,
        "lag_samples": len(ordered),
        "lag_ms_max_outside_gc": max(outside, default=0.0) * 1000,
        "gc_ms_max": max(((end - start) * 1000 for _, start, end in pauses), default=0.0),
        "full_gc": {"count": len(full), "ms_max": max(full, default=0.0)},
        **more,
    }


def run_sync(
    url: str, sessions: int, steps: int, threads: int, pool: int, cache_sessions: int = 64
) -> dict[str, Any]:
    store = CompactStore.open(
        url,
        summarizer=sync_summary,
        pool_size=pool,
        max_overflow=pool,
        cache_sessions=cache_sessions,
    )
    lock = threading.Lock()
    total = 0

    def agent(k: int) -> None:
        nonlocal total
        sess = store.session(f"sync-{k}", context_window=WINDOW, config=CONFIG)
        sess.append({"role": "user", "content": f"Task {k}: refactor the module."})
        made = 0
        for i in range(steps):
            sess.extend(step_messages(k, i))
            result = sess.process_request()
            made += result.strategy is not None and result.success
            sess.active_context()
        with lock:
            total += made

    started = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool_:
        list(pool_.map(agent, range(sessions)))
    elapsed = time.perf_counter() - started
    store.close()
    return {"seconds": elapsed, "steps_per_s": sessions * steps / elapsed, "compactions": total}


def fresh_url(db: str | None, directory: Path, label: str) -> str:
    if db is None:
        return str(directory / f"{label}.db")
    # A new PostgreSQL database per run.
    name = f"bench_async_{label}_{int(time.time())}"
    admin = create_engine(db, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    return make_url(db).set(database=name).render_as_string(hide_password=False)


def main() -> None:
    global SUMMARY_SECONDS
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=100, help="sync: threads at a time")
    parser.add_argument("--pool", type=int, default=10, help="pool_size (and max_overflow)")
    parser.add_argument("--summary-ms", type=float, default=200)
    parser.add_argument(
        "--cache-sessions",
        type=int,
        default=64,
        help="open(cache_sessions=) of both stores (default: the library's 64)",
    )
    parser.add_argument("--db", default=None, help="a PostgreSQL admin URL (default: SQLite)")
    parser.add_argument(
        "--gc-freeze",
        action="store_true",
        help="gc.freeze() once the store is open, before the async run (see the README)",
    )
    parser.add_argument(
        "--stalls",
        type=float,
        default=None,
        metavar="MS",
        help="sample where the loop's thread is while it is more than MS late (see above)",
    )
    args = parser.parse_args()
    SUMMARY_SECONDS = args.summary_ms / 1000
    with tempfile.TemporaryDirectory() as directory:
        where = Path(directory)
        results = {
            "async": asyncio.run(
                run_async(
                    fresh_url(args.db, where, "a"),
                    args.sessions,
                    args.steps,
                    args.pool,
                    args.cache_sessions,
                    args.gc_freeze,
                    args.stalls,
                )
            ),
            "sync_threads": run_sync(
                fresh_url(args.db, where, "s"),
                args.sessions,
                args.steps,
                args.threads,
                args.pool,
                args.cache_sessions,
            ),
        }
    results["args"] = vars(args)
    results["async_vs_sync"] = (
        results["async"]["steps_per_s"] / results["sync_threads"]["steps_per_s"]
    )
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
