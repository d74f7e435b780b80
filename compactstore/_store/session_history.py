"""Undoing and re-running a session's compactions, and reading their record."""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import Connection

from compactstore._core import checks, compaction, edits, handle, replay
from compactstore._core.checks import now_or_clock
from compactstore._core.recording import boundary_model, compaction_model, unrecorded_result
from compactstore._core.sessions import require
from compactstore._core.summarizing import SummaryCall
from compactstore._store.session_base import SessionBase
from compactstore.db import repository as repo
from compactstore.errors import InvalidInputError
from compactstore.models import BreakerState, CompactBoundary, CompactionConfig, CompactionResult

__all__ = ["SessionHistory"]


class SessionHistory(SessionBase):
    """Rollback, clear, pop and replay; the recorded boundaries, compactions and breaker."""

    def rollback(
        self,
        boundary_id: int | None = None,
        *,
        compaction_id: int | None = None,
        now: float | None = None,
    ) -> list[CompactBoundary]:
        """Undo the latest live boundary, or the given one and every compaction after it;
        with ``compaction_id``, compaction N (any strategy: ``clear`` and ``pop`` included)
        and every compaction recorded after it, boundaries included.

        Rows are marked rolled back, never deleted. Afterwards active_context() is exactly
        what it was before that compaction plus whatever was appended since. Returns the
        boundaries rolled back.

        Raises:
            InvalidInputError: both boundary_id and compaction_id given.
            NotFoundError: no such boundary or compaction in this session, or nothing to
                roll back.
            ConflictError: the boundary or compaction is already rolled back.
        """
        if boundary_id is not None:
            checks.check_id(boundary_id, "boundary", self.id)
        if compaction_id is not None:
            if boundary_id is not None:
                raise InvalidInputError("give boundary_id or compaction_id, not both")
            checks.check_id(compaction_id, "compaction", self.id)
        at = now_or_clock(now)

        def tx(connection: Connection) -> list[CompactBoundary]:
            handle.locked(self, connection)
            if compaction_id is not None:
                return replay.rollback_compaction(connection, self.id, compaction_id, at)
            return replay.rollback(connection, self.id, boundary_id, at)

        return self.store.write(tx)

    def clear(self, *, now: float | None = None) -> int:
        """Empty the active context (the log keeps everything): a boundary with strategy
        ``clear`` (trigger manual) after the newest message that keeps nothing — no pinned
        messages, no summary. Returns the compaction id (``rollback(compaction_id=...)``
        undoes it)."""
        at = now_or_clock(now)

        def tx(connection: Connection) -> int:
            row = handle.locked(self, connection)
            return edits.clear(connection, handle.context(self, connection, row), at)

        return self.store.write(tx)

    def pop(self, *, now: float | None = None) -> dict[str, Any] | None:
        """Take the newest message of the context's kept part out of the context and return
        it as logged (verbatim); None when there is none. A recorded edit (strategy ``pop``,
        trigger manual) that ``rollback(compaction_id=...)`` undoes; the log keeps it."""
        at = now_or_clock(now)

        def tx(connection: Connection) -> dict[str, Any] | None:
            row = handle.locked(self, connection)
            return edits.pop(connection, handle.context(self, connection, row), at)

        return self.store.write(tx)

    def rollback_plan(
        self, boundary_id: int | None = None, *, compaction_id: int | None = None
    ) -> list[CompactBoundary]:
        """The boundaries ``rollback(boundary_id)`` (or ``rollback(compaction_id=...)``)
        would undo, oldest first; changes nothing.

        For a boundary the first is the target (the latest live boundary when boundary_id
        is None): a caller that asks for confirmation then rolls back exactly that id. For
        a compaction the list may be empty (an edit-only compaction such as ``pop``).

        Raises:
            InvalidInputError, NotFoundError, ConflictError: as :meth:`rollback` would.
        """
        if boundary_id is not None:
            checks.check_id(boundary_id, "boundary", self.id)
        if compaction_id is not None:
            if boundary_id is not None:
                raise InvalidInputError("give boundary_id or compaction_id, not both")
            checks.check_id(compaction_id, "compaction", self.id)

        def read(connection: Connection) -> list[repo.DbRow]:
            if compaction_id is not None:
                replay.live_compaction(connection, self.id, compaction_id)
                return repo.boundaries_from(connection, self.id, compaction_id)
            boundary = replay.live_target(connection, self.id, boundary_id)
            return replay.undone_by(connection, self.id, boundary)

        return [boundary_model(row) for row in self.store.read(read)]

    def replay(
        self,
        boundary_id: int,
        *,
        config: CompactionConfig | None = None,
        apply: bool = False,
        now: float | None = None,
        resummarize: bool = False,
    ) -> CompactionResult:
        """Run a recorded compaction again on the context as it stood just before it.

        With the recorded config (or ``config``) and the recorded time, the same inputs
        give a byte-identical boundary and summary: the recorded summary text (rule-based
        or a summarizer's) is reused whenever the replayed cut removes exactly the recorded
        seqs; otherwise the summary is rule-based, and with ``resummarize=True`` the
        summarizer is asked again (the session's provider compactor first, when it has
        one: a provider boundary is requested again). ``result.summary.source`` says which
        (``"recorded"``, ``"rule"``, ``"summarizer"`` or ``"provider"``). ``apply=True``
        records the result as a new compaction: allowed on the latest live boundary
        (which it replaces) or on a rolled-back one whose parent is the live boundary
        again. The engines and the summary keep the recorded time; the new rows and the
        rollback they imply are dated ``now`` (epoch seconds; default: the clock).

        Raises:
            NotFoundError: no such boundary in this session.
            ConflictError: the boundary was imported from a transcript (nothing to run
                again), apply=True where the replayed result cannot take its place, or
                the session was compacted or rolled back while the replay ran.
            InvalidInputError: resummarize=True with no summarizer configured.
        """
        checks.check_id(boundary_id, "boundary", self.id)
        checks.check_config(config)
        at = now_or_clock(now)
        store = self.store
        service = None
        if resummarize:
            plugins = self._plugins()
            if plugins.summarizer is None and plugins.compactor is None:
                raise InvalidInputError(
                    "resummarize=True needs a summarizer or a compactor: give one to "
                    "CompactStore.open or store.session"
                )
            service = SummaryCall(
                summarizer=plugins.summarizer,
                name=plugins.summarizer_name,
                recorded=None,
                executor=store.summarizer_executor(),
                timeout=(config or self.config).summarizer_timeout_seconds,
                calls_left=1,
                redactor=plugins.redactor,
                loop=plugins.loop,
                # A provider compactor asks the provider again (system: the session's).
                compactor=plugins.compactor,
                model=self.model,
                system=store.read(self._request_system) if plugins.compactor else None,
            )

        def plan(connection: Connection) -> replay.ReplayPlan:
            row = require(connection, self.id, store.location)
            return replay.plan_replay(
                connection,
                row,
                self.adapter,
                store.token_counter,
                boundary_id,
                config=config,
                apply=apply,
                resummarize=service,
            )

        # Plan in a read transaction, run the engines (and any summarizer) with none open,
        # and record in one write transaction that checks nothing moved meanwhile.
        planned = store.read(plan)
        outcome = store.compute(functools.partial(replay.decide_replay, planned))
        if not apply:
            return unrecorded_result(outcome, planned.inputs.now, planned.compaction.instructions)

        def commit(connection: Connection) -> CompactionResult:
            handle.locked(self, connection)
            return replay.commit_replay(connection, self.id, planned, outcome, at)

        result = store.write(commit)
        store.notify(result)
        return result

    def _request_system(self, connection: Connection) -> Any:
        """The ``system`` this session's requests send (a provider compaction's too)."""
        row = require(connection, self.id, self.store.location)
        return compaction.request_system(handle.context(self, connection, row))

    def boundaries(self, include_rolled_back: bool = False) -> list[CompactBoundary]:
        """The recorded boundaries, oldest first."""
        rows = self.store.read(
            lambda c: repo.boundary_rows(c, self.id, include_rolled_back=include_rolled_back)
        )
        return [boundary_model(row) for row in rows]

    def compactions(self) -> list[CompactionResult]:
        """The recorded compactions, oldest first (rolled-back ones included, marked)."""

        def read(connection: Connection) -> list[CompactionResult]:
            boundaries = {
                row.id: boundary_model(row)
                for row in repo.boundary_rows(connection, self.id, include_rolled_back=True)
            }
            return [
                compaction_model(row, boundaries)
                for row in repo.compaction_rows(connection, self.id)
            ]

        return self.store.read(read)

    def breaker(self) -> BreakerState:
        """The circuit-breaker and reactive-recovery counters."""
        row = self.store.read(lambda c: repo.get_breaker(c, self.id))
        return BreakerState(
            consecutive_failures=row.consecutive_failures,
            tripped=bool(row.tripped),
            reactive_attempts=row.reactive_attempts,
            last_microcompact_at=row.last_microcompact_at,
            consecutive_fallbacks=row.consecutive_fallbacks,
        )

    def reset_breaker(self) -> None:
        """Clear the breaker's failure count, the reactive-attempt counter and the count of
        consecutive summarizer fallbacks."""

        def tx(connection: Connection) -> None:
            handle.locked(self, connection)
            repo.set_breaker(
                connection,
                self.id,
                consecutive_failures=0,
                tripped=False,
                reactive_attempts=0,
                consecutive_fallbacks=0,
            )
            repo.update_session(connection, self.id)

        self.store.write(tx)
