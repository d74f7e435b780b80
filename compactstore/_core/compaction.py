"""Every compaction path as plan -> decide -> commit.

- :func:`plan` (a read transaction) reads the snapshot a compaction is decided on: the
  active context, the stored state the engines need (breaker counters, memory, the next
  blob id), the live boundary id, the highest compaction id, the config and versions, and
  the lease. The memory provider runs here.
- :func:`decide` (no transaction) runs one of :mod:`compactstore._engines.pipeline`'s pure
  pipelines on the snapshot; the caller's summarizer runs inside it, behind a
  :class:`~compactstore._core.summarizing.SummaryCall`.
- :func:`commit` (one short write transaction) checks the snapshot against the rows: it
  proceeds iff the live boundary and config are unchanged (and this call still holds the
  lease), rebases appends and cheap-stage edits made meanwhile, allocates blob ids, and
  writes the outcome with the snapshot's figures and replay inputs.

:func:`compaction_steps` chains them with the lease, the re-plans and ``superseded``. It
runs a :class:`CompactionCall`, a state object whose steps are a generator of
:data:`~compactstore._core.steps.Op` values (read, write, compute, wait), so that one copy
of those rules serves every driver (:mod:`compactstore._core.steps`). The request types
(:class:`Request`, :class:`Plugins`, :class:`Target`) live in
:mod:`compactstore._core.calls`.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Generator
from concurrent.futures import Executor
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Literal, TypeVar

from sqlalchemy import Connection

from compactstore._context.active import ActiveContext
from compactstore._core.cache import CachedContext, read_context
from compactstore._core.cache_inputs import cache_inputs
from compactstore._core.calls import (
    LEASE_GRACE_SECONDS,
    Decide,
    Plugins,
    Request,
    Target,
    background_request,
    manual_request,
    process_request,
    reactive_request,
)
from compactstore._core.rebase import rebase
from compactstore._core.recording import (
    cache_entry_after,
    record_outcome,
    running_result,
    superseded_result,
    unrecorded_result,
)
from compactstore._core.replay_inputs import EngineRun
from compactstore._core.steps import Compute, Op, Read, Wait, Write
from compactstore._core.summarizing import SummaryCall, SummaryMemo
from compactstore._engines.base import EngineInputs
from compactstore._engines.pipeline import Outcome
from compactstore._engines.session_memory import select_memory
from compactstore._engines.summary import budget_for
from compactstore.db import repository as repo
from compactstore.errors import NotFoundError
from compactstore.formats.request import build_request_params
from compactstore.models import CompactionResult, SummaryState

__all__ = [
    "LEASE_GRACE_SECONDS",
    "MAX_REPLANS",
    "CompactionCall",
    "Decide",
    "Decision",
    "Plugins",
    "Request",
    "Snapshot",
    "State",
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

    def may_cut(self, request: Request) -> bool:
        """Whether deciding ``request`` on this snapshot may cut (and so may need the
        lease)."""
        return request.cuts(self.context, self.inputs)

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
        # Resolved with the context (the store's capability table): the engines run under
        # the policy that chose the thinking the context sends.
        edit_policy=context.edit_policy,
        prefix_checks=context.prefix_checks,
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


# -- the call: lease -> decide -> commit ----------------------------------------------------

# What a call does next: plan (read a snapshot), lease (take the lease before a cut that
# calls a summarizer), decide (run the pipeline), commit (write the outcome), done.
State = Literal["plan", "lease", "decide", "commit", "done"]


@dataclass(slots=True)
class CompactionCall:
    """One compaction call as a state object: plan -> lease -> decide -> commit, with the
    re-plans. :meth:`steps` runs it as a generator of :data:`~compactstore._core.steps.Op`
    values; the transitions (:meth:`after_lease`, :meth:`after_decide`,
    :meth:`after_commit`) are plain methods that set :attr:`state`.

    The lease ends once: the commit's write transaction releases it with the outcome
    (:func:`commit`), or the ``finally`` of :meth:`steps` does on every other way out.
    """

    target: Target
    request: Request
    plugins: Plugins
    executor: Executor
    # The request the next decide runs: the call's, or its cheap stages only.
    current: Request = field(init=False)
    state: State = "plan"
    held: bool = False  # this call holds the session's lease
    replans: int = 0
    cheap_only: bool = False  # still racing after the re-plans: cut nothing
    rule_based: bool = field(init=False)  # no summarizer (the agent is blocked)
    background: Literal["running"] | None = None  # another caller's summary is in flight
    stale: Outcome | None = None  # the outcome a changed snapshot refused
    decision: Decision = (None, None)
    owner: str = field(default_factory=lambda: uuid.uuid4().hex)
    memo: SummaryMemo = field(default_factory=SummaryMemo)

    def __post_init__(self) -> None:
        self.current = self.request
        self.rule_based = self.request.call == "reactive"

    # -- transitions ------------------------------------------------------------------------

    def after_plan(self, snapshot: Snapshot) -> None:
        """plan -> lease, decide, or done (the trigger no longer holds)."""
        request = self.request
        if self.stale is not None and request.call == "process" and not snapshot.may_cut(request):
            # Another compaction, rollback or config change landed and the trigger no
            # longer holds: nothing to record.
            self.finish(superseded_result(self.stale, request.now))
        elif self.needs_lease(snapshot):
            self.state = "lease"
        else:
            self.state = "decide"

    def needs_lease(self, snapshot: Snapshot) -> bool:
        """Whether the call must settle the lease before it decides: a cut it may make,
        not yet leased, with no summary of another caller known to be in flight."""
        return (
            not self.held
            and not self.cheap_only
            and self.background is None
            and snapshot.may_cut(self.current)
        )

    @property
    def hands_over(self) -> bool:
        """Whether the commit checks and releases the lease with the outcome: a cut's
        commit does; the cheap stages after the re-plans commit as a call with no lease
        would (the ``finally`` releases it after them)."""
        return self.held and not self.cheap_only

    def after_lease(self, acquired: bool, unchanged: bool, leased: bool) -> None:
        """lease -> decide, plan (the context moved before the lease), or done.

        ``leased``: the call asked for the lease (it was not merely free)."""
        if acquired:
            self.held = leased
            self.state = "decide" if unchanged else "plan"
            return
        # Another caller's summary is in flight: the cheap stages only.
        self.background = "running"
        cheap = self.current.cheap()
        if cheap is None:
            self.finish(running_result(self.request.now, self.request.instructions))
            return
        self.current = cheap
        self.state = "decide"

    def after_decide(self, outcome: Outcome | None) -> None:
        """decide -> commit, or done (nothing decided, or nothing to write)."""
        if outcome is None:
            self.finish(None)
        elif not outcome.writes:
            result = unrecorded_result(outcome, self.request.now, self.current.instructions)
            self.finish(result.model_copy(update={"background": self.background}))
        else:
            self.state = "commit"

    def after_commit(self, verdict: Verdict, outcome: Outcome) -> None:
        """commit -> done, or plan (the snapshot changed under the call: re-plan)."""
        now = self.request.now
        if verdict.kind == "lost" or (verdict.kind == "committed" and self.hands_over):
            self.held = False  # taken over, or released with the commit
        if verdict.kind == "committed":
            assert verdict.result is not None
            result = verdict.result.model_copy(update={"background": self.background})
            self.finish(result, verdict.cached)
            return
        if verdict.kind == "lost" or self.cheap_only:
            self.finish(superseded_result(outcome, now))
            return
        self.stale = outcome if verdict.kind == "changed" else None
        self.replans += 1
        self.state = "plan"
        if self.replans > MAX_REPLANS:
            # Still racing after the re-plans: the cheap stages only, which cut nothing.
            cheap = self.current.cheap()
            if cheap is None:
                self.finish(superseded_result(outcome, now))
            else:
                self.current, self.cheap_only, self.stale = cheap, True, None

    def finish(self, result: CompactionResult | None, cached: CachedContext | None = None) -> None:
        self.decision = (result, cached)
        self.state = "done"

    # -- steps ------------------------------------------------------------------------------

    def steps(self) -> Generator[Op, Any, Decision]:
        """Run the call; returns the result (None: reactive recovery out of attempts) and
        the cache entry of the context it left (None: rebuild from the rows)."""
        try:
            while self.state != "done":
                snapshot: Snapshot = yield Read(
                    partial(plan, target=self.target, request=self.request, plugins=self.plugins)
                )
                self.after_plan(snapshot)
                if self.state == "lease":
                    yield from self.lease(snapshot)
                if self.state == "decide":
                    yield from self.decide_and_commit(snapshot)
            return self.decision
        except GeneratorExit:
            # Closed unfinished by the driver: no step can run; the lease expires.
            self.held = False
            raise
        finally:
            if self.held:
                self.held = False
                sid = self.target.session_id
                yield Write(partial(repo.release_lease, session_id=sid, owner=self.owner))

    def lease(self, snapshot: Snapshot) -> Generator[Op, Any, None]:
        """A cut that calls a summarizer takes the lease. A rule-based one takes none
        (milliseconds; a race is settled by the commit's version check), so a killed
        process leaves none behind, but it defers to another caller's summary in flight,
        and reactive recovery takes that one over."""
        reactive = self.request.call == "reactive"
        in_flight = snapshot.lease is not None and snapshot.lease.live
        leased = summarizes(snapshot, self.plugins) or (reactive and in_flight)
        if leased:
            acquired, unchanged = yield Write(self.take_lease(snapshot, take_over=reactive))
        else:
            acquired, unchanged = not in_flight, True
        # A background job blocks no agent: it never takes a caller's lease over (that
        # caller is cutting already; a blocked one would lose its cut).
        if not acquired and snapshot.blocking and self.request.call != "background":
            timeout = snapshot.context.config.summarizer_timeout_seconds
            if (yield from _wait_for_lease(self.target, timeout)):
                self.state = "plan"  # the summary landed: decide again on what it left
                return
            acquired, unchanged = yield Write(self.take_lease(snapshot, take_over=True))
            self.rule_based = leased = True
        self.after_lease(acquired, unchanged, leased)

    def take_lease(self, snapshot: Snapshot, *, take_over: bool) -> Callable[[Connection], Any]:
        return partial(
            _take_lease,
            target=self.target,
            snapshot=snapshot,
            owner=self.owner,
            take_over=take_over,
        )

    def decide_and_commit(self, snapshot: Snapshot) -> Generator[Op, Any, None]:
        current = self.current
        service = (
            None
            if self.rule_based or current.call == "reactive"
            else summary_call(snapshot, self.plugins, self.memo, self.executor)
        )
        outcome = yield Compute(
            partial(decide, snapshot, current, service),
            waits=service is not None and snapshot.may_cut(current),
        )
        self.after_decide(outcome)
        if self.state != "commit":
            return
        assert outcome is not None
        verdict: Verdict = yield Write(
            partial(
                commit,
                target=self.target,
                snapshot=snapshot,
                outcome=outcome,
                request=current,
                owner=self.owner if self.hands_over else None,
            )
        )
        self.after_commit(verdict, outcome)


def compaction_steps(
    target: Target, request: Request, plugins: Plugins, executor: Executor
) -> Generator[Op, Any, Decision]:
    """One compaction call, plan -> lease -> decide -> commit, with the re-plans
    (:class:`CompactionCall`).

    Returns the result (None: reactive recovery out of attempts) and the cache entry of
    the context it left (None: rebuild from the rows).
    """
    return CompactionCall(target, request, plugins, executor).steps()
