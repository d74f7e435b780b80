"""The space a database takes, and giving back what deleted rows leave free.

SQLite keeps the pages of deleted rows inside the file (its freelist) for later rows. A file
compactstore creates uses incremental auto-vacuum (set on connect, which takes effect only
in a file that has no table yet), so those pages can be handed back to the disk in a moment
(``PRAGMA incremental_vacuum``) after a delete; an older file keeps them until ``VACUUM``
rebuilds it. PostgreSQL's autovacuum marks dead rows' space reusable on its own; ``VACUUM``
does it now. Neither VACUUM may run inside a transaction.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from sqlalchemy import Connection, Engine, func, select
from sqlalchemy import exc as sa_exc

from compactstore.db import schema

__all__ = ["Space", "release_free_pages", "space", "vacuum"]

# SQLite's PRAGMA auto_vacuum values.
_INCREMENTAL = 2


@dataclass(frozen=True, slots=True)
class Space:
    """How many bytes a database takes (SQLite: its pages; PostgreSQL: compactstore's tables
    with their indexes and TOAST), and how many of them are free for new rows (SQLite's
    freelist; None on PostgreSQL, which does not say without scanning)."""

    bytes: int
    free_bytes: int | None


def space(connection: Connection) -> Space:
    """The space the database behind ``connection`` takes now."""
    if connection.dialect.name == "sqlite":
        page_size = _pragma(connection, "page_size")
        return Space(
            _pragma(connection, "page_count") * page_size,
            _pragma(connection, "freelist_count") * page_size,
        )
    sizes = [func.pg_total_relation_size(table.name) for table in schema.metadata.sorted_tables]
    total = connection.execute(select(*sizes)).one()
    return Space(sum(int(size or 0) for size in total), None)


def _pragma(connection: Connection, name: str) -> int:
    return int(connection.exec_driver_sql(f"PRAGMA {name}").scalar_one())


@contextmanager
def _driver(engine: Engine, statement: str) -> Iterator[sqlite3.Connection]:
    """The SQLite driver connection of a pooled connection, outside SQLAlchemy's
    transactions (VACUUM and incremental_vacuum cannot run inside one); the driver's
    errors are raised as SQLAlchemy's, as database_errors expects them."""
    raw = engine.raw_connection()
    try:
        driver = raw.driver_connection
        assert isinstance(driver, sqlite3.Connection)
        yield driver
    except sqlite3.Error as exc:
        raise sa_exc.DBAPIError.instance(statement, None, exc, sqlite3.Error) from exc
    finally:
        raw.close()


def release_free_pages(engine: Engine) -> bool:
    """Hand the free pages of a SQLite file with incremental auto-vacuum back to the disk
    (quick: no page is rewritten but those moved from the end of the file). Returns whether
    it ran (False: another backend, or a file without incremental auto-vacuum)."""
    if engine.dialect.name != "sqlite":
        return False
    with _driver(engine, "PRAGMA incremental_vacuum") as driver:
        mode, free = (
            driver.execute(f"PRAGMA {name}").fetchone()[0]
            for name in ("auto_vacuum", "freelist_count")
        )
        if mode != _INCREMENTAL or not free:
            return False
        # executescript steps the pragma to its end (execute() would free one page); it
        # runs as a transaction of its own (the connection is in autocommit mode here).
        driver.executescript("PRAGMA incremental_vacuum")
        return True


def vacuum(engine: Engine) -> None:
    """Rebuild the database so that it takes no more space than its rows need: SQLite
    ``VACUUM`` (which also turns incremental auto-vacuum on in an older file; it needs free
    disk space about the file's size and waits for other writers), then a WAL checkpoint
    that shrinks the file; PostgreSQL ``VACUUM`` of compactstore's tables."""
    if engine.dialect.name == "sqlite":
        with _driver(engine, "VACUUM") as driver:
            driver.execute("PRAGMA auto_vacuum=INCREMENTAL")  # applied by the VACUUM
            driver.execute("VACUUM")
            driver.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        return
    tables = ", ".join(
        engine.dialect.identifier_preparer.quote(table.name)
        for table in schema.metadata.sorted_tables
    )
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.exec_driver_sql(f"VACUUM (ANALYZE) {tables}")
