"""What every query module of :mod:`compactstore.db` shares."""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BindParameter,
    Connection,
    Table,
    bindparam,
)
from sqlalchemy.dialects import postgresql, sqlite

from compactstore._text import storage_json

__all__ = ["SID", "DbRow", "columns", "dumps", "insert_ignore"]

# A result row not yet given a type of its own. (Row's type parameters differ between
# SQLAlchemy 2.0 and 2.1.)
DbRow = Any

dumps = storage_json

# Statements that run on every step are built once, with bind parameters: building a Core
# statement and its cache key costs more than SQLite takes to run it.
SID: BindParameter[str] = bindparam("sid")


def insert_ignore(connection: Connection, table: Any, values: dict[str, Any]) -> None:
    """INSERT that does nothing when the primary key exists (both backends)."""
    dialect = postgresql if connection.dialect.name == "postgresql" else sqlite
    connection.execute(dialect.insert(table).values(**values).on_conflict_do_nothing())


def columns(table: Table, row: type[tuple[Any, ...]]) -> list[Any]:
    """The columns of ``table`` a typed row holds, in its order (``row`` is a NamedTuple)."""
    return [table.c[name] for name in row._fields]  # type: ignore[attr-defined]
