"""A session's history: rollback (and its plan), replay, and the recorded compactions."""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import Connection

from compactstore._core import checks, compaction, handle, replay
from compactstore._core.checks import now_or_clock
from compactstore._core.recording import boundary_model, compaction_model, unrecorded_result
from compactstore._core.sessions import require
from compactstore._core.summarizing import SummaryCall
from compactstore._session.state import HandleState, SessionHandle
from compactstore.db import repository as repo
from compactstore.errors import InvalidInputError
from compactstore.models import BreakerState, CompactBoundary, CompactionConfig, CompactionResult

__all__ = [
    "breaker",
    "check_target",
    "compactions",
    "replay_boundary",
    "reset_breaker",
    "rollback",
    "rollback_plan",
]


def check_target(session_id: str, boundary_id: int | None, compaction_id: int | None) -> None:
    """rollback()'s and rollback_plan()'s arguments: a boundary or a compaction, not both."""
    if boundary_id is not None:
        checks.check_id(boundary_id, "boundary", session_id)
    if compaction_id is not None:
        if boundary_id is not None:
            raise InvalidInputError("give boundary_id or compaction_id, not both")
        checks.check_id(compaction_id, "compaction", session_id)


def rollback(
    session: SessionHandle,
    boundary_id: int | None,
    compaction_id: int | None,
    now: float | None,
) -> list[CompactBoundary]:
    """Session.rollback()."""
    check_target(session.id, boundary_id, compaction_id)
    at = now_or_clock(now)

    def tx(connection: Connection) -> list[CompactBoundary]:
        handle.locked(session, connection)
        if compaction_id is not None:
            return replay.rollback_compaction(connection, session.id, compaction_id, at)
        return replay.rollback(connection, session.id, boundary_id, at)

    return session.store.write(tx)


def rollback_plan(
    session: SessionHandle, boundary_id: int | None, compaction_id: int | None
) -> list[CompactBoundary]:
    """Session.rollback_plan()."""
    check_target(session.id, boundary_id, compaction_id)

    def read(connection: Connection) -> list[repo.DbRow]:
        if compaction_id is not None:
            replay.live_compaction(connection, session.id, compaction_id)
            return repo.boundaries_from(connection, session.id, compaction_id)
        boundary = replay.live_target(connection, session.id, boundary_id)
        return replay.undone_by(connection, session.id, boundary)

    return [boundary_model(row) for row in session.store.read(read)]


def replay_boundary(
    session: SessionHandle,
    state: HandleState,
    boundary_id: int,
    config: CompactionConfig | None,
    apply: bool,
    now: float | None,
    resummarize: bool,
) -> CompactionResult:
    """Session.replay(): plan in a read transaction, run the engines (and any summarizer)
    with none open, and record in one write transaction that checks nothing moved
    meanwhile."""
    checks.check_id(boundary_id, "boundary", session.id)
    checks.check_config(config)
    at = now_or_clock(now)
    store = session.store
    service = _summary_call(session, state, config) if resummarize else None

    def plan(connection: Connection) -> replay.ReplayPlan:
        row = require(connection, session.id, store.location)
        return replay.plan_replay(
            connection,
            row,
            session.adapter,
            store.token_counter,
            boundary_id,
            config=config,
            apply=apply,
            resummarize=service,
        )

    planned = store.read(plan)
    outcome = store.compute(functools.partial(replay.decide_replay, planned))
    if not apply:
        return unrecorded_result(outcome, planned.inputs.now, planned.compaction.instructions)

    def commit(connection: Connection) -> CompactionResult:
        handle.locked(session, connection)
        return replay.commit_replay(connection, session.id, planned, outcome, at)

    result = store.write(commit)
    store.notify(result)
    return result


def _summary_call(
    session: SessionHandle, state: HandleState, config: CompactionConfig | None
) -> SummaryCall:
    """replay(resummarize=True): the summarizer (or the provider compactor) asked again."""
    store = session.store
    plugins = state.plugins(store)
    if plugins.summarizer is None and plugins.compactor is None:
        raise InvalidInputError(
            "resummarize=True needs a summarizer or a compactor: give one to "
            "CompactStore.open or store.session"
        )
    return SummaryCall(
        summarizer=plugins.summarizer,
        name=plugins.summarizer_name,
        recorded=None,
        executor=store.summarizer_executor(),
        timeout=(config or session.config).summarizer_timeout_seconds,
        calls_left=1,
        redactor=plugins.redactor,
        loop=plugins.loop,
        # A provider compactor asks the provider again (system: the session's).
        compactor=plugins.compactor,
        model=session.model,
        system=store.read(functools.partial(_request_system, session))
        if plugins.compactor
        else None,
    )


def _request_system(session: SessionHandle, connection: Connection) -> Any:
    """The ``system`` this session's requests send (a provider compaction's too)."""
    row = require(connection, session.id, session.store.location)
    return compaction.request_system(handle.context(session, connection, row))


def compactions(session: SessionHandle) -> list[CompactionResult]:
    """Session.compactions()."""

    def read(connection: Connection) -> list[CompactionResult]:
        boundaries = {
            row.id: boundary_model(row)
            for row in repo.boundary_rows(connection, session.id, include_rolled_back=True)
        }
        return [
            compaction_model(row, boundaries)
            for row in repo.compaction_rows(connection, session.id)
        ]

    return session.store.read(read)


def breaker(session: SessionHandle) -> BreakerState:
    """Session.breaker()."""
    row = session.store.read(lambda c: repo.get_breaker(c, session.id))
    return BreakerState(
        consecutive_failures=row.consecutive_failures,
        tripped=bool(row.tripped),
        reactive_attempts=row.reactive_attempts,
        last_microcompact_at=row.last_microcompact_at,
        consecutive_fallbacks=row.consecutive_fallbacks,
    )


def reset_breaker(session: SessionHandle) -> None:
    """Session.reset_breaker()."""

    def tx(connection: Connection) -> None:
        handle.locked(session, connection)
        repo.set_breaker(
            connection,
            session.id,
            consecutive_failures=0,
            tripped=False,
            reactive_attempts=0,
            consecutive_fallbacks=0,
        )
        repo.update_session(connection, session.id)

    session.store.write(tx)
