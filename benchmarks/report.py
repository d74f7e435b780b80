"""How long `compactstore report` takes on a long session, how big the page is, and how long
Chromium takes to load it.

    python -m benchmarks.report --steps 10000 --db /tmp/report-bench.db

The session is the benchmark scenario (``benchmarks.scenario``, seed 1) driven as an agent
would: per step ``extend`` the step's messages, ``process_request(now=...)``, then
``record_usage`` with a provider-like count (1.3 x the raw estimate of the context + 3,000
tokens of system prompt and tools), so every step is a model call. Building it takes minutes;
an existing ``--db`` holding the session is reused.
Targets (10,000 steps): written ≤ 2 s, file ≤ 5 MB, loaded in Chromium ≤ 1 s.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.scenario import generate
from compactstore import CompactStore
from compactstore.report import collect, render, write_report

SESSION = "bench"
TARGETS = {"write_seconds": 2.0, "file_mb": 5.0, "load_seconds": 1.0}


def build(path: Path, steps: int) -> None:
    """The scenario's session in ``path``, unless it is there already."""
    with CompactStore.open(path) as store:
        if any(info.id == SESSION for info in store.sessions()):
            return
        scenario = generate(steps, seed=1)
        sess = store.session(
            SESSION, context_window=200_000, format="anthropic", now=scenario.steps[0].timestamps[0]
        )
        began = time.perf_counter()
        for number, step in enumerate(scenario.steps):
            sess.extend(step.messages, timestamps=step.timestamps)
            now = step.timestamps[-1]
            sess.process_request(now=now)
            sess.record_usage(round(sess.context().raw_tokens * 1.3) + 3_000, now=now)
            if number % 1000 == 0:
                print(
                    f"  built {number:,} steps in {time.perf_counter() - began:.0f} s", flush=True
                )


def chromium_load(page: Path, runs: int) -> list[float] | None:
    """Seconds from navigation start to the load event, per run (None: no Chromium)."""
    chromium, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver_path is None:
        return None
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        times = []
        for _ in range(runs):
            driver.get("about:blank")
            driver.get(page.as_uri())
            end = driver.execute_script(
                "return performance.getEntriesByType('navigation')[0].loadEventEnd"
            )
            times.append(end / 1000)
        return times
    finally:
        driver.quit()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--db", type=Path, help="database to build into / reuse")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, help="keep the page here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="compactstore-report-bench-") as tmp:
        db = args.db or Path(tmp) / "bench.db"
        build(db, args.steps)
        page = args.out or Path(tmp) / "report.html"
        with CompactStore.open(db) as store:
            write: list[float] = []
            for _ in range(args.runs):
                began = time.perf_counter()
                write_report(store, SESSION, page)
                write.append(time.perf_counter() - began)
            began = time.perf_counter()
            data = collect(store, SESSION)
            read = time.perf_counter() - began
            began = time.perf_counter()
            render(data)
            rendered = time.perf_counter() - began
        load = chromium_load(page, args.runs)
        result: dict[str, Any] = {
            "steps": args.steps,
            "messages": data.message_count,
            "model_calls": len(data.calls),
            "compactions": len(data.compactions),
            "cards": len(data.cards),
            "write_seconds": statistics.median(write),
            "read_seconds": read,
            "render_seconds": rendered,
            "file_mb": page.stat().st_size / 1e6,
            "load_seconds": None if load is None else statistics.median(load),
        }
    print(json.dumps(result, indent=2))
    missed = [
        f"{key} {result[key]:.2f} > {limit}"
        for key, limit in TARGETS.items()
        if result[key] is not None and result[key] > limit
    ]
    if load is None:
        print("Chromium not found: load time not measured", file=sys.stderr)
    for line in missed:
        print(f"target missed: {line}", file=sys.stderr)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
