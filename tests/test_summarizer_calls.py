"""Summarizers as the store calls them: what a summarizer receives and
returns, its timeout and failures (fallback to the rule-based summary, counted), the hourly
limit, per-session summarizers recorded by name, ``on_compaction``, ``redactor``, and replay
reusing the recorded text."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import compactstore
from compactstore import (
    CompactionResult,
    CompactStore,
    CompactStoreWarning,
    CompactStrategy,
    InvalidInputError,
    SummaryResult,
)
from tests.helpers import T0, Chat, new_session, opened, plain, text_of

WINDOW = 20_000
HOUR = 3_600


def over_threshold(store: CompactStore, sid: str = "s", **kwargs: Any) -> Chat:
    """A session at 90% of its window (above the 85% trigger)."""
    config = kwargs.pop("config", None) or plain()
    chat = new_session(store, context_window=WINDOW, sid=sid, config=config, **kwargs)
    chat.request("Rotate the API keys")
    chat.user("By the way, the old secret is hunter2")
    while chat.sess.token_usage() < 0.9 * WINDOW:
        chat.chatter(2, chars=1_600)
    return chat


class Recording:
    """A summarizer that records what it was given and answers ``answer``."""

    def __init__(self, answer: str | SummaryResult = "an LLM summary") -> None:
        self.answer = answer
        self.seen: list[tuple[list[dict[str, Any]], str | None, str | None]] = []

    def __call__(
        self, messages: list[dict[str, Any]], previous: str | None, instructions: str | None
    ) -> str | SummaryResult:
        self.seen.append((messages, previous, instructions))
        return self.answer


def test_summary_result_is_public_and_its_figures_are_recorded(db_url: str) -> None:
    assert compactstore.SummaryResult is SummaryResult
    answer = SummaryResult("an LLM summary", input_tokens=1_234, output_tokens=56, model="m-1")
    summarizer = Recording(answer)
    with opened(db_url, summarizer=summarizer) as store:
        chat = over_threshold(store)

        result = chat.sess.process_request(now=T0 + 1_000)

        assert result.effective and result.summary_text == "an LLM summary"
        info = result.summary
        assert info is not None and info.source == "summarizer" and not info.fallback
        assert (info.model, info.input_tokens, info.output_tokens) == ("m-1", 1_234, 56)
        assert info.latency_ms is not None and info.latency_ms >= 0
        assert info.summarizer == "tests.test_summarizer_calls:Recording"
        (recorded,) = chat.sess.compactions()
        assert recorded.summary == info


class AsyncCallable:
    async def __call__(self, messages: Any, previous: Any, instructions: Any) -> str:
        return "never"


async def async_summarizer(messages: Any, previous: Any, instructions: Any) -> str:
    return "never"


@pytest.mark.slow
@pytest.mark.parametrize("summarizer", [async_summarizer, AsyncCallable()])
def test_an_async_summarizer_is_refused_naming_async_compact_store(
    summarizer: Any, tmp_path: Path
) -> None:
    with pytest.raises(InvalidInputError, match="AsyncCompactStore"):
        CompactStore.open(tmp_path / "a.db", summarizer=summarizer)
    assert not (tmp_path / "a.db").exists(), "refused before the database is touched"
    with opened(tmp_path / "b.db") as store, pytest.raises(InvalidInputError, match="Async"):
        store.session("s", summarizer=summarizer)


@pytest.mark.slow
def test_failures_and_timeouts_fall_back_and_count_until_a_summary_succeeds(
    db_url: str,
) -> None:
    release = threading.Event()
    behaviour: list[str] = ["raise"]

    def summarizer(messages: Any, previous: str | None, instructions: str | None) -> str:
        if behaviour[0] == "raise":
            raise ValueError("the model is down")
        if behaviour[0] == "slow":
            release.wait(10)  # past the 0.1 s timeout: released once the call returned
            return "too late"
        return "an LLM summary"

    config = plain(summarizer_timeout_seconds=0.1)
    with opened(db_url, summarizer=summarizer) as store:
        chat = over_threshold(store, config=config)

        failed = chat.sess.compact(now=T0 + 1)

        assert failed.effective and "Full Compact" in failed.summary_text
        assert failed.summary is not None and failed.summary.fallback
        assert "ValueError: the model is down" in (failed.summary.reason or "")
        assert chat.sess.breaker().consecutive_fallbacks == 1

        behaviour[0] = "slow"
        chat.chatter(10, tag="more", chars=1_600)
        slow = chat.sess.compact(now=T0 + 2)
        release.set()

        assert slow.summary is not None and slow.summary.fallback
        assert "timed out after 0.1 s" in (slow.summary.reason or "")
        assert "too late" not in slow.summary_text
        assert chat.sess.breaker().consecutive_fallbacks == 2
        assert not chat.sess.breaker().tripped, "fallbacks do not trip the breaker"

        behaviour[0] = "ok"
        chat.chatter(10, tag="last", chars=1_600)
        fine = chat.sess.compact(now=T0 + 3)

        assert fine.summary_text == "an LLM summary"
        assert chat.sess.breaker().consecutive_fallbacks == 0


@pytest.mark.slow_on_postgres
def test_summarizer_calls_are_limited_per_session_per_hour(db_url: str) -> None:
    summarizer = Recording()
    config = plain(summarizer_max_calls_per_hour=1)
    with opened(db_url, summarizer=summarizer) as store:
        chat = over_threshold(store, config=config)

        first = chat.sess.compact(now=T0 + 10)
        chat.chatter(10, tag="b", chars=1_600)
        second = chat.sess.compact(now=T0 + 20)
        chat.chatter(10, tag="c", chars=1_600)
        later = chat.sess.compact(now=T0 + 10 + HOUR)

        assert first.summary_text == "an LLM summary"
        assert second.summary is not None and second.summary.source == "rule"
        assert not second.summary.fallback
        assert "summarizer_max_calls_per_hour" in (second.summary.reason or "")
        assert later.summary_text == "an LLM summary", "an hour later"
        assert len(summarizer.seen) == 2
        assert chat.sess.breaker().consecutive_fallbacks == 0


def named(name: str) -> Callable[..., str]:
    def summarizer(messages: Any, previous: Any, instructions: Any) -> str:
        return f"summary by {name}"

    summarizer.name = name  # type: ignore[attr-defined]
    return summarizer


@pytest.mark.slow_on_postgres
def test_a_session_summarizer_is_recorded_and_a_process_without_it_counts_a_fallback(
    db_url: str, reopen: Callable[[], CompactStore]
) -> None:
    with opened(db_url, summarizer=named("store-wide")) as store:
        chat = over_threshold(store, summarizer=named("careful"))

        own = chat.sess.compact(now=T0 + 1)

        assert own.summary_text == "summary by careful", "the session's, not the store's"

    elsewhere = reopen()  # a process that configured no summarizer
    chat = Chat(elsewhere.session("s"), "anthropic")
    chat.chatter(10, tag="b", chars=1_600)
    missing = chat.sess.compact(now=T0 + 2)

    assert missing.summary is not None and missing.summary.fallback
    assert missing.summary.summarizer == "careful"
    assert "not configured in this process" in (missing.summary.reason or "")
    assert chat.sess.breaker().consecutive_fallbacks == 1

    with opened(db_url, summarizer=named("other")) as third:
        sess = third.session("s")
        Chat(sess, "anthropic").chatter(10, tag="c", chars=1_600)
        wrong = sess.compact(now=T0 + 3)
        assert wrong.summary is not None and wrong.summary.fallback, "another summarizer"
        again = third.session("s", summarizer=named("careful"))
        Chat(again, "anthropic").chatter(10, tag="d", chars=1_600)
        assert again.compact(now=T0 + 4).summary_text == "summary by careful"
        assert again.breaker().consecutive_fallbacks == 0


@pytest.mark.slow
def test_on_compaction_is_called_after_the_commit_and_outside_any_transaction(
    tmp_path: Path,
) -> None:
    db = tmp_path / "store.db"
    seen: list[tuple[CompactionResult, bool, int]] = []

    def on_compaction(result: CompactionResult) -> None:
        probe = sqlite3.connect(db, timeout=0, isolation_level=None)
        try:
            probe.execute("BEGIN IMMEDIATE")
            probe.execute("ROLLBACK")
            free = True
        except sqlite3.OperationalError:
            free = False
        committed = probe.execute("SELECT count(*) FROM compactions").fetchone()[0]
        probe.close()
        seen.append((result, free, committed))

    with opened(db, on_compaction=on_compaction) as store:
        chat = over_threshold(store)
        assert chat.sess.process_request(now=T0 + 1, enable_auto_compact=False).id is None
        assert seen == [], "nothing recorded, nothing to report"

        result = chat.sess.process_request(now=T0 + 2)

        assert [(r.id, free, n) for r, free, n in seen] == [(result.id, True, 1)]
        assert seen[0][0].strategy == CompactStrategy.FULL

    def broken(result: CompactionResult) -> None:
        raise RuntimeError("the dashboard is down")

    with opened(tmp_path / "other.db", on_compaction=broken) as store:
        chat = over_threshold(store)
        with pytest.warns(CompactStoreWarning, match="dashboard is down"):
            kept = chat.sess.compact(now=T0 + 3)
        assert [c.id for c in chat.sess.compactions()] == [kept.id]


def test_the_redactor_is_applied_to_what_the_summarizer_is_sent(db_url: str) -> None:
    summarizer = Recording()
    with opened(
        db_url, summarizer=summarizer, redactor=lambda text: text.replace("hunter2", "[secret]")
    ) as store:
        chat = over_threshold(store)
        chat.sess.compact(instructions="keep hunter2 out", now=T0 + 1)

        (messages, _, instructions), *_ = summarizer.seen
        sent = " ".join(text_of(message) for message in messages)
        assert "hunter2" not in sent and "[secret]" in sent
        assert instructions == "keep [secret] out"
        assert all(message["role"] in ("user", "assistant") for message in messages)
        assert "hunter2" in text_of(chat.sess.messages()[1]), "the log is unchanged"


@pytest.mark.slow
def test_replay_reuses_the_recorded_text_and_resummarizes_only_when_asked(db_url: str) -> None:
    calls: list[int] = []

    def summarizer(messages: Any, previous: Any, instructions: Any) -> str:
        calls.append(len(messages))
        return f"LLM summary, take {len(calls)}"  # never the same twice

    with opened(db_url, summarizer=summarizer) as store:
        chat = over_threshold(store)
        original = chat.sess.process_request(now=T0 + 1)
        assert original.boundary is not None and original.boundary.id is not None
        boundary = original.boundary.id

        same = chat.sess.replay(boundary)

        assert len(calls) == 1, "the recorded text is reused"
        assert same.summary_text == original.summary_text == "LLM summary, take 1"
        assert same.boundary is not None
        assert same.boundary.preserved_segment == original.boundary.preserved_segment
        assert same.summary is not None and same.summary.source == "recorded"

        fresh = chat.sess.replay(boundary, resummarize=True)

        assert fresh.summary_text == "LLM summary, take 2"
        assert fresh.summary is not None and fresh.summary.source == "summarizer"

        other_cut = chat.sess.replay(boundary, config=plain(full_compact_keep_fraction=0.5))

        assert other_cut.summary is not None and other_cut.summary.source == "rule"
        assert "Full Compact" in other_cut.summary_text
        assert len(calls) == 2


def test_resummarize_needs_a_summarizer(db_url: str) -> None:
    with opened(db_url) as store:
        chat = over_threshold(store)
        result = chat.sess.process_request(now=T0 + 1)
        assert result.boundary is not None and result.boundary.id is not None
        with pytest.raises(InvalidInputError, match="needs a summarizer"):
            chat.sess.replay(result.boundary.id, resummarize=True)


@pytest.mark.slow
def test_the_redactor_applies_to_export_and_report_texts(tmp_path: Path) -> None:
    pytest.importorskip("jinja2", reason="the report needs the 'report' extra")
    from compactstore._store.export import export_lines
    from compactstore.report import session_page

    db = tmp_path / "store.db"
    with opened(db, summarizer=Recording("the agent used the key hunter2")) as store:
        chat = over_threshold(store)
        chat.sess.compact(now=T0 + 1)
        assert "hunter2" in session_page(store, "s"), "the summary names the secret"
    with opened(db, redactor=lambda text: text.replace("hunter2", "[secret]")) as store:
        sess = store.session("s")

        exported = "".join(export_lines(sess))
        page = session_page(store, "s")

        assert "hunter2" not in exported and "[secret]" in exported
        assert "hunter2" not in page and "[secret]" in page
        assert "hunter2" in text_of(sess.messages()[1]), "the log is unchanged"
