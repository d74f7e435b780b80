"""Damaged databases: a clear error naming the file and what to do, never a traceback.

A populated SQLite file is damaged in one way per case — truncated, pages overwritten, not
SQLite at all, a schema revision newer than the code, a missing table or column, rows a
person or another program mangled — and then opened and used through the API and the
command line. Every call either works or raises a CompactStoreError whose message names
the file; every command exits 0, or 1 with one ``Error:`` line naming the file.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from compactstore import CompactStore, CompactStoreError, DatabaseError, SchemaError
from compactstore._cli import cli
from compactstore.db.migrate import head_revision
from tests.conftest import snapshot

T0 = 1_700_000_000.0
PAGE = 4096
# What a message must offer the reader besides naming the file.
ADVICE = ("backup", "another file", "upgrade", "db upgrade", "restore")

Damage = Callable[[Path], None]


def _populate(path: Path) -> None:
    with CompactStore.open(path) as store:
        for sid in ("a", "b"):
            sess = store.session(sid, context_window=20_000, now=T0)
            t = T0
            for i in range(60):
                role = "user" if i % 2 == 0 else "assistant"
                text_ = f"{sid} {i} " + "lorem ipsum dolor " * 40
                sess.append({"role": role, "content": text_}, timestamp=t)
                t += 1
                if i % 10 == 5:
                    call = {"type": "tool_use", "id": f"toolu_{sid}{i}", "name": "cat", "input": {}}
                    sess.append({"role": "assistant", "content": [call]}, timestamp=t)
                    sess.append_tool_result(
                        f"toolu_{sid}{i}", "data\n" * 1200, tool_name="cat", timestamp=t
                    )
            sess.process_request(now=t + 10)
            sess.compact(now=t + 20)
            sess.remember("fact", "the tests live in tests/", now=t + 30)


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("damaged") / "template.db"
    _populate(path)
    assert not path.with_name(path.name + "-wal").exists(), "closing checkpoints the WAL"
    return path


# -- ways to damage a file ------------------------------------------------------------------------


def _truncate(fraction: float) -> Damage:
    def damage(path: Path) -> None:
        size = path.stat().st_size
        with path.open("r+b") as handle:
            handle.truncate(max(0, int(size * fraction)))

    return damage


def _truncate_to(size: int) -> Damage:
    def damage(path: Path) -> None:
        with path.open("r+b") as handle:
            handle.truncate(size)

    return damage


def _overwrite_pages(seed: int, count: int) -> Damage:
    def damage(path: Path) -> None:
        rng = random.Random(seed)
        size = path.stat().st_size
        with path.open("r+b") as handle:
            for _ in range(count):
                handle.seek(rng.randrange(PAGE, size - 64))
                handle.write(rng.randbytes(64))

    return damage


def _replace_with(data: bytes) -> Damage:
    def damage(path: Path) -> None:
        path.write_bytes(data)

    return damage


def _sql(*statements: str) -> Damage:
    """Damage made with SQL, as a person with the sqlite3 shell might."""

    def damage(path: Path) -> None:
        connection = sqlite3.connect(path)
        try:
            connection.execute("PRAGMA foreign_keys=OFF")
            for statement in statements:
                connection.execute(statement)
            connection.commit()
        finally:
            connection.close()

    return damage


def _garbage_wal(path: Path) -> None:
    path.with_name(path.name + "-wal").write_bytes(random.Random(3).randbytes(3 * PAGE))


CASES = [
    pytest.param(_truncate(0.5), True, id="truncated-to-half"),
    pytest.param(_truncate(0.9), True, id="truncated-to-90-percent"),
    pytest.param(_truncate_to(PAGE), True, id="truncated-to-the-first-page"),
    pytest.param(_truncate_to(100), True, id="truncated-inside-the-header"),
    pytest.param(_overwrite_pages(1, 20), True, id="pages-overwritten"),
    pytest.param(_overwrite_pages(2, 3), False, id="a-few-bytes-overwritten"),
    pytest.param(
        _overwrite_pages(5, 200),
        True,
        id="pages-shredded",
    ),
    pytest.param(
        lambda p: p.write_bytes(b"SQLite format 4\x00" + p.read_bytes()[16:]),
        True,
        id="header-magic-overwritten",
    ),
    pytest.param(_replace_with(random.Random(7).randbytes(64 * 1024)), True, id="random-bytes"),
    pytest.param(_replace_with(b"hello, I am a text file\n" * 100), True, id="a-text-file"),
    pytest.param(
        _replace_with(b'{"role": "user", "content": "hi"}\n'), True, id="a-transcript-given-as-db"
    ),
    pytest.param(_replace_with(b"\x1f\x8b\x08\x00" + bytes(200)), True, id="a-gzip-file"),
    pytest.param(
        _sql("UPDATE alembic_version SET version_num = 'ffffffffffff'"), True, id="newer-schema"
    ),
    pytest.param(_sql("DROP TABLE alembic_version"), True, id="no-schema-revision"),
    pytest.param(_sql("DROP TABLE messages"), True, id="missing-messages-table"),
    pytest.param(_sql("DROP TABLE breaker_state"), True, id="missing-breaker-table"),
    pytest.param(_sql("DROP TABLE sessions"), True, id="missing-sessions-table"),
    pytest.param(
        _sql("DROP VIEW compaction_history", "ALTER TABLE messages DROP COLUMN dedup_of_seq"),
        True,
        id="missing-column",
    ),
    pytest.param(
        _sql("""UPDATE sessions SET config = '{"future_setting": 1}' WHERE id = 'a'"""),
        True,
        id="config-with-an-unknown-key",
    ),
    pytest.param(
        _sql("UPDATE sessions SET config = 'not json' WHERE id = 'a'"),
        True,
        id="config-not-json",
    ),
    pytest.param(
        _sql("UPDATE messages SET payload = '{broken' WHERE session_id = 'a' AND seq = 70"),
        True,
        id="payload-not-json",
    ),
    pytest.param(_garbage_wal, False, id="garbage-wal-file"),
]


def use_session(
    store: CompactStore, sid: str, attempt: Callable[[str, Callable[[], object]], None]
) -> None:
    """Every kind of call on one session of a damaged database, each judged by ``attempt``."""
    attempt(f"{sid}.messages", lambda: store.get_session(sid).messages())
    attempt(f"{sid}.context", lambda: store.get_session(sid).active_context())
    attempt(f"{sid}.compactions", lambda: store.get_session(sid).compactions())
    attempt(f"{sid}.blob", lambda: store.get_session(sid).get_blob(1))
    attempt(
        f"{sid}.append",
        lambda: store.get_session(sid).append(
            {"role": "user", "content": "after the damage"}, timestamp=T0 + 900
        ),
    )
    attempt(
        f"{sid}.process_request",
        lambda: store.get_session(sid).process_request(now=T0 + 1000),
    )
    attempt(f"{sid}.breaker", lambda: store.get_session(sid).breaker())


def _check_api(path: Path) -> list[str]:
    """Open and use the store; return the problems (anything but a clear error)."""
    problems: list[str] = []

    def judge(name: str, exc: Exception) -> None:
        if not isinstance(exc, CompactStoreError):
            problems.append(f"{name}: raw {type(exc).__name__}: {str(exc)[:200]}")
        elif str(path) not in str(exc):
            problems.append(f"{name}: {type(exc).__name__} does not name the file: {exc}")
        elif isinstance(exc, DatabaseError | SchemaError) and not any(
            word in str(exc) for word in ADVICE
        ):
            problems.append(f"{name}: {type(exc).__name__} gives no advice: {exc}")

    def attempt(name: str, fn: Callable[[], object]) -> None:
        try:
            fn()
        except Exception as exc:
            judge(name, exc)

    try:
        store = CompactStore.open(path)
    except Exception as exc:
        judge("open", exc)
        return problems
    try:
        attempt("sessions", store.sessions)
        for sid in ("a", "b"):
            use_session(store, sid, attempt)
        hello = {"role": "user", "content": "hi"}
        attempt("new session", lambda: store.session("c", now=T0).append(hello, timestamp=T0))
    finally:
        store.close()
    return problems


COMMANDS = [
    ["sessions"],
    ["show", "a"],
    ["history", "a", "--json"],
    ["export", "b"],
    ["blob", "a", "1"],
    ["breaker", "b"],
]
ADMIN_COMMANDS = [["stats"], ["db", "current"]]


def _check_cli(path: Path, commands: list[list[str]] = COMMANDS) -> list[str]:
    problems: list[str] = []
    for command in commands:
        result = CliRunner().invoke(cli, [*command, "--db", str(path)])
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            problems.append(f"{command}: traceback: {result.exception!r}")
        elif result.exit_code not in (0, 1):
            problems.append(f"{command}: exit {result.exit_code}: {result.stderr}")
        elif result.exit_code == 1 and "--json" in command:  # one JSON object on stderr
            if str(path) not in json.loads(result.stderr)["error"]:
                problems.append(f"{command}: the JSON error does not name the file")
        elif result.exit_code == 1 and (
            not result.stderr.startswith("Error: ")
            or result.stderr.count("\n") != 1
            or str(path) not in result.stderr
        ):
            problems.append(f"{command}: not one 'Error:' line naming the file: {result.stderr!r}")
    return problems


@pytest.mark.parametrize(("damage", "breaks"), CASES)
def test_a_damaged_file_gives_a_clear_error_naming_it(
    template: Path, tmp_path: Path, damage: Damage, breaks: bool
) -> None:
    path = tmp_path / "damaged.db"
    shutil.copy(template, path)
    damage(path)
    problems = _check_api(path)
    if not breaks:
        assert not problems, "\n".join(problems)
    problems += _check_cli(path)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(_replace_with(b"hello, I am a text file\n" * 100), id="a-text-file"),
        pytest.param(_truncate(0.5), id="truncated-to-half"),
        pytest.param(_sql("DROP TABLE messages"), id="missing-messages-table"),
    ],
)
def test_stats_and_db_current_on_a_damaged_file_name_it(
    template: Path, tmp_path: Path, damage: Damage
) -> None:
    path = tmp_path / "damaged.db"
    shutil.copy(template, path)
    damage(path)
    problems = _check_cli(path, ADMIN_COMMANDS)
    assert not problems, "\n".join(problems)


def test_a_newer_schema_is_refused_naming_both_revisions_and_the_file(
    template: Path, tmp_path: Path
) -> None:
    path = tmp_path / "newer.db"
    shutil.copy(template, path)
    _sql("UPDATE alembic_version SET version_num = 'ffffffffffff'")(path)
    with pytest.raises(SchemaError) as caught:
        CompactStore.open(path)
    message = str(caught.value)
    assert str(path) in message and "ffffffffffff" in message and head_revision() in message
    assert "upgrade compactstore" in message
    result = CliRunner().invoke(cli, ["db", "upgrade", "--db", str(path)])
    assert result.exit_code == 1 and "ffffffffffff" in result.stderr


def test_garbage_in_the_wal_file_is_ignored_and_the_data_is_intact(
    template: Path, tmp_path: Path
) -> None:
    path = tmp_path / "wal.db"
    shutil.copy(template, path)
    with CompactStore.open(template) as store:
        before = snapshot(store)
    _garbage_wal(path)
    with CompactStore.open(path) as store:
        assert snapshot(store) == before


def test_an_empty_file_is_a_new_database(tmp_path: Path) -> None:
    path = tmp_path / "empty.db"
    path.touch()
    with CompactStore.open(path) as store:
        assert store.sessions() == []
        store.session("s", now=T0).append({"role": "user", "content": "hi"}, timestamp=T0)


def test_a_directory_is_not_a_database(tmp_path: Path) -> None:
    with pytest.raises(DatabaseError) as caught:
        CompactStore.open(tmp_path)
    assert str(tmp_path) in str(caught.value)
    result = CliRunner().invoke(cli, ["sessions", "--db", str(tmp_path)])
    assert result.exit_code == 1 and result.stderr.startswith("Error: ")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("damage", "name"),
    [
        pytest.param(_replace_with(b"not a database at all\n" * 50), "text", id="text"),
        pytest.param(
            _sql("UPDATE alembic_version SET version_num = 'ffffffffffff'"), "newer", id="newer"
        ),
    ],
)
def test_the_real_command_prints_one_error_line_and_no_traceback(
    template: Path, tmp_path: Path, damage: Damage, name: str
) -> None:
    """Through the installed entry point (python -m compactstore), not just CliRunner."""
    path = tmp_path / f"{name}.db"
    shutil.copy(template, path)
    damage(path)
    done = subprocess.run(
        [sys.executable, "-m", "compactstore", "show", "a", "--db", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COMPACTSTORE_DB": ""},
    )
    assert done.returncode == 1, done
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith("Error: ") and done.stderr.count("\n") == 1, done.stderr
    assert str(path) in done.stderr


# -- PostgreSQL -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_an_unreachable_server_is_a_clear_error_without_the_password() -> None:
    url = "postgresql+psycopg://agent:s3cret-pw@127.0.0.1:1/nowhere?connect_timeout=3"
    with pytest.raises(DatabaseError) as caught:
        CompactStore.open(url)
    message = str(caught.value)
    assert "s3cret-pw" not in message
    assert "127.0.0.1" in message and "nowhere" in message
    result = CliRunner().invoke(cli, ["sessions", "--db", url])
    assert result.exit_code == 1 and result.stderr.startswith("Error: ")
    assert result.stderr.count("\n") == 1 and "s3cret-pw" not in result.stderr


def test_a_postgres_database_with_a_missing_table_or_newer_schema(db_url: str) -> None:
    if "://" not in db_url:
        pytest.skip("the PostgreSQL half of this test (SQLite is covered above)")
    with CompactStore.open(db_url) as store:
        store.session("a", now=T0).append({"role": "user", "content": "hi"}, timestamp=T0)
    engine = create_engine(db_url)
    try:
        with engine.begin() as connection:
            connection.execute(text("DROP TABLE breaker_state"))
        with CompactStore.open(db_url) as store, pytest.raises(DatabaseError) as caught:
            store.get_session("a").process_request(now=T0 + 10)
        database = make_url(db_url).database
        assert database is not None and database in str(caught.value)
        assert any(word in str(caught.value) for word in ADVICE)
        with engine.begin() as connection:
            connection.execute(text("UPDATE alembic_version SET version_num = 'ffffffffffff'"))
        with pytest.raises(SchemaError, match="ffffffffffff"):
            CompactStore.open(db_url)
        result = CliRunner().invoke(cli, ["show", "a", "--db", db_url])
        assert result.exit_code == 1 and result.stderr.startswith("Error: ")
    finally:
        engine.dispose()


def test_an_unreachable_server_is_not_called_damaged() -> None:
    with pytest.raises(DatabaseError) as caught:
        CompactStore.open("postgresql+psycopg://agent@127.0.0.1:1/nowhere?connect_timeout=3")
    message = str(caught.value).lower()
    assert "backup" not in message and "damaged" not in message, message
