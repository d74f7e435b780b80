"""Keep a database's schema at the revision this code expects, with Alembic.

The app runs Alembic on its own connection, compares the stored revision with the head
shipped in the package, and refuses a schema it cannot use with the command that fixes it.
A database already at head is recognised without importing Alembic: opening a store is then
two small queries.
"""

from __future__ import annotations

import re
from functools import cache
from importlib.resources import files
from typing import TYPE_CHECKING, Any

from sqlalchemy import Column, Connection, Engine, MetaData, String, Table, func, inspect, select

from compactstore.db.engine import (
    create_engine_for,
    database_errors,
    describe,
    normalize_url,
    read_tx,
    with_retry,
    write_tx,
)
from compactstore.errors import SchemaError

if TYPE_CHECKING:
    from alembic.config import Config

__all__ = [
    "alembic_config",
    "current_revision",
    "default_auto_migrate",
    "ensure_schema",
    "head_revision",
    "open_engine",
    "revision_of",
    "stored_revision",
]

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


@cache
def head_revision() -> str:
    """The newest revision this version of compactstore knows (read from the shipped
    revision files; the tests check it against Alembic's own answer)."""
    revisions: dict[str, str | None] = {}
    for entry in files("compactstore._migrations").joinpath("versions").iterdir():
        if not entry.name.endswith(".py") or entry.name.startswith("_"):
            continue
        text = entry.read_text(encoding="utf-8")
        revision, down = _REVISION.search(text), _DOWN_REVISION.search(text)
        if revision is None or down is None:
            raise SchemaError(
                f"cannot read the revision of {entry.name}; the installation is broken"
            )
        revisions[revision.group(1)] = None if down.group(1) == "None" else down.group(1)[1:-1]
    heads = set(revisions) - set(revisions.values())
    if len(heads) != 1:
        raise SchemaError(
            f"compactstore ships {len(heads)} schema heads; the installation is broken"
        )
    return heads.pop()


_version_table = Table("alembic_version", MetaData(), Column("version_num", String(32)))


def stored_revision(connection: Connection) -> str | None:
    """The revision stored in the database (None for a database compactstore never opened)."""
    if not inspect(connection).has_table("alembic_version"):
        return None
    found = connection.execute(select(_version_table.c.version_num)).scalars().all()
    if len(found) > 1:
        raise SchemaError(f"the database has {len(found)} schema revisions: {', '.join(found)}")
    return found[0] if found else None


def current_revision(engine: Engine) -> str | None:
    """The revision stored in the database (None for a database compactstore never opened)."""
    with engine.connect() as connection:
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
        engine.dispose()


def default_auto_migrate(url: str) -> bool:
    """Whether opening ``url`` upgrades an older schema when the caller does not say (SPEC
    §9.0 "Fleets upgrade in order"): a SQLite file is one process's, so it migrates on open;
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
) -> Engine:
    """An Engine on a database whose schema is at head (see :func:`ensure_schema`);
    ``auto_migrate`` None: :func:`default_auto_migrate`.

    Raises:
        NotFoundError: read_only and there is no SQLite file at the path.
        SchemaError, DatabaseError: as :func:`ensure_schema` and :func:`database_errors`.
    """
    if auto_migrate is None:
        auto_migrate = default_auto_migrate(url)
    engine = create_engine_for(url, read_only=read_only, pool=pool)
    try:
        database_errors(
            location,
            lambda: ensure_schema(
                engine, auto_migrate=auto_migrate, location=location, read_only=read_only
            ),
        )
    except BaseException:
        engine.dispose()
        raise
    return engine


def ensure_schema(
    engine: Engine, *, auto_migrate: bool, location: str, read_only: bool = False
) -> None:
    """Bring the schema to head, or raise SchemaError saying what to do.

    Many processes may open a new database at once: the first takes the write lock (SQLite)
    or an advisory lock (PostgreSQL), reads the revision again under it and creates the
    schema; the others wait for it and find the schema at head. A ``read_only`` engine is
    never migrated: a schema not at head is refused with the command that upgrades it.
    """
    head = head_revision()
    # Retried too: switching a new SQLite file to WAL (on connect) can meet a busy lock.
    if with_retry(lambda: current_revision(engine)) == head:
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
            if current != head:
                _upgrade(connection, current, head, auto_migrate=auto_migrate, location=location)

    with_retry(attempt)


def _upgrade(
    connection: Connection, current: str | None, head: str, *, auto_migrate: bool, location: str
) -> None:
    from alembic import command

    _check_upgradable(connection, current, head, location=location)
    # An empty database is always created at head (no older version can be using it);
    # auto_migrate governs upgrades only.
    if not auto_migrate and current is not None:
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
    """Refuse a schema that upgrading to head cannot fix (newer, or tables without a
    revision)."""
    from alembic.script import ScriptDirectory

    known = {
        script.revision for script in ScriptDirectory.from_config(alembic_config()).walk_revisions()
    }
    if current is not None and current not in known:
        raise SchemaError(
            f"the database {location} has schema revision {current}, which is newer than this "
            f"compactstore (its newest is {head}); upgrade compactstore "
            f"(pip install -U compactstore) or open another database"
        )
    if current is None and inspect(connection).has_table("sessions"):
        raise SchemaError(
            f"the database {location} has compactstore tables but no schema revision; "
            f"it was not created by compactstore's migrations and cannot be upgraded safely"
        )
