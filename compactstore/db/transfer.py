"""Copy and delete whole sessions, table by table, as the schema's table list says.

Nothing here names a table of its own accord: :func:`plan` walks ``schema.metadata`` (or
the metadata it is given), so a table added later is copied and deleted with the others
(except ``schema_revisions``, the database's record of its own schema).
Every table must say which session a row belongs to (a ``session_id`` column; ``sessions``
is the session itself), or planning fails.

What a copy keeps and what it renumbers:

- Row ids the database allocates (a table's single autoincrement key: boundary, compaction,
  edit and memory ids) are allocated anew in the target, in the source's order, so every
  comparison of ids within a session (the newest live boundary, "recorded after", the
  order edits apply in) means what it meant. Every column that holds such an id is
  rewritten with the new one: foreign keys found in the schema (a boundary's parent, a
  compaction's boundary and ``replay_of``, an edit's or a blob's compaction) and the
  references the schema cannot express, listed in :data:`HIDDEN_REFERENCES` and
  :data:`JSON_REFERENCES`.
- Everything numbered per session is kept as it is: the session id, message seqs (and the
  seqs stored in other rows), tool-use ids, and blob ids, which count per session, so the
  blob ids a compaction's ``blob_ids`` lists, a preview stub names and replay inputs'
  ``next_blob_id`` give stay right.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from sqlalchemy import Column, Connection, MetaData, Table, delete, func, insert, select
from sqlalchemy.engine import Engine, create_engine

from compactstore._text import storable_text
from compactstore.db import schema
from compactstore.db.engine import read_tx
from compactstore.db.migrate import stored_revision
from compactstore.db.repository import dumps
from compactstore.db.sessions import subagents_of
from compactstore.errors import ConflictError, NotFoundError, SchemaError

__all__ = [
    "HIDDEN_REFERENCES",
    "JSON_REFERENCES",
    "PER_SESSION_IDS",
    "CopyReport",
    "TablePlan",
    "copy_from",
    "copy_sessions",
    "delete_sessions",
    "last_activity",
    "leave_wal_mode",
    "plan",
    "read_only_sqlite",
    "session_ids",
]

# Integer columns holding another row's id without a foreign key: (table, column) -> the
# table whose id it holds. ``rolled_back_after`` is the session's newest compaction id when
# a compaction was rolled back (replay compares it with compaction ids).
HIDDEN_REFERENCES: dict[tuple[str, str], str] = {
    ("compactions", "rolled_back_after"): "compactions",
    ("compactions", "started_by"): "compactions",
}

# JSON text columns holding ids: (table, column) -> {key of the top-level object: table}.
# A compaction's recorded replay inputs name the compaction an applied replay replays.
JSON_REFERENCES: dict[tuple[str, str], dict[str, str]] = {
    ("compactions", "inputs"): {"replay_of": "compactions"},
}

# Id-like columns whose values count per session and are kept as they are.
PER_SESSION_IDS: frozenset[tuple[str, str]] = frozenset({("tool_result_blobs", "id")})

# Rows per INSERT, and the text/bytes a batch may hold before it is written (memory bound).
_BATCH_ROWS = 500
_BATCH_BYTES = 2 << 20
# Rows fetched from the source at a time (blobs can be megabytes each).
_FETCH_ROWS = 64
# Session ids per IN (...) list: well under every backend's bound-parameter limit.
_CHUNK = 500


@dataclass(frozen=True, slots=True)
class TablePlan:
    """How one table's rows are found, copied and deleted by session."""

    table: Table
    session_column: Column[Any]
    # The autoincrement id the target allocates anew, or None.
    key: Column[Any] | None
    # Column -> table whose (renumbered) id it holds.
    references: Mapping[str, str]
    # JSON column -> {key: table whose id the key holds}.
    json_references: Mapping[str, Mapping[str, str]]

    @property
    def order(self) -> list[Column[Any]]:
        """Source order: by id where ids are renumbered (so the new ones keep it)."""
        return [self.key] if self.key is not None else list(self.table.primary_key.columns)


def plan(metadata: MetaData = schema.metadata) -> list[TablePlan]:
    """Every table of the schema, parents before the tables that refer to them.

    Raises:
        SchemaError: a table has no session column, or refers to a renumbered id in a way
            this module does not know how to rewrite.
    """
    # The database's own record of its schema revisions belongs to no session.
    tables = [t for t in metadata.sorted_tables if t.name != schema.schema_revisions.name]
    keys = {t.name: t.autoincrement_column for t in tables if t.autoincrement_column is not None}
    plans = []
    for table in tables:
        session_column = _session_column(table)
        references = _references(table, keys)
        json_references = {
            column_name: keys_to_tables
            for (name, column_name), keys_to_tables in JSON_REFERENCES.items()
            if name == table.name and column_name in table.c
        }
        for target_name in [*references.values()] + [
            t for refs in json_references.values() for t in refs.values()
        ]:
            if target_name not in keys:
                raise SchemaError(
                    f"table {table.name} refers to ids of {target_name}, which has no "
                    f"autoincrement key to renumber"
                )
        plans.append(
            TablePlan(
                table=table,
                session_column=session_column,
                key=keys.get(table.name),
                references=references,
                json_references=json_references,
            )
        )
    return plans


def _session_column(table: Table) -> Column[Any]:
    """The column that says which session a row of ``table`` belongs to."""
    if table.name == schema.sessions.name:
        return table.c.id
    if "session_id" in table.c:
        return table.c.session_id
    raise SchemaError(
        f"table {table.name} has no session_id column: sessions cannot be copied or "
        f"deleted without saying which session its rows belong to"
    )


def _references(table: Table, keys: Mapping[str, Column[Any]]) -> dict[str, str]:
    """column -> the renumbered table whose ids it holds (foreign keys and hidden ones)."""
    references: dict[str, str] = {}
    for column in table.columns:
        for fk in column.foreign_keys:
            target = fk.column
            if target.table.name in keys and keys[target.table.name] is target:
                references[column.name] = target.table.name
    for (name, column_name), target_name in HIDDEN_REFERENCES.items():
        if name == table.name and column_name in table.c:
            references[column_name] = target_name
    return references


@dataclass
class CopyReport:
    """What a copy wrote: the sessions, the rows per table, and old -> new id per table."""

    sessions: list[str] = field(default_factory=list)
    rows: dict[str, int] = field(default_factory=dict)
    ids: dict[str, dict[int, int]] = field(default_factory=dict)


def _chunks(items: Sequence[str]) -> Iterator[Sequence[str]]:
    for start in range(0, len(items), _CHUNK):
        yield items[start : start + _CHUNK]


def session_ids(connection: Connection, wanted: Iterable[str] | None = None) -> list[str]:
    """The sessions stored (oldest first), or those of ``wanted`` that exist (in its order)."""
    if wanted is None:
        return list(
            connection.execute(
                select(schema.sessions.c.id).order_by(
                    schema.sessions.c.created_at, schema.sessions.c.id
                )
            ).scalars()
        )
    ids = list(dict.fromkeys(wanted))
    found: set[str] = set()
    for chunk in _chunks(ids):
        found.update(
            connection.execute(
                select(schema.sessions.c.id).where(schema.sessions.c.id.in_(chunk))
            ).scalars()
        )
    return [sid for sid in ids if sid in found]


def _allocate(connection: Connection, key: Column[Any], count: int) -> list[int]:
    """``count`` new ids for a table, ascending, that no other writer can take."""
    if connection.dialect.name == "postgresql":
        sequence = func.pg_get_serial_sequence(key.table.name, key.name)
        allocated = connection.execute(
            select(func.nextval(sequence)).select_from(func.generate_series(1, count))
        ).scalars()
        return sorted(int(value) for value in allocated)
    # SQLite: the write transaction holds the database's only write lock.
    last = connection.execute(select(func.max(key))).scalar_one()
    start = (last or 0) + 1
    return list(range(start, start + count))


def _map_ids(
    source: Connection, target: Connection, table_plan: TablePlan, sessions: Sequence[str]
) -> dict[int, int]:
    key = table_plan.key
    assert key is not None
    old = list(
        source.execute(
            select(key).where(table_plan.session_column.in_(sessions)).order_by(key)
        ).scalars()
    )
    if not old:
        return {}
    return dict(zip(old, _allocate(target, key, len(old)), strict=True))


def _size(value: Any) -> int:
    return len(value) if isinstance(value, str | bytes | memoryview) else 8


def _rewrite(row: dict[str, Any], table_plan: TablePlan, ids: dict[str, dict[int, int]]) -> None:
    for column, value in row.items():
        # A text an older compactstore derived with a NUL in it (SQLite stored it; nothing
        # writes one now): as it is stored today, so a copy to PostgreSQL succeeds.
        if isinstance(value, str) and "\x00" in value:
            row[column] = storable_text(value)
    if table_plan.key is not None:
        row[table_plan.key.name] = ids[table_plan.table.name][row[table_plan.key.name]]
    for column, target in table_plan.references.items():
        if row[column] is not None:
            row[column] = ids[target][row[column]]
    for column, keys in table_plan.json_references.items():
        if row[column] is None:
            continue
        value = json.loads(row[column])
        changed = False
        for name, target in keys.items():
            if isinstance(value, dict) and value.get(name) is not None:
                value[name] = ids[target][int(value[name])]
                changed = True
        if changed:
            row[column] = dumps(value)


def _copy_table(
    source: Connection,
    target: Connection,
    table_plan: TablePlan,
    sessions: Sequence[str],
    ids: dict[str, dict[int, int]],
) -> int:
    table = table_plan.table
    result = source.execute(
        select(table).where(table_plan.session_column.in_(sessions)).order_by(*table_plan.order),
        execution_options={"yield_per": _FETCH_ROWS},
    )
    statement = insert(table)
    batch: list[dict[str, Any]] = []
    size = copied = 0
    for partition in result.partitions():
        for source_row in partition:
            row = dict(source_row._mapping)
            _rewrite(row, table_plan, ids)
            batch.append(row)
            size += sum(_size(value) for value in row.values())
            if len(batch) >= _BATCH_ROWS or size >= _BATCH_BYTES:
                target.execute(statement, batch)
                copied += len(batch)
                batch, size = [], 0
    if batch:
        target.execute(statement, batch)
        copied += len(batch)
    return copied


def copy_sessions(
    source: Connection,
    target: Connection,
    wanted: Sequence[str] | None = None,
    *,
    metadata: MetaData = schema.metadata,
) -> CopyReport:
    """Copy whole sessions (every table's rows for them) from one database into another.

    ``source`` should be a read transaction (one snapshot) and ``target`` a write
    transaction: nothing is committed here. Rows are streamed in bounded batches.

    Args:
        wanted: session ids to copy; None copies every session of the source.

    Raises:
        NotFoundError: a wanted session is not in the source.
        ConflictError: a session already exists in the target (nothing is written).
    """
    plans = plan(metadata)
    sessions = session_ids(source, wanted)
    if wanted is not None:
        missing = [sid for sid in dict.fromkeys(wanted) if sid not in set(sessions)]
        if missing:
            raise NotFoundError(f"no session {', '.join(map(repr, missing))} to copy")
    clashes = session_ids(target, sessions)
    if clashes:
        raise ConflictError(
            f"session {', '.join(map(repr, clashes[:10]))}"
            f"{f' and {len(clashes) - 10} more' if len(clashes) > 10 else ''} already "
            f"exist{'s' if len(clashes) == 1 else ''} in the target database; delete "
            f"{'it' if len(clashes) == 1 else 'them'} there first, or copy other sessions"
        )
    report = CopyReport(sessions=sessions)
    for chunk in _chunks(sessions):
        ids: dict[str, dict[int, int]] = {
            p.table.name: _map_ids(source, target, p, chunk) for p in plans if p.key is not None
        }
        for table_plan in plans:
            name = table_plan.table.name
            copied = _copy_table(source, target, table_plan, chunk, ids)
            report.rows[name] = report.rows.get(name, 0) + copied
        for name, mapping in ids.items():
            report.ids.setdefault(name, {}).update(mapping)
    return report


def delete_sessions(
    connection: Connection, wanted: Sequence[str], *, metadata: MetaData = schema.metadata
) -> list[str]:
    """Delete every row of the given sessions from every table; returns those that existed."""
    found = session_ids(connection, wanted)
    plans = plan(metadata)
    for chunk in _chunks(found):
        for table_plan in reversed(plans):
            connection.execute(delete(table_plan.table).where(table_plan.session_column.in_(chunk)))
    return found


def last_activity(connection: Connection) -> dict[str, float]:
    """Each session's latest time: its creation, its newest message or compaction."""
    sessions, messages, compactions = schema.sessions, schema.messages, schema.compactions
    latest = dict(connection.execute(select(sessions.c.id, sessions.c.created_at)).all())
    for table in (messages, compactions):
        for sid, at in connection.execute(
            select(table.c.session_id, func.max(table.c.created_at)).group_by(table.c.session_id)
        ):
            if at is not None and sid in latest:
                latest[sid] = max(latest[sid], float(at))
    return latest


def leave_wal_mode(path: str | os.PathLike[str]) -> None:
    """Switch a SQLite file nothing else has open to rollback-journal mode: one
    self-contained file, with no -wal or -shm beside it."""
    connection = sqlite3.connect(path)
    try:
        connection.execute("PRAGMA journal_mode=DELETE")
    finally:
        connection.close()


def read_only_sqlite(path: str) -> Engine:
    """An engine that only reads a SQLite file (no WAL switch, nothing created)."""
    uri = "file:" + quote(str(Path(path).resolve())) + "?mode=ro"
    return create_engine("sqlite://", creator=lambda: _connect_read_only(uri))


def _connect_read_only(uri: str) -> Any:
    return sqlite3.connect(uri, uri=True, check_same_thread=False)


def copy_from(
    source: Engine,
    target: Connection,
    wanted: Sequence[str] | None,
    *,
    source_location: str,
    target_location: str,
    source_name: str | None = None,
) -> CopyReport:
    """Copy the sessions ``wanted`` (None: all) with their subagents' sessions from the
    ``source`` database (one consistent snapshot) into the target's open write transaction;
    errors name the source ``source_name`` (default: its location).

    Raises:
        NotFoundError: a session is not in the source.
        ConflictError: a session already exists in the target.
        SchemaError: the two databases are at different schema revisions.
    """
    with read_tx(source) as source_connection:
        theirs, ours = stored_revision(source_connection), stored_revision(target)
        if theirs != ours:
            raise SchemaError(
                f"{source_location} has schema revision {theirs} and {target_location} has "
                f"{ours}: upgrade both to the same revision first"
            )
        if wanted is None:
            return copy_sessions(source_connection, target, None)
        have = set(session_ids(source_connection, wanted))
        missing = [sid for sid in dict.fromkeys(wanted) if sid not in have]
        if missing:
            name = source_name or source_location
            raise NotFoundError(f"no session {', '.join(map(repr, missing))} in {name}")
        # A session's subagents (imported Claude Code sidechains) go with it.
        children = subagents_of(source_connection, list(wanted))
        return copy_sessions(source_connection, target, [*wanted, *(c for c, _ in children)])
