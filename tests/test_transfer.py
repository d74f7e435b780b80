"""Whole sessions between databases: copy, backup/restore, delete and prune.

A copied session must be the same session: the same active context, log, boundaries,
compactions, breaker, memory and blobs, and replays that give the same results, with the
row ids the target allocated (compared through the copy's id map). Every table of the schema
is covered because the copier walks the schema's table list; a test adds a table to prove it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import (
    Column,
    ForeignKey,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    create_engine,
    func,
    insert,
    select,
    text,
)

from compactstore import CompactStore, ConflictError, NotFoundError, Session
from compactstore._core.origins import Given, extend_with_origins, read_origins
from compactstore._demo import run_demo
from compactstore._importers import read_transcript
from compactstore._simulate import simulate_transcript
from compactstore.db import schema
from compactstore.db import transfer as db_transfer
from compactstore.db.migrate import alembic_config, head_revision, stored_revision
from compactstore.errors import InvalidInputError, SchemaError
from compactstore.transfer import backup, copy_sessions, prune, restore, staging
from tests.conftest import fresh_database, snapshot
from tests.helpers import HOUR, T0, Chat, busy_log, every_stage, new_session, opened, words
from tests.test_simulate import transcript, write_jsonl

IdMap = dict[str, dict[int, int]]


def rich_session(store: CompactStore, sid: str) -> Session:
    """A session that fills every table: compactions of every kind, model calls, edits and
    blobs, a read-dedup entry, memory, a rollback and an applied replay (replay_of and the hidden
    rolled_back_after), and messages after the last compaction."""
    chat = new_session(store, sid=sid)
    busy_log(chat)
    _, (tool_use_id,) = chat.calls([("read_file", {"file_path": "src/app.py"})])
    chat.result(tool_use_id, words(900, "app"), file_path="src/app.py")
    for _ in every_stage(chat):
        chat.sess.record_usage(chat.sess.token_usage(), now=chat.tick())  # a model call
    sess = chat.sess
    live = sess.boundaries()
    sess.rollback(now=T0 + 2 * HOUR)  # the newest boundary goes
    sess.replay(live[-1].id or 0, apply=True)  # and comes back as a replay of it
    sess.remember("decision", "Keep the nightly on Python 3.12", now=T0 + 2 * HOUR)
    chat.chatter(6, tag="tail", chars=300)
    # A message given through an integration, with its framework form (message_origins).
    extend_with_origins(
        sess,
        "langchain",
        [Given({"role": "user", "content": "via LangChain"}, "lc-1", '{"type":"human"}')],
    )
    return sess


def portrait(sess: Session, ids: IdMap | None = None) -> dict[str, Any]:
    """Everything a caller can read of a session, with row ids taken back to the source's
    through the inverse of ``ids`` (old -> new per table)."""
    back = {table: {new: old for old, new in m.items()} for table, m in (ids or {}).items()}

    def old(table: str, value: int | None) -> int | None:
        return value if value is None or ids is None else back[table][value]

    def boundary(b: Any) -> Any:
        if b is None:
            return None
        return b.model_copy(
            update={
                "id": old("compact_boundaries", b.id),
                "parent_id": old("compact_boundaries", b.parent_id),
            }
        ).model_dump()

    compactions = [
        {
            **c.model_dump(exclude={"boundary"}),
            "id": old("compactions", c.id),
            "boundary": boundary(c.boundary),
        }
        for c in sess.compactions()
    ]
    boundaries = sess.boundaries(include_rolled_back=True)
    replays = {
        old("compact_boundaries", b.id): _replayed(sess, b.id or 0, back) for b in boundaries
    }
    blob_ids = sorted({blob for c in sess.compactions() for blob in c.blob_ids})
    return {
        "active_context": sess.active_context(),
        "usage": sess.token_usage(),
        "log": sess.messages(),
        "boundaries": [boundary(b) for b in boundaries],
        "compactions": compactions,
        "breaker": sess.breaker(),
        "memories": [
            m.model_copy(update={"id": old("memory_entries", m.id)}) for m in sess.memories()
        ],
        "blobs": {blob: sess.get_blob(blob) for blob in blob_ids},
        "replays": replays,
        "origins": read_origins(sess, "langchain", range(sess.message_count())),
    }


def _replayed(sess: Session, boundary_id: int, back: IdMap) -> Any:
    try:
        result = sess.replay(boundary_id)
    except ConflictError as exc:
        return str(exc)
    return (result.summary_text, result.messages, result.tokens_after, result.removed_seqs)


def row_counts(store: CompactStore, sid: str) -> dict[str, int]:
    counts = {}
    with store.engine.connect() as connection:
        for table_plan in db_transfer.plan():
            counts[table_plan.table.name] = connection.execute(
                select(func.count())
                .select_from(table_plan.table)
                .where(table_plan.session_column == sid)
            ).scalar_one()
    return counts


def stored_rows(store: CompactStore, sid: str, ids: IdMap | None = None) -> dict[str, Any]:
    """Every row of the session in every table, in source order, with the renumbered ids
    (keys, references and ids inside JSON) taken back through ``ids``."""
    back = {table: {new: old for old, new in m.items()} for table, m in (ids or {}).items()}
    out = {}
    with store.engine.connect() as connection:
        for table_plan in db_transfer.plan():
            renumbered = dict(table_plan.references)
            if table_plan.key is not None:
                renumbered[table_plan.key.name] = table_plan.table.name
            rows = []
            for row in connection.execute(
                select(table_plan.table)
                .where(table_plan.session_column == sid)
                .order_by(*table_plan.order)
            ):
                values = dict(row._mapping)
                for column, table in renumbered.items():
                    if ids is not None and values[column] is not None:
                        values[column] = back[table][values[column]]
                for column, keys in table_plan.json_references.items():
                    document = json.loads(values[column])
                    for key, table in keys.items():
                        if ids is not None and document.get(key) is not None:
                            document[key] = back[table][document[key]]
                    values[column] = document
                rows.append(values)
            out[table_plan.table.name] = rows
    return out


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A SQLite store holding two rich sessions, built once for the module."""
    path = tmp_path_factory.mktemp("source") / "source.db"
    with opened(path) as store:
        rich_session(store, "alpha")
        rich_session(store, "beta")
        yield store


@pytest.mark.slow
def test_the_source_session_fills_every_table(source: CompactStore) -> None:
    # Otherwise the copy tests below would not prove every table is carried.
    counts = row_counts(source, "alpha")
    # schema_revisions, the database's record of its own schema, belongs to no session.
    assert set(counts) == set(schema.metadata.tables) - {schema.schema_revisions.name}
    # A lease lives only while its compaction call runs (its commit releases it).
    assert counts.pop("compaction_leases") == 0
    # Background compaction jobs are covered by tests/test_background.py.
    assert counts.pop("compaction_jobs") == 0
    assert all(counts.values()), counts


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
@pytest.mark.parametrize("target_state", ["empty", "non-empty"])
def test_copy_keeps_everything_modulo_the_id_map(
    source: CompactStore, backend: str, target_state: str, tmp_path: Path
) -> None:
    before = portrait(source.get_session("alpha"))
    with fresh_database(backend, tmp_path) as url, opened(url) as target:
        if target_state == "non-empty":
            copy_sessions(source, target, ["beta"])  # so every id the copy allocates differs
            resident = portrait(target.get_session("beta"))
        report = copy_sessions(source, target, ["alpha"])
        assert report.sessions == ["alpha"]
        assert report.rows == row_counts(source, "alpha")
        if target_state == "non-empty":
            moved = report.ids["compactions"]
            assert all(new != old for old, new in moved.items())
            assert portrait(target.get_session("beta")) == resident
        copied = target.get_session("alpha")
        assert portrait(copied, report.ids) == before
        assert stored_rows(target, "alpha", report.ids) == stored_rows(source, "alpha")
        assert row_counts(target, "alpha") == row_counts(source, "alpha")
        # The copy is a live session: it carries on like the original.
        assert copied.process_request(now=T0 + 3 * HOUR) is not None
        copied.append({"role": "user", "content": "and now?"})


@pytest.mark.slow
def test_copy_of_every_session_from_sqlite_to_postgres_and_back(
    source: CompactStore, tmp_path: Path
) -> None:
    before = portrait(source.get_session("alpha"))
    with fresh_database("postgres", tmp_path, "transfer") as url, opened(url) as middle:
        first = copy_sessions(source, middle)
        assert first.sessions == ["alpha", "beta"]
        with opened(tmp_path / "back.db") as back:
            copy_sessions(source, back, ["beta"])
            second = copy_sessions(middle, back, ["alpha"])
            # Compose the two maps: source -> PostgreSQL -> SQLite.
            ids = {
                table: {
                    old: second.ids[table][mid]
                    for old, mid in m.items()
                    if mid in second.ids[table]
                }
                for table, m in first.ids.items()
            }
            assert portrait(back.get_session("alpha"), ids) == before


@pytest.mark.slow
def test_a_session_that_exists_in_the_target_is_a_conflict_and_nothing_is_written(
    source: CompactStore, db_url: str
) -> None:
    with opened(db_url) as target:
        new_session(target, sid="beta").request("another beta")
        rows = snapshot(target)
        with pytest.raises(ConflictError, match="'beta' already exists"):
            copy_sessions(source, target)  # alpha would fit; beta does not
        assert snapshot(target) == rows
        with pytest.raises(NotFoundError, match="'gamma'"):
            copy_sessions(source, target, ["alpha", "gamma"])
        assert snapshot(target) == rows


@pytest.mark.slow
def test_a_failure_half_way_leaves_the_target_unchanged(
    source: CompactStore, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with opened(db_url) as target:
        rows = snapshot(target)
        real = db_transfer._copy_table

        def failing(source: Any, target: Any, table_plan: Any, *args: Any) -> int:
            if table_plan.table.name == "tool_result_blobs":
                raise OSError("disk full")
            return real(source, target, table_plan, *args)

        monkeypatch.setattr(db_transfer, "_copy_table", failing)
        with pytest.raises(OSError, match="disk full"):
            copy_sessions(source, target, ["alpha"])
        assert snapshot(target) == rows


# -- driven by the schema's table list -------------------------------------------------------


def _extended() -> MetaData:
    """The schema plus a table added "later": a session column and a compaction id."""
    metadata = MetaData()
    for table in schema.metadata.sorted_tables:
        table.to_metadata(metadata)
    Table(
        "annotations",
        metadata,
        Column("id", Integer, primary_key=True, autoincrement=True),
        Column("session_id", String(255), ForeignKey("sessions.id"), nullable=False),
        Column("compaction_id", Integer, ForeignKey("compactions.id")),
        Column("note", Text, nullable=False),
    )
    return metadata


@pytest.mark.slow
def test_a_table_added_to_the_schema_is_copied_and_deleted_without_naming_it(
    tmp_path: Path,
) -> None:
    metadata = _extended()
    annotations = metadata.tables["annotations"]
    engines = {}
    for name in ("from", "to"):
        engines[name] = create_engine(f"sqlite:///{tmp_path / name}.db")
        metadata.create_all(engines[name])
    with opened(tmp_path / "rich.db") as rich:
        rich_session(rich, "s")
        rich_session(rich, "resident")  # so the ids the target allocates differ
        for name, sid in (("from", "s"), ("to", "resident")):
            with engines[name].begin() as to, rich.engine.connect() as frm:
                db_transfer.copy_sessions(frm, to, [sid])
    with engines["from"].begin() as connection:
        compaction = connection.execute(select(func.max(schema.compactions.c.id))).scalar_one()
        connection.execute(
            insert(annotations),
            [{"session_id": "s", "compaction_id": compaction, "note": "checked by hand"}],
        )
    with engines["from"].connect() as frm, engines["to"].begin() as to:
        report = db_transfer.copy_sessions(frm, to, ["s"], metadata=metadata)
    assert report.rows["annotations"] == 1
    with engines["to"].connect() as connection:
        row = connection.execute(select(annotations)).one()
    assert row.note == "checked by hand"
    assert row.compaction_id == report.ids["compactions"][compaction] != compaction
    with engines["to"].begin() as connection:
        assert db_transfer.delete_sessions(connection, ["s"], metadata=metadata) == ["s"]
    with engines["to"].connect() as connection:
        assert connection.execute(select(func.count()).select_from(annotations)).scalar() == 0
        assert connection.execute(select(schema.sessions.c.id)).scalars().all() == ["resident"]


def test_a_table_without_a_session_column_cannot_be_planned() -> None:
    metadata = _extended()
    Table("settings", metadata, Column("name", String(32), primary_key=True))
    with pytest.raises(SchemaError, match="table settings has no session_id column"):
        db_transfer.plan(metadata)


def test_every_id_column_is_either_renumbered_or_kept_on_purpose() -> None:
    # An integer column named like an id (id, *_id, *_of, *_by, *_after but not token counts)
    # must be a renumbered
    # key, a reference the copier rewrites, or declared per-session: a new one fails here
    # until db/transfer.py says which it is.
    undecided = []
    for table_plan in db_transfer.plan():
        for column in table_plan.table.columns:
            name = column.name
            id_like = name == "id" or name.endswith(("_id", "_of", "_by"))
            id_like = id_like or (name.endswith("_after") and not name.startswith("tokens_"))
            if not id_like or not isinstance(column.type, Integer):
                continue
            decided = (
                column is table_plan.key
                or name in table_plan.references
                or (table_plan.table.name, name) in db_transfer.PER_SESSION_IDS
            )
            if not decided:
                undecided.append(f"{table_plan.table.name}.{name}")
    assert not undecided


# -- memory ------------------------------------------------------------------------------


@pytest.mark.slow
def test_copy_streams_rows_in_bounded_batches(tmp_path: Path) -> None:
    # 12 MB of messages, copied while Python allocates a fraction of that.
    with opened(tmp_path / "big.db") as big:
        chat = new_session(big, sid="big")
        chat.request("go")
        payload = words(8_000, "big")
        for start in range(0, 1_500, 500):
            chat.extend(
                [
                    {"role": "assistant" if i % 2 else "user", "content": payload}
                    for i in range(start, start + 500)
                ]
            )
        with opened(tmp_path / "copy.db") as target:
            tracemalloc.start()
            try:
                report = copy_sessions(big, target, ["big"])
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
    assert report.rows["messages"] == 1_501
    assert peak < 4_000_000, peak


# -- backup and restore ------------------------------------------------------------------


@pytest.mark.slow
def test_backup_is_one_self_contained_file_and_restores_everything(
    source: CompactStore, db_url: str, tmp_path: Path
) -> None:
    file = tmp_path / "alpha.backup"
    backup(source, file, ["alpha"])
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("alpha")) == [
        "alpha.backup"
    ]
    assert file.stat().st_mode & 0o077 == 0
    with opened(db_url) as target:
        copy_sessions(source, target, ["beta"])
        report = restore(target, file)
        assert report.sessions == ["alpha"]
        assert portrait(target.get_session("alpha"), report.ids) == portrait(
            source.get_session("alpha")
        )
        with pytest.raises(ConflictError):
            restore(target, file)


@pytest.mark.slow
def test_backup_refuses_to_overwrite_unless_told_and_never_its_own_database(
    source: CompactStore, tmp_path: Path
) -> None:
    file = tmp_path / "all.backup"
    backup(source, file)
    with pytest.raises(InvalidInputError, match="exists"):
        backup(source, file)
    backup(source, file, ["beta"], overwrite=True)
    with opened(tmp_path / "restored.db") as target:
        assert restore(target, file).sessions == ["beta"]
    own = source.location
    with pytest.raises(InvalidInputError, match="database being backed up"):
        backup(source, own, overwrite=True)


@pytest.mark.slow
def test_a_backup_from_an_older_schema_is_upgraded_in_a_copy_and_a_newer_one_refused(
    source: CompactStore, tmp_path: Path
) -> None:
    from alembic import command

    file = tmp_path / "old.backup"
    backup(source, file, ["alpha"])
    engine = create_engine(f"sqlite:///{file}")
    with engine.begin() as connection:
        config = alembic_config()
        config.attributes["connection"] = connection
        # Back to before the summarizer columns (b7e4c1d09a52) and everything after them.
        command.downgrade(config, "c3a9e5f17d20")
        older = stored_revision(connection)
    engine.dispose()
    assert older != head_revision()
    written = file.read_bytes()
    with opened(tmp_path / "t.db") as target:
        report = restore(target, file)
        restored = portrait(target.get_session("alpha"), report.ids)
        expected = portrait(source.get_session("alpha"))
        # The older schema has no columns saying how each summary was written.
        for compaction in expected["compactions"]:
            compaction["summary"] = None
            # Nor the edit policy each ran under (a later revision: unknown in its rows).
            compaction["edit_policy"] = None
        assert restored == expected
    assert file.read_bytes() == written  # only ever read
    engine = create_engine(f"sqlite:///{file}")
    with engine.begin() as connection:
        connection.execute(text("UPDATE alembic_version SET version_num = 'f00000000000'"))
    engine.dispose()
    with opened(tmp_path / "t2.db") as target, pytest.raises(SchemaError, match="f00000000000"):
        restore(target, file)


def test_restore_of_something_that_is_not_a_backup(tmp_path: Path) -> None:
    with opened(tmp_path / "t.db") as target:
        with pytest.raises(NotFoundError, match="no backup file"):
            restore(target, tmp_path / "missing.backup")
        junk = tmp_path / "junk.backup"
        junk.write_text("not a database\n" * 100)
        with pytest.raises(InvalidInputError, match="not a compactstore backup"):
            restore(target, junk)


# -- delete and prune --------------------------------------------------------------------


@pytest.mark.slow
def test_delete_session_removes_its_rows_from_every_table_and_nothing_else(
    source: CompactStore, db_url: str
) -> None:
    with opened(db_url) as store:
        copy_sessions(source, store)
        beta = portrait(store.get_session("beta"))
        handle = store.get_session("alpha")
        handle.active_context()  # cached in this process
        store.delete_session("alpha")
        assert all(count == 0 for count in row_counts(store, "alpha").values())
        assert portrait(store.get_session("beta")) == beta
        with pytest.raises(NotFoundError):
            handle.append({"role": "user", "content": "still there?"})
        with pytest.raises(NotFoundError):
            store.get_session("alpha")
        with pytest.raises(NotFoundError):
            store.delete_session("alpha")
        # A new session under the same id starts from nothing (no cached context leaks in).
        fresh = new_session(store, sid="alpha")
        fresh.request("a new start")
        assert store.get_session("alpha").active_context() == [
            {"role": "user", "content": "a new start"}
        ]


def test_prune_deletes_sessions_idle_for_longer_than_the_limit(db_url: str) -> None:
    day = 86_400.0
    with opened(db_url) as store:
        # (session, days ago it was created, days ago its last message came)
        for sid, created, last in (("old", 40, 40), ("recent", 3, 3), ("revived", 90, 2)):
            sess = store.session(sid, now=T0 + (100 - created) * day)
            sess.append({"role": "user", "content": sid}, timestamp=T0 + (100 - last) * day)
        now = T0 + 100 * day
        assert prune(store, 30, now=now, dry_run=True) == ["old"]
        assert len(store.sessions()) == 3
        assert prune(store, 30, now=now) == ["old"]
        assert sorted(s.id for s in store.sessions()) == ["recent", "revived"]
        assert prune(store, 30, now=now) == []
        with pytest.raises(InvalidInputError):
            prune(store, -1, now=now)


# -- staging -----------------------------------------------------------------------------


@pytest.mark.slow
def test_staging_copies_when_done_and_leaves_the_target_untouched_on_error(
    db_url: str,
) -> None:
    with opened(db_url) as target:
        rows = snapshot(target)
        with pytest.raises(KeyboardInterrupt), staging(target) as stage:
            Chat(stage.session("half", now=T0), "anthropic").chatter(20)
            raise KeyboardInterrupt
        assert snapshot(target) == rows
        with staging(target) as stage:
            Chat(stage.session("whole", now=T0), "anthropic").chatter(20)
            staged = stage.get_session("whole").messages()
        assert target.get_session("whole").messages() == staged


# -- demo and simulate build apart: a stopped run leaves no half session ---------------------


def play(what: str, store: CompactStore, source: Path, progress: Any = None) -> tuple[str, int]:
    """Play the demo or simulate a transcript into ``store``: (session id, messages)."""
    if what == "demo":
        played = run_demo(store, steps=40, progress=progress)
        return played.session_id, played.messages
    transcript = read_transcript(source)
    report = simulate_transcript(transcript, window=8_000, store=store, progress=progress)
    return f"simulate-{len(store.sessions())}", report.messages


# Plays into DB and kills itself (SIGKILL, as `kill -9` does) when its progress reaches half
# way: a deterministic point, with no waiting.
KILLED_CHILD = """
import os, signal, sys
from compactstore import CompactStore
from tests.test_transfer import play

def progress(done, total):
    if total and done * 2 >= total:
        os.kill(os.getpid(), signal.SIGKILL)

what, db, source = sys.argv[1:4]
with CompactStore.open(db) as store:
    play(what, store, source, progress)
print("finished")
"""


def half_way(done: int, total: int) -> None:
    if total and done * 2 >= total:
        raise KeyboardInterrupt  # as Ctrl-C does


def resident_rows(db: str) -> dict[str, list[tuple[Any, ...]]]:
    with opened(db) as target:
        new_session(target, sid="resident").request("keep me")
        return snapshot(target)


@pytest.mark.slow
@pytest.mark.parametrize("what", ["demo", "simulate"])
def test_a_run_killed_half_way_leaves_no_half_session(tmp_path: Path, what: str) -> None:
    source = write_jsonl(tmp_path / "t.jsonl", transcript("anthropic", turns=24))
    db = str(tmp_path / "target.db")
    rows = resident_rows(db)
    (tmp_path / "tmp").mkdir()
    done = subprocess.run(
        [sys.executable, "-c", KILLED_CHILD, what, db, str(source)],
        cwd=Path(__file__).parent.parent,
        env={**os.environ, "TMPDIR": str(tmp_path / "tmp")},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    with opened(db) as target:
        assert snapshot(target) == rows


@pytest.mark.slow
@pytest.mark.parametrize("what", ["demo", "simulate"])
def test_a_run_interrupted_half_way_leaves_no_half_session(
    db_url: str, tmp_path: Path, what: str
) -> None:
    source = write_jsonl(tmp_path / "t.jsonl", transcript("anthropic", turns=24))
    rows = resident_rows(db_url)
    with opened(db_url) as target:
        with pytest.raises(KeyboardInterrupt):
            play(what, target, source, half_way)
        assert snapshot(target) == rows
        # A run that completes copies its whole session in.
        sid, messages = play(what, target, source)
        assert target.get_session(sid).message_count() == messages
