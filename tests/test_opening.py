"""Opening a database: only the commands (and the ``create=True`` opens) meant to set one up
create anything; another program's database is refused untouched unless asked; a failed
open leaves nothing beside the file, and its error names the real cause."""

from __future__ import annotations

import hashlib
import shutil
import sqlite3
import time
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.pool import QueuePool

from compactstore import CompactStore
from compactstore._cli import cli
from compactstore.errors import DatabaseError, NotFoundError, SchemaError
from tests.conftest import fresh_database
from tests.helpers import T0, opened, user
from tests.test_cli import remount_read_only, tmpfs

TRANSCRIPT = '{"role": "user", "content": "hello"}\n{"role": "assistant", "content": "hi"}\n'

# Commands that change a database but never create one, as a person would type them.
WRITE_COMMANDS = [
    ["compact", "s1"],
    ["rollback", "s1", "--yes"],
    ["breaker", "s1", "--reset"],
    ["replay", "s1", "--boundary", "1"],
    ["worker", "--once", "--summarizer", "tests.helpers:cli_summarizer"],
    ["delete", "s1", "--yes"],
    ["prune", "--older-than", "1", "--yes"],
]


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), env={"COMPACTSTORE_DB": None})


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def foreign_sqlite(path: Path) -> Path:
    """Another program's SQLite file: a table with a row and a view."""
    connection = sqlite3.connect(path)
    connection.executescript(
        "CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT);"
        "INSERT INTO notes (body) VALUES ('mine');"
        "CREATE VIEW note_bodies AS SELECT body FROM notes;"
    )
    connection.close()
    return path


@pytest.mark.parametrize("command", WRITE_COMMANDS, ids=" ".join)
def test_a_write_command_on_a_mistyped_path_creates_nothing(
    command: list[str], tmp_path: Path
) -> None:
    missing = tmp_path / "typo" / "agent.db"
    result = invoke(*command, "--db", str(missing))
    assert result.exit_code == 1, result.output
    assert f"database at {missing}" in result.stderr
    assert "check the path" in result.stderr
    assert list(tmp_path.iterdir()) == []
    # An existing empty file is no database either, and stays as it was.
    missing.parent.mkdir()
    missing.touch()
    result = invoke(*command, "--db", str(missing))
    assert result.exit_code == 1, result.output
    assert sorted(p.name for p in missing.parent.iterdir()) == ["agent.db"]
    assert missing.stat().st_size == 0


@pytest.mark.empty_database
@pytest.mark.slow_on_postgres
def test_open_with_create_false_never_sets_a_database_up(db_url: str, tmp_path: Path) -> None:
    with pytest.raises(NotFoundError, match=r"no compactstore database at .*check the path"):
        CompactStore.open(db_url, create=False)
    if "://" not in db_url:
        assert not Path(db_url).exists()
    else:
        engine = create_engine(db_url)
        with engine.connect() as connection:
            assert inspect(connection).get_table_names() == []
        engine.dispose()
    # create=True (the default) sets it up; afterwards create=False opens it.
    with opened(db_url) as store:
        store.session("s1", now=T0).append(user("hello"), timestamp=T0)
    with opened(db_url, create=False) as store:
        assert [info.id for info in store.sessions()] == ["s1"]


def test_another_programs_sqlite_file_is_refused_untouched(tmp_path: Path) -> None:
    theirs = foreign_sqlite(tmp_path / "theirs.db")
    before = digest(theirs)
    for kwargs in ({}, {"create": False}, {"read_only": True}):
        with pytest.raises(SchemaError, match=r"not a compactstore database.*note_bodies, notes"):
            CompactStore.open(theirs, **kwargs)  # type: ignore[arg-type]
    transcript = tmp_path / "t.jsonl"
    transcript.write_text(TRANSCRIPT)
    for command in (["import", str(transcript)], ["demo", "--steps", "2"], ["db", "upgrade"]):
        result = invoke(*command, "--db", str(theirs))
        assert result.exit_code == 1, result.output
        assert "--force" in result.stderr
    # Not switched to WAL, no table added, nothing left beside it.
    assert digest(theirs) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.jsonl", "theirs.db"]
    # Asked for, the tables go beside theirs, which stay as they were.
    result = invoke("import", str(transcript), "--force", "--db", str(theirs))
    assert result.exit_code == 0, result.output
    connection = sqlite3.connect(theirs)
    assert connection.execute("SELECT body FROM note_bodies").fetchall() == [("mine",)]
    connection.close()
    with opened(theirs, create=False) as store:  # from now on a compactstore database
        assert [info.id for info in store.sessions()] == ["t"]


def test_db_upgrade_force_adds_the_tables_beside_another_programs(tmp_path: Path) -> None:
    theirs = foreign_sqlite(tmp_path / "theirs.db")
    assert invoke("db", "upgrade", "--force", "--db", str(theirs)).exit_code == 0
    assert invoke("sessions", "--db", str(theirs)).exit_code == 0


@pytest.mark.pg
@pytest.mark.slow
def test_another_programs_postgresql_database_is_refused_unless_allowed(tmp_path: Path) -> None:
    with fresh_database("postgres", tmp_path, "foreign", empty=True) as url:
        engine = create_engine(url)
        with engine.begin() as connection:
            connection.execute(text("CREATE TABLE orders (id integer PRIMARY KEY)"))
        with pytest.raises(SchemaError, match=r"not a compactstore database.*\(orders\)"):
            CompactStore.open(url)
        assert invoke("import", "-", "--session", "t", "--db", url).exit_code == 1
        with engine.connect() as connection:
            assert inspect(connection).get_table_names() == ["orders"]
        with opened(url, allow_other_tables=True) as store:
            store.session("s1", now=T0)
        with opened(url, create=False) as store:
            assert [info.id for info in store.sessions()] == ["s1"]
        engine.dispose()


@pytest.mark.parametrize(
    "command",
    [["compact", "s1"], ["import", "{transcript}"], ["sessions"], ["db", "upgrade"]],
    ids=" ".join,
)
def test_a_failed_command_on_a_file_that_is_no_database_leaves_nothing_beside_it(
    command: list[str], tmp_path: Path
) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("these are my notes, not a database\n" * 20)
    transcript = tmp_path / "t.jsonl"
    transcript.write_text(TRANSCRIPT)
    args = [part.format(transcript=transcript) for part in command]
    result = invoke(*args, "--db", str(notes))
    assert result.exit_code == 1, result.output
    assert "file is not a database" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "t.jsonl"]


def test_a_directory_given_as_the_database_is_called_one(tmp_path: Path) -> None:
    transcript = tmp_path / "t.jsonl"
    transcript.write_text(TRANSCRIPT)
    for command in (["compact", "s1"], ["import", str(transcript)], ["sessions"]):
        result = invoke(*command, "--db", str(tmp_path))
        assert result.exit_code == 1, result.output
        assert f"{tmp_path} is a directory, not a database file" in result.stderr
        assert "backup" not in result.stderr and "disk I/O" not in result.stderr
    with pytest.raises(DatabaseError, match="is a directory"):
        CompactStore.open(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.jsonl"]


@pytest.mark.slow
def test_writing_on_a_read_only_mount_says_the_mount_is_read_only(tmp_path: Path) -> None:
    transcript = tmp_path / "t.jsonl"
    transcript.write_text(TRANSCRIPT)
    with tmpfs(tmp_path / "ro", "8m") as mounted:
        database = mounted / "agent.db"
        with opened(tmp_path / "template.db") as store:
            store.session("s1", now=T0).append(user("hello"), timestamp=T0)
        shutil.copyfile(tmp_path / "template.db", database)
        remount_read_only(mounted)
        for command in (["compact", "s1"], ["import", str(transcript), "--session", "t2"]):
            result = invoke(*command, "--db", str(database))
            assert result.exit_code == 1, result.output
            assert "is mounted read-only" in result.stderr
            assert "directory exists" not in result.stderr
        result = invoke("import", str(transcript), "--db", str(mounted / "new.db"))
        assert result.exit_code == 1
        assert "mounted read-only" in result.stderr


def _connections(url: str) -> int:
    """How many connections the server has to the database at ``url`` (besides this one)."""
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            return int(
                connection.scalar(
                    text(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                        "AND pid <> pg_backend_pid()"
                    )
                )
            )
    finally:
        engine.dispose()


def _connections_drop_to(url: str, expected: int) -> bool:
    """Whether the server's connections to ``url`` come down to ``expected`` within 5 s: a
    backend whose client closed its connection ends a moment later, not at once."""
    deadline = time.monotonic() + 5
    while (count := _connections(url)) > expected and time.monotonic() < deadline:
        time.sleep(0.01)
    return count == expected


def test_a_closed_stores_engine_has_no_connection_and_serves_the_next_open(db_url: str) -> None:
    server = db_url.startswith("postgresql")
    before = _connections(db_url) if server else 0  # the test database's own
    first = CompactStore.open(db_url)
    first.session("s1", now=T0).append(user("hello"), timestamp=T0)
    engine = first.engine
    first.close()
    assert isinstance(engine.pool, QueuePool)
    assert engine.pool.checkedin() == engine.pool.checkedout() == 0
    assert not server or _connections_drop_to(db_url, before)
    # Two stores open at once never share an engine (nor its pool); the one opened first
    # gets the closed store's, already set up, and reads what it wrote.
    second, third = CompactStore.open(db_url), CompactStore.open(db_url)
    try:
        assert second.engine is engine and third.engine is not engine
        assert second.get_session("s1").messages() == [user("hello")]
        assert third.get_session("s1").messages() == [user("hello")]
        third.get_session("s1").append(user("again"), timestamp=T0)
    finally:
        second.close()
        third.close()
    assert not server or _connections_drop_to(db_url, before)
    # Other options are another engine.
    with CompactStore.open(db_url, read_only=True) as reader:
        assert reader.engine is not engine
        assert reader.get_session("s1").message_count() == 2


def test_an_in_memory_databases_engine_is_not_kept() -> None:
    with CompactStore.open("sqlite://") as first:
        engine = first.engine
        first.session("s1", now=T0)
    with CompactStore.open("sqlite://") as second:
        assert second.engine is not engine
        assert second.sessions() == []


def test_a_kept_sqlite_engine_opens_the_file_now_at_its_path(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    with CompactStore.open(path) as first:
        first.session("s1", now=T0).append(user("hello"), timestamp=T0)
    for leftover in tmp_path.iterdir():  # the database, its -wal, -shm and -writer files
        leftover.unlink()
    with CompactStore.open(path) as second:  # the kept engine, on a new database
        assert second.sessions() == []
        second.session("s2", now=T0).append(user("again"), timestamp=T0)
    assert (tmp_path / "store.db-writer").exists()  # its writers take turns on a new lock file
    with CompactStore.open(path, read_only=True) as reader:
        assert [info.id for info in reader.sessions()] == ["s2"]
