"""Replay: what it refuses, how an applied replay is dated, and the
recorded inputs and summary state it reads back, which a damaged row cannot turn into a
Python traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import create_engine, text

from compactstore import (
    CompactionConfig,
    CompactStore,
    ConflictError,
    DatabaseError,
)
from compactstore._cli import cli
from compactstore.models import ImportedBoundary, ImportedMessage
from tests.conftest import Snapshot
from tests.helpers import T0, assistant, new_session, user, words


def _compacted(store: CompactStore, sid: str = "s") -> tuple[int, float]:
    """A session with one manual compaction at T0 + 100; (boundary id, its time)."""
    chat = new_session(store, sid=sid, config=CompactionConfig(token_factor=1.0))
    chat.request("Port the parser to Rust, keeping the tests green.")
    chat.chatter(12, chars=400)
    at = T0 + 100
    result = chat.sess.compact(now=at)
    assert result.boundary is not None and result.boundary.id is not None
    return result.boundary.id, at


def _imported(store: CompactStore) -> int:
    messages = [
        user("Fix the flaky test in tests/test_io.py."),
        assistant(words(300)),
        user("Now the docs too."),
        assistant("Done."),
    ]
    boundary = ImportedBoundary(first_kept_index=2, summary_text="The agent's own summary.")
    items = [ImportedMessage(m) for m in messages]
    sess = store.import_session("imported", [*items[:2], boundary, *items[2:]])
    (imported,) = sess.boundaries()
    assert imported.id is not None
    return imported.id


def test_a_boundary_imported_from_a_transcript_is_refused_with_a_clear_error(
    store: CompactStore, db_snapshot: Snapshot
) -> None:
    boundary_id = _imported(store)
    sess = store.session("imported")
    before = db_snapshot(store)
    for apply in (False, True):
        with pytest.raises(ConflictError, match="imported from a transcript"):
            sess.replay(boundary_id, apply=apply)
    assert db_snapshot(store) == before


@pytest.mark.slow
def test_the_cli_replay_of_an_imported_boundary_is_one_line_and_fails(tmp_path: Path) -> None:
    db = str(tmp_path / "imported.db")
    with CompactStore.open(db) as store:
        boundary_id = _imported(store)
    result = CliRunner().invoke(
        cli,
        ["replay", "imported", "--boundary", str(boundary_id), "--db", db],
        env={"COMPACTSTORE_DB": None},
    )
    assert result.exit_code != 0
    assert result.stderr.count("\n") == 1, result.stderr
    assert "imported from a transcript" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_an_applied_replay_is_dated_now_while_the_engines_keep_the_recorded_time(
    store: CompactStore,
) -> None:
    boundary_id, recorded_at = _compacted(store)
    sess = store.session("s")
    original = sess.compactions()[-1]
    later = T0 + 5_000
    replayed = sess.replay(boundary_id, apply=True, now=later)
    # The summary (whose header names the time) and the cut are the recorded ones.
    assert replayed.summary_text == original.summary_text
    assert replayed.created_at == later
    assert replayed.boundary is not None and replayed.boundary.timestamp == later
    history = sess.compactions()
    assert [c.created_at for c in history] == [recorded_at, later]
    assert history[0].rolled_back_at == later
    (old,) = [b for b in sess.boundaries(include_rolled_back=True) if b.id == boundary_id]
    assert old.rolled_back_at == later


def test_an_applied_replay_without_now_is_dated_by_the_clock(store: CompactStore) -> None:
    boundary_id, recorded_at = _compacted(store)
    sess = store.session("s")
    replayed = sess.replay(boundary_id, apply=True)
    assert replayed.created_at is not None and replayed.created_at > recorded_at + 10**6


def test_a_dry_replay_shows_the_recorded_time(store: CompactStore) -> None:
    boundary_id, recorded_at = _compacted(store)
    assert store.session("s").replay(boundary_id, now=T0 + 5_000).created_at == recorded_at


def _damage(store: CompactStore, statement: str) -> None:
    engine = create_engine(store.engine.url)
    try:
        with engine.begin() as connection:
            connection.execute(text(statement))
    finally:
        engine.dispose()


@pytest.mark.parametrize(
    "inputs",
    ["{}", '{"call": "manual", "now": 1.0}', '{"call": "banana", "now": 1, "last_seq": 1}', "[1"],
)
def test_damaged_replay_inputs_are_a_database_error_naming_the_database(
    store: CompactStore, inputs: str
) -> None:
    boundary_id, _ = _compacted(store)
    _damage(store, f"UPDATE compactions SET inputs = '{inputs}'")
    with pytest.raises(DatabaseError, match="holds data this compactstore cannot read") as caught:
        store.session("s").replay(boundary_id)
    assert store.location in str(caught.value)


def test_inputs_recorded_under_the_older_key_still_replay(store: CompactStore) -> None:
    boundary_id, _ = _compacted(store)
    sess = store.session("s")
    expected = sess.replay(boundary_id)
    _damage(store, "UPDATE compactions SET inputs = REPLACE(inputs, '\"call\"', '\"kind\"')")
    assert sess.replay(boundary_id) == expected


def test_a_damaged_summary_state_is_a_database_error(store: CompactStore) -> None:
    _compacted(store)
    _damage(store, "UPDATE compact_boundaries SET summary_state = '{\"topics\": 7}'")
    # A new process: nothing cached.
    url = store.engine.url.render_as_string(hide_password=False)
    with CompactStore.open(url) as fresh, pytest.raises(DatabaseError, match="cannot read"):
        fresh.session("s").active_context()
