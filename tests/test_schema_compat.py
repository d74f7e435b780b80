"""Fleets upgrade in order: revisions are marked additive or breaking, and a
version reads and writes a schema one additive revision newer than its own.

The newer schemas here are real: a database built at this version's head, then upgraded by
Alembic with revisions from a temporary directory (as a newer compactstore would), then
opened with this code.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from click.testing import CliRunner
from sqlalchemy import Engine, create_engine, inspect, select, text

from compactstore import CompactionConfig, CompactStore, SchemaError
from compactstore._cli import cli
from compactstore.db import schema
from compactstore.db.migrate import KINDS, alembic_config, current_revision, head_revision


def _engine(db_url: str) -> Engine:
    return create_engine(db_url if "://" in db_url else f"sqlite:///{db_url}")


def _scripts() -> ScriptDirectory:
    return ScriptDirectory.from_config(alembic_config())


def _newer_revision(
    directory: Path, revision: str, down: str, kind: str, upgrade: str, downgrade: str = "pass"
) -> None:
    """Write a revision file as a newer compactstore would ship it."""
    body = "\n".join("    " + line for line in upgrade.strip().splitlines())
    (directory / f"{revision}.py").write_text(
        f'"""a newer version\'s revision ({kind})"""\n\n'
        "import sqlalchemy as sa\n"
        "from alembic import op\n\n"
        f"revision = {revision!r}\n"
        f"down_revision = {down!r}\n"
        "branch_labels = None\n"
        "depends_on = None\n"
        f"kind = {kind!r}\n\n\n"
        f"def upgrade() -> None:\n{body}\n\n\n"
        f"def downgrade() -> None:\n    {downgrade}\n",
        encoding="utf-8",
    )


SCRIPT_LOCATION = alembic_config().get_main_option("script_location") or ""
VERSIONS = Path(SCRIPT_LOCATION) / "versions"


def _upgrade_with(
    db_url: str, directory: Path, target: str = "heads", *, down: bool = False
) -> None:
    """Upgrade (or downgrade) the database with the shipped revisions and those in
    ``directory``, as a newer compactstore's ``db upgrade`` would."""
    config = Config()
    config.set_main_option("script_location", SCRIPT_LOCATION)
    config.set_main_option("path_separator", "os")
    config.set_main_option("version_locations", os.pathsep.join([str(VERSIONS), str(directory)]))
    engine = _engine(db_url)
    try:
        with engine.begin() as connection:
            config.attributes["connection"] = connection
            (command.downgrade if down else command.upgrade)(config, target)
    finally:
        engine.dispose()


# A newer version's additive revision: a nullable column, a defaulted NOT NULL column,
# and a table of its own that refers to sessions ON DELETE CASCADE.
ADDITIVE = """
op.add_column("messages", sa.Column("mood", sa.Text(), nullable=True))
op.add_column(
    "sessions",
    sa.Column("priority", sa.Integer(), nullable=False, server_default=sa.text("3")),
)
op.create_table(
    "notes",
    sa.Column("id", sa.Integer(), primary_key=True),
    sa.Column(
        "session_id",
        sa.String(255),
        sa.ForeignKey("sessions.id", ondelete="CASCADE"),
        nullable=False,
    ),
    sa.Column("body", sa.Text(), nullable=False),
)
"""


@pytest.fixture
def newer(tmp_path: Path) -> Iterator[Path]:
    directory = tmp_path / "newer_versions"
    directory.mkdir()
    yield directory


def _converse(store: CompactStore, session_id: str) -> None:
    session = store.session(
        session_id,
        context_window=4_000,
        config=CompactionConfig(fixed_overhead_tokens=0),
        now=1.0,
    )
    session.append({"role": "user", "content": "please summarise the report"}, timestamp=1.0)
    for turn in range(12):
        session.append(
            {"role": "assistant", "content": f"turn {turn}: " + "reading " * 100},
            timestamp=2.0 + turn,
        )
        session.append({"role": "user", "content": f"go on {turn}"}, timestamp=2.5 + turn)
    result = session.process_request(now=100.0)
    assert result.success and result.strategy is not None
    assert session.active_context()[0]["content"] == "please summarise the report"


# -- the revisions say what they are -------------------------------------------------------


def test_every_shipped_revision_declares_whether_it_is_additive_or_breaking() -> None:
    kinds = {script.revision: script.module.kind for script in _scripts().walk_revisions()}
    assert set(kinds.values()) <= set(KINDS), kinds
    # Re-keying tool calls by seq is breaking.
    assert kinds["e5a1c7d93b26"] == "breaking"


def test_the_database_records_every_revision_with_its_parent_and_kind(store: CompactStore) -> None:
    expected = {(s.revision, s.down_revision, s.module.kind) for s in _scripts().walk_revisions()}
    table = schema.schema_revisions
    with store.engine.connect() as connection:
        rows = set(
            connection.execute(select(table.c.revision, table.c.down_revision, table.c.kind))
        )
    assert rows == expected


def _shape(engine: Engine) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    inspector = inspect(engine)
    for name in inspector.get_table_names():
        found[name] = {
            "columns": {c["name"]: c for c in inspector.get_columns(name)},
            "foreign_keys": inspector.get_foreign_keys(name),
            "unique": {tuple(u["column_names"]) for u in inspector.get_unique_constraints(name)}
            | {tuple(i["column_names"]) for i in inspector.get_indexes(name) if i["unique"]},
        }
    return found


def _additive_violations(
    revision: str, before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]]
) -> list[str]:
    """How a revision breaks the rule for additive revisions (compactstore/db/migrate.py,
    README): nothing dropped, renamed or retyped; a column added to an existing table is
    nullable or has a server default; no unique constraint on an existing table; a foreign
    key from a new table to an existing one is ON DELETE CASCADE."""
    found = []
    for name, old in before.items():
        if name not in after:
            found.append(f"{revision} drops table {name}")
            continue
        new = after[name]
        for column, shape in old["columns"].items():
            if column not in new["columns"]:
                found.append(f"{revision} drops {name}.{column}")
            elif str(new["columns"][column]["type"]) != str(shape["type"]):
                found.append(f"{revision} changes the type of {name}.{column}")
        for column in sorted(set(new["columns"]) - set(old["columns"])):
            added = new["columns"][column]
            if not added["nullable"] and added["default"] is None:
                found.append(f"{revision}: {name}.{column} is NOT NULL without a default")
        if not new["unique"] <= old["unique"]:
            found.append(f"{revision} adds a unique constraint to {name}")
    for name in sorted(set(after) - set(before)):
        for fk in after[name]["foreign_keys"]:
            if fk["referred_table"] in before and (fk["options"] or {}).get("ondelete") != (
                "CASCADE"
            ):
                found.append(
                    f"{revision}: {name} refers to {fk['referred_table']} without ON DELETE CASCADE"
                )
    return found


@pytest.mark.slow
def test_every_additive_revision_only_adds_what_an_older_version_can_ignore(
    tmp_path: Path,
) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'steps.db'}")
    config = alembic_config()
    checked, violations = [], []
    try:
        before: dict[str, dict[str, Any]] = {}
        for script in reversed(list(_scripts().walk_revisions())):
            with engine.begin() as connection:
                config.attributes["connection"] = connection
                command.upgrade(config, script.revision)
            after = _shape(engine)
            if script.module.kind == "additive":
                checked.append(script.revision)
                violations += _additive_violations(script.revision, before, after)
            before = after
    finally:
        engine.dispose()
    assert violations == []
    assert "6aa8b67dd6bf" in checked


def test_the_rule_check_finds_a_revision_that_only_claims_to_be_additive(
    tmp_path: Path, newer: Path
) -> None:
    db = str(tmp_path / "claims.db")
    CompactStore.open(db).close()
    before = _shape(_engine(db))
    _newer_revision(
        newer,
        "d0dd17e0001d",
        head_revision(),
        "additive",
        """
op.add_column("messages", sa.Column("weight", sa.Integer(), nullable=False))
op.drop_column("sessions", "cwd")
op.create_table("tags", sa.Column("session_id", sa.String(255), sa.ForeignKey("sessions.id")))
""",
    )
    _upgrade_with(db, newer)
    assert _additive_violations("d0dd17e0001d", before, _shape(_engine(db))) == [
        "d0dd17e0001d: messages.weight is NOT NULL without a default",
        "d0dd17e0001d drops sessions.cwd",
        "d0dd17e0001d: tags refers to sessions without ON DELETE CASCADE",
    ]


# -- one additive revision newer: read and written as it is --------------------------------


@pytest.mark.slow
def test_a_schema_one_additive_revision_newer_is_read_and_written(db_url: str, newer: Path) -> None:
    with CompactStore.open(db_url) as store:
        _converse(store, "before")
    head = head_revision()
    _newer_revision(newer, "a0dd17e0001a", head, "additive", ADDITIVE)
    _upgrade_with(db_url, newer)

    with CompactStore.open(db_url) as store:  # PostgreSQL: auto_migrate False by default
        assert current_revision(store.engine) == "a0dd17e0001a"
        old = store.get_session("before")
        before = old.active_context()
        old.append({"role": "user", "content": "and one more thing"}, timestamp=200.0)
        assert old.active_context() == [*before, {"role": "user", "content": "and one more thing"}]
        _converse(store, "after")
        assert {s.id for s in store.sessions()} >= {"before", "after"}
    engine = _engine(db_url)
    try:
        with engine.begin() as connection:
            # The newer version's own data, written beside the older version's rows.
            connection.execute(text("INSERT INTO notes (session_id, body) VALUES ('after', 'x')"))
            moods = connection.execute(text("SELECT count(*) FROM messages WHERE mood IS NULL"))
            assert moods.scalar_one() > 0
            priority = connection.execute(text("SELECT priority FROM sessions WHERE id='after'"))
            assert priority.scalar_one() == 3
    finally:
        engine.dispose()

    with CompactStore.open(db_url) as store:
        # ON DELETE CASCADE: the older version deletes a session the newer one annotated.
        store.delete_session("after")
        assert "after" not in {s.id for s in store.sessions()}
    # Read-only commands read it too.
    shown = CliRunner().invoke(cli, ["show", "before", "--db", db_url])
    assert shown.exit_code == 0, shown.output
    assert "and one more thing" in shown.output
    upgraded = CliRunner().invoke(cli, ["db", "upgrade", "--db", db_url])
    assert upgraded.exit_code == 0, upgraded.output
    assert "a0dd17e0001a" in upgraded.output
    current = CliRunner().invoke(cli, ["db", "current", "--json", "--db", db_url])
    assert json.loads(current.output) == {
        "current": "a0dd17e0001a",
        "head": head_revision(),
        "up_to_date": False,
        "usable": True,
    }
    shown = CliRunner().invoke(cli, ["db", "current", "--db", db_url])
    assert shown.output.endswith(
        "one additive revision newer than this version: read and written as it is\n"
    )


def test_a_breaking_newer_revision_is_refused_naming_the_newer_version(
    db_url: str, newer: Path
) -> None:
    CompactStore.open(db_url).close()
    _newer_revision(
        newer, "b0dd17e0001b", head_revision(), "breaking", 'op.drop_column("sessions", "cwd")'
    )
    _upgrade_with(db_url, newer)
    for read_only in (False, True):
        with pytest.raises(SchemaError) as caught:
            CompactStore.open(db_url, read_only=read_only)
        message = str(caught.value)
        assert "b0dd17e0001b is breaking" in message
        assert head_revision() in message
        assert "compactstore db upgrade" in message and "newer compactstore" in message


def test_two_additive_revisions_newer_are_refused(db_url: str, newer: Path) -> None:
    CompactStore.open(db_url).close()
    _newer_revision(newer, "c0dd17e0001c", head_revision(), "additive", ADDITIVE)
    _newer_revision(
        newer,
        "c0dd17e0002c",
        "c0dd17e0001c",
        "additive",
        'op.add_column("messages", sa.Column("tone", sa.Text(), nullable=True))',
        'op.drop_column("messages", "tone")',
    )
    _upgrade_with(db_url, newer)
    with pytest.raises(SchemaError, match=r"2 additive revisions newer.*compactstore db upgrade"):
        CompactStore.open(db_url)
    current = CliRunner().invoke(cli, ["db", "current", "--json", "--db", db_url])
    assert json.loads(current.output)["usable"] is False
    result = CliRunner().invoke(cli, ["show", "s", "--db", db_url])
    assert result.exit_code == 1
    assert "2 additive revisions newer" in result.output
    # Back to one step newer: usable again.
    _upgrade_with(db_url, newer, "c0dd17e0001c", down=True)
    with CompactStore.open(db_url) as store:
        assert current_revision(store.engine) == "c0dd17e0001c"
