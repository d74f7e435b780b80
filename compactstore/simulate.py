"""Replay a real transcript through compactstore as a live agent would, and measure it.

The transcript's raw log is appended message by message into a fresh session (compactions
already recorded in the file are ignored): ``process_request(now=<timestamp>)`` before every
assistant turn (each one is a model call), ``reactive_recover`` whenever the context would
not fit the window, reads routed through ``append_tool_result(file_path=...)`` so read dedup
applies, and writes invalidating their path. Every model call is measured: is the context
one a real API accepts, how full is it, is the original request still there, and what
happened to the files that compaction removed.

Real prompt sizes. Where the transcript reports the provider's prompt size for its calls
(Claude Code ``usage``, Codex ``token_count``), the real tokens of each message are learnt
from it: the growth between two consecutive calls is shared among the messages appended in
between, in proportion to their estimates, and the first call's excess over its messages is
the fixed overhead (system prompt and tool definitions). The real size of *our* context at a
call is then overhead + the real tokens of the messages in it (the summary counted at the
transcript's average ratio). The simulator calls ``record_usage`` with it after each call, as
a live agent would with the API's answer, and compares what the store predicted before it.
"""

from __future__ import annotations

import itertools
import json
import statistics
import tempfile
from collections.abc import Callable, Iterable, Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from compactstore import summary_audit as audit
from compactstore.context import ActiveContext, pairing_problems
from compactstore.db import model_calls
from compactstore.engines.summary import file_actions
from compactstore.errors import MissingExtraError
from compactstore.formats import get_format
from compactstore.formats.sdk_types import SDK_FORMATS, request_type, sdk_problems
from compactstore.importers import Transcript, read_transcript
from compactstore.models import CompactionConfig, CompactionResult, ImportedMessage
from compactstore.store import CompactStore, Session
from compactstore.summary_audit import is_noise
from compactstore.tokens import MAX_FACTOR, MIN_FACTOR, estimate_tokens
from compactstore.transfer import staging

__all__ = ["Progress", "SimulationReport", "simulate", "simulate_transcript"]

Progress = Callable[[int, int], None]

_STAGE_KEYS = (
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
    # The handoff (SPEC §9.7), checked after every cut with the checks of summary_audit.
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
            calibrated_error=self.error_stats(self.usage_errors),
            raw_error=self.error_stats(self.raw_errors),
        )
        return data


def _named(path: str, text: str) -> bool:
    """Whether a text names a file, as given or relative to some directory above it (a
    summary names files relative to the working directory)."""
    parts = path.strip("/").split("/")
    return path in text or any("/".join(parts[i:]) in text for i in range(len(parts) - 1))


class _SdkCheck:
    """Validate contexts against the official SDK request types (strictly: no undeclared
    key, no missing Required key, no stray None) when the SDK is installed."""

    def __init__(self, format_name: str) -> None:
        self.format_name: str | None = None
        if format_name in SDK_FORMATS:
            try:
                request_type(format_name)
                self.format_name = format_name
            except MissingExtraError:
                self.format_name = None

    def problem(self, messages: list[dict[str, Any]]) -> str | None:
        if self.format_name is None:
            return None
        problems = sdk_problems(self.format_name, messages)
        return f"SDK type check: {problems[0]}" if problems else None


class _RealTokens:
    """The provider's token count of any context, learnt from the transcript's usage."""

    def __init__(self, transcript: Transcript, estimates: list[int]) -> None:
        self.real: list[float | None] = [None] * len(transcript.messages)
        # Content the provider counted that the messages do not show (reminders a client
        # adds, reasoning it keeps or drops), as (from message index, tokens) steps.
        self.hidden: list[tuple[int, float]] = []
        calls = [(i, u) for i, u in enumerate(transcript.usage) if u is not None]
        self.overhead: float | None = None
        self.ratio = 1.0
        if not calls:
            return
        boundaries = sorted(b.first_kept_index for b in transcript.boundaries)
        growth_real = growth_est = 0.0
        previous_index, previous_usage = calls[0]
        for index, usage in calls[1:]:
            if any(previous_index < b <= index for b in boundaries):
                previous_index, previous_usage = index, usage
                continue
            span = range(previous_index, index)
            est = sum(estimates[k] for k in span)
            grown = usage - previous_usage
            share = min(MAX_FACTOR, max(MIN_FACTOR, grown / est)) if est > 0 else 0.0
            for k in span:
                self.real[k] = estimates[k] * share
            if grown - est * share:
                self.hidden.append((index, grown - est * share))
            if est > 0 and MIN_FACTOR <= grown / est <= MAX_FACTOR:
                growth_real += grown
                growth_est += est
            previous_index, previous_usage = index, usage
        self.ratio = growth_real / growth_est if growth_est else 1.0
        # The first call's excess over its messages is the fixed overhead (system prompt
        # and tool definitions).
        first_index, first_usage = calls[0]
        self.overhead = max(0.0, first_usage - self.ratio * sum(estimates[:first_index]))
        for k in range(len(self.real)):
            if self.real[k] is None:
                self.real[k] = estimates[k] * self.ratio

    @property
    def known(self) -> bool:
        return self.overhead is not None

    def of(self, context: ActiveContext, index_of_seq: dict[int, int], at: int) -> int:
        """Real prompt size of a context of ours, for the call producing message ``at``."""
        assert self.overhead is not None
        # Hidden content the client dropped again cannot make the prompt smaller than shown.
        total = self.overhead + max(
            0.0, sum(tokens for index, tokens in self.hidden if index <= at)
        )
        for item in context.items:
            source = index_of_seq.get(item.seq) if item.seq is not None else None
            if source is not None and item.state in ("original", "pinned"):
                real = self.real[source]
                total += real if real is not None else item.tokens * self.ratio
            else:
                total += item.tokens * self.ratio
        return max(0, round(total))


def simulate(
    path: str | Path,
    *,
    window: int = 200_000,
    format: str | None = None,
    config: CompactionConfig | None = None,
    progress: Progress | None = None,
    on_compaction: Callable[[CompactionEvent], None] | None = None,
    use_usage: bool = True,
) -> SimulationReport:
    """Replay a transcript file (any format ``import`` reads) and measure compaction.

    With ``use_usage`` (the default) the provider's counts in the transcript drive
    ``record_usage`` and the real prompt size decides when the context does not fit;
    without it the store's own estimate of the messages does.
    """
    transcript = read_transcript(path, format=format)
    return simulate_transcript(
        transcript,
        name=str(path),
        window=window,
        config=config,
        progress=progress,
        on_compaction=on_compaction,
        use_usage=use_usage,
    )


def simulate_transcript(
    transcript: Transcript,
    *,
    name: str = "transcript",
    window: int = 200_000,
    config: CompactionConfig | None = None,
    progress: Progress | None = None,
    on_compaction: Callable[[CompactionEvent], None] | None = None,
    store: CompactStore | None = None,
    use_usage: bool = True,
    calibrate: bool = True,
) -> SimulationReport:
    """Replay an already-read transcript into a fresh session (a temporary SQLite file
    unless ``store`` is given) and measure every model call."""
    import time

    began = time.perf_counter()
    with ExitStack() as stack:
        if store is None:
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="compactstore-sim-"))
            opened = stack.enter_context(CompactStore.open(Path(tmp) / "simulate.db"))
            sid = "simulate-1"
        else:
            taken = {info.id for info in store.sessions()}
            sid = next(f"simulate-{n}" for n in itertools.count(len(taken) + 1)
                       if f"simulate-{n}" not in taken)  # fmt: skip
            # Built apart and copied into the store when complete: a run that is stopped
            # (Ctrl-C, kill, a full disk) leaves no half session there.
            opened = stack.enter_context(staging(store))
        if not use_usage:
            transcript = replace(transcript, usage=[None] * len(transcript.usage))
        replay = _Replay(transcript, name, sid, window, config, opened, progress, on_compaction)
        replay.calibrate = calibrate
        report = replay.run()
    _reference_agreement(report, transcript, config)
    report.seconds = time.perf_counter() - began
    return report


class _Replay:
    def __init__(
        self,
        transcript: Transcript,
        name: str,
        sid: str,
        window: int,
        config: CompactionConfig | None,
        store: CompactStore,
        progress: Progress | None,
        on_compaction: Callable[[CompactionEvent], None] | None,
    ) -> None:
        self.t = transcript
        self.fmt = get_format(transcript.format)
        self.window = window
        self.progress = progress
        self.on_compaction = on_compaction
        first = next((ts for ts in transcript.timestamps if ts is not None), 0.0)
        self.now = first
        self.sess: Session = store.session(
            sid,
            context_window=window,
            format=transcript.format,
            config=config or CompactionConfig(),
            now=first,
        )
        self.count = store.token_counter
        self.estimates = [self.count(self.fmt.token_text(m)) for m in transcript.messages]
        self.real = _RealTokens(transcript, self.estimates)
        self.report = SimulationReport(
            file=name,
            source=transcript.source,
            format=transcript.format,
            window=window,
            messages=len(transcript.messages),
            calls=0,
        )
        self.report.overhead_tokens = (
            None if self.real.overhead is None else round(self.real.overhead)
        )
        self.report.freed = dict.fromkeys(_STAGE_KEYS, 0)
        self.sdk = _SdkCheck(transcript.format)
        self.report.sdk_checked = self.sdk.format_name is not None
        self.index_of_seq: dict[int, int] = {}
        self.request: dict[str, Any] | None = None
        self.tool_names: dict[str, str] = {}
        self.appended_since_auto: int | None = None
        self.file_mentions: dict[str, int] = {}
        # Whether the agent reports the provider's counts (record_usage) after each call.
        self.calibrate = True

    # -- the replay ---------------------------------------------------------------------

    def run(self) -> SimulationReport:
        total = len(self.t.messages)
        for index, message in enumerate(self.t.messages):
            stamp = self.t.timestamps[index]
            if stamp is not None and stamp >= self.now:
                self.now = stamp
            if self.fmt.kind(message) == "assistant":
                self._model_call(index)
            self._append(index, message)
            if self.progress is not None and (index % 25 == 0 or index == total - 1):
                self.progress(index + 1, total)
        return self.report

    def _append(self, index: int, message: dict[str, Any]) -> None:
        fmt = self.fmt
        for call in fmt.tool_calls(message):
            self.tool_names[call.id] = call.name
        results = fmt.tool_results(message)
        read_path = self.t.read_paths[index]
        if read_path is not None and len(results) == 1 and fmt.kind(message) == "tool":
            result = results[0]
            seq = self.sess.append_tool_result(
                result.tool_use_id,
                result.text,
                tool_name=self.tool_names.get(result.tool_use_id, "Read"),
                file_path=read_path,
                is_error=result.is_error,
                timestamp=self.now,
            )
            last = self.sess.context().kept[-1]
            if last.state == "deduplicated":
                saved = self.estimates[index] - last.tokens
                self.report.freed["read_dedup"] += max(0, saved)
        else:
            seq = self.sess.append(message, timestamp=self.now)
        self.index_of_seq[seq] = index
        # The user's real request: the first request that is not client noise, by checks
        # of the simulator's own (not the classifier under test).
        if self.request is None and fmt.is_request(message) and not is_noise(fmt.text(message)):
            self.request = message
        if self.appended_since_auto is not None:
            self.appended_since_auto += self.estimates[index]
        for path in self.t.write_paths[index]:
            self.sess.invalidate(path)

    def _model_call(self, index: int) -> None:
        report = self.report
        report.calls += 1
        result = self.sess.process_request(now=self.now)
        self._record(result, index)
        context = self.sess.context()
        real_size = self.real.of(context, self.index_of_seq, index) if self.real.known else None
        if real_size is not None:
            self._tokens(context, real_size)
        # Would the provider refuse it? Then recover as an agent would after the error.
        while (real_size if real_size is not None else context.usage) > self.window:
            report.reactive_calls += 1
            recovered = self.sess.reactive_recover("prompt is too long", now=self.now)
            if recovered is None:
                report.gave_up += 1
                break
            self._record(recovered, index)
            context = self.sess.context()
            real_size = self.real.of(context, self.index_of_seq, index) if self.real.known else None
        self._measure(context, real_size)

    def _record(self, result: CompactionResult, index: int) -> None:
        if result.id is None:
            return
        report = self.report
        for step in result.steps:
            if step.success:
                report.freed[step.strategy.value] = (
                    report.freed.get(step.strategy.value, 0) + step.tokens_freed
                )
        event = CompactionEvent(
            call=report.calls,
            message_index=index,
            trigger=result.trigger.value if result.trigger else "",
            strategy=result.strategy.value if result.strategy else "",
            tokens_before=result.tokens_before,
            tokens_after=result.tokens_after,
            messages_removed=len(result.removed_seqs),
            steps=[step.model_dump(mode="json") for step in result.steps],
        )
        report.compactions.append(event)
        if self.on_compaction is not None:
            self.on_compaction(event)
        cut = result.boundary is not None and result.success
        if cut and result.trigger is not None and result.trigger.value == "auto":
            share = result.tokens_after / self.window
            report.fit_after_auto_max = max(report.fit_after_auto_max or 0.0, share)
            if (
                self.appended_since_auto is not None
                and self.appended_since_auto < 0.1 * self.window
            ):
                report.loops += 1
            self.appended_since_auto = 0
        if cut:
            self._file_recall(result)
            self._handoff(result)

    def _handoff(self, result: CompactionResult) -> None:
        """After a cut: the summary's form, and what an agent needs still being there (in
        the summary, the kept messages or counted in its recall line), by the checks of
        summary_audit."""
        report = self.report
        assert result.boundary is not None
        summary = result.boundary.summary_text
        config = self.sess.config
        report.cuts += 1
        noise = audit.noise_lines(summary)
        report.noise_lines += len(noise)
        report.duplicate_files += audit.duplicate_files(audit.listed_files(summary))
        report.escaped_summaries += audit.escaped_newlines(summary)
        report.over_budget_summaries += estimate_tokens(summary) > config.summary_max_tokens
        context = self.sess.context()
        first_kept = context.first_kept_seq
        hay = "\n".join(audit.squash(self.fmt.text(item.message)) for item in context.items)
        spans = audit.recall_spans(summary)
        plan: list[str] | None = None
        last_text: str | None = None
        for seq in range(first_kept):
            index = self.index_of_seq.get(seq)
            if index is None:
                continue
            message = self.t.messages[index]
            if self.fmt.is_request(message) and not audit.is_noise(self.fmt.text(message)):
                report.instructions_due += 1
                said = audit.user_said(self.fmt.text(message))
                kept = audit.present(said, hay) or any(a <= seq <= b for a, b in spans)
                report.instructions_kept += kept
                if not kept:
                    self._example(f"instruction at seq {seq} missing: {said[:60]!r}")
            if self.fmt.kind(message) == "assistant":
                text = self.fmt.text(message).strip()
                last_text = text or last_text
                for call in self.fmt.tool_calls(message):
                    items = audit.pending_plan_items(call.name, call.input)
                    plan = items if items is not None else plan
        for item in plan or []:
            report.plan_items_due += 1
            kept = audit.present(item, hay)
            report.plan_items_kept += kept
            if not kept:
                self._example(f"plan item missing: {item[:60]!r}")
        if last_text is not None:
            report.last_text_due += 1
            kept = audit.present(last_text, hay)
            report.last_text_kept += kept
            if not kept:
                self._example(f"last assistant text missing: {last_text[:60]!r}")
        for line in noise:
            self._example(f"noise in summary: {line[:80]!r}")

    def _example(self, finding: str) -> None:
        if len(self.report.handoff_examples) < 5:
            self.report.handoff_examples.append(finding)

    def _file_recall(self, result: CompactionResult) -> None:
        removed: set[str] = set()
        for seq in result.removed_seqs:
            source = self.index_of_seq.get(seq)
            if source is not None:
                calls = self.fmt.tool_calls(self.t.messages[source])
                removed |= {path for call in calls for path, _ in file_actions(call)}
        if not removed:
            return
        text = "\n".join(json.dumps(m, ensure_ascii=False) for m in result.messages)
        self.report.files_removed += len(removed)
        self.report.files_recalled += sum(1 for path in removed if _named(path, text))

    def _measure(self, context: ActiveContext, real_size: int | None) -> None:
        report = self.report
        items = context.items
        messages = context.messages()
        problems = pairing_problems(items)
        sdk = self.sdk.problem(messages) if not problems else None
        if not problems and sdk is None:
            report.valid_calls += 1
        elif len(report.invalid_examples) < 5:
            report.invalid_examples.append(problems[0] if problems else str(sdk))
        usage = context.usage
        report.peak_usage = max(report.peak_usage, usage)
        report.fit_max = max(report.fit_max, usage / self.window)
        if self.request is None or self.request in messages:
            report.request_retained += 1
        if real_size is not None and self.calibrate:
            # As a live agent does with the API's answer (which records the model call).
            self.sess.record_usage(real_size, now=self.now)
        else:
            call = model_calls.ModelCall(context.last_seq, usage, real_size, self.now)
            self.sess.store._write(lambda c: model_calls.insert_calls(c, self.sess.id, [call]))

    def _tokens(self, context: ActiveContext, real: int) -> None:
        """The store's usage just before the call against the provider's real count."""
        report = self.report
        report.usage_calls += 1
        predicted = context.usage
        raw = sum(item.tokens for item in context.items)
        threshold = context.config.auto_compact_threshold * self.window
        if report.usage_calls > 2 and real > 0:
            report.usage_errors.append((predicted - real) / real)
            report.raw_errors.append((raw - real) / real)
        for limit, counts in (
            (threshold, report.missed_over_threshold),
            (self.window, report.missed_over_window),
        ):
            if real > limit:
                counts["calls"] += 1
                counts["calibrated"] += predicted < threshold
                counts["raw"] += raw < threshold


def _reference_agreement(
    report: SimulationReport, transcript: Transcript, config: CompactionConfig | None
) -> None:
    """Where the transcript's agent compacted vs where we did; and at each of its cuts, our
    summary of the same messages (``compact(up_to_seq=...)`` on a copy of the transcript)
    against its own: the file paths and quoted user messages its summary lists that ours
    names (our summary text only)."""
    ours = [
        e for e in report.compactions if e.messages_removed and e.trigger in ("auto", "reactive")
    ]
    for boundary in transcript.boundaries:
        nearest = min(
            ours, key=lambda e: abs(e.message_index - boundary.first_kept_index), default=None
        )
        report.reference_points.append(
            {
                "their_message_index": boundary.first_kept_index,
                "their_pre_tokens": boundary.tokens_before,
                "our_message_index": None if nearest is None else nearest.message_index,
                "our_tokens_before": None if nearest is None else nearest.tokens_before,
            }
        )
    if not transcript.boundaries:
        return
    with (
        tempfile.TemporaryDirectory(prefix="compactstore-reference-") as tmp,
        CompactStore.open(Path(tmp) / "reference.db") as store,
    ):
        copy = store.import_session(
            "reference",
            (
                ImportedMessage(message, timestamp)
                for message, timestamp in zip(
                    transcript.messages, transcript.timestamps, strict=True
                )
            ),
            format=transcript.format,
            config=config or CompactionConfig(),
        )
        _compare_summaries(report, transcript, copy)


def _compare_summaries(report: SimulationReport, transcript: Transcript, copy: Session) -> None:
    for boundary in transcript.boundaries:
        if boundary.first_kept_index < 1:
            continue
        stamp = boundary.timestamp if boundary.timestamp is not None else 0.0
        ours_text = copy.compact(up_to_seq=boundary.first_kept_index - 1, now=stamp).summary_text
        ours_squashed = audit.squash(ours_text)
        ours_paths = audit.paths_in(ours_text)
        theirs = [
            p for p in audit.paths_in(boundary.summary_text) if "/.claude/projects/" not in f"/{p}"
        ]
        report.reference_files += len(theirs)
        report.reference_files_named += sum(audit.path_named(p, ours_paths) for p in theirs)
        quoted = audit.quoted_user_messages(boundary.summary_text)
        report.reference_user_messages += len(quoted)
        report.reference_user_messages_named += sum(audit.present(q, ours_squashed) for q in quoted)


def _share(value: float | None) -> str:
    return "–" if value is None else f"{value:.1%}"


def summary_lines(report: SimulationReport) -> list[str]:
    """A readable summary of a report."""
    lines = [
        f"{report.file}: {report.source} ({report.format}), {report.messages} messages, "
        f"{report.calls} model calls, window {report.window:,}, {report.seconds:.1f} s",
        f"compactions: {len(report.compactions)}; peak usage {report.peak_usage:,} "
        f"({report.fit_max:.0%} of the window)",
        "tokens freed: " + ", ".join(f"{k} {v:,}" for k, v in report.freed.items() if v),
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
    lines.extend(f"handoff finding: {example}" for example in report.handoff_examples)
    for example in report.invalid_examples:
        lines.append(f"invalid context: {example}")
    return lines


def stage_rows(events: Iterable[CompactionEvent]) -> list[str]:
    """One line per compaction, for progress output."""
    return [
        f"call {e.call:>5}  {e.trigger:<19} {e.strategy:<15} "
        f"{e.tokens_before:>8,} → {e.tokens_after:>8,}  removed {e.messages_removed}"
        for e in events
    ]
