"""Compaction outside any database transaction: plan -> decide -> commit.

Each rule of the commit's check has a test here that fails without it. The interference is
deterministic: the summarizer itself writes through another handle (a second store on the
same database, as another process would) while the summary is being written, so the
compaction's snapshot is stale by the time it commits. No sleeps.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from compactstore import (
    CompactionConfig,
    CompactStore,
    CompactStrategy,
    NotFoundError,
)
from tests.helpers import (
    T0,
    Chat,
    assistant,
    calls_message,
    new_session,
    opened,
    plain,
    words,
)

WINDOW = 20_000
ERROR = "prompt is too long: 210000 tokens > 200000 maximum"
READ = "def parse(text):\n    return grammar.parse(text)\n" * 10  # a short file, read twice


class Interfering:
    """A summarizer that runs ``act`` (another handle's write) while it writes the summary:
    on every call, or on the first only."""

    def __init__(self, act: Callable[[int], object], *, every_call: bool = False) -> None:
        self.act = act
        self.every_call = every_call
        self.calls: list[list[dict[str, Any]]] = []

    def __call__(
        self, messages: list[dict[str, Any]], previous: str | None, instructions: str | None
    ) -> str:
        self.calls.append(messages)
        if self.every_call or len(self.calls) == 1:
            self.act(len(self.calls))
        return f"LLM summary {len(self.calls)}"


def over_threshold(
    store: CompactStore,
    *,
    ratio: float = 0.9,
    big_result: bool = False,
    config: CompactionConfig | None = None,
) -> Chat:
    """A session at ``ratio`` of its window (above the 85% trigger), whose oldest messages
    hold a read of ``a.py`` (and, with ``big_result``, a tool result the budget persists)."""
    chat = new_session(store, "anthropic", context_window=WINDOW, config=config or plain())
    chat.request("Port the parser to the new grammar")
    _, (read_id,) = chat.calls([("read_file", {"file_path": "a.py"})])
    chat.result(read_id, READ, file_path="a.py")
    persisted = 0
    if big_result:
        chat.tool(words(8_000, "log"), name="bash", args={"command": "make test"})
        persisted = 1_900  # what the budget frees before the trigger is checked
    while chat.sess.token_usage() - persisted < ratio * WINDOW:
        chat.chatter(2, chars=1_600)
    return chat


def stub_of_first_read(store: CompactStore, n: int) -> None:
    """Another handle reads a.py again: a dedup stub pointing at the first read."""
    sess = store.session("s")
    call = f"toolu_late{n}"
    sess.append(
        calls_message("anthropic", [(call, "read_file", {"file_path": "a.py"})]),
        timestamp=T0 + 500 + n,
    )
    sess.append_tool_result(
        call, READ, tool_name="read_file", file_path="a.py", timestamp=T0 + 500 + n
    )
    assert "seq" in str(sess.messages()[-1]), "the second read is a dedup stub"


def superseded(steps: list[Any]) -> bool:
    return bool(steps) and steps[-1].detail == "superseded" and not steps[-1].success


# -- the commit's check ----------------------------------------------------------------------


@pytest.mark.slow
def test_messages_appended_while_the_summary_is_written_are_kept(
    db_url: str, reopen: Callable[[], CompactStore]
) -> None:
    other = reopen()
    late = assistant("appended while the summary was written")
    summarizer = Interfering(lambda _: other.session("s").append(late, timestamp=T0 + 500))
    with opened(db_url, summarizer=summarizer) as store:
        chat = over_threshold(store)
        usage, last_seq = chat.sess.token_usage(), len(chat.sess.messages()) - 1

        result = chat.sess.process_request(now=T0 + 1_000)

        assert result.effective and result.strategy == CompactStrategy.FULL
        assert len(summarizer.calls) == 1, "an append does not make the call plan again"
        assert result.summary_text == "LLM summary 1"
        # The recorded figures and replay inputs are the snapshot's.
        assert result.tokens_before == usage
        assert result.boundary is not None and result.boundary.preserved_segment is not None
        assert result.boundary.preserved_segment[1] == last_seq
        # The cache was not stamped with versions it did not see: the append is there.
        context = chat.sess.active_context()
        assert context[-1] == late
        assert context == reopen().session("s").active_context()
        replayed = chat.sess.replay(result.boundary.id or 0)
        assert replayed.summary_text == result.summary_text
        assert replayed.summary is not None and replayed.summary.source == "recorded"


@pytest.mark.slow
def test_a_dedup_stub_of_a_removed_seq_appended_meanwhile_makes_the_call_plan_again(
    db_url: str, reopen: Callable[[], CompactStore]
) -> None:
    other = reopen()
    summarizer = Interfering(lambda n: stub_of_first_read(other, n))
    with opened(db_url, summarizer=summarizer) as store:
        chat = over_threshold(store)

        result = chat.sess.process_request(now=T0 + 1_000)

        assert result.effective and result.boundary is not None
        segment = result.boundary.preserved_segment
        assert segment is not None
        assert segment[1] == len(chat.sess.messages()) - 1, "decided again, seeing the stub"
        assert chat.sess.breaker().consecutive_failures == 0, "a re-plan is not a failure"
        # The call's row, and the stub appended meanwhile (a read dedup is a row too).
        assert [c.strategy for c in chat.sess.compactions()] == [
            CompactStrategy.READ_DEDUP,
            result.strategy,
        ]


@pytest.mark.slow
def test_a_result_appended_meanwhile_answering_a_removed_call_makes_the_call_plan_again(
    db_url: str, reopen: Callable[[], CompactStore]
) -> None:
    other = reopen()
    open_call: list[str] = []

    def answer(_: int) -> None:
        # The tool finished while the summary was written: its result arrives meanwhile.
        other.session("s").append_tool_result(
            open_call[0], "2 tests failed", tool_name="bash", timestamp=T0 + 500
        )

    summarizer = Interfering(answer)
    with opened(db_url, summarizer=summarizer) as store:
        chat = over_threshold(store)
        call_seq, ids = chat.calls([("bash", {"command": "make test"})])
        open_call.extend(ids)

        # Up to the open call: the first plan's cut removes it (no result yet).
        result = chat.sess.compact(up_to_seq=call_seq, now=T0 + 1_000)

        assert len(summarizer.calls) == 2, "planned again, on what the result left"
        assert result.effective and result.boundary is not None
        assert call_seq not in result.removed_seqs, "the call stays with its result"
        assert result.boundary.preserved_segment == (call_seq, call_seq + 1)
        context = chat.sess.context()
        assert [item.seq for item in context.kept][-2:] == [call_seq, call_seq + 1]
        assert chat.sess.breaker().consecutive_failures == 0, "a re-plan is not a failure"
        assert len(chat.sess.compactions()) == 1


def test_a_config_change_meanwhile_plans_again_reusing_the_summary_text(
    db_url: str, reopen: Callable[[], CompactStore]
) -> None:
    other = reopen()
    changed = plain(microcompact_keep_recent=4)  # the cut does not depend on it
    summarizer = Interfering(lambda _: other.session("s", config=changed) and None)
    with opened(db_url, summarizer=summarizer) as store:
        chat = over_threshold(store)

        result = chat.sess.process_request(now=T0 + 1_000)

        assert result.effective and result.summary_text == "LLM summary 1"
        assert len(summarizer.calls) == 1, "the same seqs removed: the text is reused"
        (recorded,) = chat.sess.compactions()
        assert recorded.summary is not None and recorded.summary.source == "summarizer"
        assert store.session("s").config == changed


def test_a_change_that_ends_the_trigger_supersedes_the_call_and_records_nothing(
    db_url: str, reopen: Callable[[], CompactStore]
) -> None:
    other = reopen()
    raised = plain(auto_compact_threshold=0.99)
    summarizer = Interfering(lambda _: other.session("s", config=raised) and None)
    with opened(db_url, summarizer=summarizer) as store:
        chat = over_threshold(store)

        result = chat.sess.process_request(now=T0 + 1_000)

        assert not result.success and result.id is None and result.strategy is None
        assert superseded(result.steps)
        assert chat.sess.compactions() == []
        breaker = chat.sess.breaker()
        assert breaker.consecutive_failures == 0 and breaker.consecutive_fallbacks == 0


@pytest.mark.slow
def test_after_two_re_plans_only_the_cheap_stages_are_committed(
    db_url: str, reopen: Callable[[], CompactStore]
) -> None:
    other = reopen()
    summarizer = Interfering(lambda n: stub_of_first_read(other, n), every_call=True)
    with opened(db_url, summarizer=summarizer) as store:
        chat = over_threshold(store, big_result=True)

        result = chat.sess.process_request(now=T0 + 1_000)

        assert len(summarizer.calls) == 3, "the first plan and two re-plans"
        assert result.boundary is None, "no cut"
        assert result.effective and result.strategy == CompactStrategy.TOOL_BUDGET
        # The call's row; each stub appended meanwhile is a read dedup of its own.
        strategies = [c.strategy for c in chat.sess.compactions()]
        assert [s for s in strategies if s != CompactStrategy.READ_DEDUP] == [
            CompactStrategy.TOOL_BUDGET
        ]
        assert strategies.count(CompactStrategy.READ_DEDUP) == len(summarizer.calls)
        assert chat.sess.breaker().consecutive_failures == 0


@pytest.mark.slow_on_postgres
def test_cheap_stage_edits_made_meanwhile_are_rebased_and_blob_ids_given_at_commit(
    db_url: str, reopen: Callable[[], CompactStore]
) -> None:
    other = reopen()

    def budget(_: int) -> None:
        done = other.session("s").process_request(now=T0 + 500, enable_auto_compact=False)
        assert done.strategy == CompactStrategy.TOOL_BUDGET and done.blob_ids == [1]

    summarizer = Interfering(budget)
    with opened(db_url, summarizer=summarizer) as store:
        chat = over_threshold(store, big_result=True)

        result = chat.sess.process_request(now=T0 + 1_000)

        assert result.effective and result.strategy == CompactStrategy.FULL
        assert result.blob_ids == [], "the result was persisted once, by the other call"
        assert result.cleared_tool_use_ids == [], "its edit was the other call's"
        assert [c.strategy for c in chat.sess.compactions()] == [
            CompactStrategy.TOOL_BUDGET,
            CompactStrategy.FULL,
        ]
        assert chat.sess.get_blob(1) == words(8_000, "log")
        with pytest.raises(NotFoundError):
            chat.sess.get_blob(2)


# -- the lease -------------------------------------------------------------------------------


@pytest.mark.slow_on_postgres
def test_a_second_caller_below_the_blocking_ratio_runs_the_cheap_stages_and_goes_on(
    db_url: str, reopen: Callable[[], CompactStore]
) -> None:
    other = reopen()
    seen: list[Any] = []
    summarizer = Interfering(
        lambda _: seen.append(other.session("s").process_request(now=T0 + 500))
    )
    with opened(db_url, summarizer=summarizer) as store:
        chat = over_threshold(store)

        result = chat.sess.process_request(now=T0 + 1_000)

        (second,) = seen
        assert second.background == "running" and second.boundary is None
        assert result.effective and result.summary_text == "LLM summary 1"
        assert len(summarizer.calls) == 1, "one summary for one trigger"
        assert [c.id for c in chat.sess.compactions()] == [result.id]


def test_reactive_recovery_takes_the_lease_over_and_the_owner_commit_is_refused(
    db_url: str, reopen: Callable[[], CompactStore]
) -> None:
    other = reopen()
    seen: list[Any] = []
    summarizer = Interfering(
        lambda _: seen.append(other.session("s").reactive_recover(ERROR, now=T0 + 500))
    )
    with opened(db_url, summarizer=summarizer) as store:
        chat = over_threshold(store)

        result = chat.sess.process_request(now=T0 + 1_000)

        (recovery,) = seen
        assert recovery is not None and recovery.effective
        assert "LLM summary" not in recovery.summary_text, "recovery is rule-based"
        assert not result.success and superseded(result.steps)
        assert [c.id for c in chat.sess.compactions()] == [recovery.id]


# -- no user code in a write transaction -----------------------------------------------------


def write_lock_free(db: Path) -> bool:
    """Whether another connection could take SQLite's write lock right now."""
    probe = sqlite3.connect(db, timeout=0, isolation_level=None)
    try:
        probe.execute("BEGIN IMMEDIATE")
        probe.execute("ROLLBACK")
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        probe.close()


@pytest.mark.slow
def test_no_user_code_runs_while_a_write_transaction_is_open(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    held: list[str] = []
    ran: set[str] = set()

    def probe(what: str) -> None:
        ran.add(what)
        if not write_lock_free(db):
            held.append(what)

    def counter(text: str) -> int:
        probe("token_counter")
        return len(text) // 4 + 1

    def provider(session_id: str, entries: Any, max_tokens: int) -> str:
        probe("memory_provider")
        return "remembered: " + "; ".join(entry.text for entry in entries)

    def summarizer(messages: Any, previous: str | None, instructions: str | None) -> str:
        probe("summarizer")
        return "an LLM summary"

    config = plain(session_memory_min_tail_tokens=500, session_memory_max_tail_tokens=2_000)
    with opened(
        db, token_counter=counter, memory_provider=provider, summarizer=summarizer
    ) as store:
        chat = over_threshold(store, big_result=True, config=config)
        _, (call,) = chat.calls([("read_file", {"file_path": "a.py"})])
        chat.result(call, READ, file_path="a.py")  # a dedup stub
        chat.sess.record_usage(chat.sess.token_usage(), now=T0 + 900)
        chat.sess.remember("decision", "use the new grammar everywhere", now=T0 + 900)
        chat.sess.process_request(now=T0 + 1_000)
        chat.chatter(20, tag="more", chars=1_600)
        chat.sess.compact(now=T0 + 1_001)
        chat.sess.reactive_recover(ERROR, now=T0 + 1_002)
        store.session("t").extend([assistant("hello")], timestamps=[T0])

    assert ran == {"token_counter", "memory_provider", "summarizer"}
    assert held == []


# -- waiting for a lock ----------------------------------------------------------------------
