"""How close the store's token count is to the provider's, on real transcripts.

For every model call of each dev transcript that reports the provider's prompt size, the
store's usage just before the call is compared with the real prompt size (learnt from the
transcript's usage, see compactstore._simulate): the article's plain estimate (other
characters / 4, no overhead) and the calibrated figure the store reports (default factor
until the first real count, then learnt from record_usage). Run at a 200k window and at a
64k window, where the Claude Code transcripts compact. The last column replays the same
agent trusting the plain estimate (token_factor=1.0, no record_usage) and counts the calls
whose real prompt was over the window (the API would have refused them).

Usage: python -m benchmarks.tokens [--corpus ../shared/corpus/dev] [--windows 200000,64000]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from benchmarks import DEFAULT_CORPUS
from compactstore._importers import read_transcript
from compactstore._simulate import simulate_transcript
from compactstore.models import CompactionConfig

HEADER = (
    "| transcript | window | calls | raw median | raw p90 | calibrated median | calibrated p90 "
    "| within ±5% | real > 85%: said < 85% (raw / calibrated) "
    "| real > 100%: said < 85% (raw / calibrated) | plain estimate: calls over the window |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--windows", default="200000,64000")
    args = parser.parse_args()
    files = sorted(p for p in args.corpus.rglob("*") if p.suffix in (".jsonl", ".traj"))
    if not files:
        sys.exit(f"no transcripts under {args.corpus} (give --corpus DIR)")
    print(HEADER)
    for path in files:
        transcript = read_transcript(path)
        if sum(u is not None for u in transcript.usage) < 3:
            continue  # nothing to compare
        for window in (int(w) for w in args.windows.split(",")):
            report = simulate_transcript(transcript, name=path.name, window=window)
            # The same agent trusting the article's plain estimate (no factor, no real counts).
            plain = simulate_transcript(
                transcript,
                name=path.name,
                window=window,
                config=CompactionConfig(token_factor=1.0),
                calibrate=False,
            )
            raw = report.error_stats(report.raw_errors)
            calibrated = report.error_stats(report.usage_errors)
            assert raw is not None and calibrated is not None
            over85, over100 = report.missed_over_threshold, report.missed_over_window
            print(
                f"| {path.name} | {window // 1000}k | {report.usage_calls} "
                f"| {raw['median_signed']:+.1%} | {raw['p90']:.1%} "
                f"| {calibrated['median_signed']:+.1%} | {calibrated['p90']:.1%} "
                f"| {calibrated['within_5pct']:.1%} "
                f"| {over85['raw']} / {over85['calibrated']} of {over85['calls']} "
                f"| {over100['raw']} / {over100['calibrated']} of {over100['calls']} "
                f"| {plain.missed_over_window['calls']} of {plain.calls} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
