"""Background compaction jobs: the queries of ``compaction_jobs``.

A job is pending work: the compaction a ``process_request(background=True)`` started. The
process that started it runs it in a worker thread; if that process dies, any other one
(``compactstore worker``, or the session's next background call) claims it once its lease
lapses. The lease is the job row's ``owner`` and ``expires_at``, on the database clock like
the compaction lease; a pending job's ``expires_at`` is when a worker should have claimed it.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from sqlalchemy import Connection, insert, or_, select, update

from compactstore.db.common import SID
from compactstore.db.leases import database_now
from compactstore.db.schema import compaction_jobs
from compactstore.models import JobInfo

__all__ = [
    "ACTIVE_STATES",
    "JobRow",
    "active_job",
    "claim_job",
    "finish_job",
    "get_job",
    "info",
    "insert_job",
    "lapsed",
    "latest_finished_job",
    "newest_job",
    "pending_jobs",
]

ACTIVE_STATES = ("pending", "running")


class JobRow(NamedTuple):
    id: int
    session_id: str
    state: str
    snapshot: dict[str, Any]
    started_by: int | None
    owner: str | None
    expires_at: float | None
    created_at: float
    finished_at: float | None
    compaction_id: int | None
    error: str | None


_COLUMNS = [compaction_jobs.c[name] for name in JobRow._fields]


def info(job: JobRow) -> JobInfo:
    """The public model of a job row."""
    return JobInfo(
        id=job.id,
        session_id=job.session_id,
        state=job.state,
        started_by=job.started_by,
        compaction_id=job.compaction_id,
        created_at=job.created_at,
        finished_at=job.finished_at,
        error=job.error,
    )


def _row(raw: Any) -> JobRow:
    values = raw._asdict()
    values["snapshot"] = json.loads(values["snapshot"])
    return JobRow(**values)


def insert_job(
    connection: Connection,
    session_id: str,
    *,
    snapshot: dict[str, Any],
    started_by: int | None,
    created_at: float,
    seconds: float,
) -> int:
    """A pending job, to be claimed within ``seconds`` from now on the database clock
    (after that its starting process is taken for dead: see :func:`lapsed`)."""
    result = connection.execute(
        insert(compaction_jobs)
        .values(
            session_id=session_id,
            state="pending",
            snapshot=json.dumps(snapshot, sort_keys=True),
            started_by=started_by,
            created_at=created_at,
            expires_at=database_now(connection) + seconds,
        )
        .returning(compaction_jobs.c.id)
    )
    return int(result.scalar_one())


def get_job(connection: Connection, job_id: int) -> JobRow | None:
    raw = connection.execute(select(*_COLUMNS).where(compaction_jobs.c.id == job_id)).one_or_none()
    return None if raw is None else _row(raw)


# Run on every process_request(background=True): built once (see db/common.py).
_NEWEST = (
    select(*_COLUMNS)
    .where(compaction_jobs.c.session_id == SID)
    .order_by(compaction_jobs.c.id.desc())
    .limit(1)
)


def newest_job(connection: Connection, session_id: str) -> JobRow | None:
    """The session's newest job: its active one if it has one (jobs start one at a time)."""
    raw = connection.execute(_NEWEST, {"sid": session_id}).one_or_none()
    return None if raw is None else _row(raw)


def lapsed(connection: Connection, job: JobRow) -> bool:
    """Whether a pending or running job's lease lapsed on the database clock: the process
    that started or ran it died (or lost the database while it finished). A job with no
    lease at all was left pending by a version that gave pending jobs none."""
    if job.state not in ACTIVE_STATES:
        return False
    return job.expires_at is None or job.expires_at <= database_now(connection)


def active_job(connection: Connection, session_id: str) -> JobRow | None:
    """The session's pending or running job (at most one is started at a time)."""
    return _newest(connection, session_id, compaction_jobs.c.state.in_(ACTIVE_STATES))


def latest_finished_job(connection: Connection, session_id: str) -> JobRow | None:
    """The session's most recent job that is no longer pending or running."""
    return _newest(connection, session_id, compaction_jobs.c.state.not_in(ACTIVE_STATES))


def _newest(connection: Connection, session_id: str, condition: Any) -> JobRow | None:
    raw = connection.execute(
        select(*_COLUMNS)
        .where(compaction_jobs.c.session_id == SID, condition)
        .order_by(compaction_jobs.c.id.desc())
        .limit(1),
        {"sid": session_id},
    ).one_or_none()
    return None if raw is None else _row(raw)


def pending_jobs(connection: Connection, limit: int = 100) -> list[JobRow]:
    """Jobs any worker may claim: pending, or running with a lapsed lease (oldest first)."""
    now = database_now(connection)
    rows = connection.execute(
        select(*_COLUMNS)
        .where(
            or_(
                compaction_jobs.c.state == "pending",
                (compaction_jobs.c.state == "running") & (compaction_jobs.c.expires_at <= now),
            )
        )
        .order_by(compaction_jobs.c.id)
        .limit(limit)
    ).all()
    return [_row(raw) for raw in rows]


def claim_job(connection: Connection, job_id: int, owner: str, seconds: float) -> bool:
    """Take a pending job (or a running one whose lease lapsed) for ``seconds`` from now on
    the database clock; False when another worker holds it or it is finished."""
    now = database_now(connection)
    result = connection.execute(
        update(compaction_jobs)
        .where(
            compaction_jobs.c.id == job_id,
            or_(
                compaction_jobs.c.state == "pending",
                (compaction_jobs.c.state == "running") & (compaction_jobs.c.expires_at <= now),
            ),
        )
        .values(state="running", owner=owner, expires_at=now + seconds)
    )
    return result.rowcount == 1


def finish_job(
    connection: Connection,
    job_id: int,
    owner: str,
    *,
    state: str,
    finished_at: float,
    compaction_id: int | None = None,
    error: str | None = None,
) -> bool:
    """Record how the job ended, if ``owner`` still holds it."""
    result = connection.execute(
        update(compaction_jobs)
        .where(compaction_jobs.c.id == job_id, compaction_jobs.c.owner == owner)
        .values(
            state=state,
            finished_at=finished_at,
            compaction_id=compaction_id,
            error=error,
            owner=None,
            expires_at=None,
        )
    )
    return result.rowcount == 1
