"""The suite's databases (tests/conftest.py): a PostgreSQL one a test hands back is emptied
for the next, even with a connection left open in a transaction, and one whose schema a test
changed is dropped instead; a snapshot (which tests compare to prove nothing changed) holds
every row of every table on both backends."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
from sqlalchemy.engine import make_url

from compactstore import CompactStore
from compactstore.db.schema import metadata
from tests import conftest
from tests.helpers import T0, user


def _libpq(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@pytest.mark.pg
def test_a_database_handed_back_is_emptied_even_with_a_transaction_left_open(
    tmp_path: Path,
) -> None:
    with conftest.fresh_database("postgres", tmp_path) as url:
        with CompactStore.open(url) as store:
            store.session("s1", now=T0).append(user("hello"), timestamp=T0)
        left_open = psycopg.connect(_libpq(url))
        left_open.execute("SELECT * FROM sessions FOR UPDATE").fetchall()  # holds row locks
    assert conftest._spare and conftest._spare[-1].url == url  # emptied, kept for the next
    with pytest.raises(psycopg.OperationalError):  # the server ended it
        left_open.execute("SELECT 1")
    left_open.close()
    with conftest.fresh_database("postgres", tmp_path) as again:
        assert again == url
        with CompactStore.open(again) as store:
            assert store.sessions() == []


@pytest.mark.pg
def test_a_database_whose_schema_a_test_changed_is_dropped(tmp_path: Path) -> None:
    with conftest.fresh_database("postgres", tmp_path) as url:
        connection = psycopg.connect(_libpq(url), autocommit=True)
        connection.execute("CREATE TABLE extra (id integer)")
        connection.close()
    assert all(spare.url != url for spare in conftest._spare)


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.pg)])
def test_a_snapshot_holds_every_row_of_every_table_and_changes_with_them(
    backend: str, tmp_path: Path
) -> None:
    with conftest.fresh_database(backend, tmp_path) as url, CompactStore.open(url) as store:
        before = conftest.snapshot(store)
        assert set(before) == {table.name for table in metadata.sorted_tables}
        sess = store.session("s1", now=T0)
        sess.append(user("hello"), timestamp=T0)
        after = conftest.snapshot(store)
        assert after != before
        assert len(after["messages"]) == len(before["messages"]) + 1
        (row,) = [row for row in after["sessions"] if "s1" in row]
        assert row[0] == "s1"  # the columns in the table's order
        sess.append(user("again"), timestamp=T0)
        assert conftest.snapshot(store) != after
