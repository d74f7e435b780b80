"""The replay itself: a transcript appended message by message into a fresh session as a
live agent would, every model call measured (see :mod:`compactstore._simulate`)."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any

from compactstore import _summary_audit as audit
from compactstore._context.active import ActiveContext
from compactstore._context.boilerplate import request_text
from compactstore._context.pairs import pairing_problems
from compactstore._context.tokens import estimate_tokens, message_tokens
from compactstore._core.checks import check_session_id
from compactstore._engines.summary import budget_for, file_actions
from compactstore._importers import Transcript, read_transcript
from compactstore._scratch import scratch_dir
from compactstore._simulate.cost import CacheMeter, PrefixChain, transcript_cost
from compactstore._simulate.real_tokens import RealTokens
from compactstore._simulate.recall_check import RecallCheck
from compactstore._simulate.reference import reference_agreement
from compactstore._simulate.report import (
    STAGE_KEYS,
    CompactionEvent,
    SimulationReport,
    floor_line,
)
from compactstore._store.store import CompactStore, Session
from compactstore.db import model_calls
from compactstore.errors import ConflictError, InvalidInputError, MissingExtraError
from compactstore.formats import get_format
from compactstore.formats.sdk_types import SDK_FORMATS, request_type, sdk_problems
from compactstore.models import CompactionConfig, CompactionResult
from compactstore.transfer import staging

__all__ = ["Progress", "simulate", "simulate_transcript"]

Progress = Callable[[int, int], None]


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


def simulate(
    path: str | Path,
    *,
    window: int = 200_000,
    format: str | None = None,
    config: CompactionConfig | None = None,
    progress: Progress | None = None,
    on_compaction: Callable[[CompactionEvent], None] | None = None,
    use_usage: bool = True,
    force: bool = False,
    model: str | None = None,
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
        force=force,
        model=model,
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
    session_id: str | None = None,
    force: bool = False,
    model: str | None = None,
) -> SimulationReport:
    """Replay an already-read transcript into a fresh session (a temporary SQLite file
    unless ``store`` is given) and measure every model call.

    Its cost (compactstore._simulate.cost) is priced at ``model``'s prices, by default the
    model the transcript's usage names most often, with the store's prices: under the
    store's policy, with compaction off (when that fits the window) and, where the
    transcript recorded usage, as it recorded it.

    The session kept in ``store`` is ``session_id``, by default the first free
    ``simulate-N``; the report's ``session`` names it.

    A window smaller than what the transcript needs before any compaction (the first model
    call's prompt: system prompt, tools and the opening messages, which compaction keeps)
    cannot be met by compacting: that is refused before replaying, unless ``force``.

    Raises:
        InvalidInputError: ``session_id`` without ``store``, or not a valid session id;
            the window is below what the transcript needs (without ``force``).
        ConflictError: ``store`` already has ``session_id``.
    """
    import time

    began = time.perf_counter()
    with ExitStack() as stack:
        if store is None:
            if session_id is not None:
                raise InvalidInputError("a session id names the session kept in a store: give one")
            tmp = stack.enter_context(scratch_dir("compactstore-sim-"))
            opened = stack.enter_context(CompactStore.open(Path(tmp) / "simulate.db"))
            sid = "simulate-1"
        else:
            taken = {info.id for info in store.sessions()}
            if session_id is not None:
                sid = check_session_id(session_id)
                if sid in taken:
                    raise ConflictError(
                        f"session {sid!r} already exists in {store.location}; simulate into "
                        f"a new session id"
                    )
            else:
                sid = next(f"simulate-{n}" for n in itertools.count(len(taken) + 1)
                           if f"simulate-{n}" not in taken)  # fmt: skip
            # Built apart and copied into the store when complete: a run that is stopped
            # (Ctrl-C, kill, a full disk) leaves no half session there.
            opened = stack.enter_context(staging(store))
        own = transcript_cost(transcript.ledgers, opened.prices, model)
        priced_model = model or _transcript_model(transcript)
        if not use_usage:
            transcript = replace(transcript, usage=[None] * len(transcript.usage))
        replay = _Replay(transcript, name, sid, window, config, opened, progress, on_compaction)
        replay.calibrate = calibrate
        if window < replay.report.needed_tokens and not force:
            raise InvalidInputError(
                floor_line(replay.report) + "; give a larger window, or force the replay"
            )
        replay.meters(priced_model)
        report = replay.run()
        report.transcript_cost_calls, report.transcript_cost_usd = own
        replay.close_meters()
        report.session = sid if store is not None else None
    reference_agreement(report, transcript, config)
    report.seconds = time.perf_counter() - began
    return report


def _transcript_model(transcript: Transcript) -> str | None:
    """The model the transcript's recorded usage names most often."""
    counts: dict[str, int] = {}
    for ledger in transcript.ledgers:
        if ledger is not None and ledger.model:
            counts[ledger.model] = counts.get(ledger.model, 0) + 1
    return max(counts, key=lambda m: counts[m]) if counts else None


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
            cwd=transcript.cwd,
        )
        self.count = store.token_counter
        self.estimates = [message_tokens(self.fmt, m, self.count) for m in transcript.messages]
        self.real = RealTokens(transcript, self.estimates)
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
        self.report.needed_tokens = self._needed()
        self.report.freed = dict.fromkeys(STAGE_KEYS, 0)
        self.sdk = _SdkCheck(transcript.format)
        self.report.sdk_checked = self.sdk.format_name is not None
        self.index_of_seq: dict[int, int] = {}
        self.request: dict[str, Any] | None = None
        self.tool_names: dict[str, str] = {}
        self.appended_since_auto: int | None = None
        self.file_mentions: dict[str, int] = {}
        # Whether the agent reports the provider's counts (record_usage) after each call.
        self.calibrate = True
        self.recall = RecallCheck(self.sess, self.fmt, self.report)
        # Cost (meters()): the policy's calls, and the transcript's with compaction off.
        self.policy_meter: CacheMeter | None = None
        self.off_meter: CacheMeter | None = None
        self.off_chain = PrefixChain()

    def _needed(self) -> int:
        """The first model call's prompt: the provider's count when the transcript has it,
        else the fixed overhead (when known) and the messages before the first reply."""
        messages = self.t.messages
        first = next(
            (i for i, m in enumerate(messages) if self.fmt.kind(m) == "assistant"), len(messages)
        )
        if first < len(messages) and self.t.usage[first] is not None:
            return int(self.t.usage[first] or 0)
        opening = sum(self.real.real[k] or self.estimates[k] for k in range(first))
        return round((self.real.overhead or 0.0) + opening)

    # -- the replay ---------------------------------------------------------------------

    def run(self) -> SimulationReport:
        total = len(self.t.messages)
        previous: str | None = None
        for index, message in enumerate(self.t.messages):
            stamp = self.t.timestamps[index]
            if stamp is not None and stamp >= self.now:
                self.now = stamp
            kind = self.fmt.kind(message)
            # One model call per turn: in a format whose turn is several items (responses:
            # reasoning, text, calls), the call comes before the first of them.
            if kind == "assistant" and not (self.fmt.groups_turns and previous == "assistant"):
                self._model_call(index)
            previous = kind
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
            message = last.message  # as stored: built by the format, or a dedup stub
        else:
            seq = self.sess.append(message, timestamp=self.now)
        self.index_of_seq[seq] = index
        self.recall.appended(seq, message)
        # The user's real request: the first request a person typed something in, by the
        # classifier the store pins it with and the summary quotes it by (one rule for what
        # the request is; summary_audit's own markers still check the summary's lines).
        if self.request is None and self._said(message):
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
        self._meter(context, index)

    # -- cost ---------------------------------------------------------------------------

    def meters(self, model: str | None) -> None:
        """Price the replay at ``model``'s prices (None: no cost)."""
        self.report.cost_model = model
        prices = self.sess.store.prices
        self.policy_meter = CacheMeter(model, prices) if model is not None else None
        self.off_meter = CacheMeter(model, prices) if model is not None else None
        self.off_chain = PrefixChain()
        self.off_chain.add(("overhead",), self._overhead())

    def _overhead(self) -> int:
        return round(self.real.overhead) if self.real.overhead is not None else 0

    def _real(self, index: int) -> int:
        real = self.real.real[index]
        return round(real) if real is not None else self.estimates[index]

    def _meter(self, context: ActiveContext, index: int) -> None:
        """The call producing message ``index``: through the policy's cache and, with
        compaction off, the whole transcript so far through another."""
        ledger = self.t.ledgers[index] if index < len(self.t.ledgers) else None
        output = ledger.output_tokens if ledger is not None else self.estimates[index]
        chain = self.off_chain
        while len(chain.hashes) <= index:  # units: the overhead, then messages 0..index-1
            k = len(chain.hashes) - 1
            chain.add(k, self._real(k))
        self.report.off_peak_tokens = max(self.report.off_peak_tokens, chain.cumulative[index])
        if self.policy_meter is None or self.off_meter is None:
            return
        units: list[tuple[Any, int]] = [(("overhead",), self._overhead())]
        for item in context.items:
            source = self.index_of_seq.get(item.seq) if item.seq is not None else None
            if source is not None and item.state in ("original", "pinned"):
                units.append((source, self._real(source)))
            else:
                units.append(
                    ((item.seq, item.state, item.tokens), round(item.tokens * self.real.ratio))
                )
        self.policy_meter.call(units, self.now, output)
        self.off_meter.call_prefixes(
            chain.hashes[: index + 1], chain.cumulative[: index + 1], self.now, output
        )

    def close_meters(self) -> None:
        report, policy, off = self.report, self.policy_meter, self.off_meter
        if policy is None or off is None:
            return
        report.cost_usd, report.cache_read_share = policy.cost_usd, policy.cache_read_share
        if report.off_peak_tokens <= self.window:
            report.cost_off_usd = off.cost_usd
            report.cache_read_share_off = off.cache_read_share

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
        self.recall.check(result)
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
        context = self.sess.context()
        report.cuts += 1
        noise = audit.noise_lines(summary)
        report.noise_lines += len(noise)
        report.duplicate_files += audit.duplicate_files(audit.listed_files(summary), self.t.cwd)
        report.escaped_summaries += audit.escaped_newlines(summary)
        report.over_budget_summaries += estimate_tokens(summary) > budget_for(context)
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
            said = self._said(message)
            if said:
                report.instructions_due += 1
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

    def _said(self, message: dict[str, Any]) -> str:
        """What a person typed in ``message`` when it is a request ("" otherwise)."""
        if not self.fmt.is_request(message):
            return ""
        return request_text(self.fmt.text_parts(message), self.sess.config.boilerplate_patterns)

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
            self.sess.store.write(lambda c: model_calls.insert_calls(c, self.sess.id, [call]))

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
