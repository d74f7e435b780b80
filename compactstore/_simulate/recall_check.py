"""After each recorded compaction of a replay: does ``recall`` give back exactly what it
took out of the context? Every message it removed, every message whose result it
cleared or persisted, and every blob it created, paged through with its cursors."""

from __future__ import annotations

import re
from typing import Any

from compactstore._simulate.report import SimulationReport
from compactstore._store.store import Session
from compactstore._summary_audit import whole_recall
from compactstore.formats import MessageFormat
from compactstore.formats.base import storage_json
from compactstore.models import CompactionResult

__all__ = ["RecallCheck"]

# A message's header line in a recall answer (README "Recall").
_HEADER = re.compile(r"^\[seq (\d+) · [^\n]*\]$", re.MULTILINE)


def _bodies(answer: str) -> dict[int, str]:
    """Each message's part of a whole recall answer, by seq."""
    heads = list(_HEADER.finditer(answer))
    return {
        int(head.group(1)): answer[head.end() + 1 : nxt.start() if nxt else len(answer)]
        for head, nxt in zip(heads, [*heads[1:], None], strict=True)
    }


class RecallCheck:
    """Remembers each message as stored and checks recall after each compaction."""

    def __init__(self, sess: Session, fmt: MessageFormat, report: SimulationReport) -> None:
        self.sess = sess
        self.fmt = fmt
        self.report = report
        self.stored: dict[int, dict[str, Any]] = {}
        # Calls are keyed by (id, call seq) (an id may be used again): the newest call of
        # each id, and the seq of the message answering each call.
        self.call_seq: dict[str, int] = {}
        self.result_seq: dict[tuple[str, int], int] = {}

    def appended(self, seq: int, message: dict[str, Any]) -> None:
        self.stored[seq] = message
        for result in self.fmt.tool_results(message):
            call_seq = self.call_seq.get(result.tool_use_id)
            if call_seq is not None:
                self.result_seq[(result.tool_use_id, call_seq)] = seq
        for call in self.fmt.tool_calls(message):
            self.call_seq[call.id] = seq

    def _pieces(self, message: dict[str, Any]) -> list[str]:
        """What the message says: prose, each call's input, each result's whole text."""
        fmt = self.fmt
        found = [fmt.text(message)]
        for call in fmt.tool_calls(message):
            found.append(call.input if isinstance(call.input, str) else storage_json(call.input))
        found.extend(result.text for result in fmt.tool_results(message))
        return [piece for piece in found if piece]

    def check(self, result: CompactionResult) -> None:
        report = self.report
        edited = {self.result_seq[c] for c in result.cleared_tool_calls if c in self.result_seq}
        seqs = sorted(set(result.removed_seqs) | edited)
        if seqs:
            whole, _ = whole_recall(self.sess.recall, {"from_seq": seqs[0], "to_seq": seqs[-1]})
            bodies = _bodies(whole)
            for seq in seqs:
                report.recall_due += 1
                body = bodies.get(seq)
                exact = body is not None and all(p in body for p in self._pieces(self.stored[seq]))
                report.recall_exact += exact
                if not exact and len(report.recall_examples) < 5:
                    report.recall_examples.append(f"seq {seq} not given back exactly")
        results = {r.text for seq in edited for r in self.fmt.tool_results(self.stored[seq])}
        for blob_id in result.blob_ids:
            report.recall_blobs_due += 1
            whole, _ = whole_recall(self.sess.recall, {"blob_id": blob_id})
            content = whole.split("\n", 1)[1] if "\n" in whole else ""
            exact = content in results and content == self.sess.get_blob(blob_id)
            report.recall_blobs_exact += exact
            if not exact and len(report.recall_examples) < 5:
                report.recall_examples.append(f"blob {blob_id} not given back exactly")
