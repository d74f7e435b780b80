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
from sqlalchemy import Engine, inspect

from compactstore.errors import SchemaError

__all__ = [
    "alembic_config",
    "current_revision",
    "ensure_schema",
    "head_revision",
    "revision_of",
    "upgrade",
]


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
    from compactstore.db.engine import create_engine_for, normalize_url, sqlite_path

    url = normalize_url(db)
    path = sqlite_path(url)
    if path is not None and not path.exists():
        return None
    engine = create_engine_for(url)
    try:
        return current_revision(engine)
    finally:
        engine.dispose()


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Run Alembic's upgrade on the engine, in one transaction."""
    config = alembic_config()
    with engine.connect() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, revision)
        connection.commit()


def ensure_schema(engine: Engine, *, auto_migrate: bool, location: str) -> None:
    """Bring the schema to head, or raise SchemaError saying what to do."""
    head = head_revision()
    current = current_revision(engine)
    if current == head:
        return
    known = {
        script.revision for script in ScriptDirectory.from_config(alembic_config()).walk_revisions()
    }
    if current is not None and current not in known:
        raise SchemaError(
            f"the database {location} has schema revision {current}, which is newer than this "
            f"compactstore (its newest is {head}); upgrade compactstore "
            f"(pip install -U compactstore) or open another database"
        )
    if current is None and inspect(engine).has_table("sessions"):
        raise SchemaError(
            f"the database {location} has compactstore tables but no schema revision; "
            f"it was not created by compactstore's migrations and cannot be upgraded safely"
        )
    if not auto_migrate:
        raise SchemaError(
            f"the database {location} has schema revision {current or 'none'} and this "
            f"compactstore needs {head}; run `compactstore --db {location} db upgrade` "
            f"or open it with auto_migrate=True"
        )
    upgrade(engine)
