"""What the breaker, stats, cost and demo commands print (pure, like
:mod:`compactstore._cli.render`)."""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from compactstore._cli.render import compaction_json, history_lines, plural, utc
from compactstore.models import BreakerState, CompactionResult

if TYPE_CHECKING:
    from compactstore._demo import DemoReport
    from compactstore._ledger import SessionCost
    from compactstore._store.admin import StoreStats

__all__ = ["breaker_lines", "cost_lines", "demo_json", "demo_lines", "stage_text", "stats_lines"]


# -- breaker, stats, demo -------------------------------------------------------------------


def breaker_lines(state: BreakerState, created_at: float | None = None) -> list[str]:
    """The `breaker` counters, one per line. The time trigger of microcompact counts from
    the session's creation (``created_at``) until one runs: that time is not a run."""
    last = state.last_microcompact_at
    microcompact = "none yet" if last is None or last == created_at else f"{utc(last)} UTC"
    return [
        f"consecutive failures: {state.consecutive_failures}",
        f"tripped:              {'yes' if state.tripped else 'no'}",
        f"reactive attempts:    {state.reactive_attempts}",
        f"last microcompact:    {microcompact}",
        f"summary fallbacks:    {state.consecutive_fallbacks} in a row",
    ]


def stats_lines(found: StoreStats) -> list[str]:
    """The `stats` table: one `name: value` row per count."""
    strategies = ", ".join(f"{k} {v}" for k, v in found.compactions_by_strategy.items())
    rows = [
        ("database", f"{found.location} ({found.backend})"),
        ("sessions", f"{found.sessions:,}"),
        ("messages", f"{found.messages:,} ({found.message_tokens:,} tokens)"),
        (
            "compactions",
            f"{found.compactions:,} ({found.compactions_rolled_back:,} rolled back)"
            + (f": {strategies}" if strategies else ""),
        ),
        ("stages", stage_text(found.stages)),
        (
            "boundaries",
            f"{found.boundaries_live:,} live, {found.boundaries_rolled_back:,} rolled back",
        ),
        ("blobs", f"{found.blobs:,} ({found.blob_bytes:,} bytes)"),
        ("memory entries", f"{found.memory_entries:,}"),
        ("model calls", _calls_summary(found.model_calls, found.model_calls_unpriced)),
        ("call tokens", _tokens_summary(found.call_tokens)),
        ("cost", _usd(found.cost_usd, found.model_calls_unpriced)),
    ]
    if found.db_file_bytes is not None:
        rows.append(
            ("file size", f"{found.db_file_bytes:,} bytes (+{found.wal_file_bytes or 0:,} WAL)")
        )
    return [f"{name + ':':<16}{value}" for name, value in rows]


def stage_text(stages: dict[str, tuple[int, int]]) -> str:
    """What each stage did: ``tool_budget 60 (133,844 tokens freed), ...``; the figures of
    ``stats`` and of the demo's summary."""
    return (
        ", ".join(
            f"{name} {count:,} ({freed:,} tokens freed)" for name, (count, freed) in stages.items()
        )
        or "none"
    )


def _per_stage(figures: dict[str, int], style: str) -> str:
    """The demo's figures per stage, the manual compact shown within "full" (where the
    rows, and ``stats``, count it), then the rollback."""
    manual = figures.get("manual", 0)
    parts = []
    for key, value in figures.items():
        if key == "manual":
            continue
        text = f"{key} {style.format(value)}"
        if key == "full" and manual:
            text += f" ({style.format(manual)} manual)"
        parts.append(text)
    return ", ".join(parts) or "none"


def _usd(cost: float | None, unpriced: int) -> str:
    if cost is None:
        return "unknown (no call has a price)" if unpriced else "$0.00"
    return f"${cost:,.4f}" + (f" (+{unpriced:,} calls without a price)" if unpriced else "")


def _calls_summary(calls: int, unpriced: int) -> str:
    return f"{calls:,}" + (f" ({unpriced:,} without a price)" if unpriced else "")


def _tokens_summary(tokens: Mapping[str, int]) -> str:
    return (
        f"input {tokens.get('input', 0):,} · cache read {tokens.get('cache_read', 0):,} · "
        f"cache write 5m {tokens.get('cache_write_5m', 0):,} · "
        f"1h {tokens.get('cache_write_1h', 0):,} · output {tokens.get('output', 0):,}"
    )


def cost_lines(cost: SessionCost) -> list[str]:
    """The `cost` report of a session: calls, tokens by kind, cost, cache rewrites."""
    tokens = cost.as_json()["tokens"]
    lines = [
        f"session:        {cost.session_id}",
        f"model calls:    {_calls_summary(cost.calls, cost.unpriced_calls)}",
        f"tokens:         {_tokens_summary(tokens)}",
        f"cost:           {_usd(cost.cost_usd, cost.unpriced_calls)}",
    ]
    if cost.calls_without_usage:
        lines.append(f"no usage split: {cost.calls_without_usage:,} calls (prompt size only)")
    rewrite = cost.cache_rewrite_cost_usd
    lines.append(
        f"cache rewrite:  {cost.cache_rewrite_tokens:,} tokens written again after "
        f"{len(cost.cache_rewrites):,} compactions"
        + ("" if rewrite is None else f", ${rewrite:,.4f}")
    )
    for row in cost.cache_rewrites:
        price = "no price" if row.cost_usd is None else f"${row.cost_usd:,.4f}"
        lines.append(
            f"  compaction {row.compaction_id}: {row.tokens:,} tokens "
            f"(call at seq {row.call_seq}), {price}"
        )
    return lines


def demo_json(
    report: DemoReport, compactions: list[CompactionResult], queries: list[tuple[str, str]]
) -> dict[str, Any]:
    """The `demo --json` document."""
    return {
        "report": {
            "session_id": report.session_id,
            "steps": report.steps,
            "messages": report.messages,
            "fired": dict(report.fired),
            "compactions": report.compactions,
            "tokens_freed": dict(report.tokens_freed),
            "peak_usage": report.peak_usage,
            "peak_sent": report.peak_sent,
            "context_window": report.context_window,
        },
        "compactions": [compaction_json(c) for c in compactions],
        "audit_queries": [{"title": title, "sql": sql} for title, sql in queries],
    }


def _demo_peak(report: DemoReport, compactions: list[CompactionResult]) -> list[str]:
    """The demo's peak usage, and when it is the staged "prompt is too long" (a burst sent
    without the pre-call pipeline), that reactive recovery repaired it."""
    window = report.context_window
    peak = (
        f"Peak usage {report.peak_usage:,} of {window:,} tokens "
        f"({share(report.peak_usage, window)})"
    )
    repaired = next(
        (
            c
            for c in compactions
            if c.trigger is not None
            and c.trigger.value == "reactive"
            and c.success
            and c.tokens_before == report.peak_usage
        ),
        None,
    )
    if repaired is None:
        return [peak + "."]
    return [
        f'{peak}: the staged "prompt is too long", a burst of tool output sent without the '
        f"pre-call pipeline, which reactive recovery repaired (compaction {repaired.id}: "
        f"{repaired.tokens_before:,} → {repaired.tokens_after:,} tokens).",
        f"Largest context the pipeline sent to the model: {report.peak_sent:,} tokens "
        f"({share(report.peak_sent, window)} of the window).",
    ]


def share(part: int, whole: int) -> str:
    """``part`` as a percentage of ``whole``: ``95%``."""
    return f"{part / whole:.0%}" if whole else "-"


def demo_lines(
    report: DemoReport,
    compactions: list[CompactionResult],
    queries: list[tuple[str, str]],
    *,
    location: str,
    backend: str,
    db: str,
) -> list[str]:
    """What `demo` prints: the run, its history, the SQL to audit it and the command that
    writes its report (``db`` as the user gave it)."""
    fired = _per_stage(report.fired, "{:}")
    freed = _per_stage(report.tokens_freed, "{:,}")
    client = f"sqlite3 {shlex.quote(location)}" if backend == "sqlite" else f"psql ({location})"
    lines = [
        f"Simulated {plural(report.steps, 'step')} into session {report.session_id} of "
        f"{location}: {plural(report.messages, 'message')}, "
        f"{plural(report.compactions, 'compaction')}.",
        *_demo_peak(report, compactions),
        f"Stages fired: {fired}",
        f"Tokens freed: {freed}",
        "",
        *history_lines(compactions),
        "",
        f"Audit it with SQL: paste these into {client}",
    ]
    for title, sql in queries:
        lines.extend(["", f"-- {title}", sql.strip().rstrip(";") + ";"])
    command = ["compactstore", "report", report.session_id, "--db", db]
    if re.fullmatch(r"\w[\w-]*", report.session_id, re.ASCII):
        command += ["-o", f"{report.session_id}.html"]  # else a safe name is made up
    lines += [
        "",
        "See it as a page (needs pip install 'compactstore[report]'):",
        shlex.join(command),
    ]
    return lines
