"""Active-context reconstruction and read dedup.

There is no compaction pipeline to call here: boundaries, compactions and message edits are
written as rows with SQLAlchemy Core in one transaction, exactly as the pipeline records
them, and the context is rebuilt from those rows alone.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import Connection, Table, insert, update
from sqlalchemy.types import Boolean, Float, Integer, String, Text

from compactstore import CompactionConfig, CompactStore, Session, estimate_tokens
from compactstore.db.schema import compact_boundaries, compactions, message_edits, sessions
from compactstore.formats.sdk_types import SDK_FORMATS, check_sdk_types
from tests.conftest import Snapshot, module_database
from tests.helpers import assistant, call_message, per_seq, result_message, user

FORMATS = ["anthropic", "openai", "minicode"]
Message = dict[str, Any]
_ids = itertools.count()


def unique(name: str) -> str:
    """A session id no other test in this module uses (they share one database)."""
    return f"{name}-{next(_ids)}"


# -- one database per backend for the module --------------------------------------------------
# Every test works in sessions of its own, so they can share a database: it saves creating
# a PostgreSQL database per test, and shows that sessions do not see each other's rows.


database = module_database("context")


@pytest.fixture
def store(database: str) -> Iterator[CompactStore]:
    with CompactStore.open(database) as opened:
        yield opened


@pytest.fixture
def reopen(database: str) -> Iterator[Callable[[], CompactStore]]:
    """Open the database again, as a new process would (fresh engine, no cached context)."""
    opened: list[CompactStore] = []

    def _open() -> CompactStore:
        opened.append(CompactStore.open(database))
        return opened[-1]

    yield _open
    for item in opened:
        item.close()


CLEARED = "[Old tool result content cleared by time-based microcompact]"


# -- messages in each format ----------------------------------------------------------------


def result_text(fmt: str, message: Message) -> str:
    """The text of the single tool result a message carries."""
    if fmt == "anthropic":
        (block,) = message["content"]
        assert block["type"] == "tool_result"
        return str(block["content"])
    assert message["role"] == ("tool" if fmt == "openai" else "tool_result")
    return str(message["content"])


def result_ids(fmt: str, message: Message) -> list[str]:
    """Tool-use ids answered by a message (independent of the library's adapters)."""
    if fmt == "anthropic":
        content = message["content"] if message["role"] == "user" else []
        if not isinstance(content, list):
            return []
        return [b["tool_use_id"] for b in content if b.get("type") == "tool_result"]
    if fmt == "openai":
        return [message["tool_call_id"]] if message["role"] == "tool" else []
    return [message["toolUseId"]] if message["role"] == "tool_result" else []


def call_ids(fmt: str, message: Message) -> list[str]:
    if message["role"] != "assistant":
        return []
    if fmt == "openai":
        return [call["id"] for call in message.get("tool_calls") or []]
    content = message["content"]
    if not isinstance(content, list):
        return []
    return [block["id"] for block in content if block.get("type") == "tool_use"]


def assert_the_api_accepts(fmt: str, context: list[Message]) -> None:
    """The SDK's request types take it, and every call is answered right after its message."""
    if fmt in SDK_FORMATS:
        check_sdk_types(fmt, context)
    for index, message in enumerate(context[:-1]):
        pending = set(call_ids(fmt, message))
        following = context[index + 1 :]
        while pending and following and result_ids(fmt, following[0]):
            pending -= set(result_ids(fmt, following[0]))
            following = following[1:]
        assert not pending, f"calls {sorted(pending)} of message {index} are not answered next"


# -- writing the rows a compaction would write ----------------------------------------------

_NEUTRAL = {Text: "{}", String: "", Integer: 0, Float: 0.0, Boolean: False}


def _row(table: Table, values: dict[str, Any]) -> dict[str, Any]:
    """Values for an insert: the given ones, plus a neutral value for any other NOT NULL
    column without a default (columns the schema may grow that these tests do not need)."""
    out = dict(values)
    for column in table.columns:
        if column.name in out or column.nullable or column.server_default is not None:
            continue
        if column.primary_key and column.autoincrement is not False:
            continue
        out[column.name] = next(v for t, v in _NEUTRAL.items() if isinstance(column.type, t))
    return out


def _touch(connection: Connection, sess: Session) -> None:
    """Bump the session's version counters, as every compaction and rollback does, so
    processes holding a cached context know to rebuild it from the rows."""
    counters = [name for name in ("version", "context_version") if name in sessions.c]
    connection.execute(
        update(sessions)
        .where(sessions.c.id == sess.id)
        .values({name: sessions.c[name] + 1 for name in counters})
    )


def record_compaction(
    connection: Connection, sess: Session, *, boundary_id: int | None = None, now: float = 1e6
) -> int:
    values = {
        "session_id": sess.id,
        "trigger": "auto",
        "strategy": "full" if boundary_id is not None else "microcompact",
        "success": True,
        "tokens_before": 1_000,
        "tokens_after": 400,
        "tokens_freed": 600,
        "summary_text": "",
        "boundary_id": boundary_id,
        "created_at": now,
        "steps": "[]",
        "config": CompactionConfig().model_dump_json(),
        "removed_seqs": "[]",
        "cleared_tool_calls": "[]",
        "blob_ids": "[]",
    }
    result = connection.execute(
        insert(compactions).values(**_row(compactions, values)).returning(compactions.c.id)
    )
    _touch(connection, sess)
    return int(result.scalar_one())


def record_boundary(
    sess: Session,
    *,
    first_kept_seq: int,
    summary: str,
    parent_id: int | None = None,
    now: float = 1e6,
) -> tuple[int, int]:
    """A boundary row and its compactions row, in one transaction. Returns both ids."""
    with sess.store.engine.begin() as connection:
        values = {
            "session_id": sess.id,
            "trigger": "auto",
            "strategy": "full",
            "created_at": now,
            "tokens_before": 1_000,
            "tokens_after": 400,
            "messages_removed": first_kept_seq,
            "first_kept_seq": first_kept_seq,
            "last_kept_seq": len(sess.messages()) - 1,
            "summary_text": summary,
            "summary_message": json.dumps(sess.adapter.summary_message(summary)),
            "summary_tokens": estimate_tokens(summary),
            "parent_id": parent_id,
        }
        boundary_id = int(
            connection.execute(
                insert(compact_boundaries)
                .values(**_row(compact_boundaries, values))
                .returning(compact_boundaries.c.id)
            ).scalar_one()
        )
        compaction_id = record_compaction(connection, sess, boundary_id=boundary_id, now=now)
    return boundary_id, compaction_id


def record_edit(sess: Session, seq: int, kind: str, replacement: str) -> int:
    """A compaction that gave the tool result at ``seq`` new content. Returns its id."""
    original = sess.messages()[seq]
    ids = result_ids(sess.format, original)
    payload = sess.adapter.replace_tool_results(original, dict.fromkeys(ids, replacement))
    with sess.store.engine.begin() as connection:
        compaction_id = record_compaction(connection, sess)
        connection.execute(
            insert(message_edits).values(
                **_row(
                    message_edits,
                    {
                        "session_id": sess.id,
                        "seq": seq,
                        "compaction_id": compaction_id,
                        "kind": kind,
                        "tool_use_ids": json.dumps(ids),
                        "payload": json.dumps(payload),
                        "tokens": estimate_tokens(replacement),
                    },
                )
            )
        )
    return compaction_id


def roll_back(sess: Session, table: Table, row_id: int, now: float = 2e6) -> None:
    with sess.store.engine.begin() as connection:
        connection.execute(update(table).where(table.c.id == row_id).values(rolled_back_at=now))
        _touch(connection, sess)


def conversation(store: CompactStore, fmt: str, session_id: str | None = None) -> Session:
    """A conversation with every kind of pin and two answered tool calls.

    openai / minicode seqs: 0 system, 1 first request, 2 call c1, 3 result c1, 4 text,
    5 pinned note, 6 call c2, 7 result c2, 8 user, 9 answer, 10 pinned note, 11 answer.
    anthropic has no system message, so every seq is one lower.
    """
    sess = store.session(unique(session_id or f"ctx-{fmt}"), format=fmt, now=0.0)
    if fmt != "anthropic":
        sess.append({"role": "system", "content": "You are a coding agent."})
    sess.append(user("Fix the login bug in auth.py"))
    sess.append(call_message(fmt, "c1"))
    sess.append(result_message(fmt, "c1", "def login(): ...\n" * 20))
    sess.append(assistant("Found it."))
    sess.append(user("Never touch the tests."), pinned=True)
    sess.append(call_message(fmt, "c2"))
    sess.append(result_message(fmt, "c2", "def test_login(): ...\n" * 20))
    sess.append(user("Go on."))
    sess.append(assistant("Patched auth.py."))
    sess.append(user("Also: Python 3.11 only."), pinned=True)
    sess.append(assistant("Noted."))
    return sess


def pins_of(sess: Session) -> list[int]:
    """Seqs the contract pins: leading system messages, the first request, pinned=True."""
    return [0, 1, 5] if sess.format != "anthropic" else [0, 4]


# -- boundaries -----------------------------------------------------------------------------


def test_without_a_boundary_the_active_context_is_the_whole_log(store: CompactStore) -> None:
    for fmt in FORMATS:
        sess = conversation(store, fmt)
        assert per_seq(sess) == sess.messages()
        assert sess.context().boundary is None
        assert_the_api_accepts(fmt, sess.active_context())


@pytest.mark.slow_on_postgres
def test_a_boundary_keeps_pins_then_the_summary_then_the_tail(
    store: CompactStore, reopen: Callable[[], CompactStore]
) -> None:
    for fmt in FORMATS:
        sess = conversation(store, fmt)
        log = sess.messages()
        first_kept = 6 if fmt != "anthropic" else 5  # the call c2 and everything after it
        summary = f"## Summary of {fmt}\nThe user asked to fix the login bug."
        boundary_id, _ = record_boundary(sess, first_kept_seq=first_kept, summary=summary)

        pinned_before = [seq for seq in pins_of(sess) if seq < first_kept]
        expected = [
            *(log[seq] for seq in pinned_before),
            sess.adapter.summary_message(summary),
            *log[first_kept:],
        ]
        assert per_seq(sess) == expected, fmt
        # Rebuilt from rows alone: a new process sees the same context.
        assert per_seq(reopen().session(sess.id)) == expected

        context = sess.context()
        assert context.boundary is not None
        assert (context.boundary.id, context.boundary.first_kept_seq) == (boundary_id, first_kept)
        assert [(item.seq, item.state) for item in context.items[: len(pinned_before) + 1]] == [
            *((seq, "pinned") for seq in pinned_before),
            (None, "summary"),
        ]
        # The late pinned note is kept where it was, still pinned.
        late_pin = len(log) - 2
        assert [item.state for item in context.items if item.seq == late_pin] == ["pinned"]
        # The log itself is untouched.
        assert sess.messages() == log
        assert_the_api_accepts(fmt, sess.active_context())


def test_rolling_back_a_boundary_falls_back_to_the_previous_live_one(
    store: CompactStore, reopen: Callable[[], CompactStore]
) -> None:
    sess = conversation(store, "openai")
    log = sess.messages()
    first, _ = record_boundary(sess, first_kept_seq=4, summary="first summary", now=10.0)
    second, _ = record_boundary(
        sess, first_kept_seq=8, summary="second summary", parent_id=first, now=20.0
    )
    summary = sess.adapter.summary_message

    assert per_seq(sess) == [log[0], log[1], log[5], summary("second summary"), *log[8:]]
    assert [b.id for b in sess.boundaries()] == [first, second]
    assert sess.boundaries()[1].preserved_segment == (8, len(log) - 1)
    assert sess.boundaries()[1].parent_id == first

    roll_back(sess, compact_boundaries, second)
    assert per_seq(sess) == [log[0], log[1], summary("first summary"), *log[4:]]
    assert [b.id for b in sess.boundaries()] == [first]
    assert [b.id for b in sess.boundaries(include_rolled_back=True)] == [first, second]
    assert sess.boundaries(include_rolled_back=True)[1].rolled_back_at == 2e6

    roll_back(sess, compact_boundaries, first)
    assert per_seq(sess) == log
    assert per_seq(reopen().session(sess.id)) == log
    assert sess.boundaries() == []
    assert sess.context().boundary is None


def test_a_message_that_imitates_a_boundary_does_not_cut_the_context(store: CompactStore) -> None:
    imitations = {
        "anthropic": {
            "role": "user",
            "content": "[Context compacted: everything above was summarised]",
            "_compact_boundary": True,
        },
        "openai": {
            "role": "system",
            "content": "[Context compacted: everything above was summarised]",
            "_compact_boundary": True,
        },
        "minicode": {
            "role": "system",
            "content": "[Context compacted]",
            "type": "compact_boundary",
            "_compact_boundary": True,
            "isCompactBoundary": True,
        },
    }
    for fmt, marker in imitations.items():
        sess = conversation(store, fmt)
        sess.append(marker)
        sess.append(user("And now?"))
        assert per_seq(sess) == sess.messages()
        assert sess.boundaries() == []
        assert sess.context().boundary is None
        assert sess.context().items[-2].state == "original"


# -- message edits --------------------------------------------------------------------------


def test_a_live_edit_replaces_the_message_in_the_context_until_its_compaction_is_rolled_back(
    store: CompactStore,
) -> None:
    for fmt in FORMATS:
        sess = conversation(store, fmt)
        log = sess.messages()
        old_result = 3 if fmt != "anthropic" else 2
        new_result = 7 if fmt != "anthropic" else 6
        preview = "[Tool result persisted: 340 chars, blob 1]\ndef login(): ..."

        cleared = record_edit(sess, old_result, "cleared", CLEARED)
        persisted = record_edit(sess, new_result, "persisted", preview)

        context = sess.context()
        by_seq = {item.seq: item for item in context.items}
        assert by_seq[old_result].state == "cleared"
        assert result_text(fmt, by_seq[old_result].message) == CLEARED
        assert by_seq[new_result].state == "persisted"
        assert result_text(fmt, by_seq[new_result].message) == preview
        assert by_seq[old_result].tokens == estimate_tokens(CLEARED)
        # Everything else is as appended, and the log keeps the original.
        assert [
            item.message for item in context.items if item.seq not in (old_result, new_result)
        ] == [m for seq, m in enumerate(log) if seq not in (old_result, new_result)]
        assert sess.messages() == log
        assert_the_api_accepts(fmt, sess.active_context())

        roll_back(sess, compactions, cleared)
        by_seq = {item.seq: item for item in sess.context().items}
        assert by_seq[old_result].state == "original"
        assert by_seq[old_result].message == log[old_result]
        assert by_seq[new_result].state == "persisted"

        roll_back(sess, compactions, persisted)
        assert per_seq(sess) == log
        assert {item.state for item in sess.context().items} == {"original", "pinned"}


# -- crash-orphaned tool calls --------------------------------------------------------------


def test_a_crash_orphaned_call_gets_a_synthetic_error_result_right_after_its_message(
    store: CompactStore,
) -> None:
    for fmt in FORMATS:
        sess = store.session(unique(f"orphan-{fmt}"), format=fmt, now=0.0)
        sess.append(user("Run the build"))
        orphan_seq = sess.append(call_message(fmt, "o1", "o2"))  # the agent crashed here
        sess.append(user("Hello? Still there?"))
        sess.append(call_message(fmt, "p1"))  # the newest message: p1 may still be running
        log = sess.messages()

        context = sess.context()
        states = [(item.seq, item.state) for item in context.items]
        synthetic = [item.message for item in context.items if item.state == "synthetic"]
        # anthropic answers both calls in one user message; the others one message per call.
        expected_count = 1 if fmt == "anthropic" else 2
        assert states == [
            (0, "pinned"),
            (orphan_seq, "original"),
            *[(None, "synthetic")] * expected_count,
            (2, "original"),
            (3, "original"),
        ], fmt
        assert [i for m in synthetic for i in result_ids(fmt, m)] == ["o1", "o2"]
        for message in synthetic:
            blocks = message["content"] if fmt == "anthropic" else [message]
            for block in blocks:
                assert block.get("is_error", block.get("isError", True)) is True
                assert "interrupted" in block["content"]
        # Synthetic results are not messages: the log is unchanged and p1 stays pending.
        assert sess.messages() == log
        assert "p1" not in [i for m in sess.active_context() for i in result_ids(fmt, m)]
        assert_the_api_accepts(fmt, sess.active_context())
        # When the real result of the newest call arrives, the context is complete.
        sess.append_tool_result("p1", "build ok", tool_name="read_file")
        assert_the_api_accepts(fmt, sess.active_context())


def test_the_newest_messages_pending_calls_are_left_as_they_are(store: CompactStore) -> None:
    for fmt in FORMATS:
        sess = store.session(unique(f"pending-{fmt}"), format=fmt, now=0.0)
        sess.append(user("Read two files"))
        sess.append(call_message(fmt, "a1", "a2"))
        assert per_seq(sess) == sess.messages()
        assert {item.state for item in sess.context().items} == {"pinned", "original"}


def test_the_newest_assistant_messages_pending_calls_stay_pending_while_results_arrive(
    store: CompactStore,
) -> None:
    for fmt in FORMATS:
        sess = store.session(unique(f"partial-{fmt}"), format=fmt, now=0.0)
        sess.append(user("Read two files"))
        sess.append(call_message(fmt, "a1", "a2"))
        sess.append_tool_result("a1", "first file", tool_name="read_file")
        # a2 is still running: nothing was interrupted.
        assert [item.state for item in sess.context().items] == ["pinned", "original", "original"]
        assert per_seq(sess) == sess.messages()


def test_a_result_that_arrives_after_the_conversation_moved_on_is_refused(
    store: CompactStore, db_snapshot: Snapshot
) -> None:
    from compactstore import InvalidMessageError

    for fmt in FORMATS:
        sess = store.session(unique(f"late-{fmt}"), format=fmt, now=0.0)
        sess.append(user("Run the build"))
        sess.append(call_message(fmt, "b1"))
        sess.append(user("Hello? Still there?"))
        before = db_snapshot(store)
        with pytest.raises(InvalidMessageError, match="moved on past its call"):
            sess.append_tool_result("b1", "build ok (late)", tool_name="read_file")
        assert db_snapshot(store) == before
        # The call was answered as interrupted, so the context stays valid.
        assert_the_api_accepts(fmt, sess.active_context())


# -- read dedup -----------------------------------------------------------------


class Reader:
    """An agent that reads files through tool calls, in one session."""

    def __init__(self, sess: Session) -> None:
        self.sess = sess
        self.calls = 0

    def read(self, path: str, content: str, *, is_error: bool = False) -> tuple[int, Message]:
        self.calls += 1
        call_id = f"r{self.calls}"
        self.sess.append(call_message(self.sess.format, call_id))
        seq = self.sess.append_tool_result(
            call_id, content, tool_name="read_file", file_path=path, is_error=is_error
        )
        return seq, self.sess.messages()[seq]

    def state(self, seq: int) -> str:
        return next(item.state for item in self.sess.context().items if item.seq == seq)

    def text(self, message: Message) -> str:
        return result_text(self.sess.format, message)


def reader(store: CompactStore, fmt: str, name: str, **config: Any) -> Reader:
    sess = store.session(
        unique(f"{name}-{fmt}"), format=fmt, config=CompactionConfig(**config), now=0.0
    )
    sess.append(user("Look at the code"))
    return Reader(sess)


BODY = "import os\n\ndef main():\n    return os.getcwd()\n" * 5


def test_an_unchanged_re_read_becomes_a_stub_naming_the_path_and_the_earlier_seq(
    store: CompactStore,
) -> None:
    for fmt in FORMATS:
        agent = reader(store, fmt, "dedup")
        first, message = agent.read("src/app.py", BODY)
        assert agent.text(message) == BODY
        assert agent.state(first) == "original"

        second, stub = agent.read("src/app.py", BODY)
        text = agent.text(stub)
        assert text != BODY
        assert "src/app.py" in text
        assert f"seq {first}" in text
        assert len(text) < len(BODY)
        assert agent.state(second) == "deduplicated"
        # The stub is what was stored: a new process sees the same thing.
        assert stub in agent.sess.active_context()

        # A third identical read still points at the message that holds the content.
        third, again = agent.read("src/app.py", BODY)
        assert f"seq {first}" in agent.text(again)
        assert agent.state(third) == "deduplicated"
        assert_the_api_accepts(fmt, agent.sess.active_context())


@pytest.mark.slow_on_postgres
def test_a_changed_file_other_paths_and_invalidate_read_in_full(store: CompactStore) -> None:
    for fmt in FORMATS:
        agent = reader(store, fmt, "fresh")
        agent.read("a.py", BODY)

        changed_seq, changed = agent.read("a.py", BODY + "# edited\n")
        assert agent.text(changed) == BODY + "# edited\n"
        assert agent.state(changed_seq) == "original"
        # The changed read is the new reference.
        _, stub = agent.read("a.py", BODY + "# edited\n")
        assert f"seq {changed_seq}" in agent.text(stub)

        _, other = agent.read("b.py", BODY + "# edited\n")
        assert agent.text(other) == BODY + "# edited\n"

        assert agent.sess.invalidate("a.py") is True
        assert agent.sess.invalidate("a.py") is False
        assert agent.sess.invalidate("never-read.py") is False
        after_seq, after = agent.read("a.py", BODY + "# edited\n")
        assert agent.text(after) == BODY + "# edited\n"
        assert agent.state(after_seq) == "original"


def test_error_results_are_never_deduplicated(store: CompactStore) -> None:
    for fmt in FORMATS:
        agent = reader(store, fmt, "errors")
        error = "ENOENT: no such file or directory"
        _, first = agent.read("gone.py", error, is_error=True)
        second_seq, second = agent.read("gone.py", error, is_error=True)
        assert error in agent.text(first)
        assert error in agent.text(second)
        assert agent.state(second_seq) == "original"

        # An error result does not replace the reference of a good read either.
        good_seq, _ = agent.read("app.py", BODY)
        agent.read("app.py", BODY, is_error=True)
        _, stub = agent.read("app.py", BODY)
        assert f"seq {good_seq}" in agent.text(stub)


def test_read_dedup_can_be_switched_off(store: CompactStore) -> None:
    agent = reader(store, "minicode", "off", read_dedup_enabled=False)
    agent.read("app.py", BODY)
    seq, again = agent.read("app.py", BODY)
    assert agent.text(again) == BODY
    assert agent.state(seq) == "original"


def test_a_read_whose_earlier_content_was_cleared_goes_through_and_becomes_the_reference(
    store: CompactStore,
) -> None:
    for fmt in FORMATS:
        agent = reader(store, fmt, "cleared")
        first, _ = agent.read("app.py", BODY)
        record_edit(agent.sess, first, "cleared", CLEARED)
        assert agent.state(first) == "cleared"

        second, full = agent.read("app.py", BODY)
        assert agent.text(full) == BODY
        assert agent.state(second) == "original"
        _, stub = agent.read("app.py", BODY)
        assert f"seq {second}" in agent.text(stub)


@pytest.mark.slow_on_postgres
def test_a_read_whose_earlier_content_was_summarised_away_goes_through(
    store: CompactStore,
) -> None:
    for fmt in FORMATS:
        agent = reader(store, fmt, "summarised")
        first, _ = agent.read("app.py", BODY)
        agent.sess.append(assistant("Read it."))
        record_boundary(agent.sess, first_kept_seq=first + 1, summary="Read app.py earlier.")
        assert first not in [item.seq for item in agent.sess.context().items]

        second, full = agent.read("app.py", BODY)
        assert agent.text(full) == BODY
        assert agent.state(second) == "original"
        _, stub = agent.read("app.py", BODY)
        assert f"seq {second}" in agent.text(stub)
        assert_the_api_accepts(fmt, agent.sess.active_context())
