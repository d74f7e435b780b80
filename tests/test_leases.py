"""The compaction lease (SPEC §9.1) across processes: ``kill -9`` while a summary is in flight.

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
from compactstore.db.schema import compaction_leases
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


def kill_mid_summary(url: str) -> None:
    """Run the child until its summarizer runs, then SIGKILL it."""
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.lease_child", url, "s", str(T0 + 1_000)],
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
