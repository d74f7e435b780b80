"""Keep a database's schema at the revision this code expects, with Alembic.

The app runs Alembic on its own connection, compares the stored revision with the head
shipped in the package, and refuses a schema it cannot use with the command that fixes it.
"""

from __future__ import annotations

from importlib.resources import files

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, func, inspect, select

from compactstore.db.engine import (
    create_engine_for,
    database_errors,
    describe,
    normalize_url,
    sqlite_path,
    with_retry,
    write_tx,
)
from compactstore.errors import SchemaError

__all__ = [
    "alembic_config",
    "current_revision",
    "ensure_schema",
    "head_revision",
    "revision_of",
]

# Key of the PostgreSQL advisory lock held while a schema is created or upgraded.
_SCHEMA_LOCK = 0x636F6D70616374  # "compact"


def alembic_config() -> Config:
    """An Alembic config pointing at the migrations shipped inside the package."""
    config = Config()
    config.set_main_option("script_location", str(files("compactstore._migrations")))
    return config


def head_revision() -> str:
    """The newest revision this version of compactstore knows."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    if head is None:  # pragma: no cover - the package always ships a revision
        raise SchemaError("compactstore ships no migrations; the installation is broken")
    return head


def current_revision(engine: Engine) -> str | None:
    """The revision stored in the database (None for a database compactstore never opened)."""
    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def revision_of(db: str) -> str | None:
    """The schema revision of a database given by path or URL, without creating it."""
    url = normalize_url(db)
    path = sqlite_path(url)
    if path is not None and not path.exists():
        return None
    engine = create_engine_for(url)
    try:
        return database_errors(describe(url), lambda: current_revision(engine))
    finally:
        engine.dispose()


def ensure_schema(engine: Engine, *, auto_migrate: bool, location: str) -> None:
    """Bring the schema to head, or raise SchemaError saying what to do.

    Many processes may open a new database at once: the first takes the write lock (SQLite)
    or an advisory lock (PostgreSQL), reads the revision again under it and creates the
    schema; the others wait for it and find the schema at head.
    """
    head = head_revision()
    # Retried too: switching a new SQLite file to WAL (on connect) can meet a busy lock.
    if with_retry(lambda: current_revision(engine)) == head:
        return

    def attempt() -> None:
        with write_tx(engine) as connection:
            if connection.dialect.name == "postgresql":
                connection.execute(select(func.pg_advisory_xact_lock(_SCHEMA_LOCK)))
            current = MigrationContext.configure(connection).get_current_revision()
            if current != head:
                _upgrade(connection, current, head, auto_migrate=auto_migrate, location=location)

    with_retry(attempt)


def _upgrade(
    connection: Connection, current: str | None, head: str, *, auto_migrate: bool, location: str
) -> None:
    config = alembic_config()
    known = {script.revision for script in ScriptDirectory.from_config(config).walk_revisions()}
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
    if not auto_migrate:
        raise SchemaError(
            f"the database {location} has schema revision {current or 'none'} and this "
            f"compactstore needs {head}; run `compactstore db upgrade --db {location}` "
            f"or open it with auto_migrate=True"
        )
    # Alembic runs inside this transaction (it does not begin its own when one is open).
    config.attributes["connection"] = connection
    command.upgrade(config, "head")
