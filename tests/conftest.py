"""Shared fixtures: every backend test runs on a real SQLite file and a real PostgreSQL.

PostgreSQL tests need COMPACTSTORE_TEST_PG_URL (a database the tests may create databases
from; .ci/run starts a throwaway server and sets it). They carry the ``pg`` marker; without
the variable they are deselected, and the summary line says how many.

Tests marked ``corpus`` read real agent transcripts from the corpus root given by
COMPACTSTORE_CORPUS (default: ``../shared/corpus`` beside the repository); on a clone with no
corpus they are skipped, saying where they looked.
"""

from __future__ import annotations

import asyncio
import atexit
import gc
import itertools
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from compactstore import CompactStore
from compactstore._store.session import SessionStore
from compactstore.db.schema import metadata

# Property tests keep no example database and no time limits: on a machine the suite shares
# (two test workers, other jobs) generation and examples are slower, not wrong.
settings.register_profile(
    "compactstore", deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None
)
settings.load_profile("compactstore")

# Each test process keeps its temporary files in a directory of its own (children inherit
# it through TMPDIR): a store removes the leftovers of stopped runs from the temporary
# directory and warns that it did (compactstore._scratch), which depends on what other
# programs left in the machine's, and warnings are errors here.
_TMPDIR = tempfile.mkdtemp(prefix="compactstore-tests-")
os.chmod(_TMPDIR, 0o755)  # as /tmp: the tests that run as an unprivileged user reach into it
atexit.register(shutil.rmtree, _TMPDIR, True)
os.environ["TMPDIR"] = tempfile.tempdir = _TMPDIR

PG_URL = os.environ.get("COMPACTSTORE_TEST_PG_URL")
REPO = Path(__file__).resolve().parents[1]
CORPUS = Path(os.environ.get("COMPACTSTORE_CORPUS") or REPO.parent / "shared" / "corpus")
CORPUS_DEV = CORPUS / "dev"


def corpus_transcripts() -> list[Path]:
    """The dev corpus files of a kind compactstore imports (detected from their content):
    the sweeping tests take whatever transcripts are there and skip the rest (companion
    files, formats without an importer)."""
    from compactstore._importers import transcripts

    return transcripts(sorted(CORPUS_DEV.glob("*/*")))


# The PostgreSQL half of every backend-parametrised test carries the ``pg`` marker.
BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.pg)]

_counter = itertools.count()


def pytest_sessionstart(session: pytest.Session) -> None:
    """No garbage collection while the tests are collected (see pytest_collection_finish)."""
    gc.disable()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Move what collection made (the modules the tests import, provider SDKs included, and
    the test items: ~600,000 objects) out of the garbage collector's sight: they live until
    the process ends, and each full collection would scan them again (measured: 15 full
    collections took ~2.7 s of each worker's fast suite)."""
    gc.collect()
    gc.freeze()
    gc.enable()


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the PostgreSQL halves of ``slow_on_postgres`` tests slow; deselect the PostgreSQL
    tests when no server is configured (one count in the summary instead of a skip line
    each), and skip the corpus tests when the corpus is absent."""
    for item in items:
        if item.get_closest_marker("slow_on_postgres") and item.get_closest_marker("pg"):
            item.add_marker(pytest.mark.slow)
    if not PG_URL:
        deselected = [item for item in items if item.get_closest_marker("pg") is not None]
        if deselected:
            config.hook.pytest_deselected(items=deselected)
            items[:] = [item for item in items if item.get_closest_marker("pg") is None]
    if not CORPUS_DEV.is_dir():
        skip = pytest.mark.skip(
            reason=f"no transcript corpus at {CORPUS_DEV} (set COMPACTSTORE_CORPUS to its root)"
        )
        for item in items:
            if item.get_closest_marker("corpus") is not None:
                item.add_marker(skip)


def _pg_admin_url() -> str:
    assert PG_URL is not None
    return (
        make_url(PG_URL).set(drivername="postgresql+psycopg").render_as_string(hide_password=False)
    )


def postgres_url(name: str) -> str:
    """The URL of the test server's database ``name``."""
    return make_url(_pg_admin_url()).set(database=name).render_as_string(hide_password=False)


def drop_postgres(name: str) -> None:
    engine = create_engine(_pg_admin_url(), isolation_level="AUTOCOMMIT")
    with engine.connect() as connection:
        connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    engine.dispose()


def create_postgres(label: str, template: str | None = None) -> str:
    """A new database on the test server, a copy of ``template`` when given: its name."""
    name = f"cs_{label}_{os.getpid()}_{next(_counter)}_{uuid.uuid4().hex[:6]}"
    clause = "" if template is None else f' TEMPLATE "{template}"'
    engine = create_engine(_pg_admin_url(), isolation_level="AUTOCOMMIT")
    with engine.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"{clause}'))
    engine.dispose()
    return name


_templates: dict[str, str] = {}


def _template(backend: str) -> str:
    """A database at head made once per test process by ``CompactStore.open`` (the path of a
    SQLite file, or the name of a PostgreSQL database): a test's new database is a copy of
    it, which is quicker than creating one (SQLite: a file copy of ~1 ms, against ~10)."""
    if backend in _templates:
        return _templates[backend]
    if backend == "sqlite":
        directory = tempfile.mkdtemp(prefix="compactstore-template-")
        atexit.register(shutil.rmtree, directory, True)
        path = os.path.join(directory, "template.db")
        CompactStore.open(path).close()  # closing checkpoints the WAL into the file
        _templates[backend] = path
        return path
    name = create_postgres("template")
    url = postgres_url(name)
    CompactStore.open(url, auto_migrate=True).close()
    atexit.register(drop_postgres, name)
    _templates[backend] = name
    return name


# What a test may change in a PostgreSQL database beyond its rows, read from the catalogs
# (each one's count and newest row version among the objects made after initdb): a test that
# creates, alters, drops, grants or comments changes it, so its database is dropped instead
# of being emptied and handed to the next test.
_CATALOGS = {
    "pg_class": "oid",
    "pg_attribute": "attrelid",
    "pg_attrdef": "oid",
    "pg_constraint": "oid",
    "pg_index": "indexrelid",
    "pg_trigger": "oid",
    "pg_rewrite": "oid",
    "pg_proc": "oid",
    "pg_type": "oid",
    "pg_namespace": None,
    "pg_sequence": None,
    "pg_extension": None,
    "pg_policy": None,
    "pg_default_acl": None,
    "pg_largeobject_metadata": None,
    "pg_description": "objoid",
}
_THIS_DATABASE = "(SELECT oid FROM pg_database WHERE datname = current_database())"
_CATALOG_STATE = [
    f"(SELECT count(*) || '/' || max(xmin::text::bigint) FROM {catalog}"
    + (f" WHERE {key} >= 16384)" if key else ")")
    for catalog, key in _CATALOGS.items()
] + [
    f"(SELECT xmin FROM pg_database WHERE oid = {_THIS_DATABASE})",
    f"(SELECT count(*) || '/' || max(xmin::text::bigint) FROM pg_db_role_setting "
    f"WHERE setdatabase = {_THIS_DATABASE})",
]


class _PostgresDatabase:
    """A PostgreSQL database at head (a copy of the template) that this test process hands
    to one test after another: between two tests it is emptied, unless the test changed
    more than its rows (then it is dropped). Emptying one takes a few milliseconds where
    creating and dropping one takes tens, and a database in use keeps its catalog caches.

    ``keeper`` is a connection of its own to the database, idle between tests: it ends the
    connections a test left open, deletes the rows of every table that was empty in the
    copy, restarts the sequences, and checks that the catalogs and the rows of the tables
    that were not empty (the schema revisions) are as they were in the copy."""

    def __init__(self, name: str) -> None:
        import psycopg

        self.name = name
        self.url = postgres_url(name)
        libpq = (
            make_url(self.url).set(drivername="postgresql").render_as_string(hide_password=False)
        )
        self.keeper = psycopg.connect(libpq, autocommit=True)
        tables = {
            row[0]
            for row in self.keeper.execute(
                "SELECT relname FROM pg_class WHERE relkind IN ('r', 'p') "
                "AND relnamespace = 'public'::regnamespace"
            )
        }
        seeded = sorted(
            table
            for table in tables
            if self.keeper.execute(f'SELECT 1 FROM "{table}" LIMIT 1').fetchone()
        )
        emptied = [
            table.name
            for table in reversed(metadata.sorted_tables)
            if table.name in tables and table.name not in seeded
        ]
        # A table compactstore's models do not name cannot be emptied in a safe order.
        self.reusable = tables == {*seeded, *emptied}
        state = _CATALOG_STATE + [
            f"(SELECT md5(string_agg(row::text, ',' ORDER BY row::text)) FROM \"{table}\" AS row)"
            for table in seeded
        ]
        self.state_query = "SELECT concat_ws(' ', " + ", ".join(state) + ")"
        self.reset_script = "; ".join(
            [
                # Reading pg_stat_activity costs the server ~2.5 ms: only when the
                # database has another connection than this one.
                "DO $$ BEGIN IF pg_stat_get_db_numbackends("
                "(SELECT oid FROM pg_database WHERE datname = current_database())) > 1 THEN "
                "PERFORM pg_terminate_backend(pid, 10000) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid(); END IF; END $$",
                # A lock still held (a connection that outlived that) fails the reset, which
                # then drops the database, rather than waiting for ever.
                "SET LOCAL lock_timeout = '10s'",
                *(f'DELETE FROM "{table}"' for table in emptied),
                "SELECT setval(seqrelid, seqstart, false) FROM pg_sequence",
                self.state_query,
            ]
        )
        self.state = self.read_state()

    def read_state(self) -> str:
        return str(self.keeper.execute(self.state_query).fetchone()[0])  # type: ignore[index]

    def reset(self) -> bool:
        """Empty the database for the next test; False when it cannot be reused."""
        if not self.reusable:
            return False
        try:
            # One round trip, one transaction: rolled back as a whole if the state differs.
            self.keeper.execute("BEGIN")
            cursor = self.keeper.execute(self.reset_script)
            while cursor.nextset():
                pass
            row = cursor.fetchone()
            if row is None or row[0] != self.state:
                self.keeper.execute("ROLLBACK")
                return False
            self.keeper.execute("COMMIT")
        except Exception:
            return False
        return True

    def drop(self) -> None:
        self.keeper.close()
        drop_postgres(self.name)


_spare: list[_PostgresDatabase] = []


@atexit.register
def _drop_spare() -> None:
    while _spare:
        _spare.pop().drop()


@contextmanager
def fresh_database(
    backend: str, directory: Path, label: str = "test", *, empty: bool = False
) -> Iterator[str]:
    """A new database on a backend: a SQLite file in ``directory``, or a PostgreSQL
    database, at head (a copy of :func:`_template`), or with nothing in it when ``empty``.
    A PostgreSQL database at head may be one an earlier test of this process had, emptied
    (:class:`_PostgresDatabase`); an empty one is new and dropped afterwards. Skips the test
    when PostgreSQL is not configured."""
    if backend == "sqlite":
        path = directory / "store.db"
        if not empty:
            shutil.copyfile(_template(backend), path)
            path.chmod(0o600)
        yield str(path)
        return
    if not PG_URL:
        pytest.skip("PostgreSQL half skipped: set COMPACTSTORE_TEST_PG_URL (.ci/run does)")
    if empty:
        name = create_postgres(label, None)
        try:
            yield postgres_url(name)
        finally:
            drop_postgres(name)
        return
    database = (
        _spare.pop() if _spare else _PostgresDatabase(create_postgres(label, _template(backend)))
    )
    try:
        yield database.url
    finally:
        if database.reset():
            _spare.append(database)
        else:
            database.drop()


def close_event_loop_left_set() -> bool:
    """Close the event loop a test left set on this thread, and unset it; True when one was.

    A library's sync entry point may create a loop and leave it set (pydantic-ai's
    ``run_sync`` does). Left alone, it is garbage collected later with an "unclosed event
    loop" ResourceWarning, which ``filterwarnings = error`` turns into a failure of whichever
    test runs then: a different test each run.
    """
    local = getattr(asyncio.get_event_loop_policy(), "_local", None)
    loop = getattr(local, "_loop", None)
    if loop is None or loop.is_running():
        return False
    loop.close()
    asyncio.set_event_loop(None)
    return True


@pytest.fixture(autouse=True)
def _no_event_loop_left_set() -> Iterator[None]:
    yield
    close_event_loop_left_set()


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A new database on each backend, at head; with nothing in it (not even the schema)
    for tests marked ``empty_database`` (those about creating and migrating one)."""
    empty = request.node.get_closest_marker("empty_database") is not None
    with fresh_database(request.param, tmp_path, empty=empty) as url:
        yield url


def module_database(label: str) -> Any:
    """A module-scoped fixture: one database per backend shared by a module's tests (each
    working in sessions of its own), to save creating a PostgreSQL database per test."""

    @pytest.fixture(scope="module", params=BACKENDS)
    def database(
        request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
    ) -> Iterator[str]:
        with fresh_database(request.param, tmp_path_factory.mktemp(label), label) as url:
            yield url

    return database


@pytest.fixture
def sid(request: pytest.FixtureRequest) -> str:
    """A session id of this test's own, for modules whose tests share one database
    (:func:`module_database`)."""
    return str(request.node.name)[-200:]


@pytest.fixture
def store(db_url: str) -> Iterator[CompactStore]:
    """An open store on a fresh database, on each backend."""
    opened = CompactStore.open(db_url)
    try:
        yield opened
    finally:
        opened.close()


@pytest.fixture
def reopen(db_url: str) -> Iterator[Callable[[], CompactStore]]:
    """Open the same database again, as a new process would (fresh engine, no shared state)."""
    opened: list[CompactStore] = []

    def _open() -> CompactStore:
        fresh = CompactStore.open(db_url)
        opened.append(fresh)
        return fresh

    yield _open
    for item in opened:
        item.close()


Snapshot = Callable[[CompactStore | SessionStore], dict[str, list[tuple[Any, ...]]]]


def snapshot(store: CompactStore | SessionStore) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table as the driver reads it, in a stable order: compare two to
    prove nothing changed. (Plain SQL: building the statements per store costs more than
    reading a test's few rows.)"""
    out: dict[str, list[tuple[Any, ...]]] = {table.name: [] for table in metadata.sorted_tables}
    with store.engine.connect() as connection:
        if connection.dialect.name == "postgresql":
            # One round trip: each row as JSON (its columns in order), tagged with its table.
            rows = connection.exec_driver_sql(
                " UNION ALL ".join(
                    f"SELECT '{name}', row_to_json(t)::text FROM \"{name}\" AS t" for name in out
                )
            ).all()
            for name, row in rows:
                out[name].append(tuple(json.loads(row).values()))
        else:
            for name in out:
                rows = connection.exec_driver_sql(f'SELECT * FROM "{name}"').all()
                out[name] = [tuple(row) for row in rows]
    return {name: sorted(rows, key=repr) for name, rows in out.items()}


@pytest.fixture
def db_snapshot() -> Snapshot:
    return snapshot


def corpus_params(found: list[Any], folder: Path, what: str, arity: int = 1) -> list[Any]:
    """A corpus sweep's parameters: ``found`` (each of ``arity`` values), or without any one
    parameter skipped saying where the sweep looked (an empty list would skip the test with
    pytest's "got empty parameter set", which does not say why)."""
    if found:
        return found
    reason = f"no {what} in {folder} (set COMPACTSTORE_CORPUS to the corpus root)"
    skipped = (folder, *[None] * (arity - 1))
    return [pytest.param(*skipped, id="no-corpus", marks=pytest.mark.skip(reason=reason))]
