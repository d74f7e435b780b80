"""What the commands print: text tables and JSON documents built from library objects.

Every function here is pure (no database, no click, no terminal): it takes what a command
read and returns lines or a JSON-ready dict, so the output is testable without a runner.
The JSON shapes are documented in :mod:`compactstore._cli`.
"""

from __future__ import annotations

import difflib
import json
import unicodedata
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from compactstore._context.media import shown_text
from compactstore.models import (
    CompactBoundary,
    CompactionResult,
    CompactStrategy,
    EditState,
    SessionInfo,
)

if TYPE_CHECKING:
    from compactstore._context.active import ActiveContext, ContextMessage

__all__ = [
    "boundary_json",
    "compaction_json",
    "describe",
    "display_width",
    "edit_state_json",
    "edit_state_lines",
    "history_lines",
    "json_text",
    "one_line",
    "plural",
    "preview",
    "ranges",
    "replay_diff",
    "rolled_back_lines",
    "sessions_lines",
    "show_json",
    "show_lines",
    "usage_of",
    "utc",
]

PREVIEW_CHARS = 72


def json_text(data: Any) -> str:
    """The one way commands print JSON: indented, UTF-8 as is, stable key order."""
    return json.dumps(data, ensure_ascii=False, indent=2, default=str)


def one_line(message: str) -> str:
    """An error message on one line (drivers' messages may span several)."""
    return " ".join(part.strip() for part in message.splitlines() if part.strip())


def plural(count: int, noun: str, plural_form: str | None = None) -> str:
    """``1 message``, ``2 messages``, ``1 boundary``, ``3 boundaries`` (with thousands
    separators)."""
    if count == 1:
        return f"1 {noun}"
    if plural_form is None:
        consonant_y = noun.endswith("y") and noun[-2:-1] not in ("a", "e", "o", "u")
        plural_form = noun[:-1] + "ies" if consonant_y else noun + "s"
    return f"{count:,} {plural_form}"


def utc(timestamp: float | None) -> str:
    """A Unix time as ``YYYY-MM-DD HH:MM:SS`` in UTC, ``-`` for none."""
    if timestamp is None:
        return "-"
    return datetime.fromtimestamp(timestamp, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")


def ranges(seqs: Iterable[int]) -> str:
    """1, 2, 3, 5, 7, 8 -> '1-3, 5, 7-8'."""
    runs: list[list[int]] = []
    for seq in sorted(set(seqs)):
        if runs and seq == runs[-1][1] + 1:
            runs[-1][1] = seq
        else:
            runs.append([seq, seq])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs) or "-"


def preview(text: str, width: int = PREVIEW_CHARS) -> str:
    """The text on one line, cut to ``width`` characters with an ellipsis."""
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def _kept(segment: tuple[int, int] | None) -> str:
    return "nothing" if segment is None else f"seq {segment[0]}-{segment[1]}"


# -- sessions and the active context --------------------------------------------------------


def display_width(text: str) -> int:
    """Columns ``text`` takes on a terminal: wide (CJK) characters take two, combining
    marks none."""
    return sum(
        0 if unicodedata.combining(ch) else 2 if unicodedata.east_asian_width(ch) in "WF" else 1
        for ch in text
    )


def _pad(text: str, width: int, *, right: bool = False) -> str:
    """``text`` padded with spaces to ``width`` terminal columns."""
    fill = " " * max(width - display_width(text), 0)
    return fill + text if right else text + fill


def sessions_lines(infos: Iterable[SessionInfo]) -> list[str]:
    """The `sessions` table, its columns as wide as their widest value (on a terminal: wide
    characters count twice), so long and CJK ids keep the columns aligned."""
    rows = [
        (info.id, info.format, f"{info.context_window:,}", f"{info.message_count:,}")
        for info in infos
    ]
    header = ("session", "format", "window", "messages")
    widths = [max(display_width(row[i]) for row in (header, *rows)) for i in range(4)]

    def line(row: tuple[str, str, str, str]) -> str:
        return "  ".join(
            (
                _pad(row[0], widths[0]),
                _pad(row[1], widths[1]),
                _pad(row[2], widths[2], right=True),
                _pad(row[3], widths[3], right=True),
            )
        )

    return [line(header), *(line(row) for row in rows)]


def _tail(context: ActiveContext, limit: int | None) -> tuple[ContextMessage, ...]:
    """The newest ``limit`` items of the context (all of them for None or 0)."""
    return context.items[-limit:] if limit else context.items


def show_json(
    context: ActiveContext,
    *,
    full: bool,
    limit: int | None = None,
    state: EditState | None = None,
) -> dict[str, Any]:
    """The `show --json` document of an active context: totals of the whole context, the
    session's edit state when given, and its newest ``limit`` messages (all of them for
    None)."""
    shown = _tail(context, limit)
    extra = {} if state is None else {"edit_state": edit_state_json(state)}
    return {
        "session": context.session_id,
        "format": context.fmt.name,
        "context_window": context.context_window,
        "usage": context.usage,
        "boundary_id": context.boundary.id if context.boundary is not None else None,
        **extra,
        "message_count": len(context.items),
        "not_shown": len(context.items) - len(shown),
        "messages": [_message_json(context, item, full=full) for item in shown],
    }


def _message_json(context: ActiveContext, item: ContextMessage, *, full: bool) -> dict[str, Any]:
    text = _item_text(context, item)
    return {
        "seq": item.seq,
        "role": item.message.get("role"),
        "kind": item.kind,
        "tokens": item.tokens,
        "state": item.state,
        "text": text if full else preview(text),
        "message": item.message if full else None,
    }


def link_json(
    parent: str | None, tool_use_id: str | None, subagents: list[tuple[str, str | None]]
) -> dict[str, Any]:
    """A session's links to the session whose tool call started it, and to its subagents'."""
    return {
        "parent": None if parent is None else {"session": parent, "tool_use_id": tool_use_id},
        "subagents": [{"session": sid, "tool_use_id": call} for sid, call in subagents],
    }


def link_lines(
    parent: str | None, tool_use_id: str | None, subagents: list[tuple[str, str | None]]
) -> list[str]:
    """One line naming the session whose tool call started this one, one per subagent."""

    def call(call_id: str | None) -> str:
        return f"tool call {call_id}" if call_id else "a tool call the transcript does not name"

    lines = (
        [] if parent is None else [f"subagent of session {parent}, started by {call(tool_use_id)}"]
    )
    lines += [f"subagent session {sid}, started by {call(call_id)}" for sid, call_id in subagents]
    return lines


def _item_text(context: ActiveContext, item: ContextMessage) -> str:
    """A context message's text as `show` prints it: a provider's compaction block (whose
    text the format does not count as prose) as ``[provider compaction]`` and its readable
    text, or a note for an opaque one."""
    text = shown_text(context.fmt.token_text(item.message), item.message)
    content = item.message.get("content")
    if isinstance(content, (list, tuple)):
        for block in content:
            if isinstance(block, Mapping) and block.get("type") == "compaction":
                readable = block.get("content")
                body = readable if isinstance(readable, str) and readable else "(opaque)"
                text = "\n".join(p for p in (f"[provider compaction] {body}", text) if p)
    return text


def show_lines(
    context: ActiveContext,
    *,
    full: bool,
    limit: int | None = None,
    state: EditState | None = None,
) -> list[str]:
    """The `show` table: a heading with the whole context's totals (and the session's edit
    state when given), a line saying how many older messages are left out, then one row per
    shown message (and its whole text if full).
    """
    items = context.items
    shown = _tail(context, limit)
    boundary = "no boundary" if context.boundary is None else f"boundary {context.boundary.id}"
    share = context.usage / context.context_window
    lines = [
        f"session {context.session_id} ({context.fmt.name}): {plural(len(items), 'message')}, "
        f"{context.usage:,} of {context.context_window:,} tokens ({share:.0%}), {boundary}"
    ]
    if state is not None and _worth_saying(state):
        lines.extend(edit_state_lines(state))
    if len(shown) < len(items):
        lines.append(
            f"{plural(len(items) - len(shown), 'older message')} not shown "
            f"(newest {len(shown):,}; --all shows every one)"
        )
    lines.append(f"{'seq':>6}  {'role':<11}  {'tokens':>7}  {'state':<12}  content")
    for item in shown:
        # Images and documents as markers: [image png 1000×800, 80 kB].
        text = _item_text(context, item)
        seq = "-" if item.seq is None else str(item.seq)
        role = str(item.message.get("role", item.kind))
        row = f"{seq:>6}  {role:<11}  {item.tokens:>7,}  {item.state:<12}"
        if full:
            lines.append(row.rstrip())
            lines.extend(f"{'':>8}{line}".rstrip() for line in text.splitlines())
        else:
            lines.append(f"{row}  {preview(text)}")
    return lines


# -- compactions ----------------------------------------------------------------------------


def compaction_json(result: CompactionResult) -> dict[str, Any]:
    """A CompactionResult without its messages, plus ``effective``."""
    return {**result.model_dump(mode="json", exclude={"messages"}), "effective": result.effective}


def _why_not(result: CompactionResult) -> str:
    """Why a compaction call did not compact, from its error and its failed stages."""
    reasons = [step.detail for step in result.steps if not step.success and step.detail]
    if result.error:
        reasons.insert(0, result.error)
    return "; ".join(reasons) or "nothing to compact"


def describe(result: CompactionResult) -> str:
    """One sentence about a compaction call's result."""
    head = "" if result.id is None else f"compaction {result.id}: "
    if result.strategy is None or not result.success:
        what = "" if result.strategy is None else f"{result.strategy.value} "
        trigger = f"({result.trigger.value}) " if result.trigger is not None else ""
        return f"{head}{what}{trigger}compacted nothing: {_why_not(result)}"
    trigger = result.trigger.value if result.trigger is not None else "-"
    text = (
        f"{head}{result.strategy.value} ({trigger}) freed {result.tokens_freed:,} tokens "
        f"({result.tokens_before:,} → {result.tokens_after:,})"
    )
    if result.boundary is not None:
        boundary = result.boundary
        name = "boundary" if boundary.id is None else f"boundary {boundary.id}"
        text += (
            f"; {name} summarised {plural(boundary.messages_removed, 'message')} and keeps "
            f"{_kept(boundary.preserved_segment)}"
        )
    return text


def edit_state_json(state: EditState) -> dict[str, Any]:
    """The ``edit_state`` of `history --json` and `show --json`."""
    return state.model_dump(mode="json")


def edit_state_lines(state: EditState) -> list[str]:
    """The session's model, edit policy, thinking binding and the thinking blocks the API
    dropped, as `history` and `show` print them above their tables."""
    policy = state.edit_policy
    if policy == "auto":
        why = "checks" if state.prefix_checks else "does not check"
        policy = f"auto → {state.effective_policy} (the model {why} thinking prefixes)"
    binding = (
        "none"
        if state.thinking_binding is None
        else f"{state.thinking_binding} since {utc(state.thinking_binding_at)} UTC"
    )
    lines = [
        f"model: {state.model or 'unknown'} · edit policy: {policy} · thinking binding: {binding}"
    ]
    if state.dropped:
        calls = ", ".join(f"seq {d.call_seq}: {d.count:,}" for d in state.dropped)
        lines.append(
            f"thinking blocks the API dropped: {state.dropped_total:,} in "
            f"{plural(len(state.dropped), 'model call')} ({calls})"
        )
    else:
        lines.append("thinking blocks the API dropped: 0")
    return lines


def _worth_saying(state: EditState | None) -> bool:
    """Whether the text tables print the edit state: a session with no model, the default
    policy, no thinking binding and no dropped block has nothing to say (the policy of each
    compaction is in its row)."""
    return state is not None and bool(
        state.model or state.edit_policy != "auto" or state.thinking_binding or state.dropped
    )


def history_lines(compactions: list[CompactionResult], state: EditState | None = None) -> list[str]:
    """The history table: one row per compaction (with the edit policy it ran under) and a
    line saying what was lost; with ``state``, the session's edit state above it."""
    heading = [*edit_state_lines(state), ""] if state is not None and _worth_saying(state) else []
    if not compactions:
        return [*heading, "no compactions recorded"]
    header = (
        f"{'id':>5}  {'time (UTC)':<19}  {'trigger':<19}  {'strategy':<14}  {'policy':<11}  "
        f"{'ok':<3}  "
        f"{'tokens before → after':>23}  {'freed':>8}  {'boundary':>8}  {'removed':>7}  "
        f"rolled back"
    )
    lines = [*heading, header]
    for c in compactions:
        boundary = c.boundary
        tokens = f"{c.tokens_before:,} → {c.tokens_after:,}"
        lines.append(
            f"{c.id if c.id is not None else '-':>5}  {utc(c.created_at):<19}  "
            f"{c.trigger.value if c.trigger else '-':<19}  "
            f"{c.strategy.value if c.strategy else '-':<14}  {c.edit_policy or '-':<11}  "
            f"{'yes' if c.success else 'no':<3}  "
            f"{tokens:>23}  {c.tokens_freed:>8,}  "
            f"{boundary.id if boundary is not None and boundary.id is not None else '-':>8}  "
            f"{boundary.messages_removed if boundary is not None else 0:>7}  "
            f"{utc(c.rolled_back_at) if c.rolled_back_at is not None else '-'}"
        )
        if c.strategy == CompactStrategy.READ_DEDUP and c.steps:
            lines.append(f"{'':>7}{c.steps[0].detail}")
            continue
        lost = [f"seqs {ranges(c.removed_seqs)}", _results_lost(c)]
        lost.append(f"blobs {', '.join(str(i) for i in c.blob_ids) or '-'}")
        detail = f"{'':>7}lost: {'; '.join(lost)}"
        if boundary is not None:
            detail += f"; kept {_kept(boundary.preserved_segment)}"
        if not c.success:
            detail += f"; failed: {preview(_why_not(c), 80)}"
        lines.append(detail)
    return lines


def _results_lost(result: CompactionResult) -> str:
    """How many tool results a compaction cleared and persisted (both in one figure for
    rows recorded before compactstore counted them apart)."""
    cleared, persisted = result.results_cleared, result.results_persisted
    if cleared is None or persisted is None:
        count = len(result.cleared_tool_use_ids)
        return f"{count} tool result{'' if count == 1 else 's'} cleared or persisted"
    return f"{cleared} tool result{'' if cleared == 1 else 's'} cleared, {persisted} persisted"


def rolled_back_lines(
    compactions: Iterable[CompactionResult], usage: int, window: int
) -> list[str]:
    """What a rollback undid, one line per compaction (by its boundary when it has one), and
    the active context's size afterwards."""
    lines = []
    for c in compactions:
        what = c.strategy.value if c.strategy is not None else "-"
        trigger = c.trigger.value if c.trigger is not None else "-"
        b = c.boundary
        if b is not None and b.id is not None:
            lines.append(
                f"rolled back boundary {b.id} ({b.strategy.value}, {b.trigger.value}, "
                f"{utc(b.timestamp)} UTC, {plural(b.messages_removed, 'message')} summarised; "
                f"compaction {c.id})"
            )
        else:
            lines.append(
                f"rolled back compaction {c.id} ({what}, {trigger}, {utc(c.created_at)} UTC, "
                f"{'failed' if not c.success else f'had freed {c.tokens_freed:,} tokens'})"
            )
    lines.append(f"active context: {usage_of(usage, window)}")
    return lines


def usage_of(usage: int, window: int) -> str:
    """``12,345 tokens (49% of the 25,000-token window)``."""
    share = usage / window if window else 0.0
    return f"{usage:,} tokens ({share:.0%} of the {window:,}-token window)"


def _boundary_lines(boundary: CompactBoundary | None) -> list[str]:
    if boundary is None:
        return ["(no boundary: the replay cut nothing)"]
    return [
        f"kept: {_kept(boundary.preserved_segment)}",
        f"messages removed: {boundary.messages_removed}",
        f"tokens: {boundary.tokens_before} → {boundary.tokens_after}",
        "summary:",
        *boundary.summary_text.splitlines(),
    ]


def replay_diff(recorded: CompactBoundary, replayed: CompactBoundary | None) -> str:
    """A unified diff of the recorded and the replayed summary and kept range ('' if equal)."""
    return "\n".join(
        difflib.unified_diff(
            _boundary_lines(recorded),
            _boundary_lines(replayed),
            fromfile=f"recorded (boundary {recorded.id})",
            tofile="replayed",
            lineterm="",
        )
    )


def boundary_json(boundary: CompactBoundary | None) -> dict[str, Any] | None:
    """What `replay --json` compares of a boundary."""
    if boundary is None:
        return None
    return {
        "kept": list(boundary.preserved_segment) if boundary.preserved_segment else None,
        "messages_removed": boundary.messages_removed,
        "tokens_before": boundary.tokens_before,
        "tokens_after": boundary.tokens_after,
        "summary_text": boundary.summary_text,
    }


# How a replay's summary was written (SummaryInfo.source), as `replay` says it.
SUMMARY_SOURCES = {
    "recorded": "the recorded text, reused",
    "rule": "rule-based",
    "summarizer": "written by the summarizer again",
}
