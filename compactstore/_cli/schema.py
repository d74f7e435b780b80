"""`compactstore db`: the schema's revision, and upgrading it."""

from __future__ import annotations

import click

from compactstore._cli import render
from compactstore._cli.errors import library_errors
from compactstore._cli.options import db_option, json_option
from compactstore._store.store import CompactStore

__all__ = ["db_group"]


@click.group("db")
def db_group() -> None:
    """Schema management.

    Example: compactstore db current --db agent.db
    """


@db_group.command("upgrade")
@click.option(
    "--force",
    is_flag=True,
    help="Add compactstore's tables to a database that already holds other tables.",
)
@db_option
@json_option
@library_errors
def db_upgrade(force: bool, db: str, as_json: bool) -> None:
    """Create the database or upgrade its schema to this version's head.

    A database one additive revision newer than this version is left as it is (this
    version reads and writes it); a newer one than that is refused. A database holding
    another program's tables is refused unless --force is given.

    Example: compactstore db upgrade --db agent.db
    """
    from compactstore.db.migrate import current_revision

    with CompactStore.open(db, auto_migrate=True, allow_other_tables=force) as store:
        location = store.location
        revision = current_revision(store.engine)
    if as_json:
        click.echo(render.json_text({"location": location, "revision": revision}))
    else:
        click.echo(f"{location}: schema at {revision}")


@db_group.command("current")
@db_option
@json_option
@library_errors
def db_current(db: str, as_json: bool) -> None:
    """Show the database's schema revision and this version's head.

    A database one additive revision newer than this version is marked usable: this
    version reads and writes it as it is.

    Example: compactstore db current --db agent.db
    """
    from compactstore.db.migrate import head_revision, revision_of, usable_as_is

    current = revision_of(db)
    head = head_revision()
    usable = current is not None and usable_as_is(db)
    if as_json:
        found = {"current": current, "head": head, "up_to_date": current == head, "usable": usable}
        click.echo(render.json_text(found))
    else:
        click.echo(f"current: {current or 'none'}\nhead:    {head}")
        if usable and current != head:
            click.echo("one additive revision newer than this version: read and written as it is")


@db_group.command("vacuum")
@db_option
@json_option
@library_errors
def db_vacuum(db: str, as_json: bool) -> None:
    """Give back the space deleted sessions left: SQLite VACUUM (rebuilds the file: it needs
    free disk space about the file's size, and writers wait meanwhile), PostgreSQL VACUUM of
    compactstore's tables.

    A SQLite file made by this version gives the space back on delete and prune already.

    Example: compactstore prune --older-than 30 --yes && compactstore db vacuum
    """
    from compactstore._store.admin import vacuum

    with CompactStore.open(db, create=False) as store:
        report = vacuum(store)
    if as_json:
        found = {
            "location": report.location,
            "bytes_before": report.before.bytes,
            "bytes_after": report.after.bytes,
            "freed_bytes": report.freed_bytes,
        }
        click.echo(render.json_text(found))
    elif report.after.free_bytes is None:  # PostgreSQL: VACUUM makes space reusable
        click.echo(
            f"{report.location}: VACUUM (ANALYZE) done; compactstore's tables take "
            f"{report.after.bytes:,} bytes, the space of deleted rows is reusable"
        )
    else:
        click.echo(
            f"{report.location}: {report.before.bytes:,} -> {report.after.bytes:,} bytes "
            f"({report.freed_bytes:,} given back)"
        )
