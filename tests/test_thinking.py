"""Thinking blocks: stored verbatim, sent while nothing before them
changed since the context version their message answered, counted exactly as sent, and
never given to a summarizer.

Every test goes through the public API on a real SQLite file and on PostgreSQL; what a
session shows is compared with a fresh handle (a new store reading the rows), so the cached
context and the one rebuilt from the rows agree.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from sqlalchemy import create_engine, text

from compactstore import CompactionConfig, CompactStore, Session
from compactstore._context.tokens import estimate_tokens
from compactstore.db.migrate import current_revision, head_revision
from compactstore.models import ImportedBoundary, ImportedMessage
from tests.helpers import T0, migrate_to, plain, scratch_store, validate_with_sdk
from tests.test_validation import wrong

HOUR = 3_600
NEW = "claude-opus-5-5"  # checks thinking prefixes
SIGNATURE = "EqQBCkgIARABGAIiQL2W" * 4  # opaque: compactstore never reads it


def thinking(n: int) -> dict[str, Any]:
    return {
        "type": "thinking",
        "thinking": f"Step {n}: " + "weigh the options " * 20,
        "signature": f"{SIGNATURE}{n}",
    }


REDACTED = {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4aDFu" * 3}


class Agent:
    """An anthropic tool loop whose every assistant message starts with signed thinking."""

    def __init__(self, sess: Session) -> None:
        self.sess, self.clock, self.n = sess, T0, 0

    def tick(self) -> float:
        self.clock += 1
        return self.clock

    def user(self, content: str) -> int:
        return self.sess.append({"role": "user", "content": content}, timestamp=self.tick())

    def turn(self, *, redacted: bool = False, output: str = "line\n" * 40) -> int:
        """An assistant message (thinking, a tool call) and the call's result."""
        self.n += 1
        call_id = f"toolu_{self.n}"
        blocks = [thinking(self.n), *([REDACTED] if redacted else [])]
        call = {"type": "tool_use", "id": call_id, "name": "read", "input": {"n": self.n}}
        seq = self.sess.append(
            {"role": "assistant", "content": [*blocks, call]}, timestamp=self.tick()
        )
        self.sess.append_tool_result(call_id, output, tool_name="read", timestamp=self.tick())
        return seq


def new_agent(store: CompactStore, sid: str, **config: Any) -> Agent:
    sess = store.session(sid, format="anthropic", config=plain(**config), now=T0)
    agent = Agent(sess)
    agent.user("Port the parser to the new API")
    return agent


def sent_thinking(view: Sequence[Mapping[str, Any]]) -> list[str]:
    """Signatures (or data) of the thinking blocks a view sends, in order."""
    return [
        block.get("signature", block.get("data"))
        for message in view
        if message["role"] == "assistant"
        for block in message["content"]
        if block["type"] in ("thinking", "redacted_thinking")
    ]


def thinking_cost(view: Sequence[Mapping[str, Any]]) -> int:
    """What the store's estimate charges for the thinking a view sends: per message, its
    thinking text (a redacted block's data) estimated together."""
    total = 0
    for message in view:
        if message["role"] != "assistant":
            continue
        texts = [
            block["thinking"] if block["type"] == "thinking" else block["data"]
            for block in message["content"]
            if block["type"] in ("thinking", "redacted_thinking")
        ]
        if texts:
            total += estimate_tokens("\n".join(texts))
    return total


def check(sess: Session, reopen: Callable[[], CompactStore]) -> list[str]:
    """What a session sends, checked every way it can be read; returns the signatures sent."""
    view = sess.context_view()
    assert list(view) == sess.active_context()
    assert sess.request_params()["messages"] == list(view)
    validate_with_sdk("anthropic", sess.active_context())
    context = sess.context()
    # Usage counts exactly the thinking the wire view sends (plain config: factor 1).
    assert context.raw_tokens == sum(i.tokens for i in context.items) + thinking_cost(view)
    assert sess.token_usage() == context.usage
    fresh = reopen().get_session(sess.id)  # rebuilt from the rows, not the cache
    assert list(fresh.context_view()) == list(view)
    assert fresh.token_usage() == sess.token_usage()
    # The log and context().items keep every block verbatim.
    logged = sess.messages()
    for item in context.items:
        if item.seq is not None and item.state in ("original", "pinned"):
            assert item.message == logged[item.seq]
    return sent_thinking(view)


def signatures(*numbers: int) -> list[str]:
    return [f"{SIGNATURE}{n}" for n in numbers]


def test_thinking_is_sent_verbatim_while_nothing_before_it_changed(
    store: CompactStore, reopen: Callable[[], CompactStore]
) -> None:
    agent = new_agent(store, "kept")
    for _ in range(4):
        agent.turn()
    agent.user("Now the tests")
    agent.turn(redacted=True)
    before = agent.sess.token_usage()
    assert check(agent.sess, reopen) == [*signatures(1, 2, 3, 4, 5), REDACTED["data"]]
    # The thinking is counted: the same conversation without it costs less by exactly that.
    assert agent.sess.context().thinking_tokens == thinking_cost(agent.sess.context_view()) > 0
    assert before - agent.sess.context().thinking_tokens == sum(
        item.tokens for item in agent.sess.context().items
    )


@pytest.mark.slow_on_postgres
def test_from_the_first_block_after_a_placeholder_thinking_is_left_out(
    store: CompactStore, reopen: Callable[[], CompactStore]
) -> None:
    # No model: "auto" resolves to rewrite, the policy that edits sent messages in place.
    agent = new_agent(store, "placeholders", microcompact_keep_recent=3)
    assert agent.sess.edit_policy() == ("rewrite", False)
    seqs = [agent.turn() for _ in range(6)]
    agent.user("Carry on")
    result = agent.sess.process_request(now=T0 + HOUR, enable_auto_compact=False)
    assert result is not None and result.strategy == "microcompact"
    # Results of turns 1-3 became placeholders: turn 1's prefix is unchanged, turn 2's is not,
    # and from there every later block is left out.
    assert check(agent.sess, reopen) == signatures(1)
    # The log keeps every block.
    logged = agent.sess.messages()
    assert [logged[seq]["content"][0]["signature"] for seq in seqs] == signatures(1, 2, 3, 4, 5, 6)
    # A turn after the change is sent while the request continues it...
    agent.turn()
    assert check(agent.sess, reopen) == signatures(1, 7)
    # ... and left out once a user message ends it: under rewrite the next edit in place
    # before it would cut it again, so it is not sent (nor counted) at all.
    agent.user("And the docs")
    assert check(agent.sess, reopen) == signatures(1)


@pytest.mark.slow_on_postgres
def test_the_thinking_rule_follows_the_edit_policy(
    store: CompactStore, reopen: Callable[[], CompactStore]
) -> None:
    """The same rows under each policy: append_only keeps the thinking of a turn made after
    a change (the bytes sent stay, the cache stays warm); rewrite leaves it out, a wire
    cheaper by exactly that thinking -- but on a model that checks thinking prefixes (its API
    keeps every block sent in the prompt and the cache), where it keeps it too."""
    agent = new_agent(store, "policy", microcompact_keep_recent=3)
    for _ in range(4):
        agent.turn()
    agent.user("Carry on")
    result = agent.sess.process_request(now=T0 + HOUR, enable_auto_compact=False)
    assert result is not None and result.strategy == "microcompact"
    agent.turn()
    agent.user("And the docs")
    agent.turn()  # turn 6: the loop goes on
    rewrite = agent.sess.context()
    assert rewrite.edit_policy == "rewrite"
    assert check(agent.sess, reopen) == signatures(1, 6)
    appended = store.session(
        "policy", config=plain(microcompact_keep_recent=3, edit_policy="append_only")
    )
    assert appended.edit_policy() == ("append_only", False)
    assert check(appended, reopen) == signatures(1, 5, 6)
    five = thinking_cost([{"role": "assistant", "content": [thinking(5)]}])
    assert appended.context().thinking_tokens - rewrite.thinking_tokens == five > 0
    assert appended.token_usage() - rewrite.usage == five
    # A model that checks prefixes resolves "auto" to append_only, whichever handle asks.
    checked = store.session("policy", config=plain(microcompact_keep_recent=3), model=NEW)
    assert checked.edit_policy() == ("append_only", True)
    assert check(checked, reopen) == signatures(1, 5, 6)
    assert check(agent.sess, reopen) == signatures(1, 5, 6)
    forced = store.session(
        "policy", config=plain(microcompact_keep_recent=3, edit_policy="rewrite"), model=NEW
    )
    assert forced.edit_policy() == ("rewrite", True)
    assert check(forced, reopen) == signatures(1, 5, 6)
    assert (forced.context().edit_policy, forced.context().prefix_checks) == ("rewrite", True)


@pytest.mark.slow_on_postgres
def test_a_block_made_while_an_earlier_one_of_its_turn_was_sent_anyway_is_left_out_with_it(
    store: CompactStore, reopen: Callable[[], CompactStore]
) -> None:
    agent = new_agent(store, "loop", microcompact_keep_recent=1)
    agent.turn()
    agent.turn()
    result = agent.sess.process_request(now=T0 + HOUR, enable_auto_compact=False)
    assert result is not None and result.strategy == "microcompact"
    # Turn 1's result became a placeholder: block 2's prefix changed, but the tool loop
    # continues, so it is still sent -- and block 3 is made with it before it.
    agent.turn()
    assert check(agent.sess, reopen) == signatures(1, 2, 3)
    # Once a user message ends the loop, block 2 is left out: block 3's prefix is no longer
    # what was sent before it, so it goes too.
    agent.user("Next")
    assert check(agent.sess, reopen) == signatures(1)
    agent.turn()
    agent.user("And then")
    assert check(agent.sess, reopen) == signatures(1)  # rewrite: none after the change
    # Under append_only a turn made after that keeps its own; blocks 2 and 3 stay out.
    appended = store.session(
        "loop", config=plain(microcompact_keep_recent=1, edit_policy="append_only")
    )
    assert check(appended, reopen) == signatures(1, 4)


def test_replay_rebuilds_the_context_under_the_policy_its_compaction_ran_under(
    store: CompactStore,
) -> None:
    agent = new_agent(store, "replayed", microcompact_keep_recent=3)
    for _ in range(4):
        agent.turn()
    agent.user("Carry on")
    agent.sess.process_request(now=T0 + HOUR, enable_auto_compact=False)
    agent.turn()
    agent.user("And the docs")  # turn 5 has ended: under rewrite its thinking is left out
    original = agent.sess.compact(now=T0 + 2 * HOUR)
    assert original.boundary is not None and original.boundary.id is not None
    with store.engine.connect() as connection:
        recorded = connection.execute(
            text("SELECT edit_policy FROM compactions WHERE boundary_id = :b"),
            {"b": original.boundary.id},
        ).scalar_one()
    assert recorded == "rewrite"
    # Later the session runs under append_only, which would send turn 5's thinking: the
    # replay still sees the context the compaction saw.
    store.session("replayed", config=plain(microcompact_keep_recent=3, edit_policy="append_only"))
    replayed = agent.sess.replay(original.boundary.id)
    assert replayed.tokens_before == original.tokens_before
    assert replayed.removed_seqs == original.removed_seqs
    assert replayed.summary_text == original.summary_text


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "policy", "thinking"),
    [
        # auto is rewrite: no thinking of an ended turn from the first changed block on.
        ("claude-sonnet-4-5", "auto", {"type": "enabled", "budget_tokens": 2_000}),
        # Forced to rewrite on a model that checks every thinking prefix: the per-turn rule.
        (NEW, "rewrite", None),
    ],
)
def test_under_rewrite_the_strict_api_accepts_every_request_of_a_long_session(
    tmp_path: Path, model: str, policy: str, thinking: dict[str, Any] | None
) -> None:
    """Edits in place all session long against the strict fake Messages API (signatures,
    the tool-use continuation rule, pairing, and on claude-opus-5-5 the prefix checks)."""
    pytest.importorskip("anthropic")
    from benchmarks.providers import run

    figures = run(
        model=model,
        calls=150,
        config=CompactionConfig(edit_policy=policy),
        db=str(tmp_path / "rewrite.db"),
        thinking=thinking,
    )
    assert figures["api_errors"] == 0, figures
    assert figures["steps_lost"] == figures["thinking_dropped"] == 0
    assert figures["compactions"]["tool_budget/auto"] > 50, figures  # edits in place


def test_a_preview_before_a_message_changes_its_prefix(
    store: CompactStore, reopen: Callable[[], CompactStore]
) -> None:
    agent = new_agent(store, "preview", tool_result_max_chars=1_000)
    agent.turn(output="x" * 5_000)  # over the budget, but not yet previewed
    agent.turn()
    agent.user("Next")
    assert check(agent.sess, reopen) == signatures(1, 2)
    result = agent.sess.process_request(now=T0 + 10, enable_microcompact=False)
    assert result is not None and result.strategy == "tool_budget"
    assert check(agent.sess, reopen) == signatures(1)  # turn 2 answered the whole result


def test_after_a_cut_only_thinking_that_answered_the_cut_context_is_sent(
    store: CompactStore, reopen: Callable[[], CompactStore]
) -> None:
    agent = new_agent(store, "cut")
    for _ in range(4):
        agent.turn()
    agent.user("Summarise and go on")
    last = agent.user("Really")
    agent.sess.compact(up_to_seq=last - 4, now=T0 + 100)  # turns 1-3 are summarised
    assert check(agent.sess, reopen) == []  # turn 4 is kept, after the cut
    # A cut that keeps no thinking message: what is appended next answered the new context.
    agent.sess.compact(up_to_seq=last, now=T0 + 200)
    agent.turn()
    agent.user("Done?")
    assert check(agent.sess, reopen) == signatures(5)


@pytest.mark.slow_on_postgres
def test_the_turn_a_request_continues_keeps_its_thinking(
    store: CompactStore, reopen: Callable[[], CompactStore]
) -> None:
    # The Messages API refuses a tool-use continuation whose last assistant message does
    # not start with its thinking, so a cut during a tool loop leaves that turn's thinking.
    agent = new_agent(store, "loop")
    for _ in range(3):
        agent.turn()
    agent.sess.compact(up_to_seq=2, now=T0 + 100)
    assert check(agent.sess, reopen) == signatures(2, 3)  # one turn: the loop goes on
    agent.turn()
    assert check(agent.sess, reopen) == signatures(2, 3, 4)
    agent.user("Stop here")
    assert check(agent.sess, reopen) == []


@pytest.mark.slow_on_postgres
def test_without_preserved_thinking_only_the_newest_turn_is_sent(
    store: CompactStore, reopen: Callable[[], CompactStore]
) -> None:
    agent = new_agent(store, "newest", preserved_thinking=False)
    agent.turn()
    agent.turn()
    agent.user("Next")
    agent.turn()
    agent.turn()
    assert check(agent.sess, reopen) == signatures(3, 4)
    agent.user("Again")
    assert check(agent.sess, reopen) == signatures(3, 4)  # still the newest assistant turn
    agent.turn()
    assert check(agent.sess, reopen) == signatures(5)
    # The same log with the default sends every block.
    assert check(store.session("newest", config=plain()), reopen) == signatures(1, 2, 3, 4, 5)


def test_a_message_of_thinking_only_is_not_sent_once_its_thinking_is_left_out(
    store: CompactStore, reopen: Callable[[], CompactStore]
) -> None:
    agent = new_agent(store, "only", microcompact_keep_recent=0)
    agent.turn()
    agent.sess.append({"role": "assistant", "content": [thinking(9)]}, timestamp=agent.tick())
    agent.user("Go on")
    agent.sess.process_request(now=T0 + HOUR, enable_auto_compact=False)
    assert check(agent.sess, reopen) == signatures(1)
    assert [m["role"] for m in agent.sess.context_view()] == ["user", "assistant", "user", "user"]
    assert len(agent.sess.context().items) == 5  # the context keeps it, the wire does not


def test_a_rollback_counts_as_a_change(
    store: CompactStore, reopen: Callable[[], CompactStore]
) -> None:
    agent = new_agent(store, "rollback", microcompact_keep_recent=1)
    agent.turn()
    agent.turn()
    agent.user("Next")
    agent.sess.process_request(now=T0 + HOUR, enable_auto_compact=False)
    assert check(agent.sess, reopen) == signatures(1)
    agent.sess.rollback(compaction_id=agent.sess.compactions()[-1].id)
    assert check(agent.sess, reopen) == signatures(1)  # turn 2 answered the placeholder


def test_each_assistant_message_records_the_context_version_it_answered(
    store: CompactStore,
) -> None:
    agent = new_agent(store, "versions", microcompact_keep_recent=0)
    agent.turn()
    agent.sess.process_request(now=T0 + HOUR, enable_auto_compact=False)
    agent.turn()
    with store.engine.connect() as connection:
        rows = connection.execute(
            text(
                "SELECT kind, context_version FROM messages WHERE session_id = 'versions' "
                "ORDER BY seq"
            )
        ).all()
        change = connection.execute(
            text(
                "SELECT changed_after_seq, context_version FROM compactions "
                "WHERE session_id = 'versions'"
            )
        ).all()
    assert [tuple(r) for r in rows] == [
        ("user", None),
        ("assistant", 0),
        ("tool", None),
        ("assistant", 1),
        ("tool", None),
    ]
    assert [tuple(r) for r in change] == [(2, 1)]  # the placeholder at seq 2, version 1


def test_a_summarizer_never_sees_thinking(store: CompactStore) -> None:
    seen: list[Any] = []

    def summarizer(messages: list[Any], previous: str | None, instructions: str | None) -> str:
        seen.extend(messages)
        return "Summary: the parser is half ported."

    sess = store.session("summarised", format="anthropic", summarizer=summarizer, now=T0)
    agent = Agent(sess)
    agent.user("Port the parser")
    agent.turn(redacted=True)
    agent.turn()
    agent.user("Go on")
    result = sess.compact(now=T0 + 100)
    assert result.summary is not None and result.summary.source == "summarizer"
    sent = json.dumps(seen)
    assert "weigh the options" not in sent and SIGNATURE not in sent
    assert REDACTED["data"] not in sent and '"thinking"' not in sent
    assert "[thinking left out]" in sent
    # The log still has every block.
    assert sess.messages()[1]["content"][:2] == [thinking(1), REDACTED]


def test_a_summarizer_never_sees_reasoning_items(store: CompactStore) -> None:
    seen: list[Any] = []

    def summarizer(messages: list[Any], previous: str | None, instructions: str | None) -> str:
        seen.extend(messages)
        return "Summary."

    sess = store.session("reasoning", format="responses", summarizer=summarizer, now=T0)
    sess.append({"type": "message", "role": "user", "content": "Port the parser"})
    reasoning = {
        "type": "reasoning",
        "id": "rs_1",
        "summary": [{"type": "summary_text", "text": "secret plan"}],
        "encrypted_content": "gAAAAB-secret",
    }
    sess.extend(
        [reasoning, {"type": "function_call", "call_id": "c1", "name": "read", "arguments": "{}"}]
    )
    sess.append_tool_result("c1", "ok", tool_name="read")
    sess.append({"type": "message", "role": "user", "content": "Go on"})
    sess.compact(now=T0 + 100)
    sent = json.dumps(seen)
    assert "secret" not in sent and "[thinking left out]" in sent


@pytest.mark.slow
def test_an_import_records_the_version_each_message_answered_at_its_place(
    store: CompactStore, reopen: Callable[[], CompactStore]
) -> None:
    """The transcript's own compactions are recorded compactions: a message after one
    answered the compacted context, so its thinking is sent while nothing changes."""
    call = {"type": "tool_use", "id": "toolu_1", "name": "read", "input": {}}
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}

    def said(n: int, words: str) -> dict[str, Any]:
        return {"role": "assistant", "content": [thinking(n), {"type": "text", "text": words}]}

    items: list[ImportedMessage | ImportedBoundary] = [
        ImportedMessage({"role": "user", "content": "Port the parser"}, T0),
        ImportedMessage({"role": "assistant", "content": [thinking(1), call]}, T0 + 1),
        ImportedMessage({"role": "user", "content": [result]}, T0 + 2),
        ImportedBoundary(first_kept_index=3, summary_text="Read the parser.", timestamp=T0 + 3),
        ImportedMessage(said(2, "Half done."), T0 + 3),
        ImportedMessage({"role": "user", "content": "Go on"}, T0 + 4),
        ImportedMessage(said(3, "Done."), T0 + 5),
        ImportedMessage({"role": "user", "content": "Thanks"}, T0 + 6),
    ]
    sess = store.import_session("imported", items, format="anthropic")
    with store.engine.connect() as connection:
        versions = (
            connection.execute(
                text(
                    "SELECT context_version FROM messages WHERE session_id = 'imported' "
                    "AND kind = 'assistant' ORDER BY seq"
                )
            )
            .scalars()
            .all()
        )
    assert versions == [0, 1, 1]
    assert check(sess, reopen) == signatures(2, 3)
    # A compaction here changes the prefix of both.
    sess.compact(up_to_seq=4, now=T0 + 10)
    assert check(sess, reopen) == []


# -- the migration ----------------------------------------------------------------------------

PREVIOUS = "e5a1c7d93b26"  # the head before assistant messages recorded a context version


def _columns(url: str, table: str) -> set[str]:
    from sqlalchemy import inspect

    engine = create_engine(url if "://" in url else f"sqlite:///{url}")
    try:
        return {column["name"] for column in inspect(engine).get_columns(table)}
    finally:
        engine.dispose()


@pytest.mark.slow_on_postgres
def test_the_migration_goes_down_and_up_and_old_rows_send_their_thinking(db_url: str) -> None:
    with CompactStore.open(db_url) as store:
        agent = new_agent(store, "old", microcompact_keep_recent=0)
        agent.turn()
        agent.turn()
        agent.user("Next")
        store.get_session("old").process_request(now=T0 + HOUR, enable_auto_compact=False)
        assert sent_thinking(agent.sess.context_view()) == signatures(1)
    migrate_to(db_url, PREVIOUS, down=True)
    assert "context_version" not in _columns(db_url, "messages")
    assert not {"changed_after_seq", "context_version", "rolled_back_version"} & _columns(
        db_url, "compactions"
    )
    with CompactStore.open(db_url, auto_migrate=True) as store:  # PostgreSQL: on purpose
        assert current_revision(store.engine) == head_revision()
        sess = store.get_session("old")
        # Rows from before the revision record no version: their thinking is sent as it
        # was before, and usage counts it.
        view = sess.context_view()
        assert sent_thinking(view) == signatures(1, 2)
        context = sess.context()
        assert context.raw_tokens == sum(i.tokens for i in context.items) + thinking_cost(view)
        # New messages record their version again.
        later = Agent(sess)
        later.n = 10
        later.turn()
        assert sess.context().items[-2].context_version is not None


def test_the_config_field_is_a_plain_bool() -> None:
    assert CompactionConfig().preserved_thinking is True
    with pytest.raises(ValueError):
        CompactionConfig(preserved_thinking=wrong("sometimes"))


# -- a property: random loops, every compaction, compared with the prefixes themselves -------

THINKING_EVENTS = st.lists(
    st.one_of(
        st.tuples(st.just("turn"), st.sampled_from([40, 2_000, 6_000])),
        st.tuples(st.just("turn"), st.sampled_from([40, 2_000, 6_000])),
        st.tuples(st.just("user"), st.none()),
        st.tuples(st.just("user"), st.none()),
        # A new task: a user message and a turn (a turn made after a change, then ended).
        st.tuples(st.just("task"), st.sampled_from([40, 2_000])),
        st.tuples(st.just("process"), st.sampled_from([1, 400, 3_600])),
        st.tuples(st.just("compact"), st.none() | st.floats(0, 1)),
        st.tuples(st.just("rollback"), st.none()),
    ),
    min_size=3,
    max_size=24,
)


# A cut that keeps changed thinking, then a task: the two policies send different blocks.
CUT_THEN_TASK = [
    ("turn", 40),
    ("turn", 40),
    ("user", None),
    ("turn", 40),
    ("compact", 0.5),
    ("task", 40),
    ("user", None),
    ("process", 3_600),
    ("task", 2_000),
    ("user", None),
]


@pytest.mark.slow
@settings(max_examples=25, deadline=None, database=None)
@example(events=CUT_THEN_TASK, preserved=True, window=50_000, policy="append_only")
@example(events=CUT_THEN_TASK, preserved=True, window=50_000, policy="rewrite")
@given(
    events=THINKING_EVENTS,
    preserved=st.booleans(),
    window=st.sampled_from([4_000, 50_000]),
    policy=st.sampled_from(["rewrite", "append_only"]),
)
def test_thinking_is_never_sent_after_its_prefix_changed(
    events: list[tuple[str, Any]], preserved: bool, window: int, policy: str
) -> None:
    """The prefix each assistant message answered is kept aside at append; after every step
    a block is sent only if that prefix is still exactly the context before it (or its turn
    is the one a request continues) and the wire before it is what was sent before it then,
    usage counts what is sent, and a fresh handle reads the same. Under append_only every
    block before the first changed one, and every later turn made after the change, is
    sent; under rewrite none from the first changed one on (but the continued turn's)."""
    config = plain(
        preserved_thinking=preserved,
        microcompact_keep_recent=2,
        tool_result_max_chars=3_000,
        edit_policy=policy,
    )
    with scratch_store() as store:
        sess = store.session("p", format="anthropic", config=config, context_window=window, now=T0)
        agent = Agent(sess)
        agent.user("Port the parser")
        answered: dict[int, list[Any]] = {}  # seq -> the context before it, at append
        sent_before: dict[int, list[Any]] = {}  # seq -> the wire view before it, at append
        rolled_back = False
        for kind, arg in events:
            if kind == "turn":
                before = [item.message for item in sess.context().items]
                wire = list(sess.context_view())
                seq = agent.turn(output="x" * arg)
                sent_before[seq] = wire
                answered[seq] = before
            elif kind in ("user", "task"):
                agent.user(f"Next {len(answered)}")
                if kind == "task":
                    before = [item.message for item in sess.context().items]
                    wire = list(sess.context_view())
                    seq = agent.turn(output="x" * arg)
                    sent_before[seq] = wire
                    answered[seq] = before
            elif kind == "process":
                agent.clock += arg
                sess.process_request(now=agent.tick())
            elif kind == "compact":
                seqs = [i.seq for i in sess.context().kept if i.seq is not None]
                if len(seqs) < 2:
                    continue
                up_to = None if arg is None else seqs[min(len(seqs) - 2, int(arg * len(seqs)))]
                sess.compact(up_to_seq=up_to, now=agent.tick())
            else:
                live = [
                    c
                    for c in sess.compactions()
                    if c.id is not None and c.strategy and c.rolled_back_at is None
                ]
                if not live:
                    continue
                sess.rollback(compaction_id=live[-1].id)
                rolled_back = True
            context = sess.context()
            items = context.items
            view = sess.context_view()
            assert context.raw_tokens == sum(i.tokens for i in items) + thinking_cost(view)
            fresh = store.get_session("p")
            store.cache.drop("p")  # read from the rows, as another process would
            assert list(fresh.context_view()) == list(view)
            assert fresh.token_usage() == sess.token_usage()
            thinking_at = [i for i, item in enumerate(items) if item.thinking_tokens is not None]
            sent = [i for i in thinking_at if context.sends_thinking(i)]
            assert sent_thinking(view) == [
                items[i].message["content"][0]["signature"] for i in sent
            ]
            turn = context._turn
            continued = (
                set()
                if not turn.continuing or turn.start is None
                else set(range(turn.start, len(items)))
            )
            unchanged = [
                i
                for i in thinking_at
                if [item.message for item in items[:i]] == answered.get(items[i].seq or -1)
            ]
            # Never sent after its prefix changed, unless its turn is being continued.
            assert set(sent) - continued <= set(unchanged)
            if not preserved:  # the newest assistant turn's only
                newest = len(items) if turn.start is None else turn.start
                assert all(i >= newest for i in sent)
                continue
            # What the provider checks: the wire before each block sent is what was sent
            # before it when it was made (but the continued turn's).
            for i in sent:
                if i not in continued:
                    assert list(view[:i]) == sent_before[items[i].seq or -1]
            first = next((i for i in thinking_at if i not in unchanged), len(items))
            if policy == "rewrite":  # none from the first changed block on
                assert all(i < first for i in set(sent) - continued)
            if rolled_back:
                continue  # a rollback is a change even where it restored the same bytes
            # Exactly: every block before the first changed one is sent; under append_only
            # also every later one that no changed block of its own turn comes before.
            assert [i for i in thinking_at if i < first] == [i for i in sent if i < first]
            if policy == "append_only":
                whole = [
                    i
                    for i in thinking_at
                    if all(j in unchanged for j in thinking_at if turn_start(items, i) <= j <= i)
                ]
                assert set(sent) - continued == set(whole) - continued


def turn_start(items: Sequence[Any], index: int) -> int:
    """Index of the first message of the assistant turn ``items[index]`` belongs to."""
    while index > 0 and items[index - 1].kind in ("assistant", "tool"):
        index -= 1
    return index


def test_a_reasoning_item_the_wire_view_leaves_out_is_not_counted(
    store: CompactStore, reopen: Callable[[], CompactStore]
) -> None:
    """responses without stored responses: a reasoning item with no
    encrypted_content is not sent, so usage does not count it either."""
    sess = store.session("plain-reasoning", format="responses", config=plain(), now=T0)
    sess.append({"type": "message", "role": "user", "content": "Port the parser"})
    bare = {
        "type": "reasoning",
        "id": "rs_1",
        "summary": [{"type": "summary_text", "text": "a " * 400}],
    }
    sealed = {**bare, "id": "rs_2", "encrypted_content": "gAAAA" * 40}
    call = {"type": "function_call", "call_id": "c1", "name": "read", "arguments": "{}"}
    sess.extend([bare, call])
    sess.append_tool_result("c1", "ok", tool_name="read")
    sess.extend([sealed, {**call, "call_id": "c2"}])
    sess.append_tool_result("c2", "ok", tool_name="read")
    context = sess.context()
    sent = [item for item in context.items if item.message.get("id") != "rs_1"]
    assert [m.get("id") for m in sess.context_view() if m.get("type") == "reasoning"] == ["rs_2"]
    assert context.raw_tokens == sum(item.tokens for item in sent)
    assert reopen().get_session(sess.id).token_usage() == sess.token_usage()
    kept = store.session("plain-reasoning", config=plain(responses_store=True))
    assert kept.context().raw_tokens == sum(item.tokens for item in kept.context().items)
