"""Compaction quality over the real transcripts in ../shared/corpus/dev/.

Replays every dev transcript with `compactstore simulate` at a 200k, a 64k and a 32k window,
twice: with the window applied to the conversation's messages (the store's estimate decides
when the context does not fit), and as a live agent would see it, with the provider's real
prompt sizes from the transcript (system prompt and tool definitions included) driving
record_usage. Prints one markdown table per mode.

After each table, the handoff each cut left, measured by
compactstore.summary_audit — its own noise markers and parsers, not the summary code's
classifier: noise lines, files listed twice, escaped newlines, summaries over budget, the
share of instructions / open plan items / the last assistant text before the cut still in the
summary or the kept messages, and, where the agent compacted itself, how much of what its
summary lists ours names when cut at the same place; and "recalled exactly": of the messages
each compaction removed, cleared or persisted and the blobs it wrote, how many ``recall`` gave
back exactly (paged through with its cursors).

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


def handoff_row(report: SimulationReport) -> str:
    return (
        f"| {Path(report.file).name} | {report.window // 1000}k | {report.cuts} "
        f"| {report.noise_lines} | {report.duplicate_files} | {report.escaped_summaries} "
        f"| {report.over_budget_summaries} | {_pct(report.instruction_share)} "
        f"| {_pct(report.plan_share)} | {_pct(report.last_text_share)} "
        f"| {_pct(report.reference_agreement)} | {_pct(report.reference_user_agreement)} "
        f"| {report.recall_exact + report.recall_blobs_exact}/"
        f"{report.recall_due + report.recall_blobs_due} |"
    )


HANDOFF_HEADER = (
    "| transcript | window | cuts | noise lines | files twice | escaped \\n | over budget "
    "| instructions kept | plan items kept | last text kept | ref. files | ref. user messages "
    "| recalled exactly |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
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
        reports = []
        for path in files:
            for window in windows:
                reports.append(simulate(path, window=window, use_usage=use_usage))
                print(row(reports[-1]), flush=True)
        print(f"\n#### The handoff after every cut ({title.lower()})\n\n{HANDOFF_HEADER}")
        for report in reports:
            if report.cuts:
                print(handoff_row(report))
    print(f"\n{len(files)} transcripts, {time.perf_counter() - began:.0f} s in all")


if __name__ == "__main__":
    main()
