"""Every compaction path as plan -> decide -> commit (SPEC §9.1, "Shape").

- :func:`plan` reads the snapshot a compaction is decided on: the active context, the
  stored state the engines need (breaker counters, memory, the next blob id) and the
  session's versions.
- *decide* is a pure function of the snapshot: one of :mod:`compactstore.engines.pipeline`'s
  pipelines, or :func:`compactstore.engines.imported.cut_as_imported`. No database.
- :func:`commit` writes the outcome (:func:`compactstore.core.recording.record_outcome`)
  and returns the result and the context to cache once the transaction is committed.

Today the three run inside one write transaction; they take and return plain values so a
driver can run them in separate transactions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from sqlalchemy import Connection

from compactstore.context import ActiveContext
from compactstore.core.cache import CachedContext
from compactstore.core.recording import cache_entry_after, record_outcome
from compactstore.core.replay_inputs import EngineRun, ImportedRun
from compactstore.db import repository as repo
from compactstore.engines import pipeline
from compactstore.engines.base import EngineInputs, Summarizer
from compactstore.engines.imported import cut_as_imported
from compactstore.engines.pipeline import Outcome
from compactstore.engines.session_memory import MemoryProvider, select_memory
from compactstore.errors import InvalidInputError
from compactstore.models import CompactionResult, ImportedBoundary, SummaryState
from compactstore.tokens import TokenCounter

__all__ = [
    "Decide",
    "Plugins",
    "Request",
    "Snapshot",
    "commit",
    "manual_request",
    "plan",
    "process_request",
    "reactive_request",
    "record_imported",
    "run",
]

# A pure decision: the pipeline to run on the snapshot; None when there is nothing to do
# (reactive recovery out of attempts).
Decide = Callable[[ActiveContext, EngineInputs], Outcome | None]


@dataclass(frozen=True, slots=True)
class Plugins:
    """The caller's code a compaction may run (SPEC §9.1: never in a write transaction,
    once decide runs outside one)."""

    count_tokens: TokenCounter
    summarizer: Summarizer | None = None
    memory_provider: MemoryProvider | None = None


@dataclass(frozen=True, slots=True)
class Request:
    """One compaction call: what to decide, and what to record with it for replay."""

    call: Literal["process", "reactive", "manual"]  # recorded with the replay inputs
    now: float
    decide: Decide
    options: dict[str, Any] = field(default_factory=dict)  # EngineRun fields of the call
    instructions: str | None = None
    error: str | None = None


def process_request(now: float, **flags: bool) -> Request:
    """process_request(): the pre-call pipeline with its stage switches."""

    def decide(context: ActiveContext, inputs: EngineInputs) -> Outcome:
        return pipeline.process(context, inputs, **flags)

    return Request("process", now, decide, options=dict(flags))


def reactive_request(now: float, error: str) -> Request:
    """reactive_recover(): the next recovery attempt."""
    return Request("reactive", now, pipeline.recover, error=error)


def manual_request(now: float, instructions: str | None, up_to_seq: int | None) -> Request:
    """compact(): a full compact now, or a partial one up to a seq."""

    def decide(context: ActiveContext, inputs: EngineInputs) -> Outcome:
        if up_to_seq is not None and up_to_seq > context.last_seq:
            raise InvalidInputError(
                f"up_to_seq {up_to_seq} is past the last message (seq {context.last_seq})"
            )
        if up_to_seq is not None and up_to_seq < context.first_kept_seq:
            raise InvalidInputError(
                f"up_to_seq {up_to_seq} is already summarised: the active context starts "
                f"at seq {context.first_kept_seq}"
            )
        return pipeline.manual(context, inputs, up_to_seq=up_to_seq)

    return Request(
        "manual", now, decide, options={"up_to_seq": up_to_seq}, instructions=instructions
    )


def run(
    connection: Connection,
    session: repo.SessionRow,
    context: ActiveContext,
    request: Request,
    plugins: Plugins,
) -> tuple[CompactionResult | None, CachedContext | None]:
    """plan -> decide -> commit in the caller's transaction. None: nothing was decided."""
    snapshot = plan(connection, session, context, request, plugins)
    outcome = request.decide(snapshot.context, snapshot.inputs)
    if outcome is None:
        return None, None
    return commit(connection, snapshot, outcome, request)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What one compaction is decided on, as read at one moment."""

    session: repo.SessionRow  # with the versions the snapshot was read at
    context: ActiveContext
    inputs: EngineInputs

    @property
    def live_boundary_id(self) -> int | None:
        boundary = self.context.boundary
        return None if boundary is None else boundary.id


def plan(
    connection: Connection,
    session: repo.SessionRow,
    context: ActiveContext,
    request: Request,
    plugins: Plugins,
) -> Snapshot:
    """Read what the engines need besides the context (the memory provider runs here)."""
    breaker = repo.get_breaker(connection, session.id)
    entries = repo.memories(connection, session.id)
    budget = context.config.session_memory_max_tokens
    provider = plugins.memory_provider
    memory_text = (
        provider(session.id, entries, budget)
        if provider is not None
        else select_memory(entries, budget, plugins.count_tokens)
    )
    inputs = EngineInputs(
        now=request.now,
        next_blob_id=repo.next_blob_id(connection, session.id),
        memory_text=memory_text,
        memory_count=len(entries),
        last_microcompact_at=breaker.last_microcompact_at,
        consecutive_failures=breaker.consecutive_failures,
        tripped=bool(breaker.tripped),
        reactive_attempts=breaker.reactive_attempts,
        summary_state=context.boundary.summary_state
        if context.boundary is not None
        else SummaryState(),
        summarizer=plugins.summarizer,
        instructions=request.instructions,
    )
    return Snapshot(session, context, inputs)


def commit(
    connection: Connection, snapshot: Snapshot, outcome: Outcome, request: Request
) -> tuple[CompactionResult, CachedContext | None]:
    """Write the outcome with what it was decided on (for replay); returns the result and
    the cache entry of the context it leaves (None: rebuild from the rows)."""
    context, inputs = snapshot.context, snapshot.inputs
    recorded = EngineRun.of(request.call, inputs, context, request.options)
    sid = snapshot.session.id
    result = record_outcome(
        connection,
        sid,
        outcome,
        recorded,
        at=inputs.now,
        instructions=inputs.instructions,
        error=request.error,
    )
    if not outcome.leaves_row:
        return result, None
    return result, cache_entry_after(connection, sid, outcome, result)


def record_imported(
    connection: Connection,
    session_id: str,
    context: ActiveContext,
    boundary: ImportedBoundary,
    at: float,
) -> None:
    """Record a compaction the agent did itself, cutting ``context`` before the next message."""
    recorded = ImportedRun(
        call="import", now=at, last_seq=context.last_seq, pre_tokens=boundary.tokens_before
    )
    record_outcome(connection, session_id, cut_as_imported(context, boundary), recorded, at=at)
