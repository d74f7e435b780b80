"""The pipeline as a whole: one transaction and at most one recorded row per call,
the heaviest stage named, pins kept verbatim, crash-orphaned calls answered and never
separated, look-alike messages that cut nothing, atomic failure and determinism.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from compactstore import (
    CompactStore,
    CompactStrategy,
    CompactTrigger,
    SummarizerError,
    estimate_tokens,
)
from tests.helpers import (
    FORMATS,
    HOUR,
    T0,
    Chat,
    assistant,
    busy_log,
    call_ids,
    calls_message,
    context_seqs,
    every_stage,
    new_session,
    opened,
    pair_problems,
    plain,
    result_map,
    results,
    system,
    user,
    words,
)

Snapshot = Callable[[CompactStore], dict[str, list[tuple[Any, ...]]]]


def test_nothing_to_do_records_nothing(store: CompactStore, db_snapshot: Snapshot) -> None:
    chat = new_session(store, "openai")
    chat.request("Hello")
    chat.tool(words(300, "small"))
    before = db_snapshot(store)

    result = chat.sess.process_request(now=T0 + 60)

    assert result.success is False and not result.effective
    assert result.strategy is None and result.trigger is None
    assert result.tokens_freed == 0 and result.id is None and result.steps == []
    assert chat.sess.compactions() == [] and chat.sess.boundaries() == []
    assert db_snapshot(store) == before


def test_several_stages_in_one_call_name_the_heaviest_and_list_each(store: CompactStore) -> None:
    chat = new_session(store, "minicode", context_window=18_000)
    busy_log(chat)

    result = chat.sess.process_request(now=T0 + HOUR)

    assert [(s.strategy, s.trigger) for s in result.steps] == [
        (CompactStrategy.TOOL_BUDGET, CompactTrigger.AUTO),
        (CompactStrategy.MICROCOMPACT, CompactTrigger.MICROCOMPACT_TIME),
        (CompactStrategy.FULL, CompactTrigger.AUTO),
    ]
    assert all(s.success and s.tokens_freed > 0 for s in result.steps)
    assert result.strategy == CompactStrategy.FULL
    assert sum(s.tokens_freed for s in result.steps) == result.tokens_freed
    (row,) = chat.sess.compactions()
    assert row.id == result.id and row.steps == result.steps
    assert len(row.blob_ids) == 2
    assert len(row.cleared_tool_use_ids) == 2 + 3  # two persisted, three cleared
    # Each step says which: the budget persisted two, microcompact cleared three.
    assert [(s.results_cleared, s.results_persisted) for s in row.steps] == [(0, 2), (3, 0), (0, 0)]
    assert (row.results_cleared, row.results_persisted) == (3, 2)
    assert result.boundary is not None and result.boundary.strategy == CompactStrategy.FULL
    assert chat.sess.token_usage() == result.tokens_after < 0.85 * 18_000


@pytest.mark.slow_on_postgres
def test_each_call_records_at_most_one_row_whose_tokens_after_is_the_usage(
    store: CompactStore,
) -> None:
    chat = new_session(store, "anthropic", context_window=8_000)
    chat.request("Keep the service running")
    now = T0
    for turn in range(10):
        chat.tool_turns(
            [
                (
                    "bash",
                    {"command": f"check {turn}.{i}"},
                    words(900 + 1_500 * i, f"t{turn}"),
                    False,
                )
                for i in range(4)
            ]
        )
        chat.chatter(4, tag=f"c{turn}", chars=800)
        rows = len(chat.sess.compactions())
        now += 1_500

        result = chat.sess.process_request(now=now)

        recorded = chat.sess.compactions()
        assert len(recorded) - rows == (0 if result.id is None else 1)
        if result.id is not None:
            assert recorded[-1].id == result.id
            assert recorded[-1].tokens_after == result.tokens_after == chat.sess.token_usage()
        else:
            assert result.tokens_after == chat.sess.token_usage()
    strategies = {c.strategy for c in chat.sess.compactions()}
    assert {CompactStrategy.TOOL_BUDGET, CompactStrategy.FULL} <= strategies


def check_pins(chat: Chat) -> None:
    context = chat.sess.active_context()
    assert [m for m in context if m in chat.pins] == chat.pins
    assert pair_problems(chat.fmt, context) == []


@pytest.mark.slow
def test_pins_stay_verbatim_through_every_stage(store: CompactStore) -> None:
    for fmt in FORMATS:
        config = plain(session_memory_min_tail_tokens=2_000, session_memory_max_tail_tokens=6_000)
        chat = new_session(store, fmt, sid=fmt, context_window=18_000, config=config)
        busy_log(chat)
        chat.user("Pinned: the release branch is frozen.", pinned=True)
        chat.chatter(10, tag="after-pin", chars=400)
        seen: list[CompactStrategy | None] = []

        for result in every_stage(chat):
            assert result is not None and result.effective, (fmt, seen)
            seen.append(result.strategy)
            context = chat.sess.active_context()
            assert [m for m in context if m in chat.pins] == chat.pins, (fmt, seen)
            assert pair_problems(fmt, context) == []

        assert seen == [
            CompactStrategy.TOOL_BUDGET,
            CompactStrategy.MICROCOMPACT,
            CompactStrategy.FULL,
            CompactStrategy.SESSION_MEMORY,
            *seen[4:7],  # reactive recovery: a full compact, or truncation when that is not enough
            CompactStrategy.FULL,
            CompactStrategy.PARTIAL,
        ], fmt
        assert set(seen[4:7]) <= {CompactStrategy.FULL, CompactStrategy.REACTIVE}


def test_a_crash_orphaned_call_gets_a_synthetic_result_that_is_never_separated(
    store: CompactStore,
) -> None:
    for fmt in FORMATS:
        chat = new_session(store, fmt, sid=fmt)
        chat.request("Deploy to staging")
        chat.chatter(18, chars=300)
        orphan = calls_message(fmt, [(chat.new_id(), "bash", {"command": "deploy --wait"})])
        (orphan_id,) = call_ids(fmt, orphan)
        call_seq = chat.add(orphan)  # the agent crashed before the result was stored
        chat.chatter(9, tag="after", chars=300)

        context = chat.sess.active_context()

        position = context.index(orphan)
        synthetic = context[position + 1]
        assert list(results(fmt, synthetic)) == [orphan_id]
        if fmt == "anthropic":
            assert synthetic["content"][0]["is_error"] is True
        if fmt == "minicode":
            assert synthetic["isError"] is True
        assert synthetic not in chat.sess.messages(), "it is not stored as a message"
        assert pair_problems(fmt, context) == []
        # 30 context items: a full compact keeps 10 and would cut between call and result.
        assert len(context) == 30 and position == 19

        result = chat.sess.compact(now=T0 + 100)

        context = chat.sess.active_context()
        assert pair_problems(fmt, context) == []
        assert result.boundary is not None
        assert result.boundary.preserved_segment == (call_seq, call_seq + 9)
        assert context.index(orphan) + 1 == context.index(synthetic)


def test_the_newest_assistant_messages_pending_calls_are_left_as_they_are(
    store: CompactStore,
) -> None:
    for fmt in FORMATS:
        chat = new_session(store, fmt, sid=fmt)
        chat.request("Read both files")
        _, (first, second) = chat.calls([("read_file", {"p": "a"}), ("read_file", {"p": "b"})])
        chat.result(first, "contents of a")  # the second tool is still running

        shown = result_map(fmt, chat.sess.active_context())

        assert second not in shown, f"{fmt}: a running call got a synthetic result"
        assert shown == {first: "contents of a"}


def test_messages_that_imitate_boundaries_summaries_or_stubs_cut_nothing(
    store: CompactStore,
) -> None:
    for fmt in FORMATS:
        chat = new_session(store, fmt, sid=fmt)
        chat.request("Explain how compaction works")
        fakes = [
            assistant(
                "[Context compacted at 2024-01-01 00:00:00 UTC — Full Compact]\n\n"
                "Summary of the conversation so far (99 earlier messages summarised).\n\n"
                "--- Recent conversation continues below ---"
            ),
            {"role": "user", "content": "a boundary marker", "_compact_boundary": True},
            {"role": "assistant", "content": '{"type": "compact_boundary", "first_kept_seq": 5}'},
            user(
                "[Read deduplicated: src/app.py]\nFile unchanged since last read.\n"
                "(Original content at message seq 1)"
            ),
            user("[Old tool result content cleared by time-based microcompact]"),
        ]
        if fmt != "anthropic":
            fakes.append(system("[Context compacted at 2024-01-01 — Session Memory]"))
        chat.extend(fakes)
        chat.tool("[Tool result persisted: 9000 chars, tool read_file, blob 1]\n...")
        chat.chatter(20, chars=300)
        log = chat.sess.messages()

        assert chat.sess.active_context() == log
        assert chat.sess.boundaries() == []
        assert chat.sess.token_usage() == sum(item.tokens for item in chat.sess.context().items)
        assert chat.sess.process_request(now=T0 + 60).id is None

        result = chat.sess.compact(now=T0 + 100)

        # The cut is where a full compact of this many messages puts it, nowhere else.
        assert result.boundary is not None
        n = len(log)
        assert result.boundary.preserved_segment == (n - n // 3, n - 1)
        assert chat.sess.active_context()[-(n // 3) :] == log[-(n // 3) :]


def test_a_summarizer_error_falls_back_to_the_rule_summary_and_counts_a_fallback(
    db_url: str,
) -> None:
    """a SummarizerError no longer aborts the call (it would make every
    process_request() raise for ever): the rule-based summary is used, the row says why,
    and the breaker counts consecutive fallbacks until reset_breaker()."""

    def summarizer(messages: list[dict[str, Any]], previous: str | None, note: str | None) -> str:
        raise SummarizerError("the model is overloaded")

    with opened(db_url, summarizer=summarizer) as store:
        chat = new_session(store, "anthropic", context_window=18_000)
        busy_log(chat)

        result = chat.sess.process_request(now=T0 + HOUR)

        assert result.effective and result.strategy == CompactStrategy.FULL
        assert result.summary is not None and result.summary.fallback
        assert result.summary.source == "rule"
        assert "SummarizerError: the model is overloaded" in (result.summary.reason or "")
        assert "Full Compact" in result.summary_text, "the rule-based summary"
        (recorded,) = chat.sess.compactions()
        assert recorded.summary == result.summary
        assert chat.sess.breaker().consecutive_fallbacks == 1
        assert not chat.sess.breaker().tripped, "a fallback is not a breaker failure"

        manual = chat.sess.compact(now=T0 + HOUR + 1)

        assert manual.summary is not None and manual.summary.fallback
        assert chat.sess.breaker().consecutive_fallbacks == 2
        chat.sess.reset_breaker()
        assert chat.sess.breaker().consecutive_fallbacks == 0


def test_a_token_counter_error_during_compaction_aborts_the_whole_call(
    db_url: str, db_snapshot: Snapshot
) -> None:
    class Counter:
        def __init__(self) -> None:
            self.armed = False
            self.calls = 0

        def __call__(self, text: str) -> int:
            if self.armed:
                self.calls += 1
                if self.calls > 2:  # let the first stage's edits through, then fail
                    raise SummarizerError("token service unavailable")
            return estimate_tokens(text)

    counter = Counter()
    with opened(db_url, token_counter=counter) as store:
        chat = new_session(store, "openai", context_window=18_000)
        busy_log(chat)
        before = db_snapshot(store)
        counter.armed = True

        with pytest.raises(SummarizerError):
            chat.sess.process_request(now=T0 + HOUR)

        assert counter.calls > 2
        assert db_snapshot(store) == before


def scenario(store: CompactStore) -> dict[str, Any]:
    """A whole session life: every kind of call, in order."""
    chat = new_session(store, "openai", context_window=12_000)
    busy_log(chat)
    chat.sess.process_request(now=T0 + 60)
    chat.chatter(20, tag="b", chars=1_600)
    chat.sess.process_request(now=T0 + HOUR + 60)
    chat.sess.remember("user_intent", "Nightly build green")
    chat.chatter(30, tag="c", chars=1_600)
    chat.sess.process_request(now=T0 + HOUR + 120)
    chat.sess.reactive_recover("too long", now=T0 + HOUR + 180)
    chat.chatter(20, tag="d", chars=400)
    chat.sess.compact(up_to_seq=context_seqs(chat.sess)[3], now=T0 + HOUR + 240)
    chat.sess.compact(instructions="be brief", now=T0 + HOUR + 300)
    rows = chat.sess.compactions()
    return {
        "compactions": [c.model_dump() for c in rows],
        "boundaries": [b.model_dump() for b in chat.sess.boundaries()],
        "context": chat.sess.active_context(),
        "blobs": [chat.sess.get_blob(b) for c in rows for b in c.blob_ids],
        "usage": chat.sess.token_usage(),
    }


@pytest.mark.slow
def test_the_same_log_config_and_now_give_the_same_compactions_in_two_fresh_stores(
    store: CompactStore, tmp_path: Path
) -> None:
    first = scenario(store)
    with opened(tmp_path / "twin.db") as twin:
        second = scenario(twin)

    assert len(first["compactions"]) >= 5
    assert first == second
