"""Stage 6b, full compact and manual / partial compact: a rule-based,
cumulative summary of the removed part; the newest third of the messages stays verbatim.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from compactstore import (
    CompactStore,
    CompactStrategy,
    CompactTrigger,
    InvalidInputError,
)
from tests.helpers import (
    FORMATS,
    T0,
    Chat,
    assistant,
    context_seqs,
    new_session,
    opened,
    pair_problems,
    plain,
    results,
    text_of,
    user,
    words,
)

Snapshot = Callable[[CompactStore], dict[str, list[tuple[Any, ...]]]]


def filler(chat: Chat, count: int, tag: str = "f") -> None:
    chat.chatter(count, tag, chars=150)


def test_keeps_the_newest_third_of_the_messages_up_to_40(store: CompactStore) -> None:
    for after_request, first_kept in [(29, 20), (149, 110)]:
        check_the_tail(store, after_request, first_kept)


def check_the_tail(store: CompactStore, after_request: int, first_kept: int) -> None:
    chat = new_session(store, "anthropic", sid=f"n{after_request}")
    chat.request("Refactor the storage layer")
    filler(chat, after_request)
    last = after_request

    result = chat.sess.compact(now=T0 + 1_000)

    assert result.effective
    assert result.strategy == CompactStrategy.FULL and result.trigger == CompactTrigger.MANUAL
    boundary = result.boundary
    assert boundary is not None
    assert boundary.preserved_segment == (first_kept, last)
    assert boundary.messages_removed == first_kept - 1  # everything but the pinned request
    assert result.removed_seqs == list(range(1, first_kept))
    context = chat.sess.active_context()
    assert context[-(last - first_kept + 1) :] == chat.sess.messages()[first_kept:]


@pytest.mark.slow
def test_the_summary_holds_request_instructions_files_and_errors(store: CompactStore) -> None:
    for fmt in FORMATS:
        check_the_summary(store, fmt)


def check_the_summary(store: CompactStore, fmt: str) -> None:
    chat = new_session(store, fmt, sid=fmt)
    request = words(2_500, "request")
    chat.request(request)
    for i in range(10):
        chat.extend([user(f"topic {i}: " + words(150, f"topic{i}")), assistant(f"answer {i}")])
    chat.tool_turns(
        [
            ("read_file", {"file_path": f"src/m{i}.py"}, f"contents of module {i}", False)
            for i in range(12)
        ]
        + [
            ("bash", {"command": "make test"}, "ok", False),
            ("grep", {"pattern": "TODO"}, "no match", False),
        ]
    )
    chat.tool("E0 failure: " + words(300, "err0"), name="bash", is_error=True)  # via the API
    chat.tool_turns(
        [("bash", {}, f"E{i} failure: " + words(300, f"err{i}"), True) for i in range(1, 7)]
    )
    filler(chat, 100)

    result = chat.sess.compact(now=T0 + 5_000)

    summary = result.summary_text
    assert result.boundary is not None and result.boundary.summary_text == summary
    assert any(summary in text_of(m) for m in chat.sess.active_context())
    # The original request, verbatim up to 2,000 characters.
    assert request[:2_000] in summary and request[:2_001] not in summary
    removed = [chat.sess.messages()[seq] for seq in result.removed_seqs]
    # Every later instruction, in order, verbatim (the summary is within its budget).
    asked = [
        " ".join(text_of(m).split())
        for m in removed
        if m.get("role") == "user" and text_of(m) and not results(fmt, m)
    ]
    positions = [summary.index(text) for text in asked]
    assert len(asked) > 10 and positions == sorted(positions)
    # Files, one line each, with what was done to them.
    for i in range(12):
        assert f"- src/m{i}.py — read\n" in summary
    # Errors: the newest 5, 160 characters each.
    errors = [
        " ".join(text.split())
        for m in removed
        for text in results(fmt, m).values()
        if "failure:" in text
    ]
    assert len(errors) == 7
    listed = [e for e in errors if e[:160] in summary]
    assert listed == errors[-5:]
    assert all(e[:161] not in summary for e in listed)


def test_summaries_are_cumulative_over_three_compactions(store: CompactStore) -> None:
    chat = new_session(store, "openai")
    request = "Port the CLI to click and keep every flag working"
    chat.request(request)
    summaries = []
    for phase, paths in enumerate([["cli.py", "flags.py"], ["setup.cfg"], ["docs/usage.md"]]):
        for path in paths:
            chat.tool(f"content of {path}", name="edit_file", args={"path": path})
        filler(chat, 30, tag=f"p{phase}")
        result = chat.sess.compact(instructions=f"phase {phase}", now=T0 + 1_000 * (phase + 1))
        assert result.effective
        assert result.instructions == f"phase {phase}", "recorded even without a summarizer"
        summaries.append(result.summary_text)

    latest = summaries[-1]
    assert request in latest
    for path in ("cli.py", "flags.py", "setup.cfg", "docs/usage.md"):
        assert path in latest
    assert "setup.cfg" not in summaries[0] and "cli.py" in summaries[0]
    boundaries = chat.sess.boundaries()
    assert len(boundaries) == 3
    assert [b.parent_id for b in boundaries] == [None, boundaries[0].id, boundaries[1].id]
    assert [c.instructions for c in chat.sess.compactions()] == ["phase 0", "phase 1", "phase 2"]


def test_a_summarizer_receives_removed_messages_previous_summary_and_instructions(
    db_url: str,
) -> None:
    calls: list[tuple[list[dict[str, Any]], str | None, str | None]] = []

    def summarizer(messages: list[dict[str, Any]], previous: str | None, note: str | None) -> str:
        calls.append((messages, previous, note))
        if note == "fail":
            raise ValueError("model unavailable")
        return f"LLM summary #{len(calls)} of {len(messages)} messages"

    with opened(db_url, summarizer=summarizer) as store:
        chat = new_session(store, "minicode")
        chat.request("Write the migration")
        filler(chat, 29)
        first = chat.sess.compact(now=T0 + 100)
        filler(chat, 30, tag="g")

        second = chat.sess.compact(instructions="Focus on schema changes", now=T0 + 200)

        log = chat.sess.messages()
        recorded = chat.sess.compactions()
        # A summarizer that raises: the rule summary is used and the step says why.
        filler(chat, 30, tag="h")
        fallback = chat.sess.compact(instructions="fail", now=T0 + 300)

    assert fallback.effective
    assert "Write the migration" in fallback.summary_text
    (step,) = fallback.steps
    assert "ValueError" in step.detail and "model unavailable" in step.detail

    assert first.summary_text == "LLM summary #1 of 19 messages"
    messages, previous, note = calls[0]
    assert messages == [log[seq] for seq in first.removed_seqs]
    assert previous is None and note is None
    messages, previous, note = calls[1]
    assert messages == [log[seq] for seq in second.removed_seqs]
    assert previous == first.summary_text
    assert note == "Focus on schema changes"
    assert second.summary_text.startswith("LLM summary #2")
    assert recorded[-1].instructions == "Focus on schema changes"
    assert recorded[0].instructions is None


def test_a_partial_compact_summarises_only_up_to_the_seq(store: CompactStore) -> None:
    for fmt in FORMATS:
        check_partial(store, fmt)


def check_partial(store: CompactStore, fmt: str) -> None:
    chat = new_session(store, fmt, sid=fmt)
    chat.request("Plan the release")
    filler(chat, 10, tag="early")
    cut = chat.user("EARLY-TOPIC: what about the changelog?")
    late = chat.user("LATE-TOPIC: and the version bump?")
    filler(chat, 10, tag="late")
    last = len(chat.sess.messages()) - 1

    result = chat.sess.compact(up_to_seq=cut, now=T0 + 100)

    assert result.strategy == CompactStrategy.PARTIAL and result.trigger == CompactTrigger.MANUAL
    assert result.removed_seqs == list(range(1, cut + 1))
    assert result.boundary is not None and result.boundary.preserved_segment == (late, last)
    assert "EARLY-TOPIC" in result.summary_text and "LATE-TOPIC" not in result.summary_text
    log = chat.sess.messages()
    assert chat.sess.active_context()[-(last - late + 1) :] == log[late:]


def test_up_to_seq_past_the_end_or_already_summarised_is_refused(
    store: CompactStore, db_snapshot: Snapshot
) -> None:
    chat = new_session(store, "anthropic")
    chat.request("Plan")
    filler(chat, 10)
    chat.sess.compact(up_to_seq=5, now=T0 + 10)
    before = db_snapshot(store)

    with pytest.raises(InvalidInputError, match="past the last message"):
        chat.sess.compact(up_to_seq=11, now=T0 + 20)
    with pytest.raises(InvalidInputError):
        chat.sess.compact(up_to_seq=3, now=T0 + 20)

    assert db_snapshot(store) == before


def test_a_tool_pair_at_the_cut_does_not_push_the_tail_past_40_messages(
    store: CompactStore,
) -> None:
    chat = new_session(store, "openai")
    chat.request("Audit the logs")
    chat.chatter(108)  # seqs 1..108
    ((call_seq, result_seq, _),) = chat.tool_turns([("read_file", {"path": "x.log"}, "x", False)])
    chat.chatter(39, tag="late")  # seqs 111..149: 150 messages, so the tail is 40
    assert (call_seq, result_seq) == (109, 110)

    result = chat.sess.compact(now=T0 + 10)

    assert result.boundary is not None and result.boundary.preserved_segment is not None
    first, last = result.boundary.preserved_segment
    assert last - first + 1 <= 40
    assert pair_problems("openai", chat.sess.active_context()) == []


def test_a_full_compact_always_keeps_the_newest_message_and_never_crashes(
    store: CompactStore,
) -> None:
    chat = new_session(store, "anthropic")
    chat.request("Summarise the meeting")
    chat.chatter(4)  # seqs 1..4
    first = chat.sess.compact(now=T0 + 1)
    assert first.boundary is not None and first.boundary.preserved_segment == (4, 4)

    second = chat.sess.compact(now=T0 + 2)
    third = chat.sess.compact(now=T0 + 3)

    assert 4 in context_seqs(chat.sess), "the newest message stays verbatim"
    assert not second.effective and not third.effective


def test_the_summary_lists_files_newest_first_up_to_summary_max_files(
    store: CompactStore,
) -> None:
    chat = new_session(store, "anthropic", config=plain(summary_max_files=10))
    chat.request("Touch many files")
    chat.tool_turns(
        [("edit_file", {"file_path": f"pkg/f{i:02d}.py"}, "ok", False) for i in range(12)]
    )
    chat.chatter(60)

    result = chat.sess.compact(now=T0 + 10)

    files = result.summary_text.split("## Files (newest first)\n")[1].split("\n\n")[0]
    assert files.splitlines() == [
        *(f"- pkg/f{i:02d}.py — modified" for i in range(11, 1, -1)),
        "- … 2 older files",
    ]
