"""The compaction call as a state object (compactstore._core.compaction.CompactionCall):
its transitions as a table, and the lease it holds ended exactly once, by the commit or by
the ``finally`` of its steps. No database: the transitions are plain methods."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Executor, ThreadPoolExecutor
from functools import partial

import pytest

from compactstore._context.tokens import estimate_tokens
from compactstore._core.cache import ContextCache
from compactstore._core.compaction import (
    MAX_REPLANS,
    CompactionCall,
    Plugins,
    Request,
    Target,
    Verdict,
    background_request,
    manual_request,
    process_request,
    reactive_request,
)
from compactstore._core.steps import Read, Write
from compactstore._engines import pipeline
from compactstore._engines.base import EngineInputs
from compactstore._engines.pipeline import Outcome
from compactstore.db import repository as repo
from compactstore.formats import get_format
from compactstore.models import CompactionResult
from tests.engines.builder import ContextBuilder

NOW = 1_700_010_000.0
KINDS = ["process", "background", "reactive", "manual"]


def request_of(kind: str) -> Request:
    if kind == "process":
        return process_request(NOW)
    if kind == "background":
        return background_request(NOW, started_by=None)
    if kind == "reactive":
        return reactive_request(NOW, "prompt is too long")
    return manual_request(NOW, None, None)


@pytest.fixture(scope="module")
def executor() -> Iterator[Executor]:
    with ThreadPoolExecutor(1) as pool:
        yield pool


@pytest.fixture(scope="module")
def outcome() -> Outcome:
    """A cut a call could commit (a manual compact of an in-memory context)."""
    context = ContextBuilder().request("Fix the flaky test.").chatter(30).build()
    return pipeline.manual(context, EngineInputs(now=NOW), up_to_seq=None)


def new_call(kind: str, executor: Executor, *, held: bool, replans: int = 0) -> CompactionCall:
    target = Target("s1", get_format("anthropic"), ContextCache(), "memory")
    call = CompactionCall(target, request_of(kind), Plugins(estimate_tokens), executor)
    call.held, call.replans, call.state = held, replans, "commit"
    return call


COMMITTED = CompactionResult(success=True, strategy=None, trigger=None)

# verdict, replans before, call kind -> next state, whether the call goes on with the cheap
# stages only, and the result's success when done. "held" is the lease after the
# transition when the call held it before (a call that held none never holds one after).
TABLE = [
    # Committed: the commit's transaction released the lease with the outcome.
    *[("committed", 0, kind, "done", False, True, False) for kind in KINDS],
    # Lost: the lease was taken over; superseded, nothing recorded.
    *[("lost", 0, kind, "done", False, False, False) for kind in KINDS],
    # Changed or conflict: re-plan, still holding the lease.
    *[(v, 0, kind, "plan", False, None, True) for v in ("changed", "conflict") for kind in KINDS],
    *[
        (v, MAX_REPLANS - 1, kind, "plan", False, None, True)
        for v in ("changed", "conflict")
        for kind in KINDS
    ],
    # Out of re-plans: a process call goes on with the cheap stages (they cut nothing);
    # the other calls are a cut and nothing else, so they are superseded. The lease is
    # still held: the cheap commit or the steps' finally ends it.
    *[(v, MAX_REPLANS, "process", "plan", True, None, True) for v in ("changed", "conflict")],
    *[
        (v, MAX_REPLANS, kind, "done", False, False, True)
        for v in ("changed", "conflict")
        for kind in ("background", "reactive", "manual")
    ],
]


@pytest.mark.parametrize("held", [True, False])
@pytest.mark.parametrize(("verdict", "replans", "kind", "state", "cheap", "success", "kept"), TABLE)
def test_after_commit(
    outcome: Outcome,
    executor: Executor,
    verdict: str,
    replans: int,
    kind: str,
    state: str,
    cheap: bool,
    success: bool | None,
    kept: bool,
    held: bool,
) -> None:
    call = new_call(kind, executor, held=held, replans=replans)
    result = COMMITTED if verdict == "committed" else None
    call.after_commit(Verdict(verdict, result), outcome)  # type: ignore[arg-type]
    assert call.state == state
    assert call.held == (held and kept)
    assert call.cheap_only == cheap
    if cheap:
        assert call.current.call == "process"
        assert call.current.options["enable_auto_compact"] is False
    result_after, _ = call.decision
    if state == "done":
        assert result_after is not None and result_after.success == success
        if verdict != "committed":
            assert [step.detail for step in result_after.steps] == ["superseded"]
    else:
        assert result_after is None
        assert call.replans == replans + 1
        assert (call.stale is outcome) == (verdict == "changed" and not cheap)


@pytest.mark.parametrize("kind", KINDS)
def test_a_cheap_only_call_is_superseded_by_any_verdict_but_committed(
    outcome: Outcome, executor: Executor, kind: str
) -> None:
    for verdict in ("changed", "conflict", "lost"):
        call = new_call(kind, executor, held=False)
        call.cheap_only = True
        call.after_commit(Verdict(verdict), outcome)
        result, cached = call.decision
        assert call.state == "done" and cached is None
        assert result is not None and not result.success


# acquired, unchanged, leased, call kind -> next state, held after, "running"
LEASE_TABLE = [
    *[
        (True, True, leased, kind, "decide", leased, None)
        for leased in (True, False)
        for kind in KINDS
    ],
    *[
        (True, False, leased, kind, "plan", leased, None)
        for leased in (True, False)
        for kind in KINDS
    ],
    # Another caller's summary in flight: a process call runs its cheap stages; the others
    # are a cut only and answer "running" at once.
    *[(False, True, leased, "process", "decide", False, "running") for leased in (True, False)],
    *[
        (False, True, leased, kind, "done", False, "running")
        for leased in (True, False)
        for kind in ("background", "reactive", "manual")
    ],
]


@pytest.mark.parametrize(
    ("acquired", "unchanged", "leased", "kind", "state", "held", "bg"), LEASE_TABLE
)
def test_after_lease(
    executor: Executor,
    acquired: bool,
    unchanged: bool,
    leased: bool,
    kind: str,
    state: str,
    held: bool,
    bg: str | None,
) -> None:
    call = new_call(kind, executor, held=False)
    call.state = "lease"
    call.after_lease(acquired, unchanged, leased)
    assert (call.state, call.held, call.background) == (state, held, bg)
    result, _ = call.decision
    if state == "done":
        assert result is not None and result.background == "running" and not result.success
    else:
        assert result is None
    assert (call.current is call.request) == (acquired or kind != "process")


@pytest.mark.parametrize("verdict", ["committed", "changed", "conflict", "lost"])
def test_the_cheap_stages_after_the_re_plans_leave_the_lease_to_the_finally(
    outcome: Outcome, executor: Executor, verdict: str
) -> None:
    call = new_call("process", executor, held=True)
    call.cheap_only = True
    assert not call.hands_over  # committed with no owner: no lease check, no release
    result = COMMITTED if verdict == "committed" else None
    call.after_commit(Verdict(verdict, result), outcome)  # type: ignore[arg-type]
    assert call.state == "done"
    assert call.held == (verdict != "lost")  # the finally releases it


@pytest.mark.parametrize("kind", KINDS)
def test_after_decide(outcome: Outcome, executor: Executor, kind: str) -> None:
    call = new_call(kind, executor, held=True)
    call.after_decide(outcome)
    assert (call.state, call.held) == ("commit", True)
    call.after_decide(None)  # reactive recovery out of attempts
    assert (call.state, call.decision, call.held) == ("done", (None, None), True)


def released(op: object, owner: str) -> bool:
    assert isinstance(op, Write) and isinstance(op.fn, partial)
    return op.fn.func is repo.release_lease and op.fn.keywords["owner"] == owner


@pytest.mark.parametrize("kind", KINDS)
def test_an_error_in_a_step_releases_a_held_lease_once_then_re_raises(
    executor: Executor, kind: str
) -> None:
    call = new_call(kind, executor, held=True)
    call.state = "plan"
    steps = call.steps()
    assert isinstance(next(steps), Read)
    op = steps.throw(RuntimeError("the summarizer failed"))
    assert released(op, call.owner)
    assert not call.held
    with pytest.raises(RuntimeError, match="the summarizer failed"):
        steps.send(None)


def test_an_error_with_no_lease_held_releases_nothing(executor: Executor) -> None:
    call = new_call("process", executor, held=False)
    call.state = "plan"
    steps = call.steps()
    next(steps)
    with pytest.raises(ValueError, match="bad row"):
        steps.throw(ValueError("bad row"))


def test_a_call_closed_unfinished_runs_no_step(executor: Executor) -> None:
    """A driver that drops the generator (its caller went away) cannot run a release: the
    lease expires on its own."""
    call = new_call("manual", executor, held=True)
    call.state = "plan"
    steps = call.steps()
    next(steps)
    steps.close()  # no RuntimeError: the finally yields nothing
    assert not call.held


def test_a_call_done_with_the_lease_held_releases_it_once_before_returning(
    outcome: Outcome, executor: Executor
) -> None:
    call = new_call("manual", executor, held=True, replans=MAX_REPLANS)
    call.after_commit(Verdict("changed"), outcome)  # superseded, lease still held
    assert call.state == "done" and call.held
    steps = call.steps()
    assert released(next(steps), call.owner)
    with pytest.raises(StopIteration) as stop:
        steps.send(None)
    result, cached = stop.value.value
    assert result is not None and not result.success and cached is None
