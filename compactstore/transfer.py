"""Whole sessions between databases: copy, back up, restore, delete, prune, and staging.

A copy moves every table's rows of the chosen sessions (the schema's table list decides
which tables; see :mod:`compactstore.db.transfer` for what is renumbered) in one write
transaction on the target: all of it or nothing. A backup is a compactstore SQLite
database holding just the chosen sessions, so a backup file can also be opened as a store.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import Connection

from compactstore._core import checks
from compactstore._core.sessions import release_space
from compactstore._scratch import scratch_dir
from compactstore._store.store import CompactStore
from compactstore.db import transfer as db
from compactstore.db.engine import sqlite_path
from compactstore.db.migrate import head_revision, stored_revision
from compactstore.db.transfer import CopyReport
from compactstore.errors import DatabaseError, InvalidInputError, NotFoundError, SchemaError

__all__ = [
    "CopyReport",
    "backup",
    "copy_sessions",
    "prune",
    "restore",
    "staging",
]

DAY = 86_400.0


def copy_sessions(
    source: CompactStore,
    target: CompactStore,
    session_ids: Iterable[str] | None = None,
    *,
    source_name: str | None = None,
) -> CopyReport:
    """Copy whole sessions from one store into another, in one write transaction.

    A session's subagent sessions (see :meth:`Session.subagents`) are copied with it.

    Args:
        source: the store to read (one consistent snapshot).
        target: the store to write; sessions it already has are refused.
        session_ids: the sessions to copy; None copies them all.
        source_name: how errors name the source (default: its location).

    Returns:
        The sessions copied, rows per table, and old -> new row ids per renumbered table.

    Raises:
        NotFoundError: a session is not in the source.
        ConflictError: a session already exists in the target; nothing is written.
        SchemaError: the two databases are at different schema revisions.
    """
    wanted = None if session_ids is None else [checks.check_session_id(s) for s in session_ids]

    def tx(connection: Connection) -> CopyReport:
        return db.copy_from(
            source.engine,
            connection,
            wanted,
            source_location=source.location,
            target_location=target.location,
            source_name=source_name,
        )

    return target.write(tx)


def prune(
    store: CompactStore,
    older_than_days: float,
    *,
    now: float | None = None,
    dry_run: bool = False,
    among: Iterable[str] | None = None,
) -> list[str]:
    """Delete the sessions whose last activity is more than ``older_than_days`` days old.

    A session's last activity is the latest of its creation, its newest message and its
    newest compaction (message times are those the agent or the imported transcript gave).
    All of them go in one transaction; the space is then given back as by
    ``CompactStore.delete_session``. Returns the ids (deleted, or that would be with
    ``dry_run``), oldest first.

    Args:
        among: consider only these sessions (e.g. those a person was shown and confirmed).
    """
    if isinstance(older_than_days, bool) or not isinstance(older_than_days, int | float):
        raise InvalidInputError(f"older_than_days must be a number, got {older_than_days!r}")
    if not 0 <= older_than_days < 1e7:
        raise InvalidInputError(f"older_than_days must be 0 or more, got {older_than_days}")
    cutoff = (time.time() if now is None else now) - older_than_days * DAY

    def tx(connection: Connection) -> list[str]:
        latest = db.last_activity(connection)
        if among is not None:
            latest = {sid: latest[sid] for sid in set(among) if sid in latest}
        stale = sorted((at, sid) for sid, at in latest.items() if at < cutoff)
        ids = [sid for _, sid in stale]
        if not dry_run:
            db.delete_sessions(connection, ids)
        return ids

    ids = store.read(tx) if dry_run else store.write(tx)
    for sid in [] if dry_run else ids:
        store.cache.drop(sid)
    if ids and not dry_run:
        release_space(store.engine, store.location)
    return ids


def backup(
    store: CompactStore,
    path: str | os.PathLike[str],
    session_ids: Iterable[str] | None = None,
    *,
    overwrite: bool = False,
) -> CopyReport:
    """Write sessions (default: all) with everything they own to a new SQLite file.

    The file is a compactstore database at this version's schema, in rollback-journal mode
    (one self-contained file), readable by its owner only. It is written beside ``path``
    and renamed into place when complete, so a failed backup leaves no partial file (and
    one that was killed leaves one the next backup to ``path`` removes).

    Raises:
        InvalidInputError: ``path`` is the store's own database, a directory, or exists
            and ``overwrite`` is False.
        NotFoundError: a session is not in the store.
    """
    out = Path(path).expanduser().resolve()
    own = sqlite_path(store.engine.url.render_as_string(hide_password=False))
    if own is not None and own.resolve() == out:
        raise InvalidInputError(
            f"{out} is the database being backed up; write the backup elsewhere"
        )
    if out.is_dir():
        raise InvalidInputError(f"{out} is a directory; give the backup file's name")
    if out.exists() and not overwrite:
        raise InvalidInputError(f"{out} exists; choose another name or overwrite it (--force)")
    if not out.parent.is_dir():
        raise InvalidInputError(f"cannot write {out}: the directory {out.parent} does not exist")
    # A directory of its own beside the output (.NAME.<random>.partial), removed afterwards:
    # what a backup that was killed leaves there is removed by the next backup to NAME.
    with scratch_dir(f".{out.name}.", parent=out.parent, suffix=".partial") as work:
        partial = work / out.name
        written = CompactStore.open(partial)
        try:
            report = copy_sessions(store, written, session_ids)
        finally:
            written.close()
        db.leave_wal_mode(partial)
        os.replace(partial, out)
    return report


def restore(
    store: CompactStore,
    path: str | os.PathLike[str],
    session_ids: Iterable[str] | None = None,
) -> CopyReport:
    """Copy the sessions of a backup file (default: all) into a store, in one transaction.

    Row ids are allocated anew in the store (the report maps old to new). The backup file is
    only read; one written by an older compactstore is upgraded in a temporary copy.

    Raises:
        NotFoundError: no such file, or a session is not in the backup.
        InvalidInputError: the file is not a compactstore database.
        SchemaError: the backup was written by a newer compactstore.
        ConflictError: a session of the backup already exists in the store; nothing is written.
    """
    src = Path(path).expanduser().resolve()
    if not src.is_file():
        raise NotFoundError(f"no backup file at {src}")
    source = CompactStore(db.read_only_sqlite(str(src)), str(src))
    try:
        try:
            revision = source.read(stored_revision)
        except DatabaseError as exc:
            raise InvalidInputError(f"{src} is not a compactstore backup: {exc}") from None
        if revision is None:
            raise InvalidInputError(f"{src} is not a compactstore backup (no compactstore schema)")
        if revision == head_revision():
            return copy_sessions(source, store, session_ids, source_name=f"the backup {src}")
    finally:
        source.close()
    with scratch_dir("compactstore-restore-") as tmp:
        upgraded = Path(tmp) / src.name
        shutil.copyfile(src, upgraded)
        try:
            older = CompactStore.open(upgraded)
        except SchemaError:
            raise SchemaError(
                f"the backup {src} has schema revision {revision}, which this compactstore "
                f"does not know (its newest is {head_revision()}); restore it with a newer "
                f"compactstore (pip install -U compactstore)"
            ) from None
        try:
            return copy_sessions(older, store, session_ids, source_name=f"the backup {src}")
        finally:
            older.close()


@contextmanager
def staging(target: CompactStore) -> Iterator[CompactStore]:
    """A store on a temporary SQLite file whose sessions are copied into ``target`` in one
    transaction when the block ends without an error.

    Whatever stops the work early (an exception, Ctrl-C, ``kill -9``, a full disk) leaves
    the target as it was. The temporary file lives in the system's temporary directory
    (``TMPDIR``) and is removed afterwards; one a killed run left is removed by the next
    (:mod:`compactstore._scratch`). The staging store counts tokens, summarises and
    supplies memory as ``target`` does.

    Raises:
        ConflictError: a staged session already exists in the target; nothing is copied.
    """
    with scratch_dir("compactstore-staging-") as tmp:
        stage = CompactStore.open(
            Path(tmp) / "staging.db",
            token_counter=target.token_counter,
            summarizer=target.summarizer,
            memory_provider=target.memory_provider,
            redactor=target.redactor,
            allow_block_types=target.allow_block_types,
            prices=target.prices,
        )
        stage.imports_in_place = True  # its own imports are built in place
        try:
            yield stage
            copy_sessions(stage, target)
        finally:
            stage.close()
