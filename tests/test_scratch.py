"""What a killed import, simulate or backup leaves behind is removed by the next run, and
said; what a run still working (here or in another process) holds is never touched."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest
from click.testing import CliRunner

from compactstore._cli import cli
from compactstore._importers import import_file
from compactstore._scratch import LOCK_NAME, STALE_SECONDS, remove_leftovers, scratch_dir
from compactstore.errors import CompactStoreWarning
from tests.conftest import REPO, fresh_database
from tests.helpers import opened

TRANSCRIPT = '{"role": "user", "content": "hello"}\n{"role": "assistant", "content": "hi"}\n'
HOUR_AGO = time.time() - STALE_SECONDS - 60


@pytest.fixture
def tmpdir_(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The system's temporary directory, for this test: a directory of its own."""
    with fresh_database("sqlite", tmp_path):
        pass  # the tests' template database is made (in the real TMPDIR) before
    directory = tmp_path / "tmp"
    directory.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(directory))
    return directory


def aged(path: Path) -> Path:
    """``path`` (and what a directory holds) last changed more than STALE_SECONDS ago."""
    for item in [*path.iterdir(), path] if path.is_dir() else [path]:
        os.utime(item, (HOUR_AGO, HOUR_AGO))
    return path


def names(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.iterdir())


def test_only_directories_no_run_owns_are_removed(tmpdir_: Path) -> None:
    # Left by a killed run: its owner lock exists and nobody holds it.
    dead = tmpdir_ / "compactstore-staging-dead"
    dead.mkdir()
    (dead / LOCK_NAME).touch()
    (dead / "staging.db").write_bytes(b"x" * 1000)
    # Left by an older compactstore (no owner lock): removed once untouched for an hour.
    old = tmpdir_ / "compactstore-import-old"
    old.mkdir()
    (old / "input").write_bytes(b"y" * 10)
    aged(old)
    recent = tmpdir_ / "compactstore-import-recent"
    recent.mkdir()
    (recent / "input").write_bytes(b"z")
    # Another program's files are never looked at.
    (tmpdir_ / "other-staging-x").mkdir()
    with ExitStack() as stack:
        with pytest.warns(CompactStoreWarning, match=r"removed 2 temporary files \(1,010 bytes\)"):
            live = stack.enter_context(scratch_dir("compactstore-staging-"))  # a working run
        (live / "staging.db").write_bytes(b"w")
        assert names(tmpdir_) == sorted(
            [
                "compactstore-import-recent",
                "other-staging-x",
                live.name,
            ]
        )
        # A second sweep (another import starting now) leaves the working one alone.
        assert remove_leftovers(tmpdir_, ["compactstore-"]) == []
        assert live.is_dir()
    assert names(tmpdir_) == ["compactstore-import-recent", "other-staging-x"]


@pytest.mark.slow
def test_the_next_import_removes_a_killed_imports_staging_and_says_so(
    tmpdir_: Path, tmp_path: Path
) -> None:
    dead = tmpdir_ / "compactstore-staging-killed"
    dead.mkdir()
    (dead / LOCK_NAME).touch()
    (dead / "staging.db").write_bytes(b"x" * 4096)
    transcript = tmp_path / "t.jsonl"
    transcript.write_text(TRANSCRIPT)
    with fresh_database("sqlite", tmp_path) as url, opened(url) as store:
        with pytest.warns(CompactStoreWarning, match=r"removed 1 temporary file \(4,096 bytes\)"):
            import_file(store, transcript)
        assert [info.id for info in store.sessions()] == ["t"]
    assert names(tmpdir_) == []


@contextmanager
def child(script: str, tmpdir: Path) -> Iterator[subprocess.Popen[str]]:
    """A Python process running ``script`` with ``tmpdir`` as its TMPDIR."""
    env = {**os.environ, "TMPDIR": str(tmpdir), "PYTHONPATH": str(REPO)}
    process = subprocess.Popen(
        [sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        yield process
    finally:
        process.kill()
        process.wait()
        assert process.stdout is not None
        process.stdout.close()


# An import whose token counter stops it inside its staging database until it is killed.
STUCK_IMPORT = """
import sys, time
from compactstore import CompactStore
from compactstore._importers import import_file

def count(text):
    print("staging", flush=True)
    time.sleep(600)
    return 1

store = CompactStore.open(sys.argv[1] if len(sys.argv) > 1 else {db!r}, token_counter=count)
import_file(store, {transcript!r})
"""


@pytest.mark.slow
def test_kill_9_during_an_import_then_another_import_cleans_up_but_spares_a_running_one(
    tmpdir_: Path, tmp_path: Path
) -> None:
    transcript = tmp_path / "t.jsonl"
    transcript.write_text(TRANSCRIPT)
    with fresh_database("sqlite", tmp_path) as url:
        script = STUCK_IMPORT.format(db=url, transcript=str(transcript))
        with child(script, tmpdir_) as killed, child(script, tmpdir_) as running:
            for process in (killed, running):
                assert process.stdout is not None
                assert process.stdout.readline() == "staging\n"
            assert len(names(tmpdir_)) == 2
            killed.kill()
            killed.wait()
            other = tmp_path / "other.jsonl"
            other.write_text(TRANSCRIPT)
            result = CliRunner().invoke(cli, ["import", str(other), "--db", url])
            assert result.exit_code == 0, result.output
            assert "Warning: removed 1 temporary file" in result.stderr
            assert "left by an earlier compactstore run that was stopped" in result.stderr
            # The running import's staging directory is still there, and in use.
            (left,) = names(tmpdir_)
            assert (tmpdir_ / left / "staging.db").exists()
            assert running.poll() is None


@pytest.mark.slow
def test_the_next_backup_removes_what_a_killed_backup_left_beside_its_output(
    tmp_path: Path,
) -> None:
    out = tmp_path / "backups"
    out.mkdir()
    # An older compactstore's partial file with its side files, an hour old ...
    for name in (".nightly.db.1a2b3c4d.partial", ".nightly.db.1a2b3c4d.partial-wal"):
        (out / name).write_bytes(b"x" * 100)
        aged(out / name)
    # ... and this version's partial directory whose run was killed.
    killed = out / ".nightly.db.k1ll3d.partial"
    killed.mkdir()
    (killed / LOCK_NAME).touch()
    (killed / "nightly.db").write_bytes(b"y" * 100)
    # An export's temporary file and another backup's leftovers are not this backup's.
    (out / ".nightly.db.abc.tmp").write_bytes(b"z")
    (out / ".weekly.db.1a2b3c4d.partial").write_bytes(b"w")
    aged(out / ".weekly.db.1a2b3c4d.partial")
    with fresh_database("sqlite", tmp_path) as url:
        result = CliRunner().invoke(
            cli, ["backup", "--all", "-o", str(out / "nightly.db"), "--db", url]
        )
    assert result.exit_code == 0, result.output
    assert "Warning: removed 2 temporary files (300 bytes)" in result.stderr
    assert names(out) == [".nightly.db.abc.tmp", ".weekly.db.1a2b3c4d.partial", "nightly.db"]
