"""Keep a database's schema at the revision this code expects, with Alembic.

The app runs Alembic on its own connection, compares the stored revision with the head
shipped in the package, and refuses a schema it cannot use with the command that fixes it.
A database already at head is recognised without importing Alembic: opening a store is then
one small query. An empty database is created at head from db/schema.py and stamped, as
Alembic's documentation recommends, rather than by running every revision (~10 ms instead
of ~50 on SQLite); tests/test_schema.py checks that both ways give the same schema.

Fleets upgrade in order: each revision file says whether it is ``"additive"``
or ``"breaking"`` (its module-level ``kind``), and the database records each revision
applied to it, with its parent and kind, in ``schema_revisions`` (written by
:func:`record_revision`, Alembic's ``on_version_apply`` hook in migrations/env.py). A
version opening a database one *additive* revision past its own head (that revision's
parent is this version's head) reads and writes it as it is; two revisions newer, or a
breaking one, is refused naming the newer version and ``compactstore db upgrade``.

An additive revision only adds: tables, and columns that are nullable or have a server
default; it drops, renames or retypes nothing, adds no constraint to an existing table,
and a new table that refers to an existing one does so ``ON DELETE CASCADE`` (so an older
version's ``delete_session`` and ``prune`` still remove a session whole). The newer code
reads rows the older version wrote (NULL or the default in the new columns). A test checks
the mechanical half of this rule for every additive revision.
"""

from __future__ import annotations

import re
import sqlite3
import urllib.parse
from functools import cache
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    Column,
    Connection,
    Engine,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    delete,
    func,
    insert,
    inspect,
    select,
)
from sqlalchemy.exc import DBAPIError

from compactstore.db import schema
from compactstore.db.engine import (
    create_engine_for,
    database_errors,
    describe,
    no_database,
    normalize_url,
    read_tx,
    release_engine,
    sqlite_path,
    with_retry,
    write_tx,
)
from compactstore.errors import NotFoundError, SchemaError

if TYPE_CHECKING:
    from alembic.config import Config
    from alembic.runtime.migration import MigrationContext, MigrationInfo
    from alembic.script.revision import RevisionMap

__all__ = [
    "alembic_config",
    "current_revision",
    "default_auto_migrate",
    "ensure_schema",
    "head_revision",
    "open_engine",
    "other_program",
    "record_revision",
    "revision_of",
    "stored_revision",
    "usable_as_is",
]

# The kinds a revision file may declare (its module-level ``kind``).
KINDS = ("additive", "breaking")
# The revision that creates schema_revisions: it and every revision after it are recorded
# there (it records its ancestors too when it is applied).
_FIRST_RECORDED = "6aa8b67dd6bf"

# Key of the PostgreSQL advisory lock held while a schema is created or upgraded.
_SCHEMA_LOCK = 0x636F6D70616374  # "compact"


def alembic_config() -> Config:
    """An Alembic config pointing at the migrations shipped inside the package."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(files("compactstore._migrations")))
    return config


# The revision file header Alembic writes (from migrations/script.py.mako).
_REVISION = re.compile(r"""^revision: str = ["'](\w+)["']$""", re.MULTILINE)
_DOWN_REVISION = re.compile(r"""^down_revision: [^=]+= (None|["']\w+["'])$""", re.MULTILINE)
_KIND = re.compile(r"""^kind: str = ["'](\w+)["']$""", re.MULTILINE)


@cache
def head_revision() -> str:
    """The newest revision this version of compactstore knows (read from the shipped
    revision files; the tests check it against Alembic's own answer)."""
    revisions = _shipped_revisions()
    heads = set(revisions) - set(revisions.values())
    if len(heads) != 1:
        raise SchemaError(
            f"compactstore ships {len(heads)} schema heads; the installation is broken"
        )
    return heads.pop()


@cache
def _shipped_revisions() -> dict[str, str | None]:
    """Revision -> its parent, for every revision file shipped in the package."""
    return {revision: down for revision, (down, _kind) in _shipped().items()}


@cache
def _shipped() -> dict[str, tuple[str | None, str | None]]:
    """Revision -> its parent and its ``kind`` (None when it declares none), for every
    revision file shipped in the package."""
    revisions: dict[str, tuple[str | None, str | None]] = {}
    for entry in files("compactstore._migrations").joinpath("versions").iterdir():
        if not entry.name.endswith(".py") or entry.name.startswith("_"):
            continue
        text = entry.read_text(encoding="utf-8")
        revision, down = _REVISION.search(text), _DOWN_REVISION.search(text)
        if revision is None or down is None:
            raise SchemaError(
                f"cannot read the revision of {entry.name}; the installation is broken"
            )
        kind = _KIND.search(text)
        revisions[revision.group(1)] = (
            None if down.group(1) == "None" else down.group(1)[1:-1],
            kind.group(1) if kind else None,
        )
    return revisions


# Alembic's own table, as Alembic creates it.
_version_table = Table(
    "alembic_version",
    MetaData(),
    Column("version_num", String(32), nullable=False),
    PrimaryKeyConstraint("version_num", name="alembic_version_pkc"),
)


def stored_revision(connection: Connection) -> str | None:
    """The revision stored in the database (None for a database compactstore never opened)."""
    if not inspect(connection).has_table("alembic_version"):
        return None
    return _one_revision(connection)


def _one_revision(connection: Connection) -> str | None:
    found = connection.execute(select(_version_table.c.version_num)).scalars().all()
    if len(found) > 1:
        raise SchemaError(f"the database has {len(found)} schema revisions: {', '.join(found)}")
    return found[0] if found else None


def current_revision(engine: Engine) -> str | None:
    """The revision stored in the database (None for a database compactstore never opened):
    read first as if the table were there, which opening a store at head needs no more than
    (one query); looked for when that fails."""
    with engine.connect() as connection:
        try:
            return _one_revision(connection)
        except DBAPIError:
            connection.rollback()
        return stored_revision(connection)


def revision_of(db: str) -> str | None:
    """The schema revision of a database given by path or URL, read without writing.

    Raises:
        NotFoundError: there is no SQLite file at the path.
    """
    url = normalize_url(db)
    engine = create_engine_for(url, read_only=True)
    try:
        return database_errors(describe(url), lambda: current_revision(engine))
    finally:
        release_engine(engine)


def usable_as_is(db: str) -> bool:
    """Whether this version reads and writes the database given by path or URL as it is:
    its schema is at head, or one additive revision newer (read without writing).

    Raises:
        NotFoundError: there is no SQLite file at the path.
    """
    url = normalize_url(db)
    engine = create_engine_for(url, read_only=True)

    def check() -> bool:
        with engine.connect() as connection:
            current, head = stored_revision(connection), head_revision()
            if current == head:
                return True
            try:
                return _one_additive_step_newer(connection, current, head, describe(url))
            except SchemaError:
                return False

    try:
        return database_errors(describe(url), check)
    finally:
        release_engine(engine)


def default_auto_migrate(url: str) -> bool:
    """Whether opening ``url`` upgrades an older schema when the caller does not say: a
    SQLite file is one process's, so it migrates on open;
    a server database (PostgreSQL) is shared by a fleet, whose older versions may still be
    running, so it is upgraded on purpose (``compactstore db upgrade``) before the new
    version rolls out. An empty database is created at head either way."""
    return not url.startswith("postgresql")


def open_engine(
    url: str,
    *,
    location: str,
    auto_migrate: bool | None,
    read_only: bool,
    pool: dict[str, Any] | None = None,
    create: bool = True,
    allow_other_tables: bool = False,
) -> Engine:
    """An Engine on a database whose schema is at head (see :func:`ensure_schema`);
    ``auto_migrate`` None: :func:`default_auto_migrate`.

    Raises:
        NotFoundError: no compactstore database there, and read_only or not create.
        SchemaError, DatabaseError: as :func:`ensure_schema` and :func:`database_errors`.
    """
    if auto_migrate is None:
        auto_migrate = default_auto_migrate(url)
    path = sqlite_path(url)
    if path is not None and not read_only and path.is_file():
        # Refused before a connection writes a header into an empty file or switches
        # another program's database to WAL.
        names = _sqlite_names(path)
        if names is not None and _version_table.name not in names:
            if names and not (create and allow_other_tables):
                raise other_program(location, names)
            if not create:
                raise NotFoundError(no_database(location))
    engine = create_engine_for(url, read_only=read_only, pool=pool, create=create)
    try:
        database_errors(
            location,
            lambda: ensure_schema(
                engine,
                auto_migrate=auto_migrate,
                location=location,
                read_only=read_only,
                create=create,
                allow_other_tables=allow_other_tables,
            ),
        )
    except BaseException:
        engine.dispose()
        raise
    return engine


def other_program(location: str, tables: list[str]) -> SchemaError:
    """The refusal of a database that holds another program's tables."""
    if schema.sessions.name in tables:
        return _unrevised(location)
    shown = ", ".join(tables[:5]) + (f" and {len(tables) - 5} more" if len(tables) > 5 else "")
    kind = "table or view" if len(tables) == 1 else "tables or views"
    return SchemaError(
        f"{location} is not a compactstore database: it holds {len(tables)} {kind} of "
        f"another program ({shown}); "
        f"check the path, or add compactstore's tables beside them with "
        f"`compactstore db upgrade --force --db {location}` or `import --force` (in Python, "
        f"CompactStore.open(allow_other_tables=True))"
    )


def _unrevised(location: str) -> SchemaError:
    return SchemaError(
        f"the database {location} has compactstore tables but no schema revision; "
        f"it was not created by compactstore's migrations and cannot be upgraded safely"
    )


def _sqlite_names(path: Path) -> list[str] | None:
    """The tables and views of a SQLite file, read without writing (None when it cannot be
    read: opening it then says why)."""
    uri = "file:" + urllib.parse.quote(str(path)) + "?mode=ro"
    try:
        connection = sqlite3.connect(uri, uri=True)
    except sqlite3.Error:
        return None
    try:
        names = [
            row[0]
            for row in connection.execute(
                "SELECT name FROM sqlite_master WHERE type IN ('table', 'view') "
                "AND name NOT LIKE 'sqlite^_%' ESCAPE '^' ORDER BY name"
            )
        ]
    except (sqlite3.Error, ValueError):  # ValueError: a damaged schema's text is not UTF-8
        return None
    finally:
        connection.close()
    return names


def _other_tables(connection: Connection) -> list[str]:
    """The tables and views of a database without a compactstore schema."""
    found = inspect(connection)
    return sorted({*found.get_table_names(), *found.get_view_names()})


def _check_can_create(
    connection: Connection, *, create: bool, allow_other_tables: bool, location: str
) -> None:
    """Refuse to set up compactstore's schema where it is not wanted: anywhere when not
    ``create``, and beside another program's tables unless ``allow_other_tables``."""
    others = _other_tables(connection)
    if others and not (create and allow_other_tables):
        raise other_program(location, others)
    if not create:
        raise NotFoundError(no_database(location))


def ensure_schema(
    engine: Engine,
    *,
    auto_migrate: bool,
    location: str,
    read_only: bool = False,
    create: bool = True,
    allow_other_tables: bool = False,
) -> None:
    """Bring the schema to head, or raise SchemaError saying what to do.

    Many processes may open a new database at once: the first takes the write lock (SQLite)
    or an advisory lock (PostgreSQL), reads the revision again under it and creates the
    schema; the others wait for it and find the schema at head. A ``read_only`` engine is
    never migrated: a schema not at head is refused with the command that upgrades it.

    The schema is created only in an empty database, and only with ``create``; beside other
    tables only with ``allow_other_tables`` too (a mistyped path must not turn another
    program's database into a compactstore one).
    """
    head = head_revision()
    # Retried too: switching a new SQLite file to WAL (on connect) can meet a busy lock.
    current = with_retry(lambda: current_revision(engine))
    if current == head:
        return
    if current is None and (read_only or not create):
        with read_tx(engine) as connection:
            if stored_revision(connection) is None:
                _check_can_create(
                    connection, create=False, allow_other_tables=False, location=location
                )
    if current is not None and current not in _shipped_revisions():
        with read_tx(engine) as connection:
            if _one_additive_step_newer(connection, stored_revision(connection), head, location):
                return
    if read_only:
        with read_tx(engine) as connection:
            current = stored_revision(connection)
            _check_upgradable(connection, current, head, location=location)
        raise SchemaError(
            f"the database {location} has schema revision {current or 'none'} and this "
            f"compactstore needs {head}; it was opened read-only, which never migrates: "
            f"run `compactstore db upgrade --db {location}` first"
        )

    def attempt() -> None:
        with write_tx(engine) as connection:
            if connection.dialect.name == "postgresql":
                connection.execute(select(func.pg_advisory_xact_lock(_SCHEMA_LOCK)))
            current = stored_revision(connection)
            if current is None:
                _check_can_create(
                    connection,
                    create=create,
                    allow_other_tables=allow_other_tables,
                    location=location,
                )
                _check_upgradable(connection, None, head, location=location)
                _create(connection, head)
            elif current != head and not _one_additive_step_newer(
                connection, current, head, location
            ):
                _upgrade(connection, current, head, auto_migrate=auto_migrate, location=location)

    with_retry(attempt)


def _create(connection: Connection, head: str) -> None:
    """Create the schema at ``head`` in an empty database: db/schema.py's tables, the
    history view, and the revision records the migrations leave (``alembic_version``, and
    a ``schema_revisions`` row for every revision, with its parent and kind)."""
    schema.metadata.create_all(connection, checkfirst=False)
    connection.exec_driver_sql(schema.history_view(connection.dialect.name))
    _version_table.create(connection)
    connection.execute(insert(_version_table).values(version_num=head))
    shipped = _shipped()
    rows = []
    revision: str | None = head
    while revision is not None:
        down, kind = shipped[revision]
        if kind not in KINDS:
            raise _undeclared_kind(revision)
        rows.append({"revision": revision, "down_revision": down, "kind": kind})
        revision = down
    connection.execute(insert(schema.schema_revisions), rows)


def _upgrade(
    connection: Connection, current: str, head: str, *, auto_migrate: bool, location: str
) -> None:
    from alembic import command

    if not auto_migrate:
        server = (
            ""
            if default_auto_migrate(str(connection.engine.url))
            else (
                " (a server database is not upgraded on open unless auto_migrate=True: stop "
                "the older versions first when the upgrade is breaking)"
            )
        )
        raise SchemaError(
            f"the database {location} has schema revision {current} and this "
            f"compactstore needs {head}; run `compactstore db upgrade --db {location}` "
            f"or open it with auto_migrate=True{server}"
        )
    # Alembic runs inside this transaction (it does not begin its own when one is open).
    config = alembic_config()
    config.attributes["connection"] = connection
    command.upgrade(config, "head")


def _check_upgradable(
    connection: Connection, current: str | None, head: str, *, location: str
) -> None:
    """Refuse a schema that upgrading to head cannot fix: tables without a revision (a
    newer revision is refused or accepted before, by :func:`_one_additive_step_newer`)."""
    if current is None and inspect(connection).has_table(schema.sessions.name):
        raise _unrevised(location)


def _one_additive_step_newer(
    connection: Connection, current: str | None, head: str, location: str
) -> bool:
    """Whether ``current`` is one additive revision past ``head``, which this version reads
    and writes as it is (False for a revision this version ships, or none).

    Raises:
        SchemaError: ``current`` is newer than this version in any other way (two or more
            revisions, a breaking one, or one the database has no record of), naming the
            newer version and ``compactstore db upgrade``.
    """
    if current is None or current in _shipped_revisions():
        return False
    # revision -> (parent, kind), as the versions that upgraded the database recorded them.
    recorded: dict[str, tuple[str | None, str]] = {}
    if inspect(connection).has_table(schema.schema_revisions.name):
        table = schema.schema_revisions
        recorded = {
            row.revision: (row.down_revision, row.kind)
            for row in connection.execute(
                select(table.c.revision, table.c.down_revision, table.c.kind)
            )
        }
    newer: list[tuple[str, str]] = []  # (revision, kind) from head's child to current
    revision: str | None = current
    while revision is not None and revision != head and revision in recorded:
        down, kind = recorded[revision]
        newer.insert(0, (revision, kind))
        revision = down
        if len(newer) > len(recorded):
            break  # a cycle in a damaged record
    if revision == head and len(newer) == 1 and newer[0][1] == "additive":
        return True
    by_newer = (
        "it was upgraded (`compactstore db upgrade`) by a newer compactstore; upgrade "
        "compactstore to that version (pip install -U compactstore) or open another database"
    )
    base = (
        f"the database {location} has schema revision {current}, which is newer than this "
        f"compactstore (its newest is {head})"
    )
    if revision != head:
        raise SchemaError(
            f"{base} and the database does not record how it relates to {head}; {by_newer}"
        )
    breaking = [r for r, kind in newer if kind != "additive"]
    if breaking:
        raise SchemaError(
            f"{base}: revision {breaking[0]} is breaking, which older versions cannot read "
            f"or write; {by_newer}"
        )
    raise SchemaError(
        f"{base}: {len(newer)} additive revisions newer, and a version reads and writes a "
        f"schema at most one additive revision newer than its own; {by_newer}"
    )


def record_revision(
    ctx: MigrationContext, step: MigrationInfo, heads: set[str], run_args: dict[str, Any]
) -> None:
    """Alembic's ``on_version_apply`` hook (migrations/env.py): keep ``schema_revisions``
    in step with the revisions applied, each with its parent and its file's ``kind``.

    Raises:
        SchemaError: a revision file does not declare ``kind`` as "additive" or "breaking".
    """
    if step.is_stamp or step.up_revision_id is None:
        return  # a stamp changes no schema; the record keeps what the migrations wrote
    lineage = _lineage(step.revision_map, step.up_revision_id)
    if _FIRST_RECORDED not in lineage:
        return  # the table does not exist (yet, or any more)
    table = schema.schema_revisions
    if not step.is_upgrade:
        if step.up_revision_id != _FIRST_RECORDED:  # undoing it drops the table
            ctx.execute(delete(table).where(table.c.revision == step.up_revision_id))
        return
    # The revision that creates the table records its ancestors too.
    revisions = lineage if step.up_revision_id == _FIRST_RECORDED else lineage[:1]
    for revision in revisions:
        script = step.revision_map.get_revision(revision)
        assert script is not None
        kind = getattr(getattr(script, "module", None), "kind", None)
        if kind not in KINDS:
            raise _undeclared_kind(revision)
        down = script.down_revision
        ctx.execute(
            insert(table).values(
                revision=revision, down_revision=down if isinstance(down, str) else None, kind=kind
            )
        )


def _undeclared_kind(revision: str) -> SchemaError:
    return SchemaError(
        f"migration {revision} does not say whether it is additive or breaking "
        f'(a module-level kind = "additive" or "breaking")'
    )


def _lineage(revision_map: RevisionMap, revision: str) -> list[str]:
    """``revision`` and its ancestors, newest first (the history is a single line)."""
    found: list[str] = []
    current: str | None = revision
    while current is not None:
        found.append(current)
        script = revision_map.get_revision(current)
        down = script.down_revision if script is not None else None
        current = down if isinstance(down, str) or down is None else down[0]
    return found
