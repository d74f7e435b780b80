"""Running one background compaction job, for
:meth:`compactstore.CompactStore.run_job` and ``compactstore worker``."""

from __future__ import annotations

import functools
import time
import uuid

from compactstore._core import background, compaction, handle
from compactstore._core.driver import committed
from compactstore._core.summarizing import stored_reason
from compactstore.db import jobs
from compactstore.db import repository as repo
from compactstore.errors import NotFoundError
from compactstore.formats import get_format
from compactstore.models import JobInfo

__all__ = ["run_background_job"]


def run_background_job(
    store: handle.Store, job_id: int, plugins: compaction.Plugins, owner: str | None = None
) -> JobInfo | None:
    """Claim the job, run it as plan -> decide -> commit with ``plugins``, record how it
    ended; the job as it ended, or None when another worker holds it or it is finished.

    ``owner``: the caller claimed the job already, as this owner (a background call that
    took an orphaned job over).
    """
    if owner is None:
        owner = uuid.uuid4().hex
        job = store.write(functools.partial(background.claim, job_id=job_id, owner=owner))
    else:
        job = store.read(lambda c: repo.get_job(c, job_id))
        if job is not None and job.owner != owner:
            job = None  # taken over again meanwhile
    if job is None:
        return None
    state, result, error = "failed", None, None
    try:
        row = store.read(lambda c: repo.get_session(c, job.session_id))
        if row is None:
            raise NotFoundError(f"session {job.session_id!r} no longer exists")
        request = compaction.background_request(job.created_at, job.started_by)
        target = handle.target(store, row.id, get_format(row.format))
        steps = compaction.compaction_steps(target, request, plugins, store.summarizer_executor())
        result = committed(store, store.cache, row.id, steps)
        if result is None or result.id is None:
            state = "superseded"
        elif result.success:
            state = "applied"
    except Exception as exc:
        # Recorded in the job row: a plug-in's error may quote a provider's reply.
        error = stored_reason(f"{type(exc).__name__}: {exc}", plugins.redactor)
        raise
    finally:
        store.write(
            functools.partial(
                background.finish,
                job=job,
                owner=owner,
                state=state,
                at=time.time(),
                compaction_id=None if result is None else result.id,
                error=error,
            )
        )
    # on_compaction already had the result: committed() hands every recorded compaction
    # to it once.
    ended = store.read(lambda c: repo.get_job(c, job_id))
    return None if ended is None else jobs.info(ended)
