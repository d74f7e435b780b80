"""Recorded edits of the active context: ``clear`` and ``pop``.

Both are compactions rows (trigger manual) that no engine made, so nothing is replayed;
``Session.rollback(compaction_id=N)`` undoes them like any compaction. The log keeps
everything.

- ``clear``: a boundary after the newest message that keeps nothing: no pins, no summary.
- ``pop``: the newest message of the kept part taken out of the context (a ``message_edits``
  row of kind ``removed``).
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import Connection

from compactstore._context.active import ActiveContext
from compactstore._core.replay_inputs import EditRun
from compactstore.db import repository as repo
from compactstore.models import CompactionStep, CompactStrategy, CompactTrigger, SummaryState

__all__ = ["clear", "pop"]


def _compaction(
    connection: Connection,
    context: ActiveContext,
    strategy: CompactStrategy,
    at: float,
    *,
    tokens_after: int,
    removed: list[int],
    boundary_id: int | None,
    changed_after: int,
) -> int:
    return repo.insert_compaction(
        connection,
        context.session_id,
        trigger=CompactTrigger.MANUAL.value,
        strategy=strategy.value,
        success=True,
        tokens_before=context.usage,
        tokens_after=tokens_after,
        tokens_freed=context.usage - tokens_after,
        summary_text="",
        boundary_id=boundary_id,
        created_at=at,
        steps=repo.dumps(
            [
                CompactionStep(
                    strategy=strategy,
                    trigger=CompactTrigger.MANUAL,
                    tokens_freed=context.usage - tokens_after,
                    results_cleared=0,
                    results_persisted=0,
                ).model_dump(mode="json")
            ]
        ),
        config=context.config.model_dump_json(),
        removed_seqs=repo.dumps(removed),
        cleared_tool_calls=repo.dumps([]),
        blob_ids=repo.dumps([]),
        instructions=None,
        error=None,
        inputs=EditRun(call=strategy.value, now=at, last_seq=context.last_seq).model_dump_json(),
        replay_of=None,
        changed_after_seq=changed_after,
    )


def clear(connection: Connection, context: ActiveContext, at: float) -> int:
    """Record a ``clear`` boundary after the newest message; returns the compaction id."""
    removed = [item.seq for item in (*context.head, *context.kept) if item.seq is not None]
    boundary_id = repo.insert_boundary(
        connection,
        context.session_id,
        trigger=CompactTrigger.MANUAL.value,
        strategy=CompactStrategy.CLEAR.value,
        created_at=at,
        tokens_before=context.usage,
        tokens_after=0,
        messages_removed=len(removed),
        first_kept_seq=context.last_seq + 1,
        last_kept_seq=None,
        summary_text="",
        summary_message="",
        summary_tokens=0,
        summary_state=SummaryState().model_dump_json(),
        parent_id=context.boundary.id if context.boundary is not None else None,
    )
    compaction_id = _compaction(
        connection,
        context,
        CompactStrategy.CLEAR,
        at,
        tokens_after=0,
        removed=removed,
        boundary_id=boundary_id,
        changed_after=-1,  # nothing is kept: every message's prefix changed
    )
    repo.update_session(
        connection, context.session_id, structural=True, real_tokens=None, real_estimate=None
    )
    return compaction_id


def pop(connection: Connection, context: ActiveContext, at: float) -> dict[str, Any] | None:
    """Take the newest message of the kept part out of the context; returns it as logged
    (verbatim), or None when the kept part is empty."""
    kept = [item for item in context.kept if item.seq is not None]
    if not kept:
        return None
    newest = kept[-1]
    assert newest.seq is not None
    rows = repo.log_page(
        connection, context.session_id, after_seq=newest.seq - 1, up_to_seq=newest.seq, limit=1
    )
    original = str(rows[0][1])
    compaction_id = _compaction(
        connection,
        context,
        CompactStrategy.POP,
        at,
        tokens_after=max(0, context.usage - newest.tokens),
        removed=[newest.seq],
        boundary_id=None,
        changed_after=newest.seq,
    )
    repo.insert_edits(
        connection,
        context.session_id,
        [
            {
                "seq": newest.seq,
                "compaction_id": compaction_id,
                "kind": "removed",
                "tool_use_ids": repo.dumps([]),
                "payload": original,
                "tokens": 0,
            }
        ],
    )
    repo.update_session(
        connection, context.session_id, structural=True, real_tokens=None, real_estimate=None
    )
    message: dict[str, Any] = json.loads(original)
    return message
