"""What a simulation measured: the report, its readable summary and one line per compaction."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = [
    "STAGE_KEYS",
    "CompactionEvent",
    "SimulationReport",
    "cost_line",
    "floor_line",
    "stage_rows",
    "summary_lines",
]

STAGE_KEYS = (
    "tool_budget",
    "read_dedup",
    "microcompact",
    "session_memory",
    "full",
    "partial",
    "reactive",
)


@dataclass
class CompactionEvent:
    """One recorded compaction of the replay."""

    call: int  # model call number (1-based) before which it ran
    message_index: int  # index in the transcript of the message about to be produced
    trigger: str
    strategy: str
    tokens_before: int
    tokens_after: int
    messages_removed: int
    steps: list[dict[str, Any]]


@dataclass
class SimulationReport:
    """Everything the simulator measured. ``to_dict()`` gives plain JSON."""

    file: str
    source: str
    format: str
    window: int
    messages: int
    calls: int
    session: str | None = None  # the session kept in the store given, if any
    compactions: list[CompactionEvent] = field(default_factory=list)
    freed: dict[str, int] = field(default_factory=dict)
    peak_usage: int = 0
    # Quality, over every model call of the replay.
    valid_calls: int = 0
    invalid_examples: list[str] = field(default_factory=list)
    sdk_checked: bool = False
    fit_max: float = 0.0
    fit_after_auto_max: float | None = None
    request_retained: int = 0
    files_removed: int = 0
    files_recalled: int = 0
    loops: int = 0
    reactive_calls: int = 0
    gave_up: int = 0
    # The handoff, checked after every cut with the checks of summary_audit.
    cuts: int = 0
    noise_lines: int = 0
    duplicate_files: int = 0
    escaped_summaries: int = 0
    over_budget_summaries: int = 0
    instructions_due: int = 0
    instructions_kept: int = 0
    plan_items_due: int = 0
    plan_items_kept: int = 0
    last_text_due: int = 0
    last_text_kept: int = 0
    handoff_examples: list[str] = field(default_factory=list)
    # Recall, after every compaction: the messages it removed or whose results it
    # cleared or persisted, and the blobs it created, given back exactly.
    recall_due: int = 0
    recall_exact: int = 0
    recall_blobs_due: int = 0
    recall_blobs_exact: int = 0
    recall_examples: list[str] = field(default_factory=list)
    # Reference agreement (transcripts with their own compactions): cut where the agent did
    # (compact(up_to_seq=...)) and count what its summary lists that ours names.
    reference_points: list[dict[str, Any]] = field(default_factory=list)
    reference_files: int = 0
    reference_files_named: int = 0
    reference_user_messages: int = 0
    reference_user_messages_named: int = 0
    # Token counts against the provider's (where the transcript has them).
    usage_calls: int = 0
    usage_errors: list[float] = field(default_factory=list)
    raw_errors: list[float] = field(default_factory=list)
    # Calls whose real prompt was over 85% / over 100% of the window ("calls"), and of them
    # those where the store (calibrated, or the raw estimate) said below 85%.
    missed_over_threshold: dict[str, int] = field(
        default_factory=lambda: {"calls": 0, "calibrated": 0, "raw": 0}
    )
    missed_over_window: dict[str, int] = field(
        default_factory=lambda: {"calls": 0, "calibrated": 0, "raw": 0}
    )
    overhead_tokens: int | None = None
    # What the transcript needs before any compaction: the first model call's prompt (the
    # fixed overhead and the opening messages, which compaction keeps).
    needed_tokens: int = 0
    # Cost (compactstore._simulate.cost), at cost_model's prices: the replay under the
    # store's policy, the same calls with compaction off (None when that context outgrows
    # the window: off_peak_tokens says by how much), and the transcript's own recorded usage.
    cost_model: str | None = None
    cost_usd: float | None = None
    cache_read_share: float | None = None
    cost_off_usd: float | None = None
    cache_read_share_off: float | None = None
    off_peak_tokens: int = 0
    transcript_cost_usd: float | None = None
    transcript_cost_calls: int = 0
    seconds: float = 0.0

    @property
    def validity(self) -> float:
        return self.valid_calls / self.calls if self.calls else 1.0

    @property
    def request_share(self) -> float:
        return self.request_retained / self.calls if self.calls else 1.0

    @property
    def file_recall(self) -> float | None:
        return self.files_recalled / self.files_removed if self.files_removed else None

    @property
    def reference_agreement(self) -> float | None:
        return self.reference_files_named / self.reference_files if self.reference_files else None

    @property
    def reference_user_agreement(self) -> float | None:
        return (
            self.reference_user_messages_named / self.reference_user_messages
            if self.reference_user_messages
            else None
        )

    @staticmethod
    def _share(kept: int, due: int) -> float | None:
        return kept / due if due else None

    @property
    def instruction_share(self) -> float | None:
        return self._share(self.instructions_kept, self.instructions_due)

    @property
    def plan_share(self) -> float | None:
        return self._share(self.plan_items_kept, self.plan_items_due)

    @property
    def last_text_share(self) -> float | None:
        return self._share(self.last_text_kept, self.last_text_due)

    @property
    def recall_share(self) -> float | None:
        return self._share(
            self.recall_exact + self.recall_blobs_exact, self.recall_due + self.recall_blobs_due
        )

    def error_stats(self, errors: Sequence[float]) -> dict[str, float] | None:
        """Median and p90 of |relative error|, and the share of calls within 5%."""
        if not errors:
            return None
        absolute = sorted(abs(e) for e in errors)
        return {
            "median": statistics.median(absolute),
            "p90": absolute[min(len(absolute) - 1, int(0.9 * len(absolute)))],
            "within_5pct": sum(1 for e in absolute if e <= 0.05) / len(absolute),
            "median_signed": statistics.median(errors),
        }

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("usage_errors")
        data.pop("raw_errors")
        data.update(
            validity=self.validity,
            request_share=self.request_share,
            file_recall=self.file_recall,
            reference_agreement=self.reference_agreement,
            reference_user_agreement=self.reference_user_agreement,
            instruction_share=self.instruction_share,
            plan_share=self.plan_share,
            last_text_share=self.last_text_share,
            recall_share=self.recall_share,
            calibrated_error=self.error_stats(self.usage_errors),
            raw_error=self.error_stats(self.raw_errors),
        )
        return data


def _n(count: int, noun: str) -> str:
    """``1 message``, ``2 messages``."""
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


def _share(value: float | None) -> str:
    return "–" if value is None else f"{value:.1%}"


def floor_line(report: SimulationReport) -> str:
    """One line saying the window is below what the transcript needs before any compaction."""
    overhead = report.overhead_tokens
    split = (
        f" (system prompt and tools {overhead:,}, opening messages "
        f"{report.needed_tokens - overhead:,})"
        if overhead
        else " (its opening messages)"
    )
    return (
        f"window {report.window:,} is smaller than the {report.needed_tokens:,} tokens this "
        f"transcript needs before any compaction{split}: no compaction can make it fit"
    )


def summary_lines(report: SimulationReport) -> list[str]:
    """A readable summary of a report."""
    lines = [
        f"{report.file}: {report.source} ({report.format}), {_n(report.messages, 'message')}, "
        f"{_n(report.calls, 'model call')}, window {report.window:,}, {report.seconds:.1f} s",
        f"compactions: {len(report.compactions)}; peak usage {report.peak_usage:,} "
        f"({report.fit_max:.0%} of the window)",
        "tokens freed: "
        + (", ".join(f"{k} {v:,}" for k, v in report.freed.items() if v) or "none"),
        f"validity {report.validity:.1%}"
        + ("" if report.sdk_checked else " (pairing only: SDK types not installed)")
        + f"; original request retained {report.request_share:.1%}"
        + (f"; file recall {report.file_recall:.1%}" if report.file_recall is not None else "")
        + (
            f"; fit after auto-compact ≤ {report.fit_after_auto_max:.0%}"
            if report.fit_after_auto_max
            else ""
        )
        + f"; loops {report.loops}",
    ]
    if report.window < report.needed_tokens:
        lines.insert(1, floor_line(report))
    if report.reference_points:
        agreement = report.reference_agreement
        lines.append(
            "reference: "
            + "; ".join(
                f"they compacted before message {p['their_message_index']} at "
                f"{p['their_pre_tokens']} tokens, we nearest before {p['our_message_index']} "
                f"at {p['our_tokens_before']}"
                for p in report.reference_points
            )
            + ("" if agreement is None else f"; their summary's files in ours {agreement:.0%}")
            + (
                ""
                if report.reference_user_agreement is None
                else f", their summary's user messages in ours "
                f"{report.reference_user_agreement:.0%}"
            )
        )
    calibrated, raw = report.error_stats(report.usage_errors), report.error_stats(report.raw_errors)
    if calibrated and raw:
        lines.append(
            f"token counts vs the provider's ({report.usage_calls} calls): raw estimate median "
            f"error {raw['median']:.1%} (p90 {raw['p90']:.1%}), calibrated "
            f"{calibrated['median']:.1%} (p90 {calibrated['p90']:.1%}, within ±5% on "
            f"{calibrated['within_5pct']:.0%}); real prompt over the window before the call on "
            f"{report.missed_over_window['calls']} calls, reported below 85% on "
            f"{report.missed_over_window['calibrated']} of them "
            f"(raw estimate: {report.missed_over_window['raw']})"
        )
    if report.cuts:
        lines.append(
            f"handoff over {report.cuts} cuts: noise lines {report.noise_lines}, files listed "
            f"twice {report.duplicate_files}, escaped \\n in {report.escaped_summaries}, over "
            f"budget {report.over_budget_summaries}; later instructions "
            f"{_share(report.instruction_share)}, pending plan items "
            f"{_share(report.plan_share)}, last assistant text {_share(report.last_text_share)}"
        )
    if report.recall_due or report.recall_blobs_due:
        lines.append(
            f"recall: {report.recall_exact} of {report.recall_due} messages removed, cleared or "
            f"persisted and {report.recall_blobs_exact} of {report.recall_blobs_due} blobs given "
            f"back exactly"
        )
    lines.append(cost_line(report))
    lines.extend(f"handoff finding: {example}" for example in report.handoff_examples)
    lines.extend(f"recall finding: {example}" for example in report.recall_examples)
    for example in report.invalid_examples:
        lines.append(f"invalid context: {example}")
    return lines


def _usd(value: float | None) -> str:
    return "–" if value is None else f"${value:,.2f}"


def cost_line(report: SimulationReport) -> str:
    """The replay's cost under the policy, with compaction off, and the transcript's own."""
    if report.cost_model is None:
        return "cost: no model known (the transcript records none): give --model"
    parts = [
        f"cost at {report.cost_model}'s prices: {_usd(report.cost_usd)} under the store's "
        f"policy (cache reads {_share(report.cache_read_share)} of input)"
    ]
    if report.off_peak_tokens <= report.window:
        parts.append(
            f"{_usd(report.cost_off_usd)} with compaction off "
            f"(cache reads {_share(report.cache_read_share_off)})"
        )
    else:
        parts.append(f"compaction off does not fit the window ({report.off_peak_tokens:,} tokens)")
    if report.transcript_cost_calls:
        parts.append(
            f"{_usd(report.transcript_cost_usd)} as the transcript recorded it "
            f"({_n(report.transcript_cost_calls, 'call')} with usage)"
        )
    return "; ".join(parts)


def stage_rows(events: Iterable[CompactionEvent]) -> list[str]:
    """One line per compaction, for progress output."""
    return [
        f"call {e.call:>5}  {e.trigger:<19} {e.strategy:<15} "
        f"{e.tokens_before:>8,} → {e.tokens_after:>8,}  removed {e.messages_removed}"
        for e in events
    ]
