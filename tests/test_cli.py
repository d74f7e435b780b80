"""The command line on SQLite and PostgreSQL: every command's table and --json
output, the errors (one `Error: ...` line, exit 1; usage errors exit 2; nothing written),
confirmation before a rollback, rollback + replay --apply round trips, byte-exact blobs,
COMPACTSTORE_DB and -h everywhere.

Sessions are built through the library with a small window and big tool results, so they
have blobs (tool-result budget), a read-dedup stub and two boundaries (a full and a partial
manual compact).
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from sqlalchemy import create_engine, update
from sqlalchemy.engine import make_url

from compactstore import CompactStore, Session
from compactstore._cli import cli, render, render_stats
from compactstore._cli.files import progress
from compactstore.db.schema import breaker_state
from compactstore.errors import (
    ConflictError,
    DatabaseError,
    InvalidInputError,
    NotFoundError,
    SchemaError,
)
from compactstore.models import BreakerState, CompactionConfig, SessionInfo
from tests.conftest import (
    BACKENDS,
    PG_URL,
    Snapshot,
    create_postgres,
    drop_postgres,
    postgres_url,
)
from tests.helpers import claude_code_record

Message = dict[str, Any]

T0 = 1_700_000_000.0
REQUEST = "Please fix the failing payment tests"
COMPACTION_KEYS = {
    "id",
    "success",
    "strategy",
    "edit_policy",
    "trigger",
    "boundary",
    "tokens_before",
    "tokens_after",
    "tokens_freed",
    "summary_text",
    "steps",
    "created_at",
    "rolled_back_at",
    "removed_seqs",
    "cleared_tool_calls",
    "cleared_tool_use_ids",
    "results_cleared",
    "results_persisted",
    "blob_ids",
    "instructions",
    "error",
    "effective",
    "summary",
    "background",
    "started_by",
}
BOUNDARY_KEYS = {
    "id",
    "trigger",
    "strategy",
    "timestamp",
    "tokens_before",
    "tokens_after",
    "messages_removed",
    "preserved_segment",
    "summary_text",
    "parent_id",
    "rolled_back_at",
}


# -- building sessions through the library --------------------------------------------------


def user(text: str) -> Message:
    return {"role": "user", "content": text}


def assistant(text: str) -> Message:
    return {"role": "assistant", "content": text}


def read_call(index: int, path: str) -> Message:
    return {
        "role": "assistant",
        "content": [
            {"type": "text", "text": f"Reading {path}"},
            {"type": "tool_use", "id": f"t{index}", "name": "read_file", "input": {"path": path}},
        ],
    }


def big_file(index: int) -> str:
    """A tool result over the 4,000-character budget, with non-ASCII text and CRLF lines."""
    return "\r\n".join(f"{index}:{j} def handler_{j}(): return 'é' * {j}" for j in range(200))


def build_session(store: CompactStore, session_id: str = "s1") -> Session:
    """Blobs 1-3, a read-dedup stub, boundary 1 (full) and boundary 2 (partial, live)."""
    sess = store.session(session_id, context_window=8_000, now=T0)
    t = T0
    sess.append(user(REQUEST), timestamp=t)
    for i in range(4):
        t += 10
        path = f"src/f{i}.py"
        sess.append(read_call(i, path), timestamp=t)
        content = big_file(i) if i % 2 == 0 else f"small file {i}\n"
        sess.append_tool_result(
            f"t{i}", content, tool_name="read_file", file_path=path, timestamp=t + 1
        )
        sess.process_request(now=t + 2)
    sess.compact(now=t + 3)
    t += 10
    sess.append(assistant("Now the gateway."), timestamp=t)
    mark = sess.append(user("Also check the retry logic."), timestamp=t + 1)
    for i, path in ((4, "src/gateway.py"), (5, "src/small.py"), (6, "src/small.py")):
        t += 10
        sess.append(read_call(i, path), timestamp=t)
        content = big_file(i) if i == 4 else "tiny file\n"
        sess.append_tool_result(
            f"t{i}", content, tool_name="read_file", file_path=path, timestamp=t + 1
        )
        sess.process_request(now=t + 2)
    sess.compact(up_to_seq=mark, instructions="keep the retry request", now=t + 3)
    sess.append(assistant("Done."), timestamp=t + 4)
    return sess


def build_store(store: CompactStore) -> None:
    """s1 (see build_session), then two more sessions: other (openai) and empty."""
    build_session(store)
    store.session("other", format="openai", context_window=50_000, now=T0 + 10_000)
    store.session("empty", now=T0 + 20_000)


@pytest.fixture(scope="module", params=BACKENDS)
def template(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """A database holding the fixture sessions, built once per backend and module.

    Tests that only read use it as it is (`shared`); tests that write get a copy (`copy`).
    """
    if request.param == "sqlite":
        url = str(tmp_path_factory.mktemp("template") / "template.db")
    else:
        if not PG_URL:
            pytest.skip("PostgreSQL half skipped: set COMPACTSTORE_TEST_PG_URL (.ci/run does)")
        url = postgres_url(name := create_postgres("cli_template"))
    with CompactStore.open(url) as store:
        build_store(store)
    yield url
    if request.param == "postgres":
        drop_postgres(name)


@pytest.fixture
def shared(template: str) -> Iterator[CompactStore]:
    """The template database, opened for a test that must not change it."""
    with CompactStore.open(template) as store:
        yield store


@pytest.fixture
def copy(template: str, tmp_path: Path) -> Iterator[str]:
    """A private copy of the template database, for a test that writes."""
    if "://" not in template:
        target = tmp_path / "copy.db"
        for suffix in ("", "-wal"):
            source = Path(template + suffix)
            if source.exists():
                shutil.copyfile(source, str(target) + suffix)
        yield str(target)
        return
    name = create_postgres("cli_copy", make_url(template).database)
    try:
        yield postgres_url(name)
    finally:
        drop_postgres(name)


@pytest.fixture
def copy_store(copy: str) -> Iterator[CompactStore]:
    with CompactStore.open(copy) as store:
        yield store


def invoke(
    db: str | None,
    *args: str,
    input: str | None = None,
    env: dict[str, str | None] | None = None,
) -> Result:
    """Run the CLI as `compactstore ARGS --db DB`, never reading the caller's COMPACTSTORE_DB."""
    full = [*args, "--db", db] if db is not None else list(args)
    return CliRunner().invoke(cli, full, input=input, env={"COMPACTSTORE_DB": None, **(env or {})})


def ok(result: Result) -> Result:
    assert result.exit_code == 0, (result.exit_code, result.stdout, result.stderr)
    return result


def fails(result: Result, message: str, *, code: int = 1) -> Result:
    """The command failed with exit ``code`` and one `Error: ...` line naming the problem."""
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, result.stderr
    assert message in errors[0]
    return result


def as_json(result: Result) -> Any:
    return json.loads(ok(result).stdout)


# -- help, usage errors, the database option ------------------------------------------------

COMMANDS = [
    [],
    ["demo"],
    ["sessions"],
    ["show"],
    ["history"],
    ["compact"],
    ["rollback"],
    ["replay"],
    ["blob"],
    ["breaker"],
    ["import"],
    ["export"],
    ["stats"],
    ["db"],
    ["db", "upgrade"],
    ["db", "current"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "compactstore")
def test_dash_h_prints_help_with_an_example_on_every_command(command: list[str]) -> None:
    result = ok(CliRunner().invoke(cli, [*command, "-h"]))
    assert result.stdout.startswith("Usage: ")
    assert "Example:" in result.stdout
    if command and command != ["db"]:
        assert "--db" in result.stdout
        assert "COMPACTSTORE_DB" in result.stdout


def test_every_data_command_takes_json() -> None:
    for command in COMMANDS:
        if command in ([], ["db"], ["export"]):
            continue
        assert "--json" in ok(CliRunner().invoke(cli, [*command, "-h"])).stdout, command


@pytest.mark.slow
def test_python_dash_m_runs_the_cli() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "compactstore", "-h"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "Usage:" in done.stdout
    assert "rollback" in done.stdout


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_on_a_terminal_is_a_live_bar(monkeypatch: pytest.MonkeyPatch) -> None:
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    with progress("Importing x.jsonl") as report:
        for done in range(1, 11):
            report(done, 10)
    drawn = terminal.getvalue()
    assert "Importing x.jsonl" in drawn
    assert "100%" in drawn
    assert drawn.endswith("\n")


def test_progress_elsewhere_is_one_line_after_success_and_nothing_after_a_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    log = io.StringIO()
    monkeypatch.setattr(sys, "stderr", log)
    with progress("Replaying boundary 3") as report:
        report(0, 1)
        report(1, 1)
    assert log.getvalue() == "Replaying boundary 3: 1 of 1\n"
    log.seek(0)
    log.truncate()
    with pytest.raises(ValueError), progress("Importing bad.jsonl") as report:
        report(2, 4)
        raise ValueError("line 3")
    assert log.getvalue() == ""


def test_renderers_need_neither_a_database_nor_a_runner() -> None:
    info = SessionInfo(
        id="s1",
        format="anthropic",
        context_window=8_000,
        created_at=T0,
        message_count=18,
        config=CompactionConfig(),
    )
    assert [row.split() for row in render.sessions_lines([info])] == [
        ["session", "format", "window", "messages"],
        ["s1", "anthropic", "8,000", "18"],
    ]
    state = BreakerState(
        consecutive_failures=2,
        reactive_attempts=1,
        last_microcompact_at=T0,
        consecutive_fallbacks=4,
    )
    assert render_stats.breaker_lines(state) == [
        "consecutive failures: 2",
        "tripped:              no",
        "reactive attempts:    1",
        "last microcompact:    2023-11-14 22:13:20 UTC",
        "summary fallbacks:    4 in a row",
    ]
    assert render.history_lines([]) == ["no compactions recorded"]
    assert render.ranges([8, 1, 2, 3, 5, 7]) == "1-3, 5, 7-8"
    assert render.preview("a\n  b " * 40, 10) == "a b a b a…"
    assert render.one_line("cannot open\n  the file\n") == "cannot open the file"


@pytest.mark.slow
def test_show_renders_the_library_s_active_context(template: str, shared: CompactStore) -> None:
    sess = shared.get_session("s1")
    context, state = sess.context(), sess.edit_state()
    for full in (False, True):
        option = ["--full"] if full else []
        shown = ok(invoke(template, "show", "s1", *option)).stdout
        assert shown == "\n".join(render.show_lines(context, full=full, state=state)) + "\n"
        data = as_json(invoke(template, "show", "s1", "--json", *option))
        found = render.show_json(context, full=full, state=state) | render.link_json(None, None, [])
        assert data == json.loads(render.json_text(found))


def test_usage_errors_exit_2(template: str) -> None:
    assert invoke(template, "show").exit_code == 2  # missing SESSION
    assert invoke(template, "compact", "s1", "--up-to", "x").exit_code == 2
    assert invoke(template, "replay", "s1").exit_code == 2  # --boundary is required
    assert invoke(template, "blob", "s1", "one").exit_code == 2
    assert invoke(template, "nonsense").exit_code == 2
    result = invoke(template, "show", "s1", "--bogus")
    assert result.exit_code == 2
    assert "No such option" in result.stderr


def test_compactstore_db_env_var_is_the_default_database(template: str) -> None:
    listed = as_json(invoke(None, "sessions", "--json", env={"COMPACTSTORE_DB": template}))
    assert [s["id"] for s in listed] == ["s1", "other", "empty"]
    shown = as_json(invoke(None, "show", "s1", "--json", env={"COMPACTSTORE_DB": template}))
    assert shown["session"] == "s1"


def test_without_db_or_env_the_default_is_compactstore_db_in_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    ok(invoke(None, "db", "upgrade"))
    assert (tmp_path / "compactstore.db").exists()
    assert ok(invoke(None, "sessions")).stdout.split() == [
        "session",
        "format",
        "window",
        "messages",
    ]


def test_an_unknown_session_is_one_error_line_and_is_not_created(
    template: str, shared: CompactStore, db_snapshot: Snapshot
) -> None:
    before = db_snapshot(shared)
    for command in (
        ["show", "nope"],
        ["history", "nope"],
        ["compact", "nope"],
        ["rollback", "nope", "--yes"],
        ["replay", "nope", "--boundary", "1"],
        ["blob", "nope", "1"],
        ["breaker", "nope", "--reset"],
        ["export", "nope"],
    ):
        result = fails(invoke(template, *command), "no session 'nope' in")
        assert result.stderr.count("\n") == 1, (command, result.stderr)
        assert result.stdout == ""
    assert db_snapshot(shared) == before


def test_a_library_error_is_one_line_and_changes_nothing(
    template: str, shared: CompactStore, db_snapshot: Snapshot
) -> None:
    before = db_snapshot(shared)
    result = fails(invoke(template, "compact", "s1", "--up-to", "999"), "past the last message")
    assert result.stderr.count("\n") == 1
    assert db_snapshot(shared) == before


def test_an_unusable_database_is_one_error_line(tmp_path: Path) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not a database" * 100)
    result = fails(invoke(str(junk), "sessions"), "junk.db")
    assert result.stderr.count("\n") == 1


# -- sessions, show, history ----------------------------------------------------------------


def test_sessions_lists_every_session(template: str) -> None:
    table = ok(invoke(template, "sessions")).stdout.splitlines()
    assert [row.split() for row in table] == [
        ["session", "format", "window", "messages"],
        ["s1", "anthropic", "8,000", "18"],
        ["other", "openai", "50,000", "0"],
        ["empty", "anthropic", "200,000", "0"],
    ]
    data = as_json(invoke(template, "sessions", "--json"))
    assert data[0] == {
        "id": "s1",
        "format": "anthropic",
        "context_window": 8_000,
        "created_at": T0,
        "message_count": 18,
    }


def test_show_prints_the_active_context_with_seq_role_tokens_and_state(
    template: str, shared: CompactStore
) -> None:
    context = shared.get_session("s1").context()
    lines = ok(invoke(template, "show", "s1")).stdout.splitlines()
    assert lines[0] == (
        f"session s1 (anthropic): {len(context.items)} messages, {context.usage:,} of 8,000 "
        f"tokens ({context.usage / 8_000:.0%}), boundary 2"
    )
    assert lines[1].split() == ["seq", "role", "tokens", "state", "content"]
    rows = lines[2:]
    assert len(rows) == len(context.items)
    for row, item in zip(rows, context.items, strict=True):
        seq, role, tokens, state = row.split()[:4]
        assert seq == ("-" if item.seq is None else str(item.seq))
        assert role == item.message["role"]
        assert tokens == f"{item.tokens:,}"
        assert state == item.state
    states = [row.split()[3] for row in rows]
    assert states[:2] == ["pinned", "summary"]
    assert {"original", "persisted", "deduplicated"} <= set(states)
    assert rows[0].endswith(REQUEST)
    assert all(len(row) < 120 for row in rows)  # one line each: long contents are cut


def test_show_full_prints_whole_contents(template: str, shared: CompactStore) -> None:
    sess = shared.get_session("s1")
    out = ok(invoke(template, "show", "s1", "--full")).stdout.splitlines()
    summary = sess.context().summary
    assert summary is not None
    start = out.index(next(line for line in out if line.split()[-1:] == ["summary"]))
    text = sess.adapter.text(summary.message).splitlines()
    assert out[start + 1 : start + 1 + len(text)] == [f"        {t}".rstrip() for t in text]
    assert all(line == line.rstrip() for line in out)


def test_show_json(template: str, shared: CompactStore) -> None:
    sess = shared.get_session("s1")
    context = sess.context()
    data = as_json(invoke(template, "show", "s1", "--json"))
    assert set(data) == {
        "session",
        "format",
        "context_window",
        "usage",
        "boundary_id",
        "edit_state",
        "message_count",
        "not_shown",
        "messages",
        "parent",
        "subagents",
    }
    assert (data["parent"], data["subagents"]) == (None, [])  # not a subagent, none of its own
    assert (data["message_count"], data["not_shown"]) == (len(context.items), 0)
    assert (data["session"], data["format"], data["context_window"]) == ("s1", "anthropic", 8_000)
    assert data["usage"] == context.usage
    assert data["boundary_id"] == 2
    assert [m["seq"] for m in data["messages"]] == [item.seq for item in context.items]
    assert [m["state"] for m in data["messages"]] == [item.state for item in context.items]
    assert data["messages"][0] == {
        "seq": 0,
        "role": "user",
        "kind": "user",
        "tokens": context.items[0].tokens,
        "state": "pinned",
        "text": REQUEST,
        "message": None,
    }
    full = as_json(invoke(template, "show", "s1", "--json", "--full"))
    assert [m["message"] for m in full["messages"]] == sess.active_context()
    assert full["messages"][1]["text"] == sess.adapter.text(context.items[1].message)


@pytest.mark.slow_on_postgres
def test_show_lists_the_newest_rows_and_counts_the_whole_context(
    copy: str, copy_store: CompactStore
) -> None:
    sess = copy_store.get_session("other")
    for i in range(60):
        role = "user" if i % 2 == 0 else "assistant"
        sess.append({"role": role, "content": f"message {i}"}, timestamp=T0 + i)
    context = sess.context()
    assert len(context.items) == 60
    heading = (
        f"session other (openai): 60 messages, {context.usage:,} of 50,000 tokens "
        f"({context.usage / 50_000:.0%}), no boundary"
    )

    def rows(*option: str) -> tuple[list[str], list[str]]:
        lines = ok(invoke(copy, "show", "other", *option)).stdout.splitlines()
        start = lines.index(next(line for line in lines if line.split()[:1] == ["seq"]))
        return lines[:start], [line.split()[0] for line in lines[start + 1 :]]

    head, seqs = rows()  # the default: the newest 50
    assert head == [heading, "10 older messages not shown (newest 50; --all shows every one)"]
    assert seqs == [str(seq) for seq in range(10, 60)]
    head, seqs = rows("--limit", "3")
    assert head[1].startswith("57 older messages not shown")
    assert seqs == ["57", "58", "59"]
    for option in (["--all"], ["--limit", "0"], ["--limit", "60"], ["--limit", "3", "--all"]):
        head, seqs = rows(*option)
        assert head == [heading]
        assert seqs == [str(seq) for seq in range(60)]
    data = as_json(invoke(copy, "show", "other", "--json", "--limit", "2", "--full"))
    assert (data["message_count"], data["not_shown"], data["usage"]) == (60, 58, context.usage)
    assert [m["seq"] for m in data["messages"]] == [58, 59]
    assert [m["message"] for m in data["messages"]] == sess.active_context()[58:]
    data = as_json(invoke(copy, "show", "other", "--json", "--all"))
    assert (data["not_shown"], len(data["messages"])) == (0, 60)
    assert invoke(copy, "show", "other", "--limit", "-1").exit_code == 2


def test_history_has_a_row_per_compaction_and_what_was_lost(
    template: str, shared: CompactStore
) -> None:
    compactions = shared.get_session("s1").compactions()
    lines = ok(invoke(template, "history", "s1")).stdout.splitlines()
    assert lines[0].split()[:4] == ["id", "time", "(UTC)", "trigger"]
    assert "tokens before → after" in lines[0]
    rows, lost = lines[1::2], lines[2::2]
    assert len(rows) == len(compactions) == 6
    full = compactions[2]
    assert full.strategy is not None and full.strategy.value == "full"
    assert rows[2].split()[:7] == [
        str(full.id),
        "2023-11-14",
        "22:14:03",  # T0 + 43 s, in UTC
        "manual",
        "full",
        "rewrite",  # the edit policy it ran under
        "yes",
    ]
    assert f"{full.tokens_before:,} → {full.tokens_after:,}" in rows[2]
    assert rows[2].split()[-4:] == [f"{full.tokens_freed:,}", "1", "4", "-"]
    assert lost[2].strip() == (
        "lost: seqs 1-4; 0 tool results cleared, 0 persisted; blobs -; kept seq 5-8"
    )
    assert lost[0].strip() == "lost: seqs -; 0 tool results cleared, 1 persisted; blobs 1"
    # The re-read of src/small.py is a stub, recorded as a compaction of its own; the stub
    # is longer than the tiny file, so it freed nothing.
    dedup = compactions[4]
    assert dedup.strategy is not None and dedup.strategy.value == "read_dedup"
    # Recorded under the session's policy, as every compaction is.
    assert rows[4].split()[3:7] == ["auto", "read_dedup", "rewrite", "no"]
    assert dedup.tokens_freed < 0
    assert lost[4].strip() == "seq 16 re-read src/small.py unchanged: points at seq 14"
    assert rows[5].split()[3:5] == ["manual", "partial"]


def test_history_of_a_session_without_compactions(template: str) -> None:
    assert ok(invoke(template, "history", "empty")).stdout == "no compactions recorded\n"
    assert as_json(invoke(template, "history", "empty", "--json")) == {
        "session": "empty",
        "edit_state": {
            "model": None,
            "edit_policy": "auto",
            "effective_policy": "rewrite",
            "prefix_checks": False,
            "thinking_binding": None,
            "thinking_binding_at": None,
            "dropped": [],
            "dropped_total": 0,
        },
        "compactions": [],
    }


def test_history_json(template: str, shared: CompactStore) -> None:
    data = as_json(invoke(template, "history", "s1", "--json"))
    assert set(data) == {"session", "edit_state", "compactions"}
    assert data["session"] == "s1"
    compactions = shared.get_session("s1").compactions()
    assert [c["id"] for c in data["compactions"]] == [c.id for c in compactions]
    for item in data["compactions"]:
        assert set(item) == COMPACTION_KEYS
    partial = data["compactions"][-1]
    assert partial["strategy"] == "partial"
    assert partial["instructions"] == "keep the retry request"
    assert set(partial["boundary"]) == BOUNDARY_KEYS
    assert partial["boundary"]["id"] == 2
    assert partial["boundary"]["preserved_segment"] == [11, 16]
    assert partial["removed_seqs"] == [5, 6, 7, 8, 9, 10]
    assert data["compactions"][0]["blob_ids"] == [1]
    assert data["compactions"][0]["cleared_tool_use_ids"] == ["t0"]


# -- compact, rollback, replay --------------------------------------------------------------


def test_compact_runs_a_manual_full_compact(copy: str, copy_store: CompactStore) -> None:
    sess = copy_store.get_session("s1")
    before = sess.token_usage()
    out = ok(invoke(copy, "compact", "s1", "--instructions", "focus on retries")).stdout
    last = sess.compactions()[-1]
    assert last.strategy is not None and last.strategy.value == "full"
    assert last.instructions == "focus on retries"
    assert last.boundary is not None and last.boundary.preserved_segment is not None
    first, end = last.boundary.preserved_segment
    assert out == (
        f"compaction {last.id}: full (manual) freed {last.tokens_freed:,} tokens "
        f"({before:,} → {last.tokens_after:,}); boundary 3 summarised "
        f"{last.boundary.messages_removed} messages and keeps seq {first}-{end}\n"
    )


@pytest.mark.slow_on_postgres
def test_compact_up_to_is_a_partial_compact_and_json(copy: str, copy_store: CompactStore) -> None:
    sess = copy_store.get_session("empty")
    for i in range(6):
        sess.append(user(f"question {i} " + "word " * 50), timestamp=T0 + i)
        sess.append(assistant(f"answer {i} " + "word " * 50), timestamp=T0 + i)
    data = as_json(invoke(copy, "compact", "empty", "--up-to", "5", "--json"))
    assert set(data) == COMPACTION_KEYS
    assert (data["strategy"], data["trigger"], data["success"]) == ("partial", "manual", True)
    assert data["boundary"]["preserved_segment"] == [6, 11]
    assert data["effective"] is True
    assert data["tokens_freed"] == data["tokens_before"] - data["tokens_after"] > 0
    assert len(sess.boundaries()) == 1


def test_a_compact_that_cannot_cut_says_why_and_is_recorded_as_failed(
    copy: str, copy_store: CompactStore
) -> None:
    sess = copy_store.get_session("empty")
    sess.append(user("hello"), timestamp=T0 + 20_001)
    out = ok(invoke(copy, "compact", "empty")).stdout
    failed = sess.compactions()[-1]
    assert not failed.success and failed.boundary is None
    why = failed.steps[0].detail
    assert why
    assert out == f"compaction {failed.id}: full (manual) compacted nothing: {why}\n"
    history = ok(invoke(copy, "history", "empty")).stdout.splitlines()
    assert history[1].split()[3:7] == ["manual", "full", "rewrite", "no"]
    assert history[2].strip().endswith(f"; failed: {why}")


@pytest.mark.slow_on_postgres
def test_rollback_yes_undoes_the_latest_boundary(copy: str, copy_store: CompactStore) -> None:
    sess = copy_store.get_session("s1")
    out = ok(invoke(copy, "rollback", "s1", "--yes")).stdout.splitlines()
    assert out[0].startswith("rolled back boundary 2 (partial, manual, ")
    assert out[-1] == f"active context: {render.usage_of(sess.token_usage(), 8_000)}"
    assert [b.id for b in sess.boundaries()] == [1]
    # --json, and a given boundary rolls back every one after it too.
    ok(invoke(copy, "compact", "s1"))
    data = as_json(invoke(copy, "rollback", "s1", "--boundary", "1", "--yes", "--json"))
    assert set(data) == {"session", "rolled_back", "compactions", "usage"}
    assert [b["id"] for b in data["rolled_back"]] == [1, 3]
    assert all(set(b) == BOUNDARY_KEYS and b["rolled_back_at"] for b in data["rolled_back"])
    assert data["usage"] == sess.token_usage()
    assert sess.boundaries() == []


def test_rollback_asks_and_answering_no_changes_nothing(
    copy: str, copy_store: CompactStore, db_snapshot: Snapshot
) -> None:
    before = db_snapshot(copy_store)
    for answer in ("n\n", "\n"):  # no is the default
        result = invoke(copy, "rollback", "s1", input=answer)
        assert result.exit_code == 1
        assert "Roll back boundary 2 (partial, " in result.stderr
        assert "Aborted" in result.stderr
        assert result.stdout == ""
    assert db_snapshot(copy_store) == before
    # Answering yes goes ahead.
    result = ok(invoke(copy, "rollback", "s1", "--boundary", "1", input="y\n"))
    assert (
        "Roll back boundary 1 (full, 2023-11-14 22:14:03 UTC) and 1 later boundary of session s1?"
        in result.stderr
    )
    assert copy_store.get_session("s1").boundaries() == []


def test_rollback_errors(copy: str, copy_store: CompactStore, db_snapshot: Snapshot) -> None:
    before = db_snapshot(copy_store)
    # Nothing would change, so nothing is asked: the error comes straight away.
    fails(invoke(copy, "rollback", "s1", "--boundary", "99"), "no boundary 99 in session 's1'")
    fails(invoke(copy, "rollback", "empty"), "has no live boundary")
    assert db_snapshot(copy_store) == before
    ok(invoke(copy, "rollback", "s1", "--yes"))
    fails(invoke(copy, "rollback", "s1", "--boundary", "2"), "already rolled back")


@pytest.mark.slow_on_postgres
def test_rollback_plan_says_what_rollback_would_undo_and_changes_nothing(
    copy_store: CompactStore, db_snapshot: Snapshot
) -> None:
    sess = copy_store.get_session("s1")
    before = db_snapshot(copy_store)
    assert [b.id for b in sess.rollback_plan()] == [2]
    assert [b.id for b in sess.rollback_plan(1)] == [1, 2]
    with pytest.raises(NotFoundError, match="no boundary 99 in session 's1'"):
        sess.rollback_plan(99)
    with pytest.raises(NotFoundError, match="has no live boundary"):
        copy_store.get_session("empty").rollback_plan()
    assert db_snapshot(copy_store) == before
    assert [b.id for b in sess.rollback(2)] == [2]
    with pytest.raises(ConflictError, match="already rolled back"):
        sess.rollback_plan(2)


def test_message_count_counts_one_session_s_log(shared: CompactStore) -> None:
    sess = shared.get_session("s1")
    assert sess.message_count() == len(sess.messages()) == 18
    assert shared.get_session("empty").message_count() == 0


@pytest.mark.slow_on_postgres
def test_rollback_then_replay_apply_restores_the_active_context(
    copy: str, copy_store: CompactStore
) -> None:
    sess = copy_store.get_session("s1")
    before = sess.active_context()
    ok(invoke(copy, "rollback", "s1", "--yes"))
    assert sess.active_context() != before
    out = ok(invoke(copy, "replay", "s1", "--boundary", "2", "--apply")).stdout.splitlines()
    assert out[0] == "identical: the replay of boundary 2 gives the recorded summary and kept range"
    assert out[1] == "summary: the recorded text, reused"
    assert out[2].startswith("applied: compaction 7: partial (manual) freed ")
    assert sess.active_context() == before
    assert [b.id for b in sess.boundaries()] == [1, 3]


def test_replay_of_the_recording_is_identical(template: str) -> None:
    result = ok(invoke(template, "replay", "s1", "--boundary", "1"))
    assert result.stdout == (
        "identical: the replay of boundary 1 gives the recorded summary and kept range\n"
        "summary: the recorded text, reused\n"
    )
    assert result.stderr == "Replaying boundary 1: 1 of 1\n"  # progress goes to stderr
    data = as_json(invoke(template, "replay", "s1", "--boundary", "2", "--json"))
    assert set(data) == {
        "session",
        "boundary_id",
        "applied",
        "summary_source",
        "identical",
        "diff",
        "recorded",
        "replayed",
        "result",
        "rolled_back",
        "usage",
    }
    assert (data["identical"], data["diff"], data["applied"]) == (True, "", False)
    assert (data["rolled_back"], data["usage"]) == ([], None)
    assert data["summary_source"] == "recorded"
    assert data["recorded"] == data["replayed"]
    assert set(data["recorded"]) == {
        "kept",
        "messages_removed",
        "tokens_before",
        "tokens_after",
        "summary_text",
    }
    assert data["recorded"]["kept"] == [11, 16]
    assert set(data["result"]) == COMPACTION_KEYS
    assert data["result"]["id"] is None  # a dry replay records nothing


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("keep-more.json", json.dumps({"full_compact_keep_fraction": 0.6})),
        ("keep-more.toml", "full_compact_keep_fraction = 0.6\n"),
    ],
)
def test_replay_with_another_config_shows_a_unified_diff(
    template: str,
    shared: CompactStore,
    db_snapshot: Snapshot,
    tmp_path: Path,
    name: str,
    text: str,
) -> None:
    config = tmp_path / name
    config.write_text(text)
    before = db_snapshot(shared)
    args = ["replay", "s1", "--boundary", "1", "--config", str(config)]
    out = ok(invoke(template, *args)).stdout
    lines = out.splitlines()
    assert lines[:3] == ["--- recorded (boundary 1)", "+++ replayed", lines[2]]
    assert lines[2].startswith("@@ ")
    assert "-kept: seq 5-8" in lines
    assert "+kept: seq 3-8" in lines
    assert lines[-1] == "summary: rule-based", "another cut: the recorded text does not fit"
    data = as_json(invoke(template, *args, "--json"))
    assert data["identical"] is False
    assert data["diff"] == "\n".join(lines[:-1])
    assert (data["recorded"]["kept"], data["replayed"]["kept"]) == ([5, 8], [3, 8])
    assert db_snapshot(shared) == before  # without --apply nothing is written


def test_replay_errors(
    template: str, shared: CompactStore, db_snapshot: Snapshot, tmp_path: Path
) -> None:
    before = db_snapshot(shared)
    result = fails(invoke(template, "replay", "s1", "--boundary", "99"), "no boundary 99")
    assert result.stderr.count("\n") == 1
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"summary_max_files": -1, "bogus": 1}))
    result = fails(
        invoke(template, "replay", "s1", "--boundary", "1", "--config", str(bad)),
        "invalid config in",
    )
    assert "summary_max_files" in result.stderr and "bogus" in result.stderr
    assert result.stderr.count("\n") == 1
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    fails(invoke(template, "replay", "s1", "--boundary", "1", "--config", str(broken)), "broken")
    missing = str(tmp_path / "missing.json")
    assert invoke(template, "replay", "s1", "--boundary", "1", "--config", missing).exit_code == 2
    # --apply on a boundary that is not the latest live one is refused.
    fails(invoke(template, "replay", "s1", "--boundary", "1", "--apply"), "not the latest live")
    assert db_snapshot(shared) == before


def test_replay_resummarize_asks_the_summarizer_it_names(
    template: str, shared: CompactStore, db_snapshot: Snapshot
) -> None:
    before = db_snapshot(shared)
    fails(
        invoke(template, "replay", "s1", "--boundary", "1", "--resummarize"),
        "--resummarize needs --summarizer",
    )
    fails(
        invoke(template, "replay", "s1", "--boundary", "1", "--summarizer", "openai"),
        "only apply with --resummarize",
    )
    fails(
        invoke(template, "replay", "s1", "--boundary", "1", "--resummarize", "--summarizer", "x"),
        "unknown summarizer 'x'",
    )
    fails(
        invoke(
            template, "replay", "s1", "--boundary", "1", "--resummarize", "--summarizer", "openai"
        ),
        "needs a model",
    )
    args = ["replay", "s1", "--boundary", "1", "--resummarize"]
    out = ok(invoke(template, *args, "--summarizer", "tests.helpers:cli_summarizer")).stdout
    assert "+resummarized by the CLI test" in out.splitlines()
    assert out.splitlines()[-1] == "summary: written by the summarizer again"
    data = as_json(
        invoke(template, *args, "--summarizer", "tests.helpers:cli_summarizer", "--json")
    )
    assert data["summary_source"] == "summarizer"
    assert data["replayed"]["summary_text"] == "resummarized by the CLI test"
    assert db_snapshot(shared) == before


# -- blob, breaker --------------------------------------------------------------------------


def test_blob_prints_the_persisted_tool_result_byte_exact(template: str) -> None:
    result = ok(invoke(template, "blob", "s1", "1"))
    assert result.stdout_bytes == big_file(0).encode("utf-8")


def test_blob_output_file_is_byte_exact(template: str, tmp_path: Path) -> None:
    target = tmp_path / "out" / "blob.txt"
    target.parent.mkdir()
    out = ok(invoke(template, "blob", "s1", "3", "-o", str(target))).stdout
    data = big_file(4).encode("utf-8")
    assert target.read_bytes() == data
    assert out == f"wrote {len(data):,} bytes to {target}\n"
    assert [p.name for p in target.parent.iterdir()] == ["blob.txt"]  # no temporary file left


def test_blob_json(template: str, tmp_path: Path) -> None:
    data = big_file(2).encode("utf-8")
    assert as_json(invoke(template, "blob", "s1", "2", "--json")) == {
        "session": "s1",
        "blob_id": 2,
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "output": None,
        "decoded": None,
        "content": big_file(2),
    }
    target = tmp_path / "b.txt"
    saved = as_json(invoke(template, "blob", "s1", "2", "-o", str(target), "--json"))
    assert (saved["output"], saved["content"], saved["bytes"]) == (str(target), None, len(data))
    assert target.read_bytes() == data


def test_blob_errors(template: str, tmp_path: Path) -> None:
    fails(invoke(template, "blob", "s1", "99"), "no blob 99 in session 's1'")
    fails(invoke(template, "blob", "other", "1"), "no blob 1 in session 'other'")
    nowhere = tmp_path / "missing-dir" / "blob.txt"
    fails(invoke(template, "blob", "s1", "1", "-o", str(nowhere)), "cannot write")
    assert not nowhere.parent.exists()


def _trip_breaker(store: CompactStore, session_id: str) -> None:
    with store.engine.begin() as connection:
        connection.execute(
            update(breaker_state)
            .where(breaker_state.c.session_id == session_id)
            .values(consecutive_failures=3, tripped=True, reactive_attempts=2)
        )


def test_breaker_shows_and_resets_the_counters(copy: str, copy_store: CompactStore) -> None:
    sess = copy_store.get_session("s1")
    _trip_breaker(copy_store, "s1")
    lines = ok(invoke(copy, "breaker", "s1")).stdout.splitlines()
    assert lines == [
        "consecutive failures: 3",
        "tripped:              yes",
        "reactive attempts:    2",
        "last microcompact:    none yet",  # (its clock starts at the session's creation)
        "summary fallbacks:    0 in a row",
    ]
    assert sess.breaker().last_microcompact_at == sess.created_at == T0
    data = as_json(invoke(copy, "breaker", "s1", "--json"))
    assert data == {
        "session": "s1",
        "consecutive_failures": 3,
        "tripped": True,
        "reactive_attempts": 2,
        "last_microcompact_at": sess.breaker().last_microcompact_at,
        "consecutive_fallbacks": 0,
        "reset": False,
    }
    data = as_json(invoke(copy, "breaker", "s1", "--reset", "--json"))
    assert (data["consecutive_failures"], data["tripped"], data["reactive_attempts"]) == (
        0,
        False,
        0,
    )
    assert data["reset"] is True
    state = sess.breaker()
    assert (state.consecutive_failures, state.tripped, state.reactive_attempts) == (0, False, 0)
    _trip_breaker(copy_store, "s1")
    out = ok(invoke(copy, "breaker", "s1", "--reset")).stdout
    assert out.startswith("breaker of session s1 reset\nconsecutive failures: 0\n")


# -- import, export -------------------------------------------------------------------------

TRANSCRIPT: list[Message] = [
    user("Add a retry to the gateway client"),
    read_call(1, "src/gateway.py"),
    {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "class Gateway: ..."}],
    },
    assistant("The client has no retry; adding one."),
]


def _jsonl(path: Path, records: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


@pytest.mark.slow
def test_import_jsonl_of_messages(db_url: str, store: CompactStore, tmp_path: Path) -> None:
    file = _jsonl(tmp_path / "chat.jsonl", TRANSCRIPT)
    result = ok(invoke(db_url, "import", str(file), "--session", "imp", "--format", "anthropic"))
    assert result.stdout == (
        "imported 4 messages into session imp (anthropic, 200,000 tokens, 0 boundaries)\n"
    )
    assert result.stderr == "Importing chat.jsonl: 4 of 4\n"  # progress, on stderr
    assert store.get_session("imp").messages() == TRANSCRIPT
    # --json: the format is detected and the session is named after the file.
    other = _jsonl(tmp_path / "chat2.jsonl", TRANSCRIPT)
    data = as_json(invoke(db_url, "import", str(other), "--context-window", "50000", "--json"))
    assert data.pop("usage") == store.get_session("chat2").token_usage() > 0
    assert data == {
        "session": "chat2",
        "format": "anthropic",
        "context_window": 50_000,
        "messages": 4,
        "boundaries": 0,
        "last_real_count": None,  # the file reports no provider counts
        "subagents": [],
    }


@pytest.mark.slow
def test_import_says_why_usage_differs_from_the_last_real_count(
    db_url: str, store: CompactStore, tmp_path: Path
) -> None:
    """The provider counted the system prompt and tools the transcript does not hold:
    import shows both numbers and why."""
    reply = claude_code_record(
        "assistant", [{"type": "text", "text": "On it."}], uuid="a1", message_id="m1"
    )
    reply["message"]["usage"] = {"input_tokens": 3, "cache_read_input_tokens": 20_000}
    file = _jsonl(
        tmp_path / "cc.jsonl", [claude_code_record("user", "Port the parser", uuid="u1"), reply]
    )
    result = ok(invoke(db_url, "import", str(file), "--session", "cc"))
    usage = store.get_session("cc").token_usage()
    assert result.stdout.splitlines()[1] == (
        f"usage {usage:,} tokens (the store's count of the active context); the transcript's "
        f"last model call counted 20,003: the provider also counted {20_003 - usage:,} "
        "tokens the active context does not hold (system prompt, tool definitions and "
        "reminders the client sent, messages the agent kept through its own compaction)"
    )
    data = as_json(invoke(db_url, "import", str(file), "--session", "cc2", "--json"))
    assert data["last_real_count"] == 20_003


def test_a_malformed_import_file_names_the_line_and_stores_nothing(
    db_url: str, store: CompactStore, db_snapshot: Snapshot, tmp_path: Path
) -> None:
    file = tmp_path / "bad.jsonl"
    lines = [json.dumps(m) for m in TRANSCRIPT]
    lines[2] = '{"role": "user", "content": [oops'
    file.write_text("\n".join(lines) + "\n")
    before = db_snapshot(store)
    result = fails(invoke(db_url, "import", str(file), "--session", "bad"), "line 3")
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1  # no progress line before the error
    assert db_snapshot(store) == before
    # A line that is JSON but not a valid message fails the same way.
    lines[2] = json.dumps({"role": "user", "content": [{"type": "tool_result"}]})
    file.write_text("\n".join(lines) + "\n")
    fails(invoke(db_url, "import", str(file), "--session", "bad"), "line 3")
    assert db_snapshot(store) == before


def test_import_errors(template: str, shared: CompactStore, tmp_path: Path) -> None:
    file = _jsonl(tmp_path / "chat.jsonl", TRANSCRIPT)
    fails(invoke(template, "import", str(file), "--session", "s1"), "already exists")
    result = invoke(template, "import", str(file), "--format", "klingon")
    assert result.exit_code == 2
    assert "klingon" in result.stderr
    assert invoke(template, "import", str(tmp_path / "missing.jsonl")).exit_code == 2
    assert [i.id for i in shared.sessions()] == ["s1", "other", "empty"]


def test_export_writes_the_log_as_jsonl(template: str, shared: CompactStore) -> None:
    sess = shared.get_session("s1")
    out = ok(invoke(template, "export", "s1")).stdout
    lines = out.splitlines()
    assert out.endswith("\n")
    assert len(lines) == len(sess.messages())
    assert all(isinstance(json.loads(line), dict) for line in lines)
    assert REQUEST in lines[0]


def test_export_active_writes_the_active_context(
    template: str, shared: CompactStore, tmp_path: Path
) -> None:
    out = ok(invoke(template, "export", "s1", "--active")).stdout
    assert len(out.splitlines()) == len(shared.get_session("s1").active_context())
    target = tmp_path / "active.jsonl"
    assert ok(invoke(template, "export", "s1", "--active", "-o", str(target))).stdout == ""
    assert target.read_text(encoding="utf-8") == out


@pytest.mark.slow_on_postgres
def test_export_then_import_round_trips_the_log(
    copy: str, copy_store: CompactStore, tmp_path: Path
) -> None:
    target = tmp_path / "log.jsonl"
    ok(invoke(copy, "export", "s1", "-o", str(target)))
    ok(invoke(copy, "import", str(target), "--session", "copy"))
    assert copy_store.get_session("copy").messages() == copy_store.get_session("s1").messages()


# -- demo, stats, db ------------------------------------------------------------------------


@pytest.mark.slow
def test_demo_simulates_a_session_then_prints_its_history_and_audit_queries(
    db_url: str, store: CompactStore
) -> None:
    from compactstore._demo import audit_queries

    result = ok(invoke(db_url, "demo", "--steps", "30"))
    assert result.stderr == "Simulating 30 agent steps: 30 of 30\n"  # progress, on stderr
    out = result.stdout
    compactions = store.get_session("demo").compactions()
    assert compactions
    assert out.startswith("Simulated 30 steps into session demo of ")
    assert "Stages fired: " in out
    assert f"{'id':>5}  time (UTC)" in out
    for c in compactions:
        assert any(line.split()[:1] == [str(c.id)] for line in out.splitlines())
    assert "Audit it with SQL: paste these into " in out
    for title, sql in audit_queries():
        assert f"-- {title}\n" in out
        assert sql.strip().rstrip(";") + ";" in out
    # --json: the progress bar did not leak into stdout.
    data = as_json(invoke(db_url, "demo", "--steps", "8", "--session", "d2", "--json"))
    assert set(data) == {"report", "compactions", "audit_queries"}
    assert set(data["report"]) == {
        "session_id",
        "steps",
        "messages",
        "fired",
        "compactions",
        "tokens_freed",
        "peak_usage",
        "peak_sent",
        "context_window",
    }
    assert (data["report"]["session_id"], data["report"]["steps"]) == ("d2", 8)
    assert [c["id"] for c in data["compactions"]] == [
        c.id for c in store.get_session("d2").compactions()
    ]
    assert data["audit_queries"] == [{"title": t, "sql": q} for t, q in audit_queries()]


@pytest.mark.slow_on_postgres
def test_stats_counts_the_whole_store(copy: str, copy_store: CompactStore) -> None:
    data = as_json(invoke(copy, "stats", "--json"))
    assert set(data) == {
        "location",
        "backend",
        "sessions",
        "messages",
        "compactions",
        "boundaries",
        "blobs",
        "memory_entries",
        "model_calls",
        "db_file_bytes",
        "wal_file_bytes",
    }
    assert data["sessions"] == 3
    assert data["messages"]["count"] == 18
    compactions = copy_store.get_session("s1").compactions()
    freed = {
        strategy: sum(
            step.tokens_freed
            for c in compactions
            for step in c.steps
            if step.success and step.strategy.value == strategy
        )
        for strategy in ("full", "partial", "tool_budget")
    }
    assert data["compactions"] == {
        "total": 6,
        "rolled_back": 0,
        "by_strategy": {"full": 1, "partial": 1, "read_dedup": 1, "tool_budget": 3},
        # Each stage that acted (the read dedup grew the context: it did not).
        "stages": {
            "full": {"count": 1, "tokens_freed": freed["full"]},
            "partial": {"count": 1, "tokens_freed": freed["partial"]},
            "tool_budget": {"count": 3, "tokens_freed": freed["tool_budget"]},
        },
    }
    assert data["boundaries"] == {"live": 2, "rolled_back": 0}
    blobs = [big_file(0), big_file(2), big_file(4)]
    assert data["blobs"] == {"count": 3, "bytes": sum(len(b.encode("utf-8")) for b in blobs)}
    assert data["memory_entries"] == 0
    # No call reported usage here: the ledger counts nothing, and no cost is known.
    assert data["model_calls"] == {
        "count": 0,
        "unpriced": 0,
        "tokens": {
            "input": 0,
            "cache_read": 0,
            "cache_write_5m": 0,
            "cache_write_1h": 0,
            "output": 0,
        },
        "cost_usd": None,
    }
    if data["backend"] == "sqlite":
        assert data["db_file_bytes"] == Path(copy).stat().st_size > 0
    else:
        assert (data["db_file_bytes"], data["wal_file_bytes"]) == (None, None)

    ok(invoke(copy, "rollback", "s1", "--yes"))
    data = as_json(invoke(copy, "stats", "--json"))
    assert data["boundaries"] == {"live": 1, "rolled_back": 1}
    assert data["compactions"]["rolled_back"] == 1

    lines = ok(invoke(copy, "stats")).stdout.splitlines()
    assert lines[1:6] == [
        "sessions:       3",
        f"messages:       18 ({data['messages']['tokens']:,} tokens)",
        "compactions:    6 (1 rolled back): full 1, partial 1, read_dedup 1, tool_budget 3",
        f"stages:         full 1 ({freed['full']:,} tokens freed), partial 1 "
        f"({freed['partial']:,} tokens freed), tool_budget 3 ({freed['tool_budget']:,} tokens "
        "freed)",
        "boundaries:     1 live, 1 rolled back",
    ]


@pytest.mark.empty_database
@pytest.mark.slow_on_postgres
def test_db_upgrade_and_current(db_url: str) -> None:
    from compactstore.db.migrate import head_revision

    if "://" not in db_url:  # a SQLite file that is not there yet: reading it creates nothing
        fails(invoke(db_url, "db", "current"), f"no database at {db_url}")
        assert not Path(db_url).exists()
        Path(db_url).touch()  # an empty SQLite database, as an empty PostgreSQL one
    assert as_json(invoke(db_url, "db", "current", "--json")) == {
        "current": None,
        "head": head_revision(),
        "up_to_date": False,
        "usable": False,
    }
    out = ok(invoke(db_url, "db", "upgrade")).stdout
    assert out.endswith(f": schema at {head_revision()}\n")
    assert as_json(invoke(db_url, "db", "upgrade", "--json"))["revision"] == head_revision()
    assert ok(invoke(db_url, "db", "current")).stdout == (
        f"current: {head_revision()}\nhead:    {head_revision()}\n"
    )


# -- outputs never replace a database; reading never creates, migrates or writes -------------

READ_ONLY_COMMANDS = [
    ["sessions"],
    ["show", "s1"],
    ["history", "s1"],
    ["export", "s1"],
    ["blob", "s1", "1"],
    ["breaker", "s1"],
    ["stats"],
    ["db", "current"],
]


@contextmanager
def tmpfs(directory: Path, size: str) -> Iterator[Path]:
    """A small tmpfs mounted at ``directory``: a real filesystem that can be filled or made
    read-only (root included). Skips when this process may not mount (not root)."""
    directory.mkdir()
    try:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(directory)],
            capture_output=True,
            text=True,
            check=False,
        )
    except FileNotFoundError:
        pytest.skip("no mount command: cannot make a small or read-only filesystem here")
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs (needs root): {done.stderr.strip()}")
    try:
        yield directory
    finally:
        subprocess.run(["umount", "-l", str(directory)], check=False)


def fill(directory: Path) -> Path:
    """Fill the filesystem holding ``directory`` with one file, and return that file."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_CREAT | os.O_WRONLY, 0o600)
    try:
        while True:
            os.write(fd, b"x" * 4096)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC, exc
    finally:
        os.close(fd)
    return filler


@pytest.fixture(scope="module")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The fixture sessions in a SQLite file, for tests of files, directories and mounts
    (a read-only PostgreSQL store is tested by test_a_read_only_store_never_writes)."""
    path = tmp_path_factory.mktemp("sqlite_template") / "template.db"
    with CompactStore.open(path) as store:
        build_store(store)
    return str(path)


def remount_read_only(directory: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(directory)], check=True)


def test_an_output_onto_the_database_or_any_sqlite_file_is_refused(
    template: str, shared: CompactStore, db_snapshot: Snapshot, tmp_path: Path
) -> None:
    before = db_snapshot(shared)
    other = tmp_path / "other.db"
    CompactStore.open(other).close()
    other_bytes = other.read_bytes()
    targets = [other]
    if "://" not in template:
        database = Path(template)
        targets += [database, Path(f"{template}-wal"), tmp_path / "link.db"]
        (tmp_path / "link.db").symlink_to(database)
    for target in targets:
        for command in (["export", "s1"], ["blob", "s1", "1"]):
            result = fails(invoke(template, *command, "-o", str(target)), "refusing to write")
            assert str(target) in result.stderr
        data = json.loads(invoke(template, "blob", "s1", "1", "-o", str(target), "--json").stderr)
        assert data["kind"] == "InvalidInputError"
    assert db_snapshot(shared) == before
    assert other.read_bytes() == other_bytes
    # Other files are replaced as before.
    plain = tmp_path / "plain.jsonl"
    plain.write_text("old\n")
    ok(invoke(template, "export", "s1", "-o", str(plain)))
    assert plain.read_text().startswith('{"role"')


def test_an_output_is_whole_or_absent_on_a_full_disk(template: str, tmp_path: Path) -> None:
    with tmpfs(tmp_path / "small", "64k") as small:
        target = small / "s1.jsonl"
        target.write_text("the previous export\n")
        fill(small)
        big = ["export", "s1", "-o", str(target)]  # about 40 KB: cannot fit
        fails(invoke(template, *big), f"cannot write {target}: No space left on device")
        assert target.read_text() == "the previous export\n"
        assert sorted(p.name for p in small.iterdir()) == ["filler", "s1.jsonl"]


def test_open_output_leaves_nothing_when_the_writer_fails(tmp_path: Path) -> None:
    from compactstore._cli.files import open_output

    target = tmp_path / "out.jsonl"
    with pytest.raises(KeyboardInterrupt), open_output(target, db=None) as out:
        out.write(b"half of it")
        raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []
    with open_output(target, db=None) as out:
        out.write(b"all of it")
    assert target.read_bytes() == b"all of it"
    assert target.stat().st_mode & 0o777 == 0o600  # private, like the database


@pytest.mark.parametrize("command", READ_ONLY_COMMANDS, ids=" ".join)
def test_a_read_only_command_on_a_missing_path_creates_nothing(
    command: list[str], tmp_path: Path
) -> None:
    missing = tmp_path / "typo" / "agent.db"
    result = fails(invoke(str(missing), *command), f"no database at {missing}")
    assert result.stdout == ""
    assert list(tmp_path.iterdir()) == []
    if command != ["export", "s1"]:  # export prints JSONL, it has no --json
        assert json.loads(invoke(str(missing), *command, "--json").stderr) == {
            "error": f"no database at {missing}: check the path (reading never creates a database)",
            "kind": "NotFoundError",
        }
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_read_only_commands_work_on_a_read_only_filesystem(
    sqlite_template: str, tmp_path: Path
) -> None:
    template = sqlite_template
    with tmpfs(tmp_path / "ro", "8m") as mounted:
        database = mounted / "agent.db"
        shutil.copyfile(template, database)
        remount_read_only(mounted)
        for command in READ_ONLY_COMMANDS:
            here = ok(invoke(str(database), *command)).stdout
            if command not in (["stats"],):
                assert here == ok(invoke(template, *command)).stdout, command
        # Writing is refused by its cause, and nothing is called damaged.
        result = fails(invoke(str(database), "compact", "s1"), "agent.db")
        assert "damaged" not in result.stderr.replace("nothing is damaged", "")
        assert "backup" not in result.stderr
        assert sorted(p.name for p in mounted.iterdir()) == ["agent.db"]


def as_unprivileged_user(*args: str) -> tuple[int, str, str]:
    """Run the CLI in a forked child that may not write what its file modes forbid.

    File modes do not bind root, so under root the child first becomes ``nobody`` (the
    interpreter is already loaded: the child needs only the database and the package's own
    files, which the caller has imported by running the same command once); under any
    other user it stays that user. Returns (exit code, stdout, stderr).
    """
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        try:
            os.close(read)
            if os.geteuid() == 0:
                os.setgroups([])
                os.setgid(65534)
                os.setuid(65534)
            result = CliRunner().invoke(cli, list(args), env={"COMPACTSTORE_DB": None})
            report = [result.exit_code, result.stdout, result.stderr]
            with os.fdopen(write, "wb") as pipe:
                pipe.write(json.dumps(report).encode("utf-8"))
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        data = pipe.read()
    os.waitpid(pid, 0)
    code, stdout, stderr = json.loads(data)
    return code, stdout, stderr


@pytest.mark.slow
@pytest.mark.parametrize("directory_mode", [0o555, 0o777], ids=["read-only dir", "open dir"])
def test_a_read_only_file_works_for_reading_and_refuses_writes_by_cause(
    sqlite_template: str, directory_mode: int
) -> None:
    template = sqlite_template
    expected = ok(invoke(template, "show", "s1")).stdout
    directory = Path(tempfile.mkdtemp(prefix="cs-ro-"))
    try:
        database = directory / "agent.db"
        shutil.copyfile(template, database)
        database.chmod(0o444)
        directory.chmod(directory_mode)
        code, stdout, stderr = as_unprivileged_user("show", "s1", "--db", str(database))
        assert (code, stdout) == (0, expected), stderr
        code, stdout, stderr = as_unprivileged_user("compact", "s1", "--db", str(database))
        assert code == 1
        assert "restore" not in stderr and "damaged." not in stderr
        assert "check the permissions of the file and its directory" in stderr.lower()
    finally:
        directory.chmod(0o755)
        shutil.rmtree(directory)


def test_a_read_only_store_never_writes(db_url: str) -> None:
    with CompactStore.open(db_url) as store:
        store.session("s1", now=T0).append(user(REQUEST), timestamp=T0)
    with CompactStore.open(db_url, read_only=True) as store:
        sess = store.get_session("s1")
        assert sess.messages() == [user(REQUEST)]
        with pytest.raises(DatabaseError, match="can only be read here"):
            sess.append(assistant("no"), timestamp=T0 + 1)
        with pytest.raises(DatabaseError, match="can only be read here"):
            store.session("s2", now=T0)
    with CompactStore.open(db_url) as store:
        assert [info.id for info in store.sessions()] == ["s1"]


def test_read_only_commands_never_migrate_an_older_schema(db_url: str) -> None:
    from alembic import command

    from compactstore.db.migrate import alembic_config, current_revision

    with CompactStore.open(db_url) as store:
        engine = store.engine
        with engine.begin() as connection:
            config = alembic_config()
            config.attributes["connection"] = connection
            command.downgrade(config, "-1")
        older = current_revision(engine)
    for args in READ_ONLY_COMMANDS[:-1]:
        fails(invoke(db_url, *args), "run `compactstore db upgrade --db")
    with pytest.raises(SchemaError, match="never migrates"):
        CompactStore.open(db_url, read_only=True)
    check = create_engine(db_url if "://" in db_url else f"sqlite:///{db_url}")
    try:
        assert current_revision(check) == older
    finally:
        check.dispose()
    assert as_json(invoke(db_url, "db", "current", "--json"))["current"] == older


@pytest.mark.slow
def test_a_full_disk_is_reported_by_cause_and_damages_nothing(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "small", "1m") as small:
        database = small / "agent.db"
        with CompactStore.open(database) as store:
            sess = store.session("s1", now=T0)
            sess.append(user(REQUEST), timestamp=T0)
            filler = fill(small)
            with pytest.raises(DatabaseError) as caught:
                sess.append(assistant("a long answer " * 5_000), timestamp=T0 + 1)
            message = str(caught.value)
            assert "disk that holds the database is full" in message
            assert "Free space on it" in message
            assert "restore" not in message
            transcript = tmp_path / "t.jsonl"
            transcript.write_text(json.dumps(user("x " * 40_000)) + "\n")
            result = fails(
                invoke(str(database), "import", str(transcript), "--format", "anthropic"),
                "is full",
            )
            assert "restore" not in result.stderr
            filler.unlink()
            assert sess.messages() == [user(REQUEST)]  # nothing half-written, nothing lost
            sess.append(assistant("done"), timestamp=T0 + 2)


# -- --db before the command, JSON errors, closed pipes, invisible characters ----------------


def test_db_may_come_before_the_command(template: str, tmp_path: Path) -> None:
    after = ok(invoke(template, "sessions")).stdout
    before = CliRunner().invoke(cli, ["--db", template, "sessions"], env={"COMPACTSTORE_DB": None})
    assert ok(before).stdout == after
    # The command's own --db wins; the one before it wins over COMPACTSTORE_DB.
    missing = str(tmp_path / "missing.db")
    result = CliRunner().invoke(
        cli, ["--db", missing, "show", "s1", "--db", template], env={"COMPACTSTORE_DB": missing}
    )
    assert ok(result).stdout == ok(invoke(template, "show", "s1")).stdout
    result = CliRunner().invoke(
        cli, ["--db", template, "history", "s1"], env={"COMPACTSTORE_DB": missing}
    )
    assert ok(result).stdout == ok(invoke(template, "history", "s1")).stdout


def test_with_json_errors_are_json_on_stderr(template: str, shared: CompactStore) -> None:
    result = invoke(template, "show", "nope", "--json")
    assert result.exit_code == 1
    assert result.stdout == ""
    assert json.loads(result.stderr) == {
        "error": f"no session 'nope' in {shared.location}",
        "kind": "NotFoundError",
    }
    usage = invoke(template, "compact", "s1", "--up-to", "x", "--json")
    assert usage.exit_code == 2
    assert json.loads(usage.stderr)["kind"] == "UsageError"
    assert "'x' is not a valid integer" in json.loads(usage.stderr)["error"]
    # Without --json the same failure is one Error: line.
    fails(invoke(template, "show", "nope"), "no session 'nope'")


@pytest.mark.slow
def test_piping_into_head_exits_quietly_with_0(tmp_path: Path) -> None:
    database = tmp_path / "agent.db"
    with CompactStore.open(database) as store:
        messages = [
            user(f"line {i}: " + "x" * 200) if i % 2 == 0 else assistant("ok") for i in range(2_000)
        ]
        store.session("big", now=T0).extend(messages)
    reader = subprocess.Popen(
        [sys.executable, "-m", "compactstore", "export", "big", "--db", str(database)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert reader.stdout is not None and reader.stderr is not None
    first = reader.stdout.readline()  # what `head -1` reads before it exits
    reader.stdout.close()
    errors = reader.stderr.read()
    reader.stderr.close()
    assert reader.wait(timeout=120) == 0, errors
    assert json.loads(first)["content"].startswith("line 0: ")
    assert errors == b""


@pytest.mark.parametrize(
    "session_id",
    ["admin\u202egpj.exe", "s\u200b1", "\ufeffs1", "s\u20661\u2069", "s\u200d1"],
    ids=["rlo", "zwsp", "bom", "isolate", "zwj"],
)
def test_session_ids_with_bidi_or_zero_width_characters_are_refused(
    session_id: str, template: str, tmp_path: Path
) -> None:
    with CompactStore.open(tmp_path / "agent.db") as store:
        with pytest.raises(InvalidInputError, match="invisible formatting characters"):
            store.session(session_id)
        assert store.sessions() == []
    fails(invoke(template, "show", session_id), "invisible formatting characters")
    transcript = tmp_path / "t.jsonl"
    transcript.write_text(json.dumps(user("hi")) + "\n")
    fails(
        invoke(template, "import", str(transcript), "--session", session_id),
        "invisible formatting characters",
    )


@pytest.mark.slow_on_postgres
def test_rollback_compaction_undoes_it_and_every_later_one(
    copy: str, copy_store: CompactStore, db_snapshot: Snapshot
) -> None:
    sess = copy_store.get_session("s1")
    (second,) = [c for c in sess.compactions() if c.boundary is not None and c.boundary.id == 2]
    assert second.id is not None
    later = [c.id for c in sess.compactions() if c.id is not None and c.id >= second.id]
    before = db_snapshot(copy_store)
    asked = invoke(copy, "rollback", "s1", "--compaction", str(second.id), input="n\n")
    assert asked.exit_code == 1
    assert (
        f"Roll back compaction {second.id} and every compaction after it, 1 boundary of "
        "session s1?" in asked.stderr
    )
    fails(invoke(copy, "rollback", "s1", "--compaction", "999", "--yes"), "no compaction 999")
    both = invoke(copy, "rollback", "s1", "--boundary", "1", "--compaction", "1", "--yes")
    assert both.exit_code == 2 and "give --boundary or --compaction, not both" in both.stderr
    assert db_snapshot(copy_store) == before

    data = as_json(
        invoke(copy, "rollback", "s1", "--compaction", str(second.id), "--yes", "--json")
    )

    assert [b["id"] for b in data["rolled_back"]] == [2]
    assert [b.id for b in sess.boundaries()] == [1]
    undone = [c.id for c in sess.compactions() if c.rolled_back_at is not None]
    assert undone == later
    fails(
        invoke(copy, "rollback", "s1", "--compaction", str(second.id), "--yes"),
        "already rolled back",
    )
