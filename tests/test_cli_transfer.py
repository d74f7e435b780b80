"""`compactstore backup`, `restore`, `delete` and `prune`: what a person types, on SQLite and
PostgreSQL. A restored session shows the same active context (`show`) and the same history
(`history`) as the one backed up, row ids read through the map `restore --json` prints."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from compactstore._cli import cli
from tests.helpers import new_session, opened
from tests.test_transfer import rich_session


def run(*args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), input=input)


def as_json(*args: str) -> Any:
    result = run(*args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def back_to_source(document: Any, ids: dict[str, dict[str, int]]) -> Any:
    """`show`/`history` JSON with the restored database's row ids replaced by the source's."""
    back = {table: {new: int(old) for old, new in m.items()} for table, m in ids.items()}
    boundaries, compactions = back["compact_boundaries"], back["compactions"]
    if "boundary_id" in document and document["boundary_id"] is not None:
        document["boundary_id"] = boundaries[document["boundary_id"]]
    for compaction in document.get("compactions", []):
        compaction["id"] = compactions[compaction["id"]]
        boundary = compaction["boundary"]
        if boundary is not None:
            boundary["id"] = boundaries[boundary["id"]]
            if boundary["parent_id"] is not None:
                boundary["parent_id"] = boundaries[boundary["parent_id"]]
    return document


def seen(db: str, sid: str) -> tuple[Any, Any]:
    return (
        as_json("show", sid, "--full", "--db", db),
        as_json("history", sid, "--db", db),
    )


@pytest.mark.slow
@pytest.mark.parametrize("target_state", ["empty", "non-empty"])
def test_backup_then_restore_shows_the_same_context_and_history(
    db_url: str, tmp_path: Path, target_state: str
) -> None:
    with opened(db_url) as store:
        rich_session(store, "alpha")
        rich_session(store, "beta")
    before = {sid: seen(db_url, sid) for sid in ("alpha", "beta")}
    file = tmp_path / "all.compactstore"
    backed = as_json("backup", "--all", "-o", str(file), "--db", db_url)
    assert backed["sessions"] == ["alpha", "beta"]
    assert backed["rows"]["tool_result_blobs"] > 0

    target = str(tmp_path / "target.db")
    if target_state == "non-empty":
        with opened(target) as store:
            rich_session(store, "resident")
    restored = as_json("restore", str(file), "--db", target)
    assert restored["sessions"] == ["alpha", "beta"]
    for sid in ("alpha", "beta"):
        # backup renumbered (source -> file), restore again (file -> target): compose.
        ids = {
            table: {
                old: restored["ids"][table][str(mid)] for old, mid in backed["ids"][table].items()
            }
            for table in backed["ids"]
        }
        show, history = seen(target, sid)
        assert back_to_source(show, ids) == before[sid][0]
        assert back_to_source(history, ids) == before[sid][1]
    again = run("restore", str(file), "--db", target)
    assert again.exit_code == 1
    assert "already exist" in again.stderr


@pytest.mark.slow
def test_backup_of_one_session_and_its_usage_errors(tmp_path: Path) -> None:
    db = str(tmp_path / "agent.db")
    with opened(db) as store:
        new_session(store, sid="s1").request("one")
        new_session(store, sid="s2").request("two")
    file = tmp_path / "s1.compactstore"
    out = run("backup", "s1", "-o", str(file), "--db", db)
    assert out.exit_code == 0, out.output
    assert out.stdout == f"Backed up 1 session of {db} to {file}: 1 message, 0 compactions, " \
        "0 blobs, 0 memory entries.\n"  # fmt: skip
    assert run("backup", "s1", "--db", db).exit_code == 2  # no -o
    assert run("backup", "-o", str(tmp_path / "x"), "--db", db).exit_code == 2  # nothing chosen
    assert run("backup", "s1", "--all", "-o", str(tmp_path / "x"), "--db", db).exit_code == 2
    exists = run("backup", "s2", "-o", str(file), "--db", db)
    assert exists.exit_code == 1 and "exists" in exists.stderr
    assert run("backup", "s2", "-o", str(file), "--force", "--db", db).exit_code == 0
    own = run("backup", "--all", "-o", db, "--force", "--db", db)
    assert own.exit_code == 1 and "database being backed up" in own.stderr
    missing = run("backup", "nope", "-o", str(tmp_path / "y"), "--db", db)
    assert missing.exit_code == 1 and "'nope'" in missing.stderr
    assert not (tmp_path / "y").exists()
    restored = as_json("restore", str(file), "--db", str(tmp_path / "fresh.db"))
    assert restored["sessions"] == ["s2"]


@pytest.mark.slow
def test_delete_asks_first_and_removes_the_session(db_url: str) -> None:
    with opened(db_url) as store:
        new_session(store, sid="keep").request("stay")
        rich_session(store, "gone")
    refused = run("delete", "gone", "--db", db_url, input="n\n")
    assert refused.exit_code == 1
    assert "Delete session gone (" in refused.stderr
    assert {s["id"] for s in as_json("sessions", "--db", db_url)} == {"keep", "gone"}
    done = run("delete", "gone", "--db", db_url, input="y\n")
    assert done.exit_code == 0, done.output
    assert "Deleted session gone" in done.stdout
    assert ("Freed " if "://" not in db_url else "autovacuum") in done.stdout
    assert [s["id"] for s in as_json("sessions", "--db", db_url)] == ["keep"]
    again = run("delete", "gone", "--yes", "--db", db_url)
    assert again.exit_code == 1 and "no session 'gone'" in again.stderr


def test_delete_on_a_mistyped_database_creates_nothing(tmp_path: Path) -> None:
    typo = tmp_path / "no-such-dir" / "agnet.db"
    out = run("delete", "s1", "--yes", "--db", str(typo))
    assert out.exit_code == 1
    assert not typo.parent.exists()


def test_prune_lists_asks_and_deletes_the_idle_sessions(db_url: str) -> None:
    with opened(db_url) as store:
        new_session(store, sid="ancient").request("from 2023")  # created at T0 (2023)
        store.session("today").append({"role": "user", "content": "now"})
    dry = run("prune", "--older-than", "30", "--dry-run", "--db", db_url)
    assert dry.exit_code == 0, dry.output
    assert dry.stdout == (
        "1 session idle for more than 30 days: ancient (dry run: nothing deleted).\n"
    )
    refused = run("prune", "--older-than", "30", "--db", db_url, input="n\n")
    assert refused.exit_code == 1 and "(ancient)" in refused.stderr
    done = as_json("prune", "--older-than", "30", "--yes", "--db", db_url)
    freed = done.pop("freed_bytes")
    assert done == {"older_than_days": 30.0, "dry_run": False, "sessions": ["ancient"]}
    assert isinstance(freed, int) and freed >= 0
    assert [s["id"] for s in as_json("sessions", "--db", db_url)] == ["today"]
    nothing = run("prune", "--older-than", "30", "--db", db_url)
    assert nothing.stdout == "Deleted 0 sessions idle for more than 30 days.\n"
    assert run("prune", "--older-than", "-1", "--db", db_url).exit_code == 2
