"""Agreement with the agent's own compactions: where it cut against where we did, and what
its summary lists that ours names when we cut at the same place."""

from __future__ import annotations

from pathlib import Path

from compactstore import summary_audit as audit
from compactstore.importers import Transcript
from compactstore.models import CompactionConfig, ImportedMessage
from compactstore.scratch import scratch_dir
from compactstore.simulate.report import SimulationReport
from compactstore.store import CompactStore, Session

__all__ = ["reference_agreement"]


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
