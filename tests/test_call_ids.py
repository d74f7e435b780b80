"""Tool calls keyed by (id, call seq).

In ``openai`` and ``responses`` an id may be used again once its earlier call is answered (a
real SWE-agent trajectory does); ``anthropic`` refuses a repeated ``tool_use`` id. A result
pairs with the newest unanswered call of its id; every rule that pairs calls and results —
append and importers, the cuts of the engines, the wire view, "what was lost" — keys calls by
(id, call seq).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from compactstore import CompactionConfig, CompactStore, InvalidMessageError
from compactstore._context.pairs import legal_cuts, match_pairs
from compactstore._importers import import_file, read_transcript
from compactstore.db.migrate import alembic_config, current_revision, head_revision
from tests.conftest import CORPUS_DEV, Snapshot, module_database
from tests.helpers import (
    call_message,
    migrate_to,
    pair_problems,
    result_message,
    validate_with_sdk,
)

Message = dict[str, Any]

database = module_database("call_ids")

SWE_AGENT = CORPUS_DEV / "swe-agent" / "sweagent-marshmallow-1867-function_calling.traj"


@pytest.fixture
def store(database: str) -> Iterator[CompactStore]:
    with CompactStore.open(database) as opened:
        yield opened


def fn_call(call_id: str, path: str = "a.py") -> Message:
    return {
        "type": "function_call",
        "call_id": call_id,
        "name": "read_file",
        "arguments": f'{{"path": "{path}"}}',
    }


def fn_output(call_id: str, output: str) -> Message:
    return {"type": "function_call_output", "call_id": call_id, "output": output}


def _reuse(fmt: str) -> list[Message]:
    """A request, then the same call id used by two calls, each answered."""
    if fmt == "responses":
        return [
            {"role": "user", "content": "read a.py twice"},
            fn_call("call_1", "a.py"),
            fn_output("call_1", "first read"),
            fn_call("call_1", "b.py"),
            fn_output("call_1", "second read"),
        ]
    return [
        {"role": "user", "content": "read a.py twice"},
        call_message(fmt, "call_1"),
        result_message(fmt, "call_1", "first read"),
        call_message(fmt, "call_1", name="grep"),
        result_message(fmt, "call_1", "second read"),
    ]


def _call_rows(store: CompactStore, sid: str) -> list[tuple[Any, ...]]:
    with store.engine.connect() as connection:
        return [
            tuple(row)
            for row in connection.execute(
                text(
                    "SELECT tool_use_id, call_seq, result_seq FROM tool_calls "
                    "WHERE session_id = :sid ORDER BY call_seq"
                ),
                {"sid": sid},
            )
        ]


@pytest.mark.parametrize("fmt", ["openai", "responses"])
def test_an_id_is_used_again_once_its_call_is_answered(
    store: CompactStore, sid: str, fmt: str
) -> None:
    sess = store.session(sid, format=fmt)
    assert sess.extend(_reuse(fmt)) == [0, 1, 2, 3, 4]
    # Each result answered the newest unanswered call of its id.
    assert _call_rows(store, sid) == [("call_1", 1, 2), ("call_1", 3, 4)]
    context = sess.active_context()
    assert context == _reuse(fmt)
    validate_with_sdk(fmt, context)
    if fmt == "openai":
        assert pair_problems(fmt, context) == []
    # One at a time through the live API too, and append_tool_result pairs with the newest.
    again = store.session(f"{sid}-live", format=fmt)
    for message in _reuse(fmt)[:-1]:
        again.append(message)
    again.append_tool_result("call_1", "second read", tool_name="grep")
    assert _call_rows(store, f"{sid}-live") == [("call_1", 1, 2), ("call_1", 3, 4)]
    # A third result finds no unanswered call of that id.
    with pytest.raises(
        InvalidMessageError, match=r"'call_1' already has a result \(the call at seq 3\)"
    ):
        again.append_tool_result("call_1", "third", tool_name="grep")


def test_anthropic_refuses_a_repeated_tool_use_id(
    store: CompactStore, sid: str, db_snapshot: Snapshot
) -> None:
    sess = store.session(sid, format="anthropic")
    sess.extend(_reuse("anthropic")[:3])
    before = db_snapshot(store)
    with pytest.raises(
        InvalidMessageError,
        match=r"duplicate tool call id 'call_1' in session .*: the call at seq 1 has it "
        r"already, and format anthropic refuses a repeated tool call id",
    ):
        sess.append(call_message("anthropic", "call_1"))
    assert db_snapshot(store) == before


@pytest.mark.parametrize("fmt", ["openai", "responses"])
def test_an_id_whose_call_is_still_unanswered_is_refused(
    store: CompactStore, sid: str, db_snapshot: Snapshot, fmt: str
) -> None:
    sess = store.session(sid, format=fmt)
    sess.extend(_reuse(fmt)[:2])
    before = db_snapshot(store)
    again = _reuse(fmt)[3]
    with pytest.raises(
        InvalidMessageError, match=r"the call at seq 1 with that id is still unanswered"
    ):
        sess.append(again)
    assert db_snapshot(store) == before


def test_an_abandoned_call_frees_its_id_and_gets_its_stand_in(
    store: CompactStore, sid: str
) -> None:
    sess = store.session(sid, format="openai")
    sess.extend(
        [
            {"role": "user", "content": "go"},
            call_message("openai", "call_1"),  # the agent crashed before answering
            {"role": "user", "content": "go on"},  # answered as interrupted from here
            call_message("openai", "call_1", name="grep"),
            result_message("openai", "call_1", "grep output"),
        ]
    )
    assert _call_rows(store, sid) == [("call_1", 1, None), ("call_1", 3, 4)]
    context = sess.active_context()
    assert context[2]["tool_call_id"] == "call_1" and "interrupted" in context[2]["content"]
    assert context[-1] == result_message("openai", "call_1", "grep output")
    assert pair_problems("openai", context) == []
    validate_with_sdk("openai", context)


@pytest.mark.parametrize("fmt", ["openai", "responses"])
def test_a_cut_never_separates_a_call_from_its_result_when_ids_repeat(
    store: CompactStore, sid: str, fmt: str
) -> None:
    sess = store.session(sid, format=fmt)
    messages = _reuse(fmt)
    key = "output" if fmt == "responses" else "content"
    messages[2] = {**messages[2], key: "long output " * 400}  # worth summarising
    sess.extend(messages)
    sess.append({"role": "user", "content": "thanks"})
    kept = sess.context().kept
    # Starting the context at a result would leave it without its call; keyed by id alone,
    # the first result (seq 2) looked answered by the later call of the same id (seq 3).
    assert [item.seq for item in kept] == [0, 1, 2, 3, 4, 5]
    assert legal_cuts(kept) == [True, True, False, True, False, True, True]
    assert [p for p in match_pairs(kept).answers.items()] == [
        ((2, "call_1"), 1),
        ((4, "call_1"), 3),
    ]
    result = sess.compact(up_to_seq=2, now=2e9)
    assert result.success and result.boundary is not None
    assert result.boundary.preserved_segment == (3, 5)
    context = sess.active_context()
    validate_with_sdk(fmt, context)
    if fmt == "openai":
        assert pair_problems("openai", context) == []
    # Recall says which call of that id the removed result answered.
    assert "← tool result for call_1 (the call at seq 1):" in sess.recall({"from_seq": 2})


@pytest.mark.parametrize("fmt", ["openai", "responses"])
def test_what_was_lost_records_id_and_call_seq(store: CompactStore, sid: str, fmt: str) -> None:
    config = CompactionConfig(tool_result_max_chars=1_000)
    sess = store.session(sid, format=fmt, config=config)
    big = "x" * 5_000
    messages = _reuse(fmt)
    for index in (2, 4):
        key = "output" if fmt == "responses" else "content"
        messages[index] = {**messages[index], key: big + str(index)}
    sess.extend(messages)
    result = sess.process_request(now=2e9)
    assert result.cleared_tool_calls == [("call_1", 1), ("call_1", 3)]
    assert result.cleared_tool_use_ids == ["call_1", "call_1"]
    assert sess.compactions()[-1].cleared_tool_calls == [("call_1", 1), ("call_1", 3)]
    with store.engine.connect() as connection:
        stored = connection.execute(
            text("SELECT cleared_tool_calls FROM compaction_history WHERE compaction_id = :id"),
            {"id": result.id},
        ).scalar_one()
    assert stored == '[["call_1",1],["call_1",3]]'
    # Each blob names the tool of the call its result answered.
    assert [sess.get_blob(blob_id) for blob_id in result.blob_ids] == [big + "2", big + "4"]
    context = sess.active_context()
    validate_with_sdk(fmt, context)


@pytest.mark.corpus
def test_a_swe_agent_trajectory_keeps_its_reused_ids(store: CompactStore, sid: str) -> None:
    transcript = read_transcript(SWE_AGENT)
    ids = [
        call["id"] for message in transcript.messages for call in message.get("tool_calls") or []
    ]
    assert len(ids) > len(set(ids)), "the trajectory reuses call ids"
    assert not any("~" in i for i in ids), "ids are kept as the trajectory wrote them"
    sess = import_file(store, SWE_AGENT, session_id=sid)
    context = sess.active_context()
    assert pair_problems("openai", context) == []
    validate_with_sdk("openai", context)
    # The live API takes the same messages one at a time.
    live = store.session(f"{sid}-live", format="openai")
    for message in transcript.messages:
        live.append(message)
    assert live.active_context() == context


# -- the migration ----------------------------------------------------------------------------

PREVIOUS = "c3f8a2e61d47"  # the head before calls were keyed by (id, call seq)


def _rows(url: str, sql: str) -> list[tuple[Any, ...]]:
    engine = create_engine(url if "://" in url else f"sqlite:///{url}")
    try:
        with engine.connect() as connection:
            return [tuple(row) for row in connection.execute(text(sql))]
    finally:
        engine.dispose()


@pytest.mark.slow_on_postgres
def test_a_database_at_the_previous_head_upgrades_and_reads_back(db_url: str) -> None:
    config = CompactionConfig(tool_result_max_chars=1_000)
    big = "y" * 4_000
    with CompactStore.open(db_url) as store:
        sess = store.session("old", format="openai", config=config)
        sess.extend(
            [
                {"role": "user", "content": "read both"},
                call_message("openai", "c1"),
                result_message("openai", "c1", big + "1"),
                call_message("openai", "c2"),
                result_message("openai", "c2", big + "2"),
                {"role": "user", "content": "thanks"},
            ]
        )
        lost = sess.process_request(now=2e9)
        assert lost.cleared_tool_calls == [("c1", 1), ("c2", 3)]
        context, history = sess.active_context(), sess.compactions()
    # The previous head's shape: one call per id, what was lost as a list of ids.
    migrate_to(db_url, PREVIOUS, down=True)
    assert _rows(db_url, "SELECT cleared_tool_use_ids FROM compactions") == [('["c1","c2"]',)]
    assert _rows(db_url, "SELECT cleared_tool_use_ids FROM compaction_history") == [
        ('["c1","c2"]',)
    ]
    assert _rows(db_url, "SELECT count(*) FROM tool_calls") == [(2,)]
    with CompactStore.open(db_url, auto_migrate=True) as store:  # PostgreSQL: on purpose
        assert current_revision(store.engine) == head_revision()
        sess = store.session("old")
        assert sess.active_context() == context
        # The downgrade dropped what later revisions added (the policy each ran under).
        assert sess.compactions() == [c.model_copy(update={"edit_policy": None}) for c in history]
        assert sess.compactions()[-1].cleared_tool_calls == [("c1", 1), ("c2", 3)]
        # The new rules hold on the old rows: c1 is answered, so it may be used again.
        sess.append(call_message("openai", "c1", name="grep"))
        sess.append_tool_result("c1", "again", tool_name="grep")
        validate_with_sdk("openai", sess.active_context())
    assert _rows(
        db_url, "SELECT tool_use_id, call_seq, result_seq FROM tool_calls ORDER BY call_seq"
    ) == [("c1", 1, 2), ("c2", 3, 4), ("c1", 6, 7)]
    assert _rows(db_url, "SELECT cleared_tool_calls FROM compaction_history") == [
        ('[["c1",1],["c2",3]]',)
    ]


@pytest.mark.slow_on_postgres
def test_downgrading_refuses_reused_ids_the_older_schema_cannot_hold(db_url: str) -> None:
    with CompactStore.open(db_url) as store:
        store.session("s", format="openai").extend(_reuse("openai"))
    with pytest.raises(RuntimeError, match="uses tool call id 'call_1' more than once"):
        migrate_to(db_url, PREVIOUS, down=True)
    assert _rows(db_url, "SELECT version_num FROM alembic_version") == [(head_revision(),)]


def test_every_revision_is_marked_additive_or_breaking() -> None:
    from alembic.script import ScriptDirectory

    marks = {
        script.revision: (script.doc or "").rstrip().rsplit("(", 1)[-1].rstrip(")")
        for script in ScriptDirectory.from_config(alembic_config()).walk_revisions()
        if script.down_revision is not None  # the initial schema is neither
    }
    assert set(marks.values()) <= {"additive", "breaking"}, marks
    assert marks["e5a1c7d93b26"] == "breaking"
    # The first line says what the file's kind (what the database records) says.
    kinds = {
        script.revision: script.module.kind
        for script in ScriptDirectory.from_config(alembic_config()).walk_revisions()
        if script.down_revision is not None
    }
    assert marks == kinds
