"""Every compaction path as plan -> decide -> commit.

- :func:`plan` (a read transaction) reads the snapshot a compaction is decided on: the
  active context, the stored state the engines need (breaker counters, memory, the next
  blob id), the live boundary id, the highest compaction id, the config and versions, and
  the lease. The memory provider runs here.
- :func:`decide` (no transaction) runs one of :mod:`compactstore.engines.pipeline`'s pure
  pipelines on the snapshot; the caller's summarizer runs inside it, behind a
  :class:`~compactstore.core.summarizing.SummaryCall`.
- :func:`commit` (one short write transaction) checks the snapshot against the rows: it
  proceeds iff the live boundary and config are unchanged (and this call still holds the
  lease), rebases appends and cheap-stage edits made meanwhile, allocates blob ids, and
  writes the outcome with the snapshot's figures and replay inputs.

:func:`compaction_steps` chains them with the lease, the re-plans and ``superseded``. It
is a generator of :data:`~compactstore.core.steps.Op` values (read, write, compute, wait)
so that one copy of those rules serves every driver (:mod:`compactstore.core.steps`).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Generator, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Literal, TypeVar

from sqlalchemy import Connection

from compactstore.capabilities import MODEL_CAPABILITIES, ModelCapabilities, resolve_policy
from compactstore.context import ActiveContext
from compactstore.core.cache import CachedContext, ContextCache, read_context
from compactstore.core.cache_inputs import cache_inputs
from compactstore.core.rebase import rebase
from compactstore.core.recording import (
    cache_entry_after,
    record_outcome,
    running_result,
    superseded_result,
    unrecorded_result,
)
from compactstore.core.replay_inputs import EngineRun
from compactstore.core.steps import Compute, Op, Read, Wait, Write
from compactstore.core.summarizing import Redactor, SummaryCall, SummaryMemo
from compactstore.db import repository as repo
from compactstore.engines import auto_compact, pipeline
from compactstore.engines.base import EngineInputs, Summarizer
from compactstore.engines.pipeline import Outcome
from compactstore.engines.session_memory import MemoryProvider, select_memory
from compactstore.engines.summary import budget_for
from compactstore.errors import InvalidInputError, NotFoundError
from compactstore.formats import MessageFormat
from compactstore.formats.request import build_request_params
from compactstore.models import CompactionResult, SummaryState
from compactstore.pricing import PriceTable
from compactstore.tokens import TokenCounter

__all__ = [
    "Decide",
    "Decision",
    "Plugins",
    "Request",
    "Snapshot",
    "Target",
    "Verdict",
    "background_request",
    "commit",
    "compaction_steps",
    "decide",
    "manual_request",
    "plan",
    "process_request",
    "reactive_request",
]

T = TypeVar("T")

# Re-plans a call makes before it commits the cheap stages only.
MAX_REPLANS = 2
# Seconds added to summarizer_timeout_seconds for a lease's lifetime.
LEASE_GRACE_SECONDS = 30.0

# A pure decision: the pipeline to run on the snapshot; None when there is nothing to do
# (reactive recovery out of attempts).
Decide = Callable[[ActiveContext, EngineInputs], Outcome | None]


@dataclass(frozen=True, slots=True)
class Plugins:
    """The caller's code a compaction may run; none of it ever runs in a write
    transaction."""

    count_tokens: TokenCounter
    summarizer: Summarizer | None = None
    memory_provider: MemoryProvider | None = None
    summarizer_name: str | None = None
    executor: Executor | None = None  # bounded: where sync summarizers run
    redactor: Redactor | None = None
    loop: asyncio.AbstractEventLoop | None = None  # where async summarizers are awaited
    compactor: Any = None  # a provider compactor (compactstore.providers)


@dataclass(frozen=True, slots=True)
class Target:
    """The session a compaction works on, as the driver knows it."""

    session_id: str
    adapter: MessageFormat
    cache: ContextCache
    location: str
    # The model capability table (compactstore.capabilities; the store's, with its
    # overrides): it resolves the "auto" edit policy.
    capabilities: Mapping[str, ModelCapabilities] = field(
        default_factory=lambda: MODEL_CAPABILITIES
    )
    # The store's prices (compactstore.pricing): a provider compaction's billed usage is
    # recorded as a model call with its cost, and the cost rule of in-place edits.
    prices: PriceTable | None = None


@dataclass(frozen=True, slots=True)
class Request:
    """One compaction call: what to decide, and what to record with it for replay."""

    call: Literal["process", "reactive", "manual", "background"]  # recorded for replay
    now: float
    decide: Decide
    options: dict[str, Any] = field(default_factory=dict)  # EngineRun fields of the call
    instructions: str | None = None
    error: str | None = None
    started_by: int | None = None  # a background compaction: the starting call's row

    def may_cut(self, snapshot: Snapshot) -> bool:
        """Whether deciding this call on the snapshot may cut (and so may need the lease)."""
        return self.cuts(snapshot.context, snapshot.inputs)

    def cuts(self, context: ActiveContext, inputs: EngineInputs) -> bool:
        """:meth:`may_cut` before the snapshot is whole. The cheap stages only lower usage,
        so a process call whose context is below the auto-compact threshold never cuts."""
        if self.call != "process":
            return True
        return bool(self.options.get("enable_auto_compact", True)) and (
            auto_compact.should_trigger(context, inputs)
        )

    def cheap(self) -> Request | None:
        """This call with the cheap stages only (tool budget, microcompact); None for calls
        that are a cut and nothing else."""
        if self.call != "process":
            return None
        flags = {**self.options, "enable_auto_compact": False}
        return process_request(self.now, **flags)


def process_request(now: float, **flags: bool) -> Request:
    """process_request(): the pre-call pipeline with its stage switches."""

    def decide(context: ActiveContext, inputs: EngineInputs) -> Outcome:
        return pipeline.process(context, inputs, **flags)

    return Request("process", now, decide, options=dict(flags))


def background_request(now: float, started_by: int | None) -> Request:
    """A background compaction a process_request(background=True) started."""
    return Request("background", now, pipeline.background, started_by=started_by)


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


# -- plan -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What one compaction is decided on, as read in one read transaction."""

    session: repo.SessionRow  # with the versions and config the snapshot was read at
    context: ActiveContext
    inputs: EngineInputs  # without a summary service (decide adds it)
    max_compaction_id: int
    # Read only when the call may cut (Request.cuts); else no memory, 0 and None.
    summarizer_calls: int  # summarizer calls recorded in the hour before the call's now
    lease: repo.LeaseRow | None

    @property
    def live_boundary_id(self) -> int | None:
        boundary = self.context.boundary
        return None if boundary is None else boundary.id

    @property
    def blocking(self) -> bool:
        """Usage at or above ``reactive_blocking_ratio`` of the window: the agent is
        blocked, so it waits for a running summary instead of going on."""
        context = self.context
        return context.usage >= context.config.reactive_blocking_ratio * context.context_window


def require(connection: Connection, target: Target, *, lock: bool = False) -> repo.SessionRow:
    """The session's row (locked with ``lock``); NotFoundError once it was deleted."""
    row = repo.get_session(connection, target.session_id, lock=lock)
    if row is None:
        raise NotFoundError(f"session {target.session_id!r} no longer exists in {target.location}")
    return row


def plan(connection: Connection, target: Target, request: Request, plugins: Plugins) -> Snapshot:
    """Read the snapshot (run in a read transaction; the memory provider runs here)."""
    sid = target.session_id
    session = require(connection, target)
    context = read_context(
        connection,
        target.cache,
        sid,
        target.adapter,
        plugins.count_tokens,
        location=target.location,
        row=session,
    )
    breaker, next_blob_id, max_compaction_id = repo.plan_state(connection, sid)
    policy, prefix_checks = resolve_policy(
        context.config.edit_policy, session.model, target.capabilities
    )
    inputs = EngineInputs(
        now=request.now,
        next_blob_id=next_blob_id,
        last_microcompact_at=breaker.last_microcompact_at,
        consecutive_failures=breaker.consecutive_failures,
        tripped=bool(breaker.tripped),
        reactive_attempts=breaker.reactive_attempts,
        summary_state=context.boundary.summary_state
        if context.boundary is not None
        else SummaryState(),
        instructions=request.instructions,
        edit_policy=policy,
        prefix_checks=prefix_checks,
        **cache_inputs(connection, sid, session.model, target.prices),
    )
    if not request.cuts(context, inputs):
        # What only a cut uses is not read: a step of an agent below the threshold costs
        # no memory provider call, no count of summaries and no lease read.
        return Snapshot(session, context, inputs, max_compaction_id, summarizer_calls=0, lease=None)
    entries = repo.memories(connection, sid)
    # The memory is part of a summary: within the window's share too.
    budget = min(context.config.session_memory_max_tokens, budget_for(context))
    provider = plugins.memory_provider
    memory_text = (
        provider(sid, entries, budget)
        if provider is not None
        else select_memory(entries, budget, plugins.count_tokens)
    )
    return Snapshot(
        session=session,
        context=context,
        inputs=replace(inputs, memory_text=memory_text, memory_count=len(entries)),
        max_compaction_id=max_compaction_id,
        summarizer_calls=repo.summarizer_calls_since(connection, sid, request.now - 3_600),
        lease=repo.get_lease(connection, sid),
    )


# -- decide ---------------------------------------------------------------------------------


def summary_call(
    snapshot: Snapshot, plugins: Plugins, memo: SummaryMemo, executor: Executor
) -> SummaryCall | None:
    """The summary service of a call on this snapshot; None when no summarizer is set for
    the store or the session (the rule-based summary, no fallback)."""
    if not summarizes(snapshot, plugins):
        return None
    config = snapshot.context.config
    system = None if plugins.compactor is None else request_system(snapshot.context)
    return SummaryCall(
        summarizer=plugins.summarizer,
        name=plugins.summarizer_name,
        recorded=snapshot.session.summarizer,
        executor=executor,
        timeout=config.summarizer_timeout_seconds,
        calls_left=config.summarizer_max_calls_per_hour - snapshot.summarizer_calls,
        redactor=plugins.redactor,
        memo=memo,
        loop=plugins.loop,
        compactor=plugins.compactor,
        model=snapshot.session.model,
        system=system,
        drop_block=snapshot.session.thinking_binding == "drop_block",
    )


def request_system(context: ActiveContext) -> Any:
    """The ``system`` the session's requests send (None: none): a provider compaction
    request sends it too, since the block is bound to it."""
    prompt = [item for item in context.items if item.message.get("role") == "system"]
    if not prompt:
        return None
    wire = build_request_params(
        context.fmt,
        context.config,
        prompt,
        [item.copy_message() for item in prompt],
        cache_control=False,
    )
    return wire.get("system")


def summarizes(snapshot: Snapshot, plugins: Plugins) -> bool:
    """Whether a summarizer is set for the store or the session: a cut then calls it, and
    so takes the lease first. A rule-based cut takes milliseconds and needs no lease: two
    callers racing are settled by the commit's version check."""
    return (
        plugins.summarizer is not None
        or snapshot.session.summarizer is not None
        or plugins.compactor is not None
    )


def decide(snapshot: Snapshot, request: Request, service: SummaryCall | None) -> Outcome | None:
    """Run the call's pipeline on the snapshot (no transaction; the summarizer runs here)."""
    return request.decide(snapshot.context, replace(snapshot.inputs, summarizer=service))


# -- commit ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Verdict:
    """What a commit did: ``committed``; ``changed`` (the live boundary or config moved:
    re-plan if the trigger still holds); ``conflict`` (a message appended meanwhile needs
    a seq the cut removes: re-plan); ``lost`` (the lease was taken over)."""

    kind: Literal["committed", "changed", "conflict", "lost"]
    result: CompactionResult | None = None
    cached: CachedContext | None = None


def commit(
    connection: Connection,
    target: Target,
    snapshot: Snapshot,
    outcome: Outcome,
    request: Request,
    owner: str | None,
) -> Verdict:
    """Check the snapshot against the rows and write the outcome (one write transaction).

    ``owner`` is the lease token when the call holds the lease; the lease is released with
    the commit.
    """
    sid = target.session_id
    row = require(connection, target, lock=True)
    if owner is not None and not repo.owns_lease(connection, sid, owner):
        return Verdict("lost")
    live = repo.live_boundary(connection, sid)
    live_id = None if live is None else live.id
    if live_id != snapshot.live_boundary_id or row.config != snapshot.session.config:
        return Verdict("changed")
    quiet = row.version == snapshot.session.version
    if not quiet:
        cut, last_seq = outcome.cut, snapshot.context.last_seq
        if cut is not None and row.last_seq > last_seq:
            needed = repo.appended_conflicts(connection, sid, last_seq)
            if needed & set(cut.removed_seqs):
                return Verdict("conflict")
        outcome = rebase(
            connection, snapshot.session.id, snapshot.context, snapshot.max_compaction_id, outcome
        )
    recorded = EngineRun.of(request.call, snapshot.inputs, snapshot.context, request.options)
    result = record_outcome(
        connection,
        sid,
        outcome,
        recorded,
        at=snapshot.inputs.now,
        instructions=snapshot.inputs.instructions,
        error=request.error,
        started_by=request.started_by,
        prices=target.prices,
    )
    if owner is not None:
        repo.release_lease(connection, sid, owner)
    # The outcome's context saw the snapshot only: cached only when nothing else wrote
    # meanwhile, so it is never stamped with versions it did not see.
    cached = cache_entry_after(connection, sid, outcome, result) if quiet else None
    return Verdict("committed", result, cached)


Decision = tuple[CompactionResult | None, CachedContext | None]


def _take_lease(
    connection: Connection,
    target: Target,
    snapshot: Snapshot,
    owner: str,
    take_over: bool,
) -> tuple[bool, bool]:
    """(acquired, the context is still the snapshot's) in one short write transaction."""
    sid = target.session_id
    row = require(connection, target, lock=True)
    seconds = row.config.summarizer_timeout_seconds + LEASE_GRACE_SECONDS
    acquired = repo.acquire_lease(connection, sid, owner, seconds, take_over=take_over)
    return acquired, row.context_version == snapshot.session.context_version


def _release(connection: Connection, session_id: str, owner: str) -> None:
    repo.release_lease(connection, session_id, owner)


def _lease_free(connection: Connection, session_id: str) -> bool:
    lease = repo.get_lease(connection, session_id)
    return lease is None or not lease.live


def _wait_for_lease(target: Target, timeout: float) -> Generator[Op, Any, bool]:
    """Wait up to ``timeout`` seconds for another caller's lease; True when it was freed."""
    waited, pause = 0.0, 0.02
    while waited < timeout:
        pause = min(pause, timeout - waited)
        yield Wait(pause)
        waited += pause
        pause = min(pause * 2, 0.25)
        if (yield Read(partial(_lease_free, session_id=target.session_id))):
            return True
    return False


def compaction_steps(
    target: Target, request: Request, plugins: Plugins, executor: Executor
) -> Generator[Op, Any, Decision]:
    """One compaction call, plan -> decide -> commit, with the lease and the re-plans.

    Returns the result (None: reactive recovery out of attempts) and the cache entry of
    the context it left (None: rebuild from the rows).
    """
    memo = SummaryMemo()
    owner = uuid.uuid4().hex
    held = False  # this call holds the session's lease
    replans = 0
    cheap_only = False
    current: Request | None = request
    rule_based = request.call == "reactive"  # the agent is blocked: no summarizer
    background: Literal["running"] | None = None
    stale: Outcome | None = None  # the outcome a changed snapshot refused
    sid = target.session_id
    try:
        while True:
            snapshot: Snapshot = yield Read(
                partial(plan, target=target, request=request, plugins=plugins)
            )
            if stale is not None and request.call == "process" and not request.may_cut(snapshot):
                # Another compaction, rollback or config change landed and the trigger no
                # longer holds: nothing to record.
                if held:
                    yield Write(partial(_release, session_id=sid, owner=owner))
                    held = False
                return superseded_result(stale, request.now), None
            assert current is not None
            if not held and not cheap_only and background is None and current.may_cut(snapshot):
                # A cut that calls a summarizer takes the lease. A rule-based one takes none
                # (milliseconds; a race is settled by the commit's version check), so a
                # killed process leaves none behind, but it defers to another caller's
                # summary in flight, and reactive recovery takes that one over.
                in_flight = snapshot.lease is not None and snapshot.lease.live
                leased = summarizes(snapshot, plugins) or (request.call == "reactive" and in_flight)
                if leased:
                    acquired, unchanged = yield Write(
                        partial(
                            _take_lease,
                            target=target,
                            snapshot=snapshot,
                            owner=owner,
                            take_over=request.call == "reactive",
                        )
                    )
                else:
                    acquired, unchanged = not in_flight, True
                # A background job blocks no agent: it never takes a caller's lease over
                # (that caller is cutting already; a blocked one would lose its cut).
                if not acquired and snapshot.blocking and request.call != "background":
                    timeout = snapshot.context.config.summarizer_timeout_seconds
                    if (yield from _wait_for_lease(target, timeout)):
                        continue  # the summary landed: decide again on what it left
                    acquired, unchanged = yield Write(
                        partial(
                            _take_lease,
                            target=target,
                            snapshot=snapshot,
                            owner=owner,
                            take_over=True,
                        )
                    )
                    rule_based = leased = True
                if acquired:
                    held = leased
                    if not unchanged:
                        continue  # another compaction landed before the lease: see it
                else:
                    # Another caller's summary is in flight: the cheap stages only.
                    background = "running"
                    current = current.cheap()
                    if current is None:
                        return running_result(request.now, request.instructions), None
            service = (
                None
                if rule_based or current.call == "reactive"
                else summary_call(snapshot, plugins, memo, executor)
            )
            outcome = yield Compute(
                partial(decide, snapshot, current, service),
                waits=service is not None and current.may_cut(snapshot),
            )
            if outcome is None:
                if held:
                    yield Write(partial(_release, session_id=sid, owner=owner))
                    held = False
                return None, None
            if not outcome.writes:
                if held:
                    yield Write(partial(_release, session_id=sid, owner=owner))
                    held = False
                result = unrecorded_result(outcome, request.now, current.instructions)
                return result.model_copy(update={"background": background}), None
            verdict: Verdict = yield Write(
                partial(
                    commit,
                    target=target,
                    snapshot=snapshot,
                    outcome=outcome,
                    request=current,
                    owner=owner if held else None,
                )
            )
            if verdict.kind == "committed":
                held = False
                assert verdict.result is not None
                return verdict.result.model_copy(update={"background": background}), (
                    verdict.cached
                )
            if verdict.kind == "lost":
                held = False
                return superseded_result(outcome, request.now), None
            if cheap_only:
                return superseded_result(outcome, request.now), None
            stale = outcome if verdict.kind == "changed" else None
            replans += 1
            if replans > MAX_REPLANS:
                # Still racing after the re-plans: the cheap stages only, which cut nothing.
                if held:
                    yield Write(partial(_release, session_id=sid, owner=owner))
                    held = False
                cheap_only, stale = True, None
                current = current.cheap()
                if current is None:
                    return superseded_result(outcome, request.now), None
    except GeneratorExit:
        raise
    except BaseException:
        if held:
            yield Write(partial(_release, session_id=sid, owner=owner))
        raise
