"""Background compaction: process_request(background=True) never
waits for a summary below reactive_blocking_ratio; a worker writes it and commits it."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import select, update

from compactstore import (
    AsyncCompactStore,
    CompactionConfig,
    CompactionResult,
    CompactStore,
    Session,
)
from compactstore._cli import cli
from compactstore._core import background
from compactstore.db.schema import compaction_jobs, compactions
from tests.helpers import new_session, plain, scratch_store, words

WINDOW = 10_000
CONFIG = CompactionConfig(summarizer_timeout_seconds=5)
CONFIG_LEASE = background.lease_seconds(CONFIG)  # a job's lease: 35 s


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


class Gate:
    """A summarizer that waits until the test opens the gate (at most 5 s)."""

    name = "tests.test_background:Gate"

    def __init__(self) -> None:
        self.open = threading.Event()
        self.entered = threading.Event()
        self.calls = 0

    def __call__(self, messages: list[Any], previous: str | None, instructions: Any) -> str:
        self.calls += 1
        self.entered.set()
        self.open.wait(5)
        return f"background summary of {len(messages)} messages"


def step(sess: Session, i: int) -> None:
    # ~6% of the 10k window per step.
    sess.append(user(f"question {i}: " + "word " * 300))
    sess.append(assistant(f"answer {i}"))


def wait_for_jobs(store: CompactStore) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if not store.read(
            lambda c: c.execute(
                select(compaction_jobs.c.id).where(
                    compaction_jobs.c.state.in_(["pending", "running"])
                )
            ).all()
        ):
            return
        time.sleep(0.02)
    raise AssertionError("the background job did not finish")


@pytest.mark.slow_on_postgres
def test_started_running_applied_and_the_started_by_link(db_url: str) -> None:
    gate = Gate()
    notified: list[CompactionResult] = []
    with CompactStore.open(db_url, summarizer=gate, on_compaction=notified.append) as store:
        sess = store.session("bg", context_window=WINDOW, config=CONFIG)
        statuses = []
        i = 0
        while True:
            step(sess, i)
            result = sess.process_request(background=True, now=100.0 + i)
            i += 1
            statuses.append(result.background)
            if result.background == "started":
                break
            assert sess.token_usage() < 0.7 * WINDOW + 700
        starter = result
        assert starter.id is not None, "the starting call records its own row"
        # The summary is in flight: the agent goes on, past auto_compact_threshold too, and
        # never waits for it below reactive_blocking_ratio.
        for _ in range(3):
            step(sess, i)
            result = sess.process_request(background=True, now=100.0 + i)
            i += 1
            # Returned while the summary is still held at the gate: it did not wait.
            assert result.background == "running" and not gate.open.is_set()
        assert (
            CONFIG.auto_compact_threshold * WINDOW
            < sess.token_usage()
            < CONFIG.reactive_blocking_ratio * WINDOW
        )
        assert gate.entered.wait(5), "the worker called the summarizer"
        assert gate.calls == 1
        gate.open.set()
        wait_for_jobs(store)
        step(sess, i)
        result = sess.process_request(background=True, now=100.0 + i)
        assert result.background == "applied"
        assert sess.token_usage() < CONFIG.background_threshold * WINDOW
        rows = store.read(
            lambda c: c.execute(
                select(compactions.c.id, compactions.c.trigger, compactions.c.started_by)
                .where(compactions.c.session_id == "bg")
                .order_by(compactions.c.id)
            ).all()
        )
        background = [row for row in rows if row.started_by is not None]
        assert len(background) == 1
        assert background[0].started_by == starter.id and background[0].trigger == "auto"
        recorded = {c.id: c for c in sess.compactions()}
        # CompactionResult.started_by says the same, read back and as handed to the callback.
        assert [c.id for c in recorded.values() if c.started_by is not None] == [background[0].id]
        assert recorded[background[0].id].started_by == starter.id
        assert [r.started_by for r in notified if r.id == background[0].id] == [starter.id]
        summary = recorded[background[0].id].summary
        assert summary is not None and summary.source == "summarizer"
        assert "background summary" in recorded[background[0].id].summary_text
        assert statuses[:-1] == [None] * (len(statuses) - 1)


@pytest.mark.slow
def test_without_a_summarizer_background_is_the_ordinary_call(tmp_path: Path) -> None:
    with CompactStore.open(tmp_path / "s.db") as store:
        sess = store.session("s", context_window=WINDOW)
        results = []
        for i in range(20):
            step(sess, i)
            results.append(sess.process_request(background=True, now=float(i)))
        assert all(r.background is None for r in results)
        assert any(r.strategy == "full" for r in results)
        assert store.pending_jobs() == []


@pytest.mark.slow
def test_close_waits_for_work_in_flight(tmp_path: Path) -> None:
    def slow(messages: list[Any], previous: str | None, instructions: Any) -> str:
        time.sleep(0.3)
        return "written while close() waited"

    store = CompactStore.open(tmp_path / "s.db", summarizer=slow)
    sess = store.session("s", context_window=WINDOW, config=CONFIG)
    i = 0
    while sess.process_request(background=True, now=float(i)).background != "started":
        step(sess, i)
        i += 1
    store.close()
    with CompactStore.open(tmp_path / "s.db") as reopened:
        texts = [c.summary_text for c in reopened.get_session("s").compactions()]
        assert any("written while close() waited" in text for text in texts)
        assert reopened.pending_jobs() == []


def test_a_background_compaction_that_leaves_usage_high_is_a_breaker_failure(
    tmp_path: Path,
) -> None:
    # The pinned first request alone is ~75% of the window: no cut gets below 70%.
    with CompactStore.open(tmp_path / "s.db", summarizer=lambda m, p, i: "short") as store:
        sess = store.session("s", context_window=WINDOW, config=CONFIG)
        sess.append(user("the request: " + "word " * 3_700))
        for i in range(3):
            sess.append(assistant(f"answer {i} " + "word " * 60))
            sess.append(user(f"more {i}"))
        result = sess.process_request(background=True, now=1.0)
        assert result.background == "started"
        wait_for_jobs(store)
        assert sess.breaker().consecutive_failures == 1
        assert sess.token_usage() >= CONFIG.background_threshold * WINDOW


def test_a_real_count_measured_on_a_superseded_version_is_not_used(tmp_path: Path) -> None:
    with CompactStore.open(tmp_path / "s.db") as store:
        sess = store.session("s", context_window=WINDOW)
        for i in range(6):
            step(sess, i)
        sess.active_context()  # the version the agent sends
        other = store.get_session("s")
        other.compact(now=5.0)  # lands while the model call runs
        before = sess.token_usage()
        # Measured on the context before the compaction: recorded, not calibrated on.
        assert sess.record_usage(9_000, now=7.0) is False
        assert sess.token_usage() == before
        sess.active_context()
        assert sess.record_usage(sess.token_usage(), now=8.0) is True


@pytest.mark.slow
def test_the_worker_command_runs_a_job_whose_process_died(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    child = textwrap.dedent(
        f"""
        import os, time
        from compactstore import CompactStore, CompactionConfig
        def stuck(messages, previous, instructions):
            time.sleep(30)
            return "never"
        store = CompactStore.open({str(db)!r}, summarizer=stuck)
        sess = store.session("s", context_window={WINDOW},
                             config=CompactionConfig(summarizer_timeout_seconds=60))
        for i in range(40):
            sess.append({{"role": "user", "content": f"q{{i}} " + "word " * 300}})
            sess.append({{"role": "assistant", "content": "a"}})
            if sess.process_request(background=True, now=float(i)).background == "started":
                os._exit(0)  # the agent exits before its summary is written
        os._exit(3)
        """
    )
    subprocess.run([sys.executable, "-c", child], check=True, timeout=60)
    with CompactStore.open(db) as store:
        (job,) = store.read(lambda c: c.execute(select(compaction_jobs)).all())
        assert job.state in ("pending", "running")
        # A dead worker's lease lapses (here: moved into the past instead of waiting 90 s).
        store.write(lambda c: c.execute(update(compaction_jobs).values(expires_at=0.0)))
    result = CliRunner().invoke(
        cli,
        ["worker", "--once", "--summarizer", "tests.helpers:cli_summarizer", "--db", str(db)],
        env={"COMPACTSTORE_DB": None},
    )
    assert result.exit_code == 0, result.output
    assert f"job {job.id} session s: applied (compaction" in result.stdout
    with CompactStore.open(db) as store:
        texts = [c.summary_text for c in store.get_session("s").compactions()]
        assert any("resummarized by the CLI test" in text for text in texts)
        assert store.pending_jobs() == []


@pytest.mark.slow
def test_the_async_store_runs_background_work_on_its_loop(tmp_path: Path) -> None:
    async def summarize(messages: list[Any], previous: str | None, instructions: Any) -> str:
        await asyncio.sleep(0.1)
        return "an async background summary"

    async def main() -> list[str | None]:
        store = await AsyncCompactStore.open(tmp_path / "a.db", summarizer=summarize)
        sess = await store.session("s", context_window=WINDOW, config=CONFIG)
        statuses: list[str | None] = []
        for i in range(20):
            await sess.append(user(f"question {i}: " + "word " * 300))
            await sess.append(assistant("ok"))
            statuses.append((await sess.process_request(background=True, now=float(i))).background)
            await asyncio.sleep(0.05)
        await store.close()
        return statuses

    statuses = asyncio.run(main())
    assert "started" in statuses and "applied" in statuses
    with CompactStore.open(tmp_path / "a.db") as store:
        texts = [c.summary_text for c in store.get_session("s").compactions()]
        assert any("an async background summary" in text for text in texts)


# -- at reactive_blocking_ratio: wait for the summary in flight ----------------------------

ISSUE_WINDOW = 20_000


def issue_step(sess: Session, i: int) -> None:
    # ~2.2% of the 20k window per step.
    sess.append(user(f"q{i} " + "word " * 150))
    sess.append(assistant(f"a{i} " + "word " * 60))


def blocking(sess: Session, config: CompactionConfig) -> bool:
    return sess.token_usage() >= config.reactive_blocking_ratio * sess.context_window


@pytest.mark.slow
def test_at_the_blocking_ratio_a_background_call_waits_for_the_summary_in_flight(
    tmp_path: Path,
) -> None:
    # The reported run: a 20k window and a summarizer that takes seconds. Once a job
    # summarised, every call said "running" within milliseconds, past 100% of the window.
    gate = Gate()
    config = CompactionConfig(summarizer_timeout_seconds=10)
    with CompactStore.open(tmp_path / "s.db", summarizer=gate) as store:
        sess = store.session("s", context_window=ISSUE_WINDOW, config=config)
        statuses: list[str | None] = []
        i = 0
        while not blocking(sess, config):
            issue_step(sess, i)
            if blocking(sess, config):
                break
            statuses.append(sess.process_request(background=True, now=100.0 + i).background)
            i += 1
        assert "started" in statuses and statuses[-1] == "running"
        assert gate.entered.wait(5), "the job is summarising"
        recorded = len(sess.compactions())
        # The agent is blocked; the summary comes 0.3 s later.
        started = time.monotonic()
        threading.Timer(0.3, gate.open.set).start()

        result = sess.process_request(background=True, now=100.0 + i)

        assert time.monotonic() - started >= 0.3, "it waited for the summary in flight"
        assert sess.token_usage() < config.background_threshold * ISSUE_WINDOW
        # It applied the job's summary: one background row, and no cut of its own.
        added = sess.compactions()[recorded:]
        assert [c.started_by is not None for c in added] == [True]
        assert "background summary" in added[0].summary_text
        assert result.boundary is None and gate.calls == 1
        wait_for_jobs(store)
        # Said once: by this call if the job had recorded its end, else by the next.
        after = sess.process_request(background=True, now=200.0 + i).background
        assert {result.background, after} == {"applied", None}


@pytest.mark.slow
def test_the_async_store_waits_for_the_summary_in_flight_at_the_blocking_ratio(
    tmp_path: Path,
) -> None:
    config = CompactionConfig(summarizer_timeout_seconds=10)
    release = asyncio.Event()

    async def summarize(messages: list[Any], previous: str | None, instructions: Any) -> str:
        await release.wait()
        return "an async background summary"

    async def main() -> tuple[float, int, list[str | None]]:
        store = await AsyncCompactStore.open(tmp_path / "a.db", summarizer=summarize)
        sess = await store.session("s", context_window=ISSUE_WINDOW, config=config)
        statuses: list[str | None] = []
        i = 0
        while True:
            await sess.append(user(f"q{i} " + "word " * 150))
            await sess.append(assistant(f"a{i} " + "word " * 60))
            if await sess.token_usage() >= config.reactive_blocking_ratio * ISSUE_WINDOW:
                break
            statuses.append((await sess.process_request(background=True, now=100.0 + i)).background)
            i += 1
        started = time.monotonic()
        asyncio.get_running_loop().call_later(0.3, release.set)
        await sess.process_request(background=True, now=100.0 + i)
        waited = time.monotonic() - started
        usage = await sess.token_usage()
        await store.close()
        return waited, usage, statuses

    waited, usage, statuses = asyncio.run(main())
    assert "started" in statuses and statuses[-1] == "running"
    assert waited >= 0.3 and usage < config.background_threshold * ISSUE_WINDOW
    with CompactStore.open(tmp_path / "a.db") as store:
        texts = [c.summary_text for c in store.get_session("s").compactions()]
        assert sum("an async background summary" in text for text in texts) == 1


class Delayed:
    """A summarizer that answers after ``seconds``; None: not before the test ends (past
    any summarizer_timeout_seconds, so its caller falls back)."""

    name = "tests.test_background:Delayed"

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds
        self.done = threading.Event()

    def __call__(self, messages: list[Any], previous: str | None, instructions: Any) -> str:
        self.done.wait(10 if self.seconds is None else self.seconds)
        return f"summary of {len(messages)} messages"


@pytest.mark.slow
@settings(max_examples=12, deadline=None, database=None)
@given(
    delay=st.sampled_from([0.0, 0.01, 0.05, 0.2, None]),
    steps=st.lists(st.integers(1, 30), min_size=10, max_size=30),
)
def test_no_context_handed_out_exceeds_the_window_whatever_the_summary_delay(
    delay: float | None, steps: list[int]
) -> None:
    """Each step appends ``percent`` of the window; after each background call the context
    the agent sends is within the window, unless one message alone is not."""
    window = ISSUE_WINDOW
    summarizer = Delayed(delay)
    config = plain(summarizer_timeout_seconds=0.25)
    try:
        with scratch_store(summarizer=summarizer) as store:
            chat = new_session(store, context_window=window, config=config)
            chat.request("Port the parser to the new grammar")
            for i, percent in enumerate(steps):
                chars = percent * window * 4 // 100 // 2  # tokens = chars / 4, two messages
                chat.user(words(chars, f"q{i}"))
                chat.say(words(chars, f"a{i}"))
                chat.sess.process_request(background=True, now=chat.tick())
                largest = max(item.tokens for item in chat.sess.context().items)
                assert chat.sess.token_usage() <= window or largest > window
    finally:
        summarizer.done.set()


# -- an orphaned job: its lease lapsed -----------------------------------------------------


def jobs_of(store: CompactStore) -> list[Any]:
    return list(store.read(lambda c: c.execute(select(compaction_jobs)).all()))


def age_jobs(store: CompactStore, seconds: float | None) -> None:
    """As if ``seconds`` passed on the database clock since the jobs' leases were taken
    (None: a pending job with no lease, as earlier versions left them)."""
    expires = None if seconds is None else compaction_jobs.c.expires_at - seconds
    store.write(lambda c: c.execute(update(compaction_jobs).values(expires_at=expires)))


@pytest.mark.parametrize("left", ["pending", "running", "pending without a lease"])
@pytest.mark.slow_on_postgres
def test_an_orphaned_job_is_taken_over_by_the_next_call(
    db_url: str, left: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process that died after starting a job (pending) or while running it (running)
    leaves it active: the session's next background call takes it over once its lease
    lapsed, and runs it."""
    with CompactStore.open(db_url, summarizer=lambda m, p, i: "the taker's summary") as store:
        sess = store.session("s", context_window=WINDOW, config=CONFIG)
        i = 0
        with monkeypatch.context() as patch:
            # The starting process dies before its worker runs the job.
            patch.setattr(store, "submit_job", lambda *args: None)
            while sess.process_request(background=True, now=100.0 + i).background != "started":
                step(sess, i)
                i += 1
        if left == "running":
            # ...or while its worker ran it: claimed, then the database never heard of it.
            store.write(lambda c: background.claim(c, jobs_of(store)[0].id, "killed-worker"))
        (job,) = jobs_of(store)
        assert job.state == ("running" if left == "running" else "pending")
        # The lease is live: it may still be running somewhere.
        assert sess.process_request(background=True, now=100.0 + i).background == "running"
        assert jobs_of(store) == [job], "not taken over"
        age_jobs(store, None if left == "pending without a lease" else CONFIG_LEASE + 1)

        taken = sess.process_request(background=True, now=101.0 + i)

        assert taken.background == "running"
        wait_for_jobs(store)
        (ended,) = jobs_of(store)
        assert ended.id == job.id and ended.state == "applied"
        (applied,) = [c for c in sess.compactions() if c.id == ended.compaction_id]
        assert applied.started_by == job.started_by
        assert applied.summary_text.endswith("the taker's summary")
        assert sess.token_usage() < CONFIG.background_threshold * WINDOW
        assert sess.process_request(background=True, now=102.0 + i).background == "applied"


@pytest.mark.slow
def test_a_job_never_takes_over_the_lease_of_a_blocked_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent's call at the blocking ratio cuts with its summary in flight; the job it
    made moot gives up instead of waiting and taking that call's lease over (which refused
    the call's cut and handed out a context over the window)."""
    gate = Gate()
    config = CompactionConfig(summarizer_timeout_seconds=10)
    with CompactStore.open(tmp_path / "s.db", summarizer=gate) as store:
        sess = store.session("s", context_window=WINDOW, config=config)
        i = 0
        with monkeypatch.context() as patch:
            patch.setattr(store, "submit_job", lambda *args: None)  # no worker yet
            while sess.process_request(background=True, now=100.0 + i).background != "started":
                step(sess, i)
                i += 1
            (job,) = jobs_of(store)
            while not blocking(sess, config):
                step(sess, i)
                i += 1
            results: list[CompactionResult] = []
            agent = threading.Thread(
                target=lambda: results.append(sess.process_request(background=True, now=100.0 + i))
            )
            agent.start()
            assert gate.entered.wait(5), "the blocked call summarises, holding the lease"
            ended = store.run_job(job.id)  # its worker gets to it now
            gave_up = agent.is_alive()  # before the call it would wait for ends
            gate.open.set()
            agent.join(10)
        assert ended is not None and ended.state == "superseded"
        assert gave_up, "it did not wait for the lease: the blocked call was still summarising"
        (result,) = results
        assert result.effective and result.summary_text.startswith("background summary")
        assert sess.token_usage() < WINDOW
