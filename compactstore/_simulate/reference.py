"""Agreement with the agent's own compactions: where it cut against where we did, and what
its summary lists that ours names when we cut at the same place."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compactstore import _summary_audit as audit
from compactstore._context.boilerplate import request_text
from compactstore._importers import Transcript
from compactstore._scratch import scratch_dir
from compactstore._simulate.report import SimulationReport
from compactstore._store.store import CompactStore, Session
from compactstore.formats import get_format
from compactstore.models import CompactionConfig, ImportedMessage

__all__ = ["AgentCut", "agent_cuts", "pending_tasks", "reference_agreement"]


def reference_agreement(
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
        scratch_dir("compactstore-reference-") as tmp,
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
        if transcript.cwd is not None:  # as an import does: summary paths relative to it
            copy = store.session("reference", cwd=transcript.cwd)
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


# -- what the agent kept at its own cuts ----------------------------------------------------


@dataclass
class AgentCut:
    """One compaction the agent did, against our summary of the same messages.

    ``kind``: ``"summary"`` (the agent's own summary: Claude Code's ``isCompactSummary``,
    an OpenHands condensation's) or ``"replacement_history"`` (what a Codex ``compacted``
    record kept). Each pair is (how many the agent's handoff has, how many of those ours
    has): files it names among those the tool calls before the cut touched, the user's
    messages it keeps, and the tasks
    it says are pending (Claude Code's "Pending Tasks" section; for Codex, the open items of
    the last ``update_plan`` before the cut).
    """

    file: str
    source: str  # the transcript's source (claude-code, codex, openhands, ...)
    kind: str
    cut: int  # index of the first message after the cut
    files: tuple[int, int] = (0, 0)
    user_messages: tuple[int, int] = (0, 0)
    tasks: tuple[int, int] = (0, 0)


_Cut = tuple[int, str, str | None, list[dict[str, Any]]]


def agent_cuts(path: str | Path, config: CompactionConfig | None = None) -> list[AgentCut]:
    """Every compaction the transcript's agent did (Claude Code's summaries, Codex's
    ``compacted`` records), each compared with our summary at the same cut: on a copy of
    the transcript, ``compact(up_to_seq=...)`` at each cut in turn; "ours" is our summary
    plus what we keep from before the cut (the pinned request)."""
    source, fmt, messages, cuts, cwd = _transcript_cuts(path)
    adapter = get_format(fmt)
    found: list[AgentCut] = []
    with (
        scratch_dir("compactstore-reference-") as tmp,
        CompactStore.open(Path(tmp) / "reference.db") as store,
    ):
        copy = store.import_session(
            "reference",
            (ImportedMessage(message) for message in messages),
            format=fmt,
            config=config or CompactionConfig(),
        )
        if cwd is not None:  # as an import does: summary paths relative to it
            copy = store.session("reference", cwd=cwd)
        for cut, kind, summary, history in _one_per_place(cuts):
            if cut < 1 or cut > len(messages):
                continue
            ours_summary = copy.compact(up_to_seq=cut - 1, now=0.0).summary_text
            kept = [
                adapter.token_text(item.message)
                for item in copy.context().items
                if item.seq is not None and item.seq < cut
            ]
            ours = "\n".join([ours_summary, *kept])
            before = messages[:cut]
            if kind == "summary":
                assert summary is not None
                theirs_text, users = summary, audit.quoted_user_messages(summary)
                tasks = pending_tasks(summary)
            else:
                theirs_text, users = _history_users(history, copy.config.boilerplate_patterns)
                tasks = _open_plan_items(before)
            found.append(
                AgentCut(
                    Path(path).name,
                    source,
                    kind,
                    cut,
                    files=_files(theirs_text, _touched(before), ours_summary),
                    user_messages=_share(users, audit.squash(ours)),
                    tasks=_tasks_named(tasks, ours),
                )
            )
    return found


def _transcript_cuts(
    path: str | Path,
) -> tuple[str, str, list[dict[str, Any]], list[_Cut], str | None]:
    """(source, format, messages, the agent's cuts, cwd) of a transcript: each cut is (index
    of the first message after it, "summary" or "replacement_history", the summary text,
    Codex's replacement history)."""
    from compactstore._importers import BoundaryEntry, convert, open_transcript

    messages: list[dict[str, Any]] = []
    lines: list[int] = []
    cuts: list[_Cut] = []
    with open_transcript(path) as file:
        source, fmt, items = convert(file)
        for item in items:
            if isinstance(item, BoundaryEntry):
                boundary = item.boundary
                cuts.append((boundary.first_kept_index, "summary", boundary.summary_text, []))
                continue
            messages.append(item.message)
            lines.append(_line(item.where))
        if source == "codex":
            for number, record in file.records():
                payload = record.get("payload")
                history = payload.get("replacement_history") if isinstance(payload, dict) else None
                if record.get("type") == "compacted" and isinstance(history, list):
                    cut = sum(1 for line in lines if line < number)
                    cuts.append((cut, "replacement_history", None, history))
        return source, fmt, messages, cuts, file.cwd


def _one_per_place(cuts: list[_Cut]) -> list[_Cut]:
    """A Codex compaction is a boundary of the import and a replacement history: compare it
    once, with what Codex kept (one cut per place, the history first), in order."""
    at: dict[int, _Cut] = {}
    for entry in cuts:
        if entry[0] not in at or entry[1] == "replacement_history":
            at[entry[0]] = entry
    return sorted(at.values(), key=lambda c: c[0])


def _line(where: str) -> int:
    """The line number of a converted message's place ("line 12"; 0 when not a line)."""
    head, _, number = where.partition(" ")
    return int(number) if head == "line" and number.isdigit() else 0


def _touched(messages: list[dict[str, Any]]) -> set[str]:
    """The file paths the tool calls of these messages name in their arguments."""
    touched: set[str] = set()
    for message in messages:
        content = message.get("content")
        blocks = content if isinstance(content, list) else []
        for block in blocks:
            if isinstance(block, dict) and block.get("type") in ("tool_use", "function_call"):
                touched |= _argument_paths(block.get("input", block.get("arguments")))
        for call in message.get("tool_calls") or []:
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict):
                touched |= _argument_paths(function.get("arguments"))
    return touched


def _argument_paths(arguments: Any) -> set[str]:
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return audit.paths_in(arguments)
    paths = audit.paths_in(json.dumps(arguments, ensure_ascii=False).replace("\\\\", "\\"))
    if isinstance(arguments, dict):
        for key in ("file_path", "notebook_path", "path"):
            value = arguments.get(key)
            if isinstance(value, str) and value:
                paths.add(value)
    return paths


def _files(theirs: str, touched: set[str], ours: str) -> tuple[int, int]:
    named = [
        p
        for p in audit.paths_in(theirs)
        if "/.claude/projects/" not in f"/{p}" and audit.path_named(p, touched)
    ]
    ours_paths = audit.paths_in(ours)
    return len(named), sum(audit.path_named(p, ours_paths) for p in named)


def _share(texts: list[str], haystack: str) -> tuple[int, int]:
    return len(texts), sum(audit.present(text, haystack) for text in texts)


def _history_users(
    history: list[dict[str, Any]], patterns: tuple[str, ...]
) -> tuple[str, list[str]]:
    """(all the text, what a person typed in each user message, by the store's classifier)
    of a Codex ``replacement_history``."""
    texts, users = [], []
    for item in history:
        if not isinstance(item, dict) or item.get("type") != "message":
            continue
        content = item.get("content")
        parts = [
            str(part.get("text"))
            for part in (content if isinstance(content, list) else [])
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        ]
        texts += parts
        said = request_text(parts, patterns) if item.get("role") == "user" else ""
        if said:
            users.append(said)
    return "\n".join(texts), users


def _open_plan_items(messages: list[dict[str, Any]]) -> list[str]:
    """The open items of the last plan call (``update_plan``, ``TodoWrite``) in these."""
    found: list[str] = []
    for message in messages:
        for call in message.get("tool_calls") or []:
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict):
                items = audit.pending_plan_items(
                    str(function.get("name")), function.get("arguments")
                )
                found = found if items is None else items
        content = message.get("content")
        for block in content if isinstance(content, list) else []:
            if isinstance(block, dict) and block.get("type") == "tool_use":
                items = audit.pending_plan_items(str(block.get("name")), block.get("input"))
                found = found if items is None else items
    return [item for item in found if item.strip()]


_PENDING = re.compile(r"^\s*(?:\d+\.\s*)?\**Pending Tasks\**:?\s*$", re.M | re.I)
_HEADING = re.compile(r"^\s*(?:\d+\.\s+\S|#{1,6}\s)", re.M)
_WORD = re.compile(r"\w+")


def pending_tasks(summary: str) -> list[str]:
    """The items of a Claude Code summary's "Pending Tasks" section (its top-level bullets;
    none when it says there are none)."""
    found = _PENDING.search(summary)
    if found is None:
        return []
    rest = summary[found.end() :]
    end = _HEADING.search(rest)
    section = rest[: end.start()] if end else rest
    bullets = re.findall(r"^([ \t]*)[-*][ \t]+(.+)$", section, re.M)
    if not bullets:
        return []
    top = min(len(indent) for indent, _ in bullets)
    items = [text for indent, text in bullets if len(indent) == top]
    return [i for i in items if not re.match(r"\W*(none|no pending)\b", i, re.I)]


def _words(text: str) -> set[str]:
    """The words that carry meaning: 4 letters or more, or any word outside ASCII."""
    return {
        w.lower() for w in _WORD.findall(text) if len(w) >= 4 or (not w.isascii() and len(w) >= 2)
    }


_LABEL = re.compile(r"^\s*\*\*[^*]+\*\*\s*(?:\([^)]*\))?\s*:?\s*")
# A task the agent's summary names by its number ("**Task 3 (in_progress)**: …"), and an
# open task our summary lists by its number ("- [pending] #3 …", compactstore._engines.tasks).
_TASK_NUMBER = re.compile(r"^\W*Task\s+#?(\d+)\b", re.I)
_OUR_TASK = re.compile(r"^- \[[^\]\n]+\] #(\d+) ", re.M)


def _tasks_named(tasks: list[str], ours: str) -> tuple[int, int]:
    """How many tasks, and how many of them ours names: the same task number among our open
    tasks (Claude Code numbers its TaskCreate tasks, and its summary words them in its own
    way, in any language), else at least 60% of the words of a task's text (after its
    label, "**Task 3 (in_progress)**:")."""
    have = _words(ours)
    numbers = set(_OUR_TASK.findall(ours))
    named = 0
    for task in tasks:
        number = _TASK_NUMBER.match(task)
        if number is not None and number.group(1) in numbers:
            named += 1
            continue
        words = _words(_LABEL.sub("", task)) or _words(task)
        if words and len(words & have) >= 0.6 * len(words):
            named += 1
    return len(tasks), named
