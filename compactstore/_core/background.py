"""Background compaction: the reads and writes around a job.

``process_request(background=True)`` below ``reactive_blocking_ratio`` never waits for a
summary: it runs the cheap stages (its own row), and once usage passes
``background_threshold`` it starts a job in one write transaction (:func:`start`): a
``compaction_jobs`` row with the snapshot it saw, linked to the call's own compactions row
(recorded here when the cheap stages left none). A worker (the starting process's, or
``compactstore worker``) claims the job and runs :func:`compaction.background_request` through
the ordinary plan -> decide -> commit, so the lease, the rebase and the re-plans are the same
as for any compaction; its row's ``started_by`` names the starting call's row.

At ``reactive_blocking_ratio`` the agent is blocked anyway: the call compacts as without
background, so it waits for the job's summary in flight (the job holds the compaction
lease) up to ``summarizer_timeout_seconds``, then takes the lease over. A job whose lease
lapsed (the process running it died) is an orphan: the session's next background call
claims it (:func:`claim`) and runs it, as ``compactstore worker`` would.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from sqlalchemy import Connection

from compactstore._context.active import ActiveContext
from compactstore._context.tokens import TokenCounter
from compactstore._core.cache import read_context
from compactstore._core.compaction import LEASE_GRACE_SECONDS, Plugins, Request, Target, require
from compactstore._core.handle import Store
from compactstore._core.recording import record_attempt
from compactstore._engines import auto_compact
from compactstore.db import repository as repo
from compactstore.db.jobs import ACTIVE_STATES
from compactstore.models import CompactionConfig, CompactionResult, CompactTrigger

__all__ = ["Probe", "call", "claim", "finish", "lease_seconds", "probe", "start"]


@dataclass(frozen=True, slots=True)
class Probe:
    """What a background call decides on, read in one read transaction."""

    context: ActiveContext
    context_version: int
    active: repo.JobRow | None  # the session's pending or running job, lease live
    orphan: repo.JobRow | None  # its pending or running job whose lease lapsed
    finished: repo.JobRow | None  # its latest finished job
    tripped: bool

    @property
    def blocking(self) -> bool:
        context = self.context
        return context.usage >= context.config.reactive_blocking_ratio * context.context_window

    def passes(self, usage: int) -> bool:
        """Whether ``usage`` passes the background threshold (and the breaker allows)."""
        return not self.tripped and usage >= auto_compact.background_threshold(self.context)


def probe(connection: Connection, target: Target, count_tokens: TokenCounter) -> Probe:
    row = require(connection, target)
    context = read_context(
        connection,
        target.cache,
        target.session_id,
        target.adapter,
        count_tokens,
        location=target.location,
        row=row,
    )
    newest = repo.newest_job(connection, target.session_id)
    active = newest is not None and newest.state in ACTIVE_STATES
    orphan = newest is not None and repo.lapsed(connection, newest)
    return Probe(
        context=context,
        context_version=row.context_version,
        active=newest if active and not orphan else None,
        orphan=newest if orphan else None,
        # A finished job older than an active one was reported before that one started.
        finished=None if newest is None or active else newest,
        tripped=bool(repo.get_breaker(connection, target.session_id).tripped),
    )


def start(
    connection: Connection,
    target: Target,
    *,
    started_by: int | None,
    usage: int,
    at: float,
) -> tuple[int, int] | None:
    """Start a job (one write transaction): the starting call's row (recorded here when its
    cheap stages left none) and the job. None when the session has one pending or running.

    Returns:
        (the starting call's compaction id, the job id).
    """
    sid = target.session_id
    row = require(connection, target, lock=True)
    if repo.active_job(connection, sid) is not None:
        return None
    if started_by is None:
        started_by = record_attempt(
            connection,
            sid,
            trigger=CompactTrigger.AUTO,
            reason=None,
            tokens=usage,
            config=row.config,
            inputs=json.dumps({"call": "background_start", "now": at, "last_seq": row.last_seq}),
            at=at,
        )
    snapshot = {
        "context_version": row.context_version,
        "version": row.version,
        "last_seq": row.last_seq,
        "usage": usage,
    }
    job_id = repo.insert_job(
        connection,
        sid,
        snapshot=snapshot,
        started_by=started_by,
        created_at=at,
        seconds=lease_seconds(row.config),
    )
    repo.update_session(connection, sid)
    return started_by, job_id


def lease_seconds(config: CompactionConfig) -> float:
    """How long a job's lease lasts: as long as the compaction lease."""
    return config.summarizer_timeout_seconds + LEASE_GRACE_SECONDS


def claim(connection: Connection, job_id: int, owner: str) -> repo.JobRow | None:
    """Claim a job for this worker (one write transaction): a pending job, or a running one
    whose lease lapsed; None when another holds it or it is finished or its session is
    gone."""
    job = repo.get_job(connection, job_id)
    if job is None:
        return None
    session = repo.get_session(connection, job.session_id, lock=True)
    if session is None:
        return None
    if not repo.claim_job(connection, job_id, owner, lease_seconds(session.config)):
        return None
    return repo.get_job(connection, job_id)


def finish(
    connection: Connection,
    job: repo.JobRow,
    owner: str,
    *,
    state: str,
    at: float,
    compaction_id: int | None = None,
    error: str | None = None,
) -> None:
    repo.finish_job(
        connection,
        job.id,
        owner,
        state=state,
        finished_at=at,
        compaction_id=compaction_id,
        error=error,
    )


# A compaction call of the session (plan -> decide -> commit); None only for a reactive one.
Compact = Callable[[Request], CompactionResult | None]


def call(
    store: Store,
    target: Target,
    request: Request,
    plugins: Plugins,
    compact: Compact,
    seen_job: int | None,
) -> tuple[CompactionResult, int]:
    """``process_request(background=True)`` with a summarizer (see the module docstring):
    the result, its ``background`` status set, and the newest finished job the session's
    handle has now reported (``seen_job``: the one it had; None: it never looked)."""
    seen = store.read(partial(probe, target=target, count_tokens=store.token_counter))
    status, seen_job = _reported(seen.finished, seen_job)
    job = seen.active
    if seen.orphan is not None:
        # Its lease lapsed: the process running it died. Taken over, as a lapsed
        # compaction lease is: claimed here and run by this store's worker.
        job = seen.orphan
        owner = uuid.uuid4().hex
        if store.write(partial(claim, job_id=job.id, owner=owner)):
            store.submit_job(job.id, plugins, owner)
    if seen.blocking:
        # The agent is blocked anyway: compact now, as without background. A job's summary
        # in flight holds the lease: the call waits for it (up to
        # summarizer_timeout_seconds) and decides again on what it left, or takes the lease
        # over and cuts with the rule-based summary.
        result = _decided(compact(request))
        if job is not None:
            status, seen_job = _job_status(store, job.id, seen_job)
        if status is None:
            return result, seen_job
        return result.model_copy(update={"background": status}), seen_job
    cheap = request.cheap()
    assert cheap is not None
    result = _decided(compact(cheap))
    if job is not None or result.background == "running":
        status = "running"
    else:
        usage = result.tokens_after if result.success else seen.context.usage
        if seen.passes(usage):
            result, status = _started(store, target, request, plugins, result, usage)
    return result.model_copy(update={"background": status}), seen_job


def _decided(result: CompactionResult | None) -> CompactionResult:
    assert result is not None, "the pipeline always decides"
    return result


def _reported(finished: repo.JobRow | None, seen_job: int | None) -> tuple[str | None, int]:
    """The status to report for the latest finished job ("applied" once, for a job newer
    than the one the handle reported), and the job the handle has now seen."""
    if finished is None:
        return None, 0 if seen_job is None else seen_job
    status = None
    if seen_job is not None and finished.id > seen_job:
        status = "applied" if finished.state == "applied" else None
    return status, finished.id


def _job_status(store: Store, job_id: int, seen_job: int | None) -> tuple[str | None, int]:
    """``background`` for a job a blocking call may have waited for: "running", or how it
    ended ("applied" or None), which is then reported."""
    ended = store.read(lambda c: repo.get_job(c, job_id))
    if ended is None or ended.state in ACTIVE_STATES:
        return "running", seen_job or 0
    return ("applied" if ended.state == "applied" else None), max(seen_job or 0, ended.id)


def _started(
    store: Store,
    target: Target,
    request: Request,
    plugins: Plugins,
    result: CompactionResult,
    usage: int,
) -> tuple[CompactionResult, str]:
    """Start a job (unless another call just did: "running"); the call's result names its
    own row, recorded by :func:`start` when the cheap stages left none."""
    started = store.write(
        partial(start, target=target, started_by=result.id, usage=usage, at=request.now)
    )
    if started is None:
        return result, "running"
    started_by, job_id = started
    if result.id is None:
        result = result.model_copy(update={"id": started_by, "trigger": CompactTrigger.AUTO})
    store.submit_job(job_id, plugins)
    return result, "started"
