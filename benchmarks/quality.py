"""Compaction quality over the real transcripts in ../shared/corpus/dev/.

Replays every dev transcript with `compactstore simulate` at a 200k, a 64k and a 32k window,
twice: with the window applied to the conversation's messages (the store's estimate decides
when the context does not fit), and as a live agent would see it, with the provider's real
prompt sizes from the transcript (system prompt and tool definitions included) driving
record_usage. Prints one markdown table per mode.

Usage: python -m benchmarks.quality [--corpus ../shared/corpus/dev] [--windows 200000,64000,32000]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from benchmarks import DEFAULT_CORPUS
from compactstore.simulate import SimulationReport, simulate


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value:.0%}"


def row(report: SimulationReport) -> str:
    calibrated = report.error_stats(report.usage_errors)
    return (
        f"| {Path(report.file).name} | {report.window // 1000}k | {report.calls} "
        f"| {len(report.compactions)} | {_pct(report.validity)} | {_pct(report.fit_max)} "
        f"| {_pct(report.fit_after_auto_max)} | {_pct(report.request_share)} "
        f"| {_pct(report.file_recall)} | {_pct(report.reference_agreement)} | {report.loops} "
        f"| {report.reactive_calls} | "
        + ("–" if calibrated is None else f"{calibrated['within_5pct']:.0%}")
        + f" | {report.seconds:.1f} |"
    )


HEADER = (
    "| transcript | window | calls | compactions | validity | fit (max) | fit after auto "
    "| request kept | file recall | reference files | loops | reactive | usage ±5% | s |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--windows", default="200000,64000,32000")
    args = parser.parse_args()
    files = sorted(p for p in args.corpus.rglob("*") if p.suffix in (".jsonl", ".traj"))
    if not files:
        sys.exit(f"no transcripts under {args.corpus} (give --corpus DIR)")
    windows = [int(w) for w in args.windows.split(",")]
    began = time.perf_counter()
    for use_usage, title in (
        (False, "Window applied to the conversation (store estimate)"),
        (True, "As a live agent: provider's prompt sizes, overhead included"),
    ):
        print(f"\n### {title}\n\n{HEADER}")
        for path in files:
            for window in windows:
                report = simulate(path, window=window, use_usage=use_usage)
                print(row(report), flush=True)
    print(f"\n{len(files)} transcripts, {time.perf_counter() - began:.0f} s in all")


if __name__ == "__main__":
    main()
