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
from dataclasses import dataclass

from sqlalchemy import Connection

from compactstore.context import ActiveContext
from compactstore.core.cache import read_context
from compactstore.core.compaction import LEASE_GRACE_SECONDS, Target, require
from compactstore.core.recording import record_attempt
from compactstore.db import repository as repo
from compactstore.db.jobs import ACTIVE_STATES
from compactstore.engines import auto_compact
from compactstore.models import CompactionConfig, CompactTrigger
from compactstore.tokens import TokenCounter

__all__ = ["Probe", "claim", "finish", "lease_seconds", "probe", "start"]


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
