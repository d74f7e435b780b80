"""Rollback and replay of recorded compactions, as plan -> decide -> commit.

A rollback marks rows; nothing is deleted. A replay rebuilds the context as it stood just
before a recorded compaction from the rows and the inputs recorded with it (a read
transaction), runs the same pipeline again with no transaction open (the recorded summary
text, or the summarizer again when resummarising), and, applied, rolls back what it
replaces and records the new result in one write transaction.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

from sqlalchemy import Connection

from compactstore._context.active import ActiveContext
from compactstore._context.tokens import TokenCounter
from compactstore._core import replay_inputs
from compactstore._core.assembling import load_context
from compactstore._core.recording import compaction_model, record_outcome, rolled_back_model
from compactstore._core.replay_inputs import EditRun, EngineRun, ImportedRun, ServerRun
from compactstore._core.summarizing import RecordedSummary
from compactstore._engines import pipeline
from compactstore._engines.base import EngineInputs, SummaryService
from compactstore._engines.pipeline import Outcome
from compactstore.db import repository as repo
from compactstore.errors import ConflictError, DatabaseError, NotFoundError
from compactstore.formats import MessageFormat
from compactstore.models import (
    CompactBoundary,
    CompactionConfig,
    CompactionResult,
    CompactStrategy,
)

__all__ = [
    "ReplayPlan",
    "commit_replay",
    "decide_replay",
    "live_target",
    "plan_replay",
    "roll_back",
    "rollback",
    "rollback_compaction",
    "target",
    "undone_by",
]


def target(connection: Connection, session_id: str, boundary_id: int | None) -> repo.DbRow:
    """The boundary a rollback or replay names; the latest live one when None."""
    if boundary_id is None:
        row = repo.live_boundary(connection, session_id)
        if row is None:
            raise NotFoundError(f"session {session_id!r} has no live boundary to roll back")
        return row
    row = repo.get_boundary(connection, session_id, boundary_id)
    if row is None:
        raise NotFoundError(f"no boundary {boundary_id} in session {session_id!r}")
    return row


def roll_back(
    connection: Connection, session_id: str, boundary: repo.DbRow, at: float
) -> list[CompactBoundary]:
    """Mark a boundary, its compaction and everything recorded after them rolled back."""
    compaction = repo.compaction_of_boundary(connection, session_id, boundary.id)
    if compaction is None:  # every boundary is written with its compaction
        raise DatabaseError(
            f"boundary {boundary.id} of session {session_id!r} has no compactions row"
        )
    live = undone_by(connection, session_id, boundary)
    repo.roll_back(connection, session_id, boundary.id, compaction.id, at)
    # The context changed, so the last real count no longer describes it.
    repo.update_session(
        connection, session_id, structural=True, real_tokens=None, real_estimate=None
    )
    return [rolled_back_model(row, at) for row in live]


def undone_by(connection: Connection, session_id: str, boundary: repo.DbRow) -> list[repo.DbRow]:
    """The boundary's row and every live one after it: what rolling it back undoes."""
    return [
        row
        for row in repo.boundary_rows(connection, session_id, include_rolled_back=False)
        if row.id >= boundary.id
    ]


def live_target(connection: Connection, session_id: str, boundary_id: int | None) -> repo.DbRow:
    """The boundary a rollback names (the latest live one when None).

    Raises:
        NotFoundError: no such boundary, or nothing to roll back.
        ConflictError: the boundary is already rolled back.
    """
    boundary = target(connection, session_id, boundary_id)
    if boundary.rolled_back_at is not None:
        raise ConflictError(
            f"boundary {boundary.id} of session {session_id!r} is already rolled back"
        )
    return boundary


def rollback(
    connection: Connection, session_id: str, boundary_id: int | None, at: float
) -> list[CompactBoundary]:
    """Roll back the boundary (the latest live one when None) and everything after it.

    Raises:
        NotFoundError, ConflictError: as :func:`live_target`.
    """
    return roll_back(connection, session_id, live_target(connection, session_id, boundary_id), at)


def live_compaction(connection: Connection, session_id: str, compaction_id: int) -> None:
    """Check that a rollback can start at compaction ``compaction_id``.

    Raises:
        NotFoundError: no such compaction in this session.
        ConflictError: it is already rolled back.
    """
    row = repo.get_compaction(connection, session_id, compaction_id)
    if row is None:
        raise NotFoundError(f"no compaction {compaction_id} in session {session_id!r}")
    if row.rolled_back_at is not None:
        raise ConflictError(
            f"compaction {compaction_id} of session {session_id!r} is already rolled back"
        )
    if row.strategy == CompactStrategy.READ_DEDUP:
        raise ConflictError(
            f"compaction {compaction_id} of session {session_id!r} is a read dedup: the "
            "re-read was stored as the stub, so there is nothing to undo"
        )


def rollback_compaction(
    connection: Connection, session_id: str, compaction_id: int, at: float
) -> list[CompactBoundary]:
    """Roll back compaction ``compaction_id`` and every compaction recorded after it,
    boundaries included; returns the boundaries rolled back.

    Raises:
        NotFoundError: no such compaction in this session.
        ConflictError: it is already rolled back.
    """
    live_compaction(connection, session_id, compaction_id)
    live = repo.roll_back_from(connection, session_id, compaction_id, at)
    repo.update_session(
        connection, session_id, structural=True, real_tokens=None, real_estimate=None
    )
    return [rolled_back_model(row, at) for row in live]


@dataclass(frozen=True, slots=True)
class ReplayPlan:
    """A recorded compaction and everything needed to run it again."""

    boundary: repo.DbRow
    compaction: repo.DbRow
    replay_inputs: EngineRun
    context: ActiveContext
    inputs: EngineInputs
    live_boundary_id: int | None  # when planned, for the commit's check


def plan_replay(
    connection: Connection,
    session: repo.SessionRow,
    adapter: MessageFormat,
    count_tokens: TokenCounter,
    boundary_id: int,
    *,
    config: CompactionConfig | None,
    apply: bool,
    resummarize: SummaryService | None = None,
) -> ReplayPlan:
    """Rebuild the context just before the boundary's compaction, with its inputs.

    The summary service is the recorded text (used when the replayed cut removes exactly
    the recorded seqs), or ``resummarize`` (the summarizer, asked again).

    Raises:
        NotFoundError: no such boundary in this session.
        ConflictError: the boundary was imported (nothing of compactstore's ran to make it),
            or apply=True where the replayed result cannot take its place.
    """
    sid = session.id
    boundary = target(connection, sid, boundary_id)
    compaction = repo.compaction_of_boundary(connection, sid, boundary.id)
    if compaction is None:
        raise DatabaseError(f"boundary {boundary.id} of session {sid!r} has no compactions row")
    recorded = replay_inputs.parse(compaction.inputs)
    if isinstance(recorded, ImportedRun):
        raise ConflictError(
            f"boundary {boundary.id} was imported from a transcript: the agent that wrote it "
            f"did that compaction, so compactstore has nothing recorded to replay"
        )
    if isinstance(recorded, EditRun):
        raise ConflictError(
            f"boundary {boundary.id} was recorded by {recorded.call} (an edit, not an engine "
            f"run): there is nothing to replay; rollback undoes it"
        )
    if isinstance(recorded, ServerRun):
        raise ConflictError(
            f"boundary {boundary.id} is a compaction the provider did on its own (a "
            f"compaction block or item in a response): nothing of compactstore's ran, so "
            f"there is nothing to replay; rollback undoes it"
        )
    if not isinstance(recorded, EngineRun):  # only engine runs cut, so this row is damaged
        raise DatabaseError(f"boundary {boundary.id} of session {sid!r} has no engine inputs")
    as_of = repo.AsOf(
        compaction_id=compaction.id,
        boundary_id=boundary.parent_id,
        last_seq=recorded.last_seq,
        usage_offset=recorded.usage_offset,
        token_factor=recorded.token_factor,
        config=config or CompactionConfig.model_validate_json(compaction.config),
    )
    # The policy the compaction ran under: it chose the thinking the context sent.
    policy = (recorded.edit_policy, recorded.prefix_checks)
    context = load_context(connection, session, adapter, count_tokens, policy=policy, as_of=as_of)
    context = context.answered()
    service = resummarize or RecordedSummary(
        tuple(json.loads(compaction.removed_seqs)),
        compaction.summary_text,
        compaction_model(compaction, {}).summary,
    )
    inputs = recorded.engine_inputs(context, service, compaction.instructions)
    live = repo.live_boundary(connection, sid)
    if apply:
        if boundary.rolled_back_at is None:
            if live is None or live.id != boundary.id:
                raise ConflictError(
                    f"boundary {boundary.id} is not the latest live boundary; roll back "
                    f"the later ones first or replay without apply"
                )
        elif (live.id if live is not None else None) != boundary.parent_id:
            raise ConflictError(
                f"boundary {boundary.id} was rolled back, but the live boundary is no "
                f"longer its parent ({boundary.parent_id}); replay without apply"
            )
        # Blobs the replay persists get new ids: the recorded ones stay with the original.
        inputs = replace(inputs, next_blob_id=repo.next_blob_id(connection, sid))
    return ReplayPlan(
        boundary, compaction, recorded, context, inputs, None if live is None else live.id
    )


def decide_replay(plan: ReplayPlan) -> Outcome:
    """Run the recorded pipeline again on the rebuilt context (pure)."""
    recorded, context, inputs = plan.replay_inputs, plan.context, plan.inputs
    if recorded.call == "process":
        return pipeline.process(context, inputs, **recorded.switches())
    if recorded.call == "manual":
        return pipeline.manual(context, inputs, up_to_seq=recorded.up_to_seq)
    if recorded.call == "background":
        return pipeline.background(context, inputs)
    outcome = pipeline.recover(context, inputs)
    if outcome is None:
        raise ConflictError("the recorded reactive attempt would now give up; nothing to replay")
    return outcome


def commit_replay(
    connection: Connection, session_id: str, plan: ReplayPlan, outcome: Outcome, at: float
) -> CompactionResult:
    """Record the replayed result in place of the original (rolled back first if live),
    dated ``at``; the engines keep the recorded time.

    Raises:
        ConflictError: the live boundary moved since the replay was planned.
    """
    live = repo.live_boundary(connection, session_id)
    if (None if live is None else live.id) != plan.live_boundary_id:
        raise ConflictError(
            f"session {session_id!r} was compacted or rolled back while boundary "
            f"{plan.boundary.id} was replayed; nothing was recorded, replay it again"
        )
    if plan.boundary.rolled_back_at is None:
        roll_back(connection, session_id, plan.boundary, at)
    compaction = plan.compaction
    return record_outcome(
        connection,
        session_id,
        outcome,
        plan.replay_inputs.model_copy(update={"replay_of": compaction.id}),
        at=at,
        instructions=compaction.instructions,
        error=compaction.error,
        replay_of=compaction.id,
    )
