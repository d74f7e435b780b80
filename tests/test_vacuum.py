"""Deleting sessions gives the space back: at once in a SQLite file compactstore made
(incremental auto-vacuum), with `compactstore db vacuum` in an older one and on PostgreSQL;
`delete` and `prune` say how much was freed."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from compactstore import CompactStore
from compactstore._cli import cli
from compactstore._store.admin import database_space, vacuum
from compactstore.transfer import prune
from tests.helpers import T0, assistant, opened, user

DAY = 86_400.0


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), env={"COMPACTSTORE_DB": None})


def fill(store: CompactStore, sid: str, *, created: float = T0, messages: int = 60) -> None:
    """A session of about ``messages`` x 8 KB, its messages dated ``created``."""
    sess = store.session(sid, now=created)
    for n in range(messages // 2):
        sess.append(user(f"question {n} " + "q" * 8_000), timestamp=created)
        sess.append(assistant(f"answer {n} " + "a" * 8_000), timestamp=created)


def file_size(path: Path) -> int:
    """The size of a closed SQLite file (closing checkpointed its WAL into it)."""
    assert not Path(f"{path}-wal").exists()
    return path.stat().st_size


def older_file(path: Path) -> Path:
    """A database as an older compactstore made it: WAL switched on before its tables, so
    without auto-vacuum."""
    connection = sqlite3.connect(path)
    connection.execute("PRAGMA journal_mode=WAL")
    connection.close()
    CompactStore.open(path).close()
    connection = sqlite3.connect(path)
    assert connection.execute("PRAGMA auto_vacuum").fetchone() == (0,)
    connection.close()
    return path


@pytest.mark.slow
def test_deleting_from_a_new_sqlite_file_shrinks_it(tmp_path: Path) -> None:
    path = tmp_path / "agent.db"
    with opened(path) as store:
        for sid in ("keep", "old-1", "old-2"):
            fill(store, sid, created=T0 if sid != "keep" else T0 + 100 * DAY)
    full = file_size(path)
    with opened(path) as store:
        store.delete_session("old-1")
        assert prune(store, 30, now=T0 + 101 * DAY) == ["old-2"]
        assert database_space(store).free_bytes == 0
    # Two of three equal sessions gone: the file is about a third of what it was.
    assert file_size(path) < full * 0.45
    with opened(path) as store:
        assert [info.id for info in store.sessions()] == ["keep"]
        assert len(store.get_session("keep").messages()) == 60


@pytest.mark.slow
def test_delete_and_prune_say_how_much_was_freed(tmp_path: Path) -> None:
    path = tmp_path / "agent.db"
    with opened(path) as store:
        fill(store, "gone")
        fill(store, "stale", created=1_000.0)
        fill(store, "keep", created=10**10)
    result = invoke("delete", "gone", "--yes", "--db", str(path))
    assert result.exit_code == 0, result.output
    freed = int(result.stdout.split("Freed ")[1].split(" bytes")[0].replace(",", ""))
    assert freed > 400_000  # 60 messages of 8 KB
    assert "stay free" not in result.stdout  # nothing is left for `db vacuum`
    result = invoke("prune", "--older-than", "30", "--yes", "--json", "--db", str(path))
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["freed_bytes"] > 400_000


@pytest.mark.slow
def test_db_vacuum_gives_an_older_files_space_back(tmp_path: Path) -> None:
    path = older_file(tmp_path / "old.db")
    with opened(path) as store:
        fill(store, "gone")
        fill(store, "keep")
    full = file_size(path)
    result = invoke("delete", "gone", "--yes", "--db", str(path))
    assert result.exit_code == 0, result.output
    assert "Freed 0 bytes" in result.stdout
    assert "stay free inside the file for new rows; `compactstore db vacuum`" in result.stdout
    assert file_size(path) == full
    result = invoke("db", "vacuum", "--json", "--db", str(path))
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["freed_bytes"] == report["bytes_before"] - report["bytes_after"] > 400_000
    assert file_size(path) < full * 0.6
    # VACUUM switched incremental auto-vacuum on: from now on deleting gives space back.
    connection = sqlite3.connect(path)
    assert connection.execute("PRAGMA auto_vacuum").fetchone() == (2,)
    connection.close()


@pytest.mark.slow
def test_vacuum_runs_outside_a_transaction_on_both_backends(db_url: str) -> None:
    with opened(db_url) as store:
        fill(store, "gone", messages=20)
        fill(store, "keep", messages=20)
        store.delete_session("gone")
        report = vacuum(store)  # PostgreSQL refuses VACUUM inside a transaction block
        assert report.location == store.location
        if "://" not in db_url:
            assert report.after.bytes <= report.before.bytes
        assert len(store.get_session("keep").messages()) == 20
    result = invoke("db", "vacuum", "--db", db_url)
    assert result.exit_code == 0, result.output
    assert ("given back" if "://" not in db_url else "VACUUM (ANALYZE) done") in result.stdout


def test_db_vacuum_never_creates_a_database(tmp_path: Path) -> None:
    missing = tmp_path / "typo.db"
    result = invoke("db", "vacuum", "--db", str(missing))
    assert result.exit_code == 1
    assert "no compactstore database at" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_store_opened_while_another_process_writes_reads_at_once(tmp_path: Path) -> None:
    """Incremental auto-vacuum is set only on a new file: on an existing one the pragma
    waits for the write lock, so every connection opened during another writer's
    transaction waited for it (a reader must never wait for a writer under WAL)."""
    path = tmp_path / "store.db"
    with CompactStore.open(str(path)) as store:
        store.session("s", context_window=10_000).append(user("hello"))
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")
    writer.execute("UPDATE sessions SET context_window = context_window")
    try:
        with CompactStore.open(str(path), auto_migrate=False) as store:
            assert [s.id for s in store.sessions()] == ["s"]
    finally:
        writer.execute("ROLLBACK")
        writer.close()
