"""The schema is owned by Alembic: models and migrations agree, a new database (created
from the models and stamped) has exactly the schema the migrations build, the repository's
`alembic` command works, out-of-date and foreign databases are refused with a clear error,
and SQLite files are private and opened with the documented pragmas.
"""

from __future__ import annotations

import os
import re
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from click.testing import CliRunner
from sqlalchemy import Engine, create_engine, inspect, text
from sqlalchemy.exc import IntegrityError

import compactstore
from compactstore import CompactStore, DatabaseError, SchemaError
from compactstore._cli import cli
from compactstore.db.engine import create_engine_for, normalize_url
from compactstore.db.migrate import alembic_config, current_revision, head_revision
from compactstore.db.schema import metadata
from tests.conftest import fresh_database
from tests.helpers import TABLES, migrate_to

# These tests are about creating and migrating a database: each gets one with nothing in it.
pytestmark = pytest.mark.empty_database

REPO = Path(__file__).resolve().parents[1]
UNKNOWN_REVISION = "ffffffffffff"


def _alembic(*args: str, env_db: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run `python -m alembic ARGS` from the repository root, as a developer would."""
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("COMPACTSTORE_DB", None)
    if env_db is not None:
        env["COMPACTSTORE_DB"] = env_db
    return subprocess.run(
        [sys.executable, "-m", "alembic", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _alembic_ok(*args: str, db_url: str) -> None:
    # SQLite: the database comes from COMPACTSTORE_DB; PostgreSQL: from `-x db=URL`.
    if "://" in db_url:
        result = _alembic("-x", f"db={db_url}", *args)
    else:
        result = _alembic(*args, env_db=db_url)
    assert result.returncode == 0, result.stderr


def _view_names(url: str) -> set[str]:
    engine = create_engine(url if "://" in url else f"sqlite:///{url}")
    try:
        return set(inspect(engine).get_view_names())
    finally:
        engine.dispose()


def _table_names(url: str) -> set[str]:
    engine = create_engine(url if "://" in url else f"sqlite:///{url}")
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


# -- models and migrations ------------------------------------------------------------------


def _migrated(url: str) -> Engine:
    """An engine on ``url`` (an empty database) after running every migration, as an
    upgrade from the first revision would."""
    migrate_to(url, "head", down=False)
    return create_engine_for(normalize_url(url))


def _schema(engine: Engine) -> dict[str, object]:
    """Everything a query can see of a database's schema, from the backend's own catalog:
    each table's columns in order (type, nullability, default, key), its indexes, keys and
    constraints, the view's definition, and the revision records."""
    described: dict[str, object] = {}
    with engine.connect() as connection:
        if connection.dialect.name == "sqlite":
            names = connection.exec_driver_sql(
                "SELECT name, type, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' "
                "ORDER BY name"
            ).all()
            for name, kind, sql in names:
                if kind == "view":
                    described[name] = " ".join(sql.split())
                if kind != "table":
                    continue
                indexes = connection.exec_driver_sql(f"PRAGMA index_list('{name}')").all()
                keys: dict[int, list[tuple[object, ...]]] = {}
                for part in connection.exec_driver_sql(f"PRAGMA foreign_key_list('{name}')"):
                    keys.setdefault(part[0], []).append(tuple(part[1:]))
                described[name] = (
                    connection.exec_driver_sql(f"PRAGMA table_xinfo('{name}')").all(),
                    sorted(
                        (
                            *index[1:],
                            connection.exec_driver_sql(f"PRAGMA index_xinfo('{index[1]}')").all(),
                        )
                        for index in indexes
                    ),
                    # A foreign key's id is its place among the table's: not compared.
                    sorted(keys.values()),
                )
        else:
            queries = {
                "columns": "SELECT table_name, ordinal_position, column_name, data_type, "
                "character_maximum_length, numeric_precision, numeric_scale, is_nullable, "
                "column_default, is_identity FROM information_schema.columns "
                "WHERE table_schema = 'public'",
                "constraints": "SELECT conrelid::regclass::text, conname, contype, "
                "pg_get_constraintdef(oid) FROM pg_constraint "
                "WHERE connamespace = 'public'::regnamespace",
                "indexes": "SELECT tablename, indexname, indexdef FROM pg_indexes "
                "WHERE schemaname = 'public'",
                "views": "SELECT viewname, definition FROM pg_views WHERE schemaname = 'public'",
                "sequences": "SELECT sequencename, data_type, start_value, increment_by "
                "FROM pg_sequences WHERE schemaname = 'public'",
            }
            for key, query in queries.items():
                described[key] = sorted(connection.exec_driver_sql(query).all())
            # A column's ordinal_position counts the dropped columns before it too: compare
            # each table's columns in order, without it.
            by_table: dict[str, list[tuple[object, ...]]] = {}
            for column in described["columns"]:  # type: ignore[attr-defined]
                by_table.setdefault(column[0], []).append(tuple(column[2:]))
            described["columns"] = by_table
        for table in ("alembic_version", "schema_revisions"):
            described[f"{table} rows"] = sorted(
                connection.exec_driver_sql(f"SELECT * FROM {table}").all()
            )
    return described


@pytest.mark.slow_on_postgres
def test_models_and_migrations_agree(db_url: str) -> None:
    engine = _migrated(db_url)
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(
                connection, opts={"compare_type": True, "compare_server_default": True}
            )
            assert compare_metadata(context, metadata) == []
    finally:
        engine.dispose()


@pytest.mark.slow_on_postgres
def test_a_new_database_has_exactly_the_schema_the_migrations_build(
    db_url: str, tmp_path: Path
) -> None:
    backend = "postgres" if db_url.startswith("postgresql") else "sqlite"
    (tmp_path / "new").mkdir()
    with fresh_database(backend, tmp_path / "new", "new", empty=True) as new_url:
        CompactStore.open(new_url, auto_migrate=False).close()
        created, migrated = create_engine_for(normalize_url(new_url)), _migrated(db_url)
        try:
            expected = _schema(migrated)
            assert _schema(created) == expected
        finally:
            created.dispose()
            migrated.dispose()
    from alembic.script import ScriptDirectory

    every = {
        script.revision for script in ScriptDirectory.from_config(alembic_config()).walk_revisions()
    }
    assert {row[0] for row in expected["schema_revisions rows"]} == every  # type: ignore[attr-defined]


@pytest.mark.slow_on_postgres
def test_a_new_database_is_created_at_head_with_every_table_and_the_history_view(
    store: CompactStore,
) -> None:
    assert current_revision(store.engine) == head_revision()
    names = set(inspect(store.engine).get_table_names())
    assert names >= TABLES
    assert "compaction_history" in set(inspect(store.engine).get_view_names())
    assert store.sessions() == []


def test_the_head_read_from_the_revision_files_is_alembics() -> None:
    from alembic.script import ScriptDirectory

    assert head_revision() == ScriptDirectory.from_config(alembic_config()).get_current_head()


@pytest.mark.slow
def test_opening_a_database_at_head_does_not_load_alembic(db_url: str) -> None:
    CompactStore.open(db_url).close()
    code = (
        "import sys; from compactstore import CompactStore; "
        "CompactStore.open(sys.argv[1]).close(); print(sorted(m for m in sys.modules "
        "if m.split('.')[0] == 'alembic'))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, db_url], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout


@pytest.mark.slow
def test_alembic_upgrade_downgrade_upgrade_from_the_repository_root(db_url: str) -> None:
    _alembic_ok("upgrade", "head", db_url=db_url)
    assert _table_names(db_url) >= TABLES
    assert "compaction_history" in _view_names(db_url)

    _alembic_ok("downgrade", "base", db_url=db_url)
    assert _table_names(db_url) & TABLES == set()
    assert "compaction_history" not in _view_names(db_url)

    _alembic_ok("upgrade", "head", db_url=db_url)
    assert "compaction_history" in _view_names(db_url)
    with CompactStore.open(db_url, auto_migrate=False) as opened:
        assert current_revision(opened.engine) == head_revision()
        opened.session("s1", now=1.0).append({"role": "user", "content": "hi"}, timestamp=1.0)


# -- revisions the code cannot use ---------------------------------------------------------


@pytest.mark.slow_on_postgres
def test_a_schema_newer_than_the_code_is_refused_naming_both_revisions(db_url: str) -> None:
    CompactStore.open(db_url).close()
    engine = create_engine(db_url if "://" in db_url else f"sqlite:///{db_url}")
    with engine.begin() as connection:
        connection.execute(
            text("UPDATE alembic_version SET version_num = :v"), {"v": UNKNOWN_REVISION}
        )
    engine.dispose()

    with pytest.raises(SchemaError) as caught:
        CompactStore.open(db_url)
    message = str(caught.value)
    assert UNKNOWN_REVISION in message
    assert head_revision() in message
    assert "newer" in message


def test_an_empty_database_is_created_at_head_even_with_auto_migrate_false(
    tmp_path: Path,
) -> None:
    # auto_migrate governs upgrades only; no older version can use an empty file.
    path = tmp_path / "empty.db"
    path.touch()
    with CompactStore.open(path, auto_migrate=False) as store:
        assert current_revision(store.engine) == head_revision()
        assert _table_names(str(path)) >= TABLES


@pytest.mark.slow
def test_auto_migrate_false_refuses_a_downgraded_database_and_true_upgrades_it(
    db_url: str,
) -> None:
    CompactStore.open(db_url).close()
    _alembic_ok("downgrade", "-1", db_url=db_url)

    with pytest.raises(SchemaError, match=r"db upgrade") as caught:
        CompactStore.open(db_url, auto_migrate=False)
    # The command it names works as written.
    command = re.search(r"`compactstore ([^`]+)`", str(caught.value))
    assert command is not None, caught.value
    result = CliRunner().invoke(cli, shlex.split(command.group(1)))
    assert result.exit_code == 0, result.output
    CompactStore.open(db_url, auto_migrate=False).close()

    _alembic_ok("downgrade", "-1", db_url=db_url)
    with CompactStore.open(db_url, auto_migrate=True) as upgraded:
        assert current_revision(upgraded.engine) == head_revision()


@pytest.mark.slow
def test_by_default_sqlite_files_migrate_on_open_and_postgresql_does_not(db_url: str) -> None:
    """`compactstore db upgrade` first, then the new
    version rolls out; a SQLite file is one process's and keeps migrating on open."""
    CompactStore.open(db_url).close()  # an empty database: created at head on both
    _alembic_ok("downgrade", "-1", db_url=db_url)
    if "://" in db_url:
        with pytest.raises(SchemaError, match=r"db upgrade .*a server database is not upgraded"):
            CompactStore.open(db_url)
        assert as_revision(db_url) != head_revision()
        result = CliRunner().invoke(cli, ["db", "upgrade", "--db", db_url])
        assert result.exit_code == 0, result.output
    with CompactStore.open(db_url) as store:
        assert current_revision(store.engine) == head_revision()


def as_revision(url: str) -> str | None:
    engine = create_engine(url if "://" in url else f"sqlite:///{url}")
    try:
        return current_revision(engine)
    finally:
        engine.dispose()


def test_tables_without_a_revision_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "foreign.db"
    engine = create_engine(f"sqlite:///{path}")
    with engine.begin() as connection:
        connection.execute(text("CREATE TABLE sessions (id TEXT PRIMARY KEY)"))
    engine.dispose()
    with pytest.raises(SchemaError, match=r"no schema revision"):
        CompactStore.open(path)


# -- files that are not databases -----------------------------------------------------------


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(b"just some notes, not a database\n" * 40, id="text"),
        pytest.param(bytes(range(256)) * 16, id="binary"),
        pytest.param(b"hello", id="tiny"),
    ],
)
def test_a_file_that_is_not_sqlite_raises_DatabaseError_naming_it(
    tmp_path: Path, content: bytes
) -> None:
    path = tmp_path / "notes.db"
    path.write_bytes(content)
    with pytest.raises(DatabaseError) as caught:
        CompactStore.open(path)
    assert type(caught.value) is compactstore.DatabaseError
    message = str(caught.value)
    assert str(path) in message
    assert "not a database" in message
    # One line a person can act on, not a driver's exception dump.
    assert "\n" not in message
    assert "sqlalche.me" not in message
    assert "(sqlite3." not in message
    assert caught.value.__cause__ is None
    assert caught.value.__suppress_context__
    # The file is left as it was.
    assert path.read_bytes() == content


def test_a_directory_is_not_a_database(tmp_path: Path) -> None:
    with pytest.raises(DatabaseError) as caught:
        CompactStore.open(tmp_path)
    assert str(tmp_path) in str(caught.value)


# -- SQLite file and connection settings ----------------------------------------------------


def test_a_new_sqlite_file_is_private_to_its_owner(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "dir" / "agent.db"
    with CompactStore.open(path) as opened:
        opened.session("s1", now=1.0).append({"role": "user", "content": "hi"}, timestamp=1.0)
        for name in ("agent.db", "agent.db-wal", "agent.db-shm"):
            file = path.parent / name
            if file.exists():
                assert stat.S_IMODE(file.stat().st_mode) == 0o600, name
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_sqlite_connections_use_wal_foreign_keys_normal_sync_and_a_busy_timeout(
    tmp_path: Path,
) -> None:
    with CompactStore.open(tmp_path / "agent.db") as opened, opened.engine.connect() as connection:

        def pragma(name: str) -> object:
            return connection.exec_driver_sql(f"PRAGMA {name}").scalar()

        assert pragma("journal_mode") == "wal"
        assert pragma("foreign_keys") == 1
        assert pragma("synchronous") == 1  # NORMAL
        busy = pragma("busy_timeout")
        assert isinstance(busy, int)
        assert busy >= 1_000


def test_foreign_keys_are_enforced_on_sqlite(tmp_path: Path) -> None:
    with (
        CompactStore.open(tmp_path / "agent.db") as opened,
        pytest.raises(IntegrityError, match=r"FOREIGN KEY"),
        opened.engine.begin() as connection,
    ):
        connection.execute(
            text(
                "INSERT INTO messages (session_id, seq, role, kind, payload, tokens, created_at) "
                "VALUES ('nobody', 0, 'user', 'user', '{}', 0, 0)"
            )
        )


def test_the_migrations_have_exactly_one_head() -> None:
    """Two migrations branching from one revision would leave the schema two ways to go."""
    from alembic.script import ScriptDirectory

    heads = ScriptDirectory.from_config(alembic_config()).get_heads()
    assert len(heads) == 1, f"the migrations have {len(heads)} heads: {heads}"
    assert heads == [head_revision()]
