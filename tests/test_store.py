"""The public store API on SQLite and PostgreSQL: sessions, the append-only
log, pins, reading back from a new process, calibration against real token counts, memory,
breaker defaults and token estimation.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from compactstore import (
    BreakerState,
    CompactionConfig,
    CompactStore,
    ConflictError,
    DatabaseError,
    InvalidInputError,
    InvalidMessageError,
    NotFoundError,
    SessionInfo,
    estimate_tokens,
)
from compactstore.db import repository as repo
from tests.conftest import Snapshot, module_database
from tests.helpers import assistant, call_message, result_message, user

REPO = Path(__file__).resolve().parents[1]
FORMATS = ["anthropic", "openai", "minicode"]

Message = dict[str, Any]


# -- one database per backend for the module --------------------------------------------------
# Every test works in sessions named after itself, so they can share a database: it saves
# creating a PostgreSQL database per test, and shows that sessions do not see each other.
# conftest's `store` and `reopen` fixtures open this `db_url`.

_ids = itertools.count()


database = module_database("store")


@pytest.fixture
def db_url(database: str) -> str:
    return database


@pytest.fixture
def sid() -> str:
    """A session id no other test in this module uses."""
    return f"s{next(_ids)}"


# -- sessions: get or create ----------------------------------------------------------------


def test_a_new_session_takes_the_defaults(store: CompactStore, sid: str) -> None:
    sess = store.session(sid, now=100.0)
    assert sess.id == sid
    assert sess.format == "anthropic"
    assert sess.context_window == 200_000
    assert sess.config == CompactionConfig()
    assert sess.created_at == 100.0


def test_reopening_with_another_format_or_window_is_a_conflict_and_changes_nothing(
    store: CompactStore, db_snapshot: Snapshot, sid: str
) -> None:
    store.session(sid, format="openai", context_window=50_000, now=1.0)
    before = db_snapshot(store)

    with pytest.raises(ConflictError, match=r"format 'openai'.*'minicode'"):
        store.session(sid, format="minicode")
    with pytest.raises(ConflictError, match=r"context_window 50000.*60000"):
        store.session(sid, context_window=60_000)
    with pytest.raises(ConflictError, match=r"format 'openai'"):
        store.session(sid, format="anthropic", context_window=50_000)

    assert db_snapshot(store) == before
    # Giving the stored values again is not a conflict.
    same = store.session(sid, format="openai", context_window=50_000)
    assert (same.format, same.context_window) == ("openai", 50_000)


def test_a_session_id_alone_reopens_with_the_stored_values(
    store: CompactStore, reopen: Callable[[], CompactStore], sid: str
) -> None:
    config = CompactionConfig(max_message_bytes=4_096, microcompact_keep_recent=2)
    store.session(sid, format="minicode", context_window=32_000, config=config, now=5.0)

    for opened in (store, reopen()):
        sess = opened.session(sid)
        assert sess.format == "minicode"
        assert sess.context_window == 32_000
        assert sess.config == config
        assert sess.created_at == 5.0
        assert opened.get_session(sid).config == config


def test_a_new_config_replaces_the_stored_one(
    store: CompactStore, reopen: Callable[[], CompactStore], sid: str
) -> None:
    store.session(sid, now=1.0)
    small = CompactionConfig(max_message_bytes=2_048)

    assert store.session(sid, config=small).config == small
    fresh = reopen()
    assert fresh.session(sid).config == small
    assert [info.config for info in fresh.sessions() if info.id == sid] == [small]
    # ... and it is the config the session now works with.
    with pytest.raises(InvalidMessageError, match=r"over the limit of 2048"):
        fresh.session(sid).append(user("x" * 3_000))


def test_get_session_of_an_unknown_id_raises_NotFoundError(store: CompactStore) -> None:
    with pytest.raises(NotFoundError, match=r"no session 'nope'"):
        store.get_session("nope")


def test_sessions_lists_every_session_oldest_first_with_its_message_count(
    store: CompactStore, sid: str
) -> None:
    def mine() -> list[SessionInfo]:
        # Other tests' sessions share this database; look at this test's own.
        return [info for info in store.sessions() if info.id.startswith(f"{sid}-")]

    assert mine() == []
    store.session(f"{sid}-late", format="openai", context_window=8_000, now=300.0)
    early = store.session(f"{sid}-early", now=100.0)
    early.extend([user("a"), assistant("b"), user("c")], timestamps=[101.0, 102.0, 103.0])

    infos = mine()
    assert [(i.id, i.format, i.context_window, i.created_at, i.message_count) for i in infos] == [
        (f"{sid}-early", "anthropic", 200_000, 100.0, 3),
        (f"{sid}-late", "openai", 8_000, 300.0, 0),
    ]
    assert all(info.config == CompactionConfig() for info in infos)


# -- the append-only log --------------------------------------------------------------------


def test_append_and_extend_return_consecutive_seqs_from_zero(store: CompactStore, sid: str) -> None:
    for fmt in FORMATS:
        sess = store.session(f"{sid}-{fmt}", format=fmt, now=0.0)
        assert sess.append(user("one"), timestamp=1.0) == 0
        assert sess.append(call_message(fmt, "c1"), timestamp=2.0) == 1
        assert sess.append(result_message(fmt, "c1", "body"), timestamp=3.0) == 2
        assert sess.extend([assistant("four"), user("five")], timestamps=[4.0, 5.0]) == [3, 4]
        assert sess.append(call_message(fmt, "c2"), timestamp=6.0) == 5
        assert sess.append_tool_result("c2", "result", tool_name="read_file", timestamp=7.0) == 6
        assert sess.extend([]) == []
        assert [item.seq for item in sess.context().items] == list(range(7)), fmt


def test_seqs_count_per_session(store: CompactStore, sid: str) -> None:
    first, second = store.session(f"{sid}-a", now=0.0), store.session(f"{sid}-b", now=0.0)
    assert first.append(user("1")) == 0
    assert second.append(user("1")) == 0
    assert first.append(assistant("2")) == 1
    assert second.append(assistant("2")) == 1


@pytest.mark.parametrize(
    "third",
    [
        pytest.param({"role": "robot", "content": "?"}, id="invalid-shape"),
        pytest.param(result_message("openai", "never-called", "x"), id="result-of-unknown-call"),
    ],
)
def test_extend_is_atomic(
    store: CompactStore, db_snapshot: Snapshot, third: Message, sid: str
) -> None:
    sess = store.session(sid, format="openai", now=0.0)
    sess.append(user("start"), timestamp=1.0)
    batch = [call_message("openai", "c1"), result_message("openai", "c1", "ok"), third, user("y")]
    before = db_snapshot(store)

    with pytest.raises(InvalidMessageError, match=r"^message 2: "):
        sess.extend(batch, timestamps=[2.0, 3.0, 4.0, 5.0])

    assert db_snapshot(store) == before
    assert sess.messages() == [user("start")]
    # The call id of the refused batch was not half-registered: the same batch, fixed, goes in.
    assert sess.extend([*batch[:2], user("y")]) == [1, 2, 3]


def test_messages_returns_the_log_verbatim(store: CompactStore, sid: str) -> None:
    sess = store.session(sid, format="openai", now=0.0)
    log: list[dict[str, Any]] = [
        {"content": "keys in an unusual order", "role": "system", "name": "boot"},
        {"role": "user", "content": [{"type": "text", "text": "naïve café 日本語 🙂 \u0000 \\n"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "type": "function",
                    "id": "c1",
                    "function": {"arguments": '{"z": 1, "a": [1.5, null, true]}', "name": "f"},
                }
            ],
            "refusal": None,
        },
        {"role": "tool", "content": "", "tool_call_id": "c1"},
        {"role": "assistant", "content": "done", "x_vendor_field": {"b": 2, "a": 1}},
    ]
    sess.extend(log)
    got = sess.messages()
    assert got == log
    assert json.dumps(got) == json.dumps(log)  # key order too


# -- pins -----------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["openai", "minicode"])
def test_leading_system_messages_the_first_user_message_and_pinned_ones_are_pins(
    store: CompactStore, fmt: str, sid: str
) -> None:
    sess = store.session(sid, format=fmt, now=0.0)
    sess.append({"role": "system", "content": "you are an agent"})
    sess.append({"role": "developer" if fmt == "openai" else "system", "content": "rules"})
    sess.append(user("fix the login bug"))
    sess.append(assistant("on it"))
    sess.append({"role": "system", "content": "a later system note is not a leading one"})
    sess.append(user("second request is not pinned"))
    sess.append(user("remember: never push to main"), pinned=True)
    sess.append(assistant("ok"))

    states = [(item.seq, item.state) for item in sess.context().items]
    assert states == [
        (0, "pinned"),
        (1, "pinned"),
        (2, "pinned"),
        (3, "original"),
        (4, "original"),
        (5, "original"),
        (6, "pinned"),
        (7, "original"),
    ]


def test_anthropic_pins_the_first_user_message_and_pinned_ones(
    store: CompactStore, sid: str
) -> None:
    sess = store.session(sid, format="anthropic", now=0.0)
    sess.append({"role": "user", "content": [{"type": "text", "text": "build me a parser"}]})
    sess.append(assistant("sure"))
    sess.append(user("and tests"))
    sess.append(user("the API key lives in $KEY"), pinned=True)
    assert [item.state for item in sess.context().items] == [
        "pinned",
        "original",
        "original",
        "pinned",
    ]


def test_the_first_user_message_is_the_first_one_a_person_wrote(
    store: CompactStore, sid: str
) -> None:
    # A tool result is not a request, even when it is a user message in this format.
    sess = store.session(sid, format="anthropic", now=0.0)
    sess.append(assistant("hello, what shall we do?"))
    sess.append(call_message("anthropic", "c1"))
    sess.append(result_message("anthropic", "c1", "file body"))
    sess.append(user("refactor it"))
    states = [item.state for item in sess.context().items]
    assert states == ["original", "original", "original", "pinned"]


# -- durability: a new process sees the same thing ------------------------------------------

_CHILD = """
import json, sys
from compactstore import CompactStore
with CompactStore.open(sys.argv[1]) as store:
    out = {}
    for session_id in sys.argv[2:]:
        sess = store.session(session_id)
        out[session_id] = {"context": sess.active_context(), "usage": sess.token_usage(),
                           "format": sess.format, "window": sess.context_window}
    print(json.dumps(out))
"""


def _write_a_conversation(store: CompactStore, fmt: str, sid: str) -> str:
    sess = store.session(f"{sid}-{fmt}", format=fmt, context_window=64_000, now=0.0)
    if fmt != "anthropic":
        sess.append({"role": "system", "content": "system prompt"})
    sess.append(user("résumé: 日本語のテキスト"), timestamp=1.0)
    sess.append(call_message(fmt, "c1", "c2"), timestamp=2.0)
    sess.append_tool_result("c1", "line 1\nline 2", tool_name="read_file", timestamp=3.0)
    sess.append_tool_result("c2", "boom", tool_name="read_file", is_error=True, timestamp=4.0)
    sess.append(call_message(fmt, "c3"), timestamp=5.0)  # crashed mid-tool ...
    sess.append(user("are you there?"), timestamp=6.0)  # ... and the user wrote again
    sess.record_usage(5_000)
    sess.append(assistant("yes " * 100), timestamp=7.0)
    return sess.id


@pytest.mark.slow
def test_a_new_process_reads_back_exactly_what_was_written(
    store: CompactStore, db_url: str, tmp_path: Path, sid: str
) -> None:
    ids = [_write_a_conversation(store, fmt, sid) for fmt in FORMATS]

    env = {**os.environ, "PYTHONIOENCODING": "utf-8", "PYTHONDONTWRITEBYTECODE": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, db_url, *ids],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=120,
        check=False,
    )
    assert child.returncode == 0, child.stderr
    seen = json.loads(child.stdout)

    for fmt, session_id in zip(FORMATS, ids, strict=True):
        sess = store.session(session_id)
        there = seen[session_id]
        assert there["context"] == sess.active_context()
        assert json.dumps(there["context"]) == json.dumps(sess.active_context())
        assert there["usage"] == sess.token_usage()
        assert (there["format"], there["window"]) == (fmt, 64_000)


def test_two_stores_on_one_database_see_each_others_writes(
    store: CompactStore, reopen: Callable[[], CompactStore], sid: str
) -> None:
    here = store.session(sid, format="openai", now=0.0)
    here.extend([{"role": "system", "content": "sys"}, user("start")])
    assert here.active_context() == here.messages()  # read once, so this process holds it

    other_store = reopen()
    there = other_store.session(sid)
    there.append(call_message("openai", "c1"))
    there.append_tool_result("c1", "body", tool_name="read_file", file_path="a.py")
    there.append(call_message("openai", "c2"))
    there.append_tool_result("c2", "body", tool_name="read_file", file_path="a.py")  # dedup
    there.record_usage(700)
    there.append(user("more"), pinned=True)

    assert here.active_context() == there.active_context() == there.messages()
    assert [i.state for i in here.context().items] == [i.state for i in there.context().items]
    assert here.token_usage() == there.token_usage()

    other_store.session(sid, config=CompactionConfig(fixed_overhead_tokens=100))
    assert here.context().config.fixed_overhead_tokens == 100
    assert here.token_usage() == there.token_usage()


# -- calibration ------------------------------------------------------------------


def test_token_usage_is_the_sum_of_stored_estimates_plus_the_fixed_overhead(
    store: CompactStore,
    sid: str,
) -> None:
    plain = CompactionConfig(fixed_overhead_tokens=1_500, token_factor=1.0)
    sess = store.session(sid, config=plain, now=0.0)
    sess.append(user("abcd" * 100))  # 100 tokens
    sess.append(assistant("你好" * 30))  # 60 CJK characters: 40 tokens
    items = sess.context().items
    assert [item.tokens for item in items] == [100, 40]
    assert sess.token_usage() == 1_500 + 140


def test_before_any_real_count_the_default_factor_does_not_undercount_code(
    store: CompactStore, sid: str
) -> None:
    # Real Claude tokens run ~1.4-1.5x the article's estimate on code-heavy sessions.
    sess = store.session(sid, now=0.0)
    assert CompactionConfig().token_factor == 1.6
    sess.append(user("abcd" * 100))  # an estimate of 100 tokens
    assert sess.token_usage() == 160


def test_a_custom_token_counter_replaces_the_estimate(db_url: str, sid: str) -> None:
    with CompactStore.open(db_url, token_counter=len) as counted:
        # An exact counter needs no correction factor.
        sess = counted.session(sid, config=CompactionConfig(token_factor=1.0), now=0.0)
        sess.append(user("abcd" * 10))
        assert sess.context().items[0].tokens == 40
        assert sess.token_usage() == 40


def test_record_usage_makes_usage_follow_the_real_count_and_learns_a_factor(
    store: CompactStore, reopen: Callable[[], CompactStore], sid: str
) -> None:
    sess = store.session(sid, now=0.0)
    sess.append(user("hello " * 200))
    assert sess.context().token_factor is None

    sess.record_usage(1_000)
    assert sess.token_usage() == 1_000

    sess.append(assistant("x" * 1_600))  # an estimate of 400 tokens
    factor = sess.context().factor
    assert sess.context().items[-1].tokens == 400
    assert abs(sess.token_usage() - (1_000 + factor * 400)) <= 1

    # The provider counted 1.4x what we estimated for the growth: a factor is learnt.
    sess.record_usage(1_000 + 560)
    learnt = sess.context().token_factor
    assert learnt is not None
    assert 0.5 <= learnt <= 4
    assert learnt > 1
    assert sess.token_usage() == 1_560

    sess.append(user("y" * 800))  # 200 tokens more
    assert abs(sess.token_usage() - (1_560 + learnt * 200)) <= 1
    # The calibration is stored with the session, not kept in memory.
    again = reopen().session(sid)
    assert again.context().token_factor == learnt
    assert again.token_usage() == sess.token_usage()


def test_record_usage_resets_the_reactive_attempt_counter(store: CompactStore, sid: str) -> None:
    sess = store.session(sid, now=0.0)
    sess.append(user("hi"))
    with store.engine.begin() as connection:
        repo.set_breaker(connection, sid, reactive_attempts=2)
    assert sess.breaker().reactive_attempts == 2

    sess.record_usage(10)
    assert sess.breaker().reactive_attempts == 0


def test_record_usage_refuses_what_is_not_a_token_count(
    store: CompactStore, db_snapshot: Snapshot, sid: str
) -> None:
    sess = store.session(sid, now=0.0)
    before = db_snapshot(store)
    not_counts: tuple[Any, ...] = (-1, 1.5, True, "100", None)
    for bad in not_counts:
        with pytest.raises(
            InvalidInputError, match=r"input_tokens must be (a whole number|between 0 and)"
        ):
            sess.record_usage(bad)
    assert db_snapshot(store) == before


# -- memory, breaker, blobs, history --------------------------------------------------------


def test_remember_stores_memory_entries(store: CompactStore, sid: str) -> None:
    sess = store.session(sid, now=0.0)
    first = sess.remember("user_intent", "ship the parser by Friday", now=10.0)
    second = sess.remember("decision", "use SQLite for tests 日本", now=11.0)
    assert first != second

    entries = sess.memories()
    assert [(e.id, e.kind, e.text, e.created_at, e.scope) for e in entries] == [
        (first, "user_intent", "ship the parser by Friday", 10.0, "session"),
        (second, "decision", "use SQLite for tests 日本", 11.0, "session"),
    ]
    assert [e.tokens for e in entries] == [
        estimate_tokens("ship the parser by Friday"),
        estimate_tokens("use SQLite for tests 日本"),
    ]
    assert store.session(f"{sid}-other").memories() == []


def test_remember_refuses_unknown_kinds_and_empty_text(
    store: CompactStore, db_snapshot: Snapshot, sid: str
) -> None:
    sess = store.session(sid, now=0.0)
    before = db_snapshot(store)
    with pytest.raises(InvalidInputError, match=r"unknown memory kind 'gossip'; expected one of"):
        sess.remember("gossip", "x")
    not_texts: tuple[Any, ...] = ("   ", "", 42)
    for bad_text in not_texts:
        with pytest.raises(InvalidInputError, match=r"memory text must be a non-empty string"):
            sess.remember("fact", bad_text)
    assert db_snapshot(store) == before
    assert sess.memories() == []


def test_the_breaker_starts_closed_with_the_microcompact_clock_at_creation(
    store: CompactStore,
    sid: str,
) -> None:
    sess = store.session(sid, now=1_234.5)
    assert sess.breaker() == BreakerState(
        consecutive_failures=0, tripped=False, reactive_attempts=0, last_microcompact_at=1_234.5
    )
    sess.reset_breaker()
    assert sess.breaker().consecutive_failures == 0
    assert not sess.breaker().tripped


def test_a_plan_reads_the_breaker_and_both_ids_in_one_statement_as_three_reads_would(
    store: CompactStore, sid: str
) -> None:
    def state() -> tuple[Any, ...]:
        def read(connection: Any) -> tuple[Any, ...]:
            last = connection.execute(
                text("SELECT max(id) FROM compactions WHERE session_id = :sid"), {"sid": sid}
            ).scalar_one()
            separate = (
                repo.get_breaker(connection, sid),
                repo.next_blob_id(connection, sid),
                last or 0,
            )
            return repo.plan_state(connection, sid), separate

        combined, separate = store.read(read)
        assert combined == separate
        return tuple(combined)

    sess = store.session(sid, now=0.0, config=CompactionConfig(tool_result_max_chars=100))
    assert state()[1:] == (1, 0)  # no blob, no compaction yet
    sess.append(user("read the logs"))
    sess.append(call_message("anthropic", "t1"))
    sess.append(result_message("anthropic", "t1", "log line\n" * 200))
    result = sess.process_request(now=10.0)  # the budget persists the long result
    assert state()[1:] == (2, result.id)


def test_get_blob_of_an_unknown_id_raises_NotFoundError(store: CompactStore, sid: str) -> None:
    sess = store.session(sid, now=0.0)
    with pytest.raises(NotFoundError, match=rf"no blob 1 in session '{re.escape(sid)}'"):
        sess.get_blob(1)


def test_a_new_session_has_no_boundaries_and_no_compactions(store: CompactStore, sid: str) -> None:
    sess = store.session(sid, now=0.0)
    sess.extend([user("a"), assistant("b")])
    assert sess.boundaries() == []
    assert sess.boundaries(include_rolled_back=True) == []
    assert sess.compactions() == []
    assert sess.context().boundary is None


# -- token estimation -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        pytest.param("", 0, id="empty"),
        pytest.param("abcd", 1, id="four-ascii"),
        pytest.param("abcde", 2, id="rounds-up"),
        pytest.param("a" * 400, 100, id="ascii"),
        pytest.param("你好吗", 2, id="han"),
        pytest.param("こんにちは", 4, id="kana"),  # 5 / 1.5 = 3.33
        pytest.param("안녕하세요", 4, id="hangul"),
        pytest.param("ab你好", 2, id="mixed"),  # 2 / 1.5 + 2 / 4 = 1.83
        pytest.param("修复 login 的 bug", 5, id="mixed-sentence"),  # 3 CJK + 11 other: 2 + 2.75
        pytest.param("🙂🙂🙂🙂", 1, id="emoji-is-other"),
    ],
)
def test_estimate_tokens(text: str, tokens: int) -> None:
    assert estimate_tokens(text) == tokens


def test_memory_means_a_database_in_memory_not_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with CompactStore.open(":memory:") as store:
        assert store.location == "sqlite:///:memory:"
        sess = store.session("s")
        sess.append({"role": "user", "content": "hi"})
        assert sess.process_request(now=1_700_000_000.0).success is False
        assert store.get_session("s").messages() == [{"role": "user", "content": "hi"}]
    assert list(tmp_path.iterdir()) == [], "no file named ':memory:' (or any other)"


def test_a_transaction_stores_its_writes_together_or_not_at_all(store: CompactStore) -> None:
    with store.transaction() as connection:
        connection.exec_driver_sql("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
        connection.exec_driver_sql("INSERT INTO notes VALUES (1, 'kept')")
    with pytest.raises(KeyError, match="the caller's own"), store.transaction() as connection:
        connection.exec_driver_sql("INSERT INTO notes VALUES (2, 'rolled back')")
        raise KeyError("the caller's own error, as raised")
    with (
        pytest.raises(DatabaseError, match=f"{re.escape(store.location)} refused the data"),
        store.transaction() as connection,
    ):
        connection.exec_driver_sql("INSERT INTO notes VALUES (3, 'rolled back too')")
        connection.exec_driver_sql("INSERT INTO notes VALUES (1, 'a duplicate id')")
    notes = store.read(lambda c: c.exec_driver_sql("SELECT id, body FROM notes").all())
    assert [tuple(row) for row in notes] == [(1, "kept")]
    # No connection or lock was left behind: the store's own writes go on.
    sess = store.session("after")
    assert sess.append(user("hello")) == 0


@pytest.mark.slow
def test_a_transaction_on_a_read_only_store_is_a_DatabaseError(tmp_path: Path) -> None:
    path = tmp_path / "ro.db"
    CompactStore.open(path).close()
    with CompactStore.open(path, read_only=True) as store:
        with pytest.raises(DatabaseError, match=re.escape(str(path))), store.transaction() as c:
            c.exec_driver_sql("CREATE TABLE notes (id INTEGER PRIMARY KEY)")
        assert store.sessions() == []
