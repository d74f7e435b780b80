"""Shared fixtures: every backend test runs on a real SQLite file and a real PostgreSQL.

PostgreSQL tests need COMPACTSTORE_TEST_PG_URL (a database the tests may create databases
from; .ci/run starts a throwaway server and sets it). They carry the ``pg`` marker; without
the variable they are deselected, and the summary line says how many.

Tests marked ``corpus`` read real agent transcripts from the corpus root given by
COMPACTSTORE_CORPUS (default: ``../shared/corpus`` beside the repository); on a clone with no
corpus they are skipped, saying where they looked.
"""

from __future__ import annotations

import atexit
import itertools
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
from sqlalchemy import create_engine, select, text
from sqlalchemy.engine import make_url

from compactstore import CompactStore
from compactstore.db.schema import metadata
from compactstore.session import SessionStore

# Property tests keep no example database and no time limits: on a machine the suite shares
# (two test workers, other jobs) generation and examples are slower, not wrong.
settings.register_profile(
    "compactstore", deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None
)
settings.load_profile("compactstore")

# Each test process keeps its temporary files in a directory of its own (children inherit
# it through TMPDIR): a store removes the leftovers of stopped runs from the temporary
# directory and warns that it did (compactstore.scratch), which depends on what other
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
    from compactstore.errors import InvalidInputError
    from compactstore.importers import detect

    found = []
    for path in sorted(CORPUS_DEV.glob("*/*")):
        try:
            detect(path)
        except InvalidInputError:
            continue
        found.append(path)
    return found


# The PostgreSQL half of every backend-parametrised test carries the ``pg`` marker.
BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.pg)]

_counter = itertools.count()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the PostgreSQL tests when no server is configured (one count in the summary
    instead of a skip line each), and skip the corpus tests when the corpus is absent."""
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


_templates: dict[str, str] = {}


def _template(backend: str) -> str:
    """A database at head made once per test process by ``CompactStore.open`` (the path of a
    SQLite file, or the name of a PostgreSQL database): a test's new database is a copy of
    it, which takes milliseconds where running every migration takes a few hundred."""
    if backend in _templates:
        return _templates[backend]
    if backend == "sqlite":
        directory = tempfile.mkdtemp(prefix="compactstore-template-")
        atexit.register(shutil.rmtree, directory, True)
        path = os.path.join(directory, "template.db")
        CompactStore.open(path).close()  # closing checkpoints the WAL into the file
        _templates[backend] = path
        return path
    name = f"cs_template_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    admin = create_engine(_pg_admin_url(), isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    url = make_url(_pg_admin_url()).set(database=name).render_as_string(hide_password=False)
    CompactStore.open(url, auto_migrate=True).close()

    def drop() -> None:
        engine = create_engine(_pg_admin_url(), isolation_level="AUTOCOMMIT")
        with engine.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        engine.dispose()

    atexit.register(drop)
    _templates[backend] = name
    return name


@contextmanager
def fresh_database(
    backend: str, directory: Path, label: str = "test", *, empty: bool = False
) -> Iterator[str]:
    """A new database on a backend: a SQLite file in ``directory``, or a new PostgreSQL
    database (dropped afterwards), at head (a copy of :func:`_template`), or with nothing in
    it when ``empty``. Skips the test when PostgreSQL is not configured."""
    if backend == "sqlite":
        path = directory / "store.db"
        if not empty:
            shutil.copyfile(_template(backend), path)
            path.chmod(0o600)
        yield str(path)
        return
    if not PG_URL:
        pytest.skip("PostgreSQL half skipped: set COMPACTSTORE_TEST_PG_URL (.ci/run does)")
    name = f"cs_{label}_{os.getpid()}_{next(_counter)}_{uuid.uuid4().hex[:6]}"
    template = "" if empty else f' TEMPLATE "{_template(backend)}"'
    admin = create_engine(_pg_admin_url(), isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"{template}'))
    try:
        yield make_url(_pg_admin_url()).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


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
    """Every row of every table, in a stable order: compare two to prove nothing changed."""
    out: dict[str, list[tuple[Any, ...]]] = {}
    with store.engine.connect() as connection:
        for table in metadata.sorted_tables:
            rows = connection.execute(select(table)).all()
            out[table.name] = sorted((tuple(row) for row in rows), key=repr)
    return out


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
