"""Shared fixtures: every backend test runs on a real SQLite file and a real PostgreSQL.

PostgreSQL tests need COMPACTSTORE_TEST_PG_URL (a database the tests may create databases
from; .ci/run starts a throwaway server and sets it). Without it they are skipped, saying so.
"""

from __future__ import annotations

import itertools
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, select, text
from sqlalchemy.engine import make_url

from compactstore import CompactStore
from compactstore.db.schema import metadata

PG_URL = os.environ.get("COMPACTSTORE_TEST_PG_URL")
SHARED = Path(__file__).resolve().parents[2] / "shared"
CORPUS_DEV = SHARED / "corpus" / "dev"
BACKENDS = ["sqlite", "postgres"]

_counter = itertools.count()


def _pg_admin_url() -> str:
    assert PG_URL is not None
    return (
        make_url(PG_URL).set(drivername="postgresql+psycopg").render_as_string(hide_password=False)
    )


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty database on each backend."""
    if request.param == "sqlite":
        yield str(tmp_path / "store.db")
        return
    if not PG_URL:
        pytest.skip("PostgreSQL half skipped: set COMPACTSTORE_TEST_PG_URL (.ci/run does)")
    name = f"cs_test_{os.getpid()}_{next(_counter)}_{uuid.uuid4().hex[:6]}"
    admin = create_engine(_pg_admin_url(), isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(_pg_admin_url()).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


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


Snapshot = Callable[[CompactStore], dict[str, list[tuple[Any, ...]]]]


def snapshot(store: CompactStore) -> dict[str, list[tuple[Any, ...]]]:
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
