"""Commands that move or remove whole sessions: backup, restore, delete, prune."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from compactstore._cli import render
from compactstore._cli.errors import library_errors
from compactstore._cli.options import db_option, json_option, output_option, session_argument
from compactstore._store.admin import Space, database_space
from compactstore._store.store import CompactStore
from compactstore.db.transfer import CopyReport
from compactstore.transfer import backup as backup_sessions
from compactstore.transfer import prune as prune_sessions
from compactstore.transfer import restore as restore_sessions

__all__ = ["backup", "delete", "prune", "restore"]


def _freed(before: Space, after: Space) -> str:
    """What deleting did to the database's size, and what to do for the rest."""
    freed = max(0, before.bytes - after.bytes)
    if after.free_bytes is None:
        return (
            f"PostgreSQL's autovacuum makes the space reusable ({after.bytes:,} bytes in "
            f"compactstore's tables); `compactstore db vacuum` does it now."
        )
    line = f"Freed {freed:,} bytes: the database now takes {after.bytes:,}."
    if after.free_bytes:
        line += (
            f" {after.free_bytes:,} bytes stay free inside the file for new rows; "
            f"`compactstore db vacuum` gives them back to the disk."
        )
    return line


def _n(count: int, one: str, many: str | None = None) -> str:
    return f"{count:,} {one if count == 1 else many or one + 's'}"


def _counts(report: CopyReport) -> str:
    rows = report.rows
    return ", ".join(
        [
            _n(rows.get("messages", 0), "message"),
            _n(rows.get("compactions", 0), "compaction"),
            _n(rows.get("tool_result_blobs", 0), "blob"),
            _n(rows.get("memory_entries", 0), "memory entry", "memory entries"),
        ]
    )


def _copy_json(report: CopyReport, **extra: Any) -> str:
    return render.json_text(
        {
            **extra,
            "sessions": report.sessions,
            "rows": report.rows,
            "ids": {
                table: {str(old): new for old, new in ids.items()}
                for table, ids in report.ids.items()
            },
        }
    )


@click.command(short_help="Write sessions with everything they own to a file.")
@click.argument("session_ids", metavar="[SESSION]...", nargs=-1)
@click.option("--all", "every", is_flag=True, help="Back up every session.")
@output_option("The backup file to write (a compactstore SQLite database).")
@click.option("--force", is_flag=True, help="Replace the output file if it exists.")
@db_option
@json_option
@library_errors
def backup(
    session_ids: tuple[str, ...],
    every: bool,
    output: Path | None,
    force: bool,
    db: str,
    as_json: bool,
) -> None:
    """Back up sessions (or --all) with their log, boundaries, compactions, edits, blobs,
    memory, breaker state and model calls to one SQLite file that `restore` reads.

    The file is written beside its name and renamed into place when complete.

    Example: compactstore backup --all -o nightly.compactstore --db agent.db
    """
    if output is None:
        raise click.UsageError("give the backup file with -o FILE")
    if every == bool(session_ids):
        raise click.UsageError("give the SESSION(s) to back up, or --all (not both)")
    with CompactStore.open(db, read_only=True) as store:
        report = backup_sessions(store, output, None if every else session_ids, overwrite=force)
        location = store.location
    if as_json:
        click.echo(_copy_json(report, location=location, file=str(output)))
    else:
        click.echo(
            f"Backed up {_n(len(report.sessions), 'session')} of {location} to {output}: "
            f"{_counts(report)}."
        )


@click.command(short_help="Copy the sessions of a backup file into the database.")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--session",
    "session_ids",
    multiple=True,
    metavar="SESSION",
    help="Restore only this session (repeatable; default: every session in the file).",
)
@db_option
@json_option
@library_errors
def restore(file: Path, session_ids: tuple[str, ...], db: str, as_json: bool) -> None:
    """Restore the sessions of a backup file, in one transaction, into an empty or a
    non-empty database. A session id the database already has is refused (nothing is
    written). Boundary, compaction, edit and memory ids are allocated anew: --json shows the
    old -> new map.

    Example: compactstore restore nightly.compactstore --db fresh.db
    """
    with CompactStore.open(db) as store:
        report = restore_sessions(store, file, session_ids or None)
        location = store.location
    if as_json:
        click.echo(_copy_json(report, location=location, file=str(file)))
    else:
        names = ", ".join(report.sessions) or "none"
        click.echo(f"Restored into {location}: {names} ({_counts(report)}).")


@click.command(short_help="Delete a session and everything it owns.")
@session_argument
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@db_option
@json_option
@library_errors
def delete(session_id: str, yes: bool, db: str, as_json: bool) -> None:
    """Delete a session: its log, compactions, boundaries, edits, blobs, memory and every
    other row it owns, in one transaction. There is no undo: back it up first.

    Asks for confirmation unless --yes is given.

    Example: compactstore backup s1 -o s1.compactstore && compactstore delete s1 --yes
    """
    with CompactStore.open(db, read_only=True) as store:
        sess = store.get_session(session_id)  # no database or no session: nothing asked
        messages = sess.message_count()
    if not yes:
        click.confirm(
            f"Delete session {sess.id} ({_n(messages, 'message')}) and everything it owns? "
            f"There is no undo",
            abort=True,
            err=True,
        )
    with CompactStore.open(db, create=False) as store:
        before = database_space(store)
        store.delete_session(session_id)
        after = database_space(store)
        location = store.location
    if as_json:
        found = {"location": location, "session": sess.id, "deleted": True}
        click.echo(render.json_text({**found, "freed_bytes": max(0, before.bytes - after.bytes)}))
    else:
        click.echo(f"Deleted session {sess.id} ({_n(messages, 'message')}) from {location}.")
        click.echo(_freed(before, after))


@click.command(short_help="Delete the sessions idle for more than some days.")
@click.option(
    "--older-than",
    "days",
    type=click.FloatRange(min=0),
    required=True,
    metavar="DAYS",
    help="Delete sessions whose last message, compaction or creation is older than this.",
)
@click.option("--dry-run", is_flag=True, help="List what would be deleted; delete nothing.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@db_option
@json_option
@library_errors
def prune(days: float, dry_run: bool, yes: bool, db: str, as_json: bool) -> None:
    """Delete every session idle for more than DAYS days, in one transaction.

    A session's last activity is the latest of its creation, its newest message and its
    newest compaction (message times are the agent's or the imported transcript's). Asks
    for confirmation, listing the sessions, unless --yes or --dry-run is given.

    Example: compactstore prune --older-than 30 --dry-run
    """
    with CompactStore.open(db, read_only=True) as store:
        stale = prune_sessions(store, days, dry_run=True)
    deleted: list[str] = []
    before = after = None
    if stale and not dry_run:
        if not yes:
            click.confirm(
                f"Delete {_n(len(stale), 'session')} idle for more than {days:g} days "
                f"({', '.join(stale)})? There is no undo",
                abort=True,
                err=True,
            )
        with CompactStore.open(db, create=False) as store:
            before = database_space(store)
            # Only those shown: one that came back to life meanwhile is kept.
            deleted = prune_sessions(store, days, among=stale)
            after = database_space(store)
    if as_json:
        listed = stale if dry_run else deleted
        found = {"older_than_days": days, "dry_run": dry_run, "sessions": listed}
        freed = None if before is None or after is None else max(0, before.bytes - after.bytes)
        click.echo(render.json_text({**found, "freed_bytes": freed}))
    elif dry_run:
        click.echo(
            f"{_n(len(stale), 'session')} idle for more than {days:g} days"
            + (f": {', '.join(stale)}" if stale else "")
            + " (dry run: nothing deleted)."
        )
    else:
        click.echo(
            f"Deleted {_n(len(deleted), 'session')} idle for more than {days:g} days"
            + (f": {', '.join(deleted)}." if deleted else ".")
        )
        if deleted and before is not None and after is not None:
            click.echo(_freed(before, after))
