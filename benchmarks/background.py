"""Background compaction (issue 14): does the agent ever wait for a summary?

A simulated 200-call agent session: each call appends ~1.5% of the window, then
``process_request(background=True)`` and ``active_context()``, then "calls the model", which
takes ``--model-s`` seconds; the summarizer takes ``--summary-s`` seconds. Times are scaled by
``--scale`` (default 0.02: a 2 s model call sleeps 40 ms, a 10 s summary 200 ms) so the run
takes seconds; ``--scale 1`` runs in real time. The store's clock (``now=``) advances by the
unscaled model time per call.

Reported: process_request latency (p50/p99/max, real milliseconds), how many calls waited
for a summary (a whole summary ran inside the call; ``--plain`` shows the ordinary call),
the highest usage as a fraction of the window, and the background compactions
started/applied.

    python -m benchmarks.background
    python -m benchmarks.background --calls 200 --scale 1 --db postgresql+psycopg://...

Targets: p99 <= 20 ms, 0 waits, usage never over the window.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from compactstore import CompactionConfig, CompactStore

WINDOW = 200_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--share", type=float, default=0.015, help="window share per call")
    parser.add_argument("--model-s", type=float, default=2.0)
    parser.add_argument("--summary-s", type=float, default=10.0)
    parser.add_argument("--scale", type=float, default=0.02)
    parser.add_argument("--db", default=None, help="a database URL (default: a new SQLite file)")
    parser.add_argument(
        "--plain", action="store_true", help="process_request() without background, to compare"
    )
    args = parser.parse_args()

    summaries: list[tuple[float, float]] = []  # (start, end) of each summary
    calls: list[tuple[float, float]] = []  # (start, end) of each process_request

    def summarize(messages: list[Any], previous: str | None, instructions: Any) -> str:
        started = time.perf_counter()
        time.sleep(args.summary_s * args.scale)
        summaries.append((started, time.perf_counter()))
        return f"Summary of {len(messages)} messages: the task, the files, what is left."

    with tempfile.TemporaryDirectory() as directory:
        db = args.db or str(Path(directory) / "bg.db")
        store = CompactStore.open(db, summarizer=summarize)
        sess = store.session(
            f"bg-{int(time.time())}",
            context_window=WINDOW,
            config=CompactionConfig(summarizer_timeout_seconds=max(30.0, 3 * args.summary_s)),
        )
        sess.append({"role": "user", "content": "Refactor the billing module."})
        # Size one call's message to the share of the window (as the store counts it).
        probe = "x" * 4_000
        before = sess.token_usage()
        sess.append({"role": "assistant", "content": probe})
        per_char = (sess.token_usage() - before) / len(probe)
        chars = int(args.share * WINDOW / per_char)
        latencies: list[float] = []
        statuses: dict[str, int] = {}
        peak = 0.0
        now = 1_000.0
        for i in range(args.calls):
            sess.append({"role": "user", "content": f"tool output {i}\n" + "y" * chars})
            started = time.perf_counter()
            result = sess.process_request(background=not args.plain, now=now)
            ended = time.perf_counter()
            latencies.append((ended - started) * 1000)
            calls.append((started, ended))
            statuses[str(result.background)] = statuses.get(str(result.background), 0) + 1
            sess.active_context()
            peak = max(peak, sess.token_usage() / WINDOW)
            time.sleep(args.model_s * args.scale)  # the model call
            sess.append({"role": "assistant", "content": f"step {i} done"})
            now += args.model_s
        store.close()
        ordered = sorted(latencies)
        # A call waited for a summary when a whole summary ran inside it.
        waits = sum(1 for a, b in calls if any(a <= start and end <= b for start, end in summaries))
        report = {
            "args": vars(args),
            "process_request_ms": {
                "p50": ordered[len(ordered) // 2],
                "p99": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))],
                "max": ordered[-1],
            },
            "waits_for_a_summary": waits,
            "summaries": len(summaries),
            "peak_usage_of_window": peak,
            "background": statuses,
        }
        print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
