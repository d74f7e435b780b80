"""Compaction quality over the real transcripts in ../shared/corpus/dev/.

Replays every dev transcript with `compactstore simulate` at a 200k, a 64k and a 32k window,
twice: with the window applied to the conversation's messages (the store's estimate decides
when the context does not fit), and as a live agent would see it, with the provider's real
prompt sizes from the transcript (system prompt and tool definitions included) driving
record_usage. Prints one markdown table per mode.

After each table, the handoff each cut left, measured by
compactstore._summary_audit — its own noise markers and parsers, not the summary code's
classifier: noise lines, files listed twice, escaped newlines, summaries over budget, the
share of instructions / open plan items / the last assistant text before the cut still in the
summary or the kept messages, and, where the agent compacted itself, how much of what its
summary lists ours names when cut at the same place; and "recalled exactly": of the messages
each compaction removed, cleared or persisted and the blobs it wrote, how many ``recall`` gave
back exactly (paged through with its cursors).

Then, against the agent's own handoff at its own cuts (compactstore._simulate.reference
.agent_cuts): Claude Code's summaries and what Codex's ``compacted`` records kept
(``replacement_history``), each against our summary of the same messages — the files the
agent names among those the tool calls before the cut touched, the user's messages it keeps,
and the tasks it says are pending (Codex: the open items of its last ``update_plan``), and how
many of each ours has (our summary plus what we keep from before the cut).

Usage: python -m benchmarks.quality [--corpus ../shared/corpus/dev] [--windows 200000,64000,32000]
       python -m benchmarks.quality --agent-cuts   (only the comparison with the agent's own)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from benchmarks import DEFAULT_CORPUS
from compactstore._importers import transcripts as readable_transcripts
from compactstore._simulate import SimulationReport, simulate
from compactstore._simulate.reference import AgentCut, agent_cuts
from compactstore.errors import InvalidInputError


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


AGENT_HEADER = (
    "| transcript | agent's handoff | cut before message | files it names (touched) "
    "| its user messages | its pending tasks |\n"
    "|---|---|---|---|---|---|"
)


def _pair(pair: tuple[int, int]) -> str:
    total, ours = pair
    return "–" if not total else f"{ours}/{total} ({ours / total:.0%})"


def agent_row(cut: AgentCut) -> str:
    return (
        f"| {cut.file} | {cut.source} {cut.kind} | {cut.cut} | {_pair(cut.files)} "
        f"| {_pair(cut.user_messages)} | {_pair(cut.tasks)} |"
    )


def agent_totals(cuts: list[AgentCut], source: str, kind: str) -> str:
    chosen = [c for c in cuts if (c.source, c.kind) == (source, kind)]

    def total(name: str) -> tuple[int, int]:
        pairs = [getattr(c, name) for c in chosen]
        return sum(p[0] for p in pairs), sum(p[1] for p in pairs)

    return (
        f"| all ({len(chosen)} cuts) | {source} {kind} | | {_pair(total('files'))} "
        f"| {_pair(total('user_messages'))} | {_pair(total('tasks'))} |"
    )


def agent_section(files: list[Path]) -> None:
    print(f"\n### Against the agent's own handoff at its cuts\n\n{AGENT_HEADER}")
    cuts: list[AgentCut] = []
    for path in files:
        for cut in agent_cuts(path):
            cuts.append(cut)
            print(agent_row(cut), flush=True)
    for source, kind in dict.fromkeys((c.source, c.kind) for c in cuts):
        print(agent_totals(cuts, source, kind))


def transcripts(corpus: Path) -> list[Path]:
    """The files under ``corpus`` that compactstore reads as a transcript (by their content,
    as ``import`` detects it): companion files and formats it has no importer for are left
    out."""
    return readable_transcripts(sorted(p for p in corpus.rglob("*") if p.is_file()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--windows", default="200000,64000,32000")
    parser.add_argument(
        "--agent-cuts", action="store_true", help="only the comparison with the agent's own"
    )
    args = parser.parse_args()
    files = transcripts(args.corpus)
    if not files:
        sys.exit(f"no transcripts under {args.corpus} (give --corpus DIR)")
    if args.agent_cuts:
        agent_section(files)
        return
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
                try:
                    reports.append(simulate(path, window=window, use_usage=use_usage))
                except InvalidInputError as exc:
                    # The window is below what the transcript needs before any compaction
                    # (its system prompt and tools): no compaction can make a call fit.
                    print(f"| {path.name} | {window // 1000}k | {str(exc).split(':')[0]} |")
                    continue
                print(row(reports[-1]), flush=True)
        print(f"\n#### The handoff after every cut ({title.lower()})\n\n{HANDOFF_HEADER}")
        for report in reports:
            if report.cuts:
                print(handoff_row(report))
    agent_section(files)
    print(f"\n{len(files)} transcripts, {time.perf_counter() - began:.0f} s in all")


if __name__ == "__main__":
    main()
