"""Stage 6b, full compact (SPEC §5.6): a rule-based structured summary, no LLM needed.

The summary keeps the original request verbatim, topics, tools used, files touched and
errors, and is cumulative: the previous boundary's summary state is folded in, so the
original request and the file list survive any number of compactions. The newest third
of the kept messages (at most ``full_compact_max_tail_messages``) stays verbatim; the cut
moves so no tool call is separated from its result. A ``summarizer`` may write the text
instead; when it raises, the rule-based summary is used and the step says why.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from compactstore.boilerplate import request_text
from compactstore.context import ActiveContext, ContextMessage, legal_cuts
from compactstore.engines.base import Cut, EngineInputs, StageResult, nearest_legal_cut
from compactstore.errors import SummarizerError
from compactstore.formats import ToolCall
from compactstore.models import CompactionConfig, CompactStrategy, CompactTrigger, SummaryState

__all__ = [
    "PATH_PATTERN",
    "continuing",
    "files_of",
    "fold_state",
    "original_request",
    "render_files",
    "render_state",
    "run",
    "summarise",
]

# Tool-call input keys that name a file the tool read or wrote.
FILE_KEYS = ("file_path", "path", "filePath", "notebook_path", "filename", "file")


def original_request(context: ActiveContext) -> str | None:
    """What the user asked: the real request (the first user message that is not client
    boilerplate, pinned at insert), boilerplate removed; None before it was appended."""
    for item in context.items:
        if item.seq is not None and item.seq == context.real_request_seq:
            text = request_text(context.fmt.text(item.message), context.config.boilerplate_patterns)
            return text or None
    return None


# A path-like token inside a command or pattern: a directory part and a file extension.
PATH_PATTERN = re.compile(
    r"(?<![\w/.-])(?:\.{1,2}/|/)?(?:[\w@+-][\w.@+-]*/)+[\w@+-][\w.@+-]*\.[A-Za-z0-9]{1,8}"
)


def files_of(calls: Iterable[ToolCall]) -> list[str]:
    """Files that tool calls name: file arguments, and paths inside commands."""
    files: list[str] = []
    for call in calls:
        arguments: Any = call.input
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                arguments = {"command": arguments}
        if not isinstance(arguments, dict):
            continue
        for key in FILE_KEYS:
            value = arguments.get(key)
            if isinstance(value, str) and value.strip():
                files.append(value.strip())
        for key, value in arguments.items():
            if key not in FILE_KEYS and isinstance(value, str):
                files.extend(match.group(0) for match in PATH_PATTERN.finditer(value))
    return files


def _is_error(text: str, flagged: bool) -> bool:
    return flagged or text.startswith("Error: ")


# Tokens a new summary is expected to add on top of the previous one.
_SUMMARY_ALLOWANCE = 1_000


def continuing(state: SummaryState) -> SummaryState:
    """The state to fold into when a second cut continues the same compaction call."""
    return state.model_copy(update={"compactions": max(0, state.compactions - 1)})


def fold_state(
    previous: SummaryState,
    removed: Sequence[ContextMessage],
    context: ActiveContext,
) -> SummaryState:
    """The summary state after summarising ``removed`` on top of ``previous``."""
    config = context.config
    fmt = context.fmt
    request = original_request(context) or previous.original_request
    topics = list(previous.topics)
    tools = set(previous.tools)
    files = list(previous.files)
    errors = list(previous.errors)
    for item in removed:
        if fmt.is_request(item.message):
            said = request_text(fmt.text(item.message), config.boilerplate_patterns)
            text = " ".join(said.split())
            if text and text != " ".join((request or "").split()):
                topics.append(text[: config.summary_topic_chars])
        for call in item.calls:
            tools.add(call.name)
        for path in files_of(item.calls):
            if path in files:
                files.remove(path)
            files.append(path)  # newest last
        for result in item.results:
            if _is_error(result.text, result.is_error):
                errors.append(" ".join(result.text.split())[: config.summary_error_chars])
    return SummaryState(
        original_request=request,
        topics=tuple(topics[-config.summary_max_topics :] if config.summary_max_topics else ()),
        tools=tuple(sorted(tools)),
        files=tuple(
            files[-(config.summary_max_files + config.summary_max_earlier_files) :]
            if config.summary_max_files
            else ()
        ),
        errors=tuple(errors[-config.summary_max_errors :] if config.summary_max_errors else ()),
        compactions=previous.compactions + 1,
        messages_removed=previous.messages_removed + len(removed),
    )


def render_state(state: SummaryState, config: CompactionConfig) -> str:
    """The sections of a rule-based summary, without its header line."""
    parts = [
        f"Summary of the conversation so far ({state.messages_removed} earlier messages "
        f"summarised over {state.compactions} compactions)."
    ]
    request = state.original_request
    if request:
        parts.append("## Original request\n" + request[: config.summary_request_chars])
    if state.topics:
        parts.append("## Topics discussed\n" + "\n".join(f"- {t}" for t in state.topics))
    if state.tools:
        parts.append("## Tools used\n" + ", ".join(state.tools))
    parts.extend(render_files(state, config))
    if state.errors:
        parts.append("## Errors encountered\n" + "\n".join(f"- {e}" for e in state.errors))
    return "\n\n".join(parts)


def render_files(state: SummaryState, config: CompactionConfig) -> list[str]:
    """The files sections: the newest ten as a list, older ones on one line."""
    files = state.files
    if not files or not config.summary_max_files:
        return []
    newest = files[-config.summary_max_files :]
    earlier = files[: -config.summary_max_files]
    parts = ["## Files touched\n" + "\n".join(f"- {f}" for f in newest)]
    if earlier:
        parts.append("## Earlier files\n" + ", ".join(earlier))
    return parts


def header(label: str, now: float) -> str:
    stamp = datetime.fromtimestamp(now, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return f"[Context compacted at {stamp} — {label}]"


def summarise(
    context: ActiveContext,
    inputs: EngineInputs,
    removed: Sequence[ContextMessage],
    state: SummaryState,
    label: str,
) -> tuple[str, str]:
    """Summary text for a cut, and a note on how it was made (empty when rule-based)."""
    rule_text = (
        f"{header(label, inputs.now)}\n\n{render_state(state, context.config)}\n\n"
        "Continue from where we left off."
    )
    if inputs.summarizer is None:
        return rule_text, ""
    previous = context.boundary.summary_text if context.boundary is not None else None
    try:
        # Copies: a summarizer that changes what it is given must not change the context.
        messages = [item.copy_message() for item in removed]
        text = inputs.summarizer(messages, previous, inputs.instructions)
    except SummarizerError:
        raise
    except Exception as exc:  # a failing summarizer must never lose the compaction
        return (
            rule_text,
            f"summarizer failed ({type(exc).__name__}: {exc}); used the rule-based summary",
        )
    if not isinstance(text, str) or not text.strip():
        return rule_text, "summarizer returned no text; used the rule-based summary"
    return text, "summary written by the summarizer"


def run(
    context: ActiveContext,
    inputs: EngineInputs,
    *,
    trigger: CompactTrigger,
    up_to_seq: int | None = None,
) -> StageResult:
    """Summarise the older part of the kept messages (or those up to ``up_to_seq``)."""
    config = context.config
    kept = context.kept
    before = context.usage
    strategy = CompactStrategy.FULL if up_to_seq is None else CompactStrategy.PARTIAL
    if up_to_seq is None:
        tail = max(
            1,
            min(
                config.full_compact_max_tail_messages,
                int(len(kept) * config.full_compact_keep_fraction),
            ),
        )
        target = len(kept) - tail
        kept_tokens = context.factor * sum(item.tokens for item in kept)
        # Everything that stays besides the tail: overhead, pins, and the summary (the
        # previous one, already in the head, plus what this compaction adds to it).
        fixed = context.usage - kept_tokens + _SUMMARY_ALLOWANCE
        budget = config.full_compact_target_share * context.context_window - fixed
        tail_tokens = context.factor * sum(item.tokens for item in kept[target:])
        while target < len(kept) - 1 and tail_tokens > budget:
            tail_tokens -= context.factor * kept[target].tokens
            target += 1
    else:
        target = next(
            (i for i, item in enumerate(kept) if item.seq is not None and item.seq > up_to_seq),
            len(kept),
        )
    # A full compact keeps at least the newest message and at most max_tail_messages unless
    # a pair forces more; a partial one may take all it names.
    highest = len(kept) - 1 if up_to_seq is None else len(kept)
    lowest = len(kept) - config.full_compact_max_tail_messages if up_to_seq is None else 1
    cut = nearest_legal_cut(legal_cuts(kept), target, highest=highest, lowest=lowest)
    removed = [item for item in kept[:cut] if not item.pinned] if cut else []
    if cut is None or not removed:
        return StageResult(
            strategy=strategy,
            trigger=trigger,
            applied=False,
            context=context,
            tokens_before=before,
            tokens_after=before,
            detail="nothing to compact: no legal cut removes a message",
        )
    state = fold_state(inputs.summary_state, removed, context)
    label = "Full Compact" if up_to_seq is None else f"Partial Compact up to seq {up_to_seq}"
    text, note = summarise(context, inputs, removed, state, label)
    after = context.cut(cut, text)
    success = after.usage < before
    return StageResult(
        strategy=strategy,
        trigger=trigger,
        applied=success,
        context=after if success else context,
        tokens_before=before,
        tokens_after=after.usage if success else before,
        cut=Cut.of(after, removed, text, state) if success else None,
        detail=note if success else "the summary is not smaller than what it replaces",
    )
