"""The compaction lease across processes: ``kill -9`` while a summary is in flight.

A child process (tests/lease_child.py) starts a summary and is killed with SIGKILL: nothing
is recorded; the lease it held makes other callers go on with the cheap stages below the
blocking ratio, and wait for it (then take it over, with the rule-based summary) at or above
it; and a crashed owner's lease expires, after which the next process compacts normally.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, select, update

from compactstore import CompactStore, CompactStrategy
from compactstore.db.schema import compaction_jobs, compaction_leases
from tests.helpers import T0, new_session, opened, plain

ROOT = Path(__file__).resolve().parents[1]
WINDOW = 20_000


def fill(store: CompactStore, ratio: float, *, timeout: float) -> None:
    """Session "s" at ``ratio`` of its window."""
    chat = new_session(
        store, context_window=WINDOW, config=plain(summarizer_timeout_seconds=timeout)
    )
    chat.request("Port the parser to the new grammar")
    while chat.sess.token_usage() < ratio * WINDOW:
        chat.chatter(2, chars=1_600)


def kill_mid_summary(url: str, *, background: bool = False) -> None:
    """Run the child until its summarizer runs, then SIGKILL it (``background``: the
    summarizer of the background job its call started)."""
    mode = ["background"] if background else []
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.lease_child", url, "s", str(T0 + 1_000), *mode],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    with child:
        assert child.stdout is not None and child.stderr is not None
        line = child.stdout.readline().decode().strip()
        if line != "summarizing":
            child.kill()
            pytest.fail(f"the child did not start its summary: {child.stderr.read().decode()}")
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL


def leases(store: CompactStore) -> list[Any]:
    with store.engine.connect() as connection:
        return list(connection.execute(select(compaction_leases)).all())


@pytest.fixture
def killed(db_url: str) -> Iterator[str]:
    """A session whose compaction's owner was killed mid-summary (usage 90%)."""
    with opened(db_url) as store:
        fill(store, 0.9, timeout=30)
    kill_mid_summary(db_url)
    yield db_url


@pytest.mark.slow
def test_a_killed_owner_records_nothing_and_its_lease_holds_off_a_second_summary(
    killed: str,
) -> None:
    calls: list[int] = []

    def summarizer(messages: Any, previous: str | None, instructions: str | None) -> str:
        calls.append(len(messages))
        return "an LLM summary"

    with opened(killed, summarizer=summarizer) as store:
        sess = store.session("s")
        assert sess.compactions() == [], "nothing recorded by the killed process"
        (lease,) = leases(store)
        # Expires on the database clock: summarizer_timeout_seconds + 30 s after it was taken.
        assert lease.expires_at - lease.acquired_at == pytest.approx(60.0)

        result = sess.process_request(now=T0 + 2_000)

        assert result.background == "running" and result.boundary is None
        assert calls == [] and sess.compactions() == []


@pytest.mark.slow
def test_at_the_blocking_ratio_a_caller_waits_then_takes_the_lease_over(killed: str) -> None:
    with opened(killed) as store:
        # The wait is summarizer_timeout_seconds (a config change does not touch the lease).
        chat = new_session(
            store, context_window=WINDOW, config=plain(summarizer_timeout_seconds=0.3)
        )
        while chat.sess.token_usage() < 0.97 * WINDOW:
            chat.chatter(2, tag="more", chars=1_600)
        started = time.monotonic()

        result = chat.sess.process_request(now=T0 + 2_000)

        assert time.monotonic() - started >= 0.3, "it waited for the running summary"
        assert result.effective and result.strategy == CompactStrategy.FULL
        assert result.summary is None, "taken over: the rule-based summary"
        assert leases(store) == [], "released with the commit"


def age_leases(store: CompactStore, seconds: float) -> None:
    """As if ``seconds`` passed on the database clock since the leases were taken."""
    with store.engine.begin() as connection:
        connection.execute(
            update(compaction_leases).values(
                acquired_at=compaction_leases.c.acquired_at - seconds,
                expires_at=compaction_leases.c.expires_at - seconds,
            )
        )


@pytest.mark.slow
def test_a_crashed_owner_lease_expires_and_the_next_process_compacts(db_url: str) -> None:
    with opened(db_url) as store:
        fill(store, 0.9, timeout=1)
    kill_mid_summary(db_url)
    with opened(db_url, summarizer=lambda m, p, i: "an LLM summary") as store:
        (lease,) = leases(store)
        # Taken on the database's clock (which agrees with this machine's), for 31 s.
        assert abs(lease.acquired_at - time.time()) < 60
        assert lease.expires_at - lease.acquired_at == pytest.approx(31.0)
        sess = store.session("s")
        age_leases(store, 29.0)
        assert sess.process_request(now=T0 + 2_000).background == "running", "still live"

        age_leases(store, 2.5)  # 31.5 s after it was taken: lapsed
        result = sess.process_request(now=T0 + 2_001)

        assert result.effective and result.summary_text == "an LLM summary"
        assert [c.id for c in sess.compactions()] == [result.id]


def test_a_rule_based_cut_takes_no_lease_so_a_killed_process_leaves_none(db_url: str) -> None:
    """Without a summarizer a cut takes milliseconds: it takes no lease (the commit's version
    check settles a race), so a process killed mid-cut cannot make the next caller wait."""
    with opened(db_url) as store:
        fill(store, 0.97, timeout=30)
        statements: list[str] = []

        def seen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
            statements.append(statement)

        event.listen(store.engine, "before_cursor_execute", seen)
        try:
            result = store.session("s").process_request(now=T0 + 2_000)
        finally:
            event.remove(store.engine, "before_cursor_execute", seen)

        assert result.effective and result.strategy == CompactStrategy.FULL
        assert any("compaction_leases" in s for s in statements), "it looked for a lease"
        assert not any(
            "compaction_leases" in s and s.lstrip().upper().startswith(("INSERT", "UPDATE"))
            for s in statements
        ), "a rule-based cut wrote a lease"


# -- a background job whose process was killed ------------------------------------------------


def jobs(store: CompactStore) -> list[Any]:
    with store.engine.connect() as connection:
        return list(connection.execute(select(compaction_jobs)).all())


def age_jobs(store: CompactStore, seconds: float) -> None:
    """As if ``seconds`` passed on the database clock since the jobs' leases were taken."""
    with store.engine.begin() as connection:
        connection.execute(
            update(compaction_jobs).values(expires_at=compaction_jobs.c.expires_at - seconds)
        )


def wait_for_job(store: CompactStore, job_id: int) -> Any:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        (job,) = [job for job in jobs(store) if job.id == job_id]
        if job.state not in ("pending", "running"):
            return job
        time.sleep(0.02)
    raise AssertionError(f"job {job_id} did not finish")


@pytest.fixture
def killed_job(db_url: str) -> Iterator[str]:
    """A session whose background job's process was killed mid-summary (usage 72%)."""
    with opened(db_url) as store:
        fill(store, 0.72, timeout=1)
    kill_mid_summary(db_url, background=True)
    yield db_url


@pytest.mark.slow
def test_a_killed_background_job_is_taken_over_by_the_next_call(killed_job: str) -> None:
    with opened(killed_job, summarizer=lambda m, p, i: "the next process's summary") as store:
        sess = store.session("s")
        (job,) = jobs(store)
        assert job.state == "running" and job.compaction_id is None
        # Its lease (summarizer_timeout_seconds + 30 s) is live: it may be running elsewhere.
        assert sess.process_request(background=True, now=T0 + 2_000).background == "running"
        assert jobs(store) == [job]

        age_jobs(store, 31.5)
        age_leases(store, 31.5)  # the compaction lease the killed worker held
        taken = sess.process_request(background=True, now=T0 + 2_001)

        assert taken.background == "running", "taken over, now run by this process"
        ended = wait_for_job(store, job.id)
        assert ended.state == "applied" and ended.owner is None
        (applied,) = [c for c in sess.compactions() if c.id == ended.compaction_id]
        assert applied.started_by == job.started_by
        assert applied.summary_text.endswith("the next process's summary")
        assert sess.process_request(background=True, now=T0 + 2_002).background == "applied"
        assert leases(store) == []


@pytest.mark.slow
def test_at_the_blocking_ratio_a_call_waits_for_a_killed_job_then_takes_over(
    killed_job: str,
) -> None:
    with opened(killed_job, summarizer=lambda m, p, i: "the next process's summary") as store:
        chat = new_session(store, context_window=WINDOW, config=plain(summarizer_timeout_seconds=1))
        while chat.sess.token_usage() < 0.97 * WINDOW:
            chat.chatter(2, tag="more", chars=1_600)
        (job,) = jobs(store)
        started = time.monotonic()

        result = chat.sess.process_request(background=True, now=T0 + 2_000)

        # It waited summarizer_timeout_seconds for the killed job's summary, then took the
        # compaction lease over and cut with the rule-based summary.
        assert time.monotonic() - started >= 1.0
        assert result.effective and result.strategy == CompactStrategy.FULL
        assert result.summary is None and result.background == "running"
        assert chat.sess.token_usage() < WINDOW
        # Once the job's own lease lapses, the next call takes it over: nothing left to do.
        age_jobs(store, 31.5)
        assert chat.sess.process_request(background=True, now=T0 + 2_001).background == ("running")
        ended = wait_for_job(store, job.id)
        assert ended.state == "superseded" and ended.compaction_id is None
        assert [c.id for c in chat.sess.compactions() if c.started_by == job.started_by] == []
