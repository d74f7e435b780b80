"""Engines and transactions: SQLite pragmas, BEGIN IMMEDIATE for writers, retries on busy.

SQLite follows SQLAlchemy's documented pysqlite recipe: the driver's own transaction
handling is switched off on connect and the ``begin`` event emits BEGIN itself, so a write
transaction takes the write lock up front (BEGIN IMMEDIATE) and two processes writing one
session queue up instead of failing half-way. PostgreSQL writers lock the session row.
"""

from __future__ import annotations

import errno
import json
import os
import random
import sqlite3
import threading
import time
import urllib.parse
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from time import monotonic
from typing import Any, TypeVar

from pydantic import ValidationError
from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, OperationalError

from compactstore.db.writer_turns import WriterTurns
from compactstore.errors import DatabaseError, InvalidInputError, NotFoundError

__all__ = [
    "create_engine_for",
    "database_errors",
    "describe",
    "is_busy",
    "no_database",
    "normalize_url",
    "read_tx",
    "release_engine",
    "sqlite_path",
    "with_retry",
    "write_tx",
]

_WRITE = "compactstore_write"
BUSY_TIMEOUT_MS = 30_000
# Per SQLite engine: the threads of one process take turns here before BEGIN IMMEDIATE. A
# thread waiting on this lock wakes the moment the writer before it is done; one waiting
# in SQLite's busy handler polls with sleeps of 1, 2, 5, ... up to 100 ms, and may lose
# the race again each time (measured: a pool of 2 threads idled a third of the time).
_WRITERS: weakref.WeakKeyDictionary[Engine, threading.RLock] = weakref.WeakKeyDictionary()
# Per SQLite file engine: the turn its writers take between processes (db/writer_turns.py).
_TURNS: weakref.WeakKeyDictionary[Engine, WriterTurns] = weakref.WeakKeyDictionary()
# Engines of closed stores, without connections, kept for the next open of the same URL with
# the same options in this process (release_engine, create_engine_for): their dialect is set
# up and their statements compiled, which costs a new engine ~9 ms of CPU (PostgreSQL) or ~5
# (SQLite) in its first transactions. Engines in use are never shared; past 8, the one kept
# longest is dropped.
_PARKED: OrderedDict[tuple[str, bool, str], Engine] = OrderedDict()
_PARKED_LIMIT = 8
_PARKED_LOCK = threading.Lock()
_PARK_KEYS: weakref.WeakKeyDictionary[Engine, tuple[str, bool, str]] = weakref.WeakKeyDictionary()
T = TypeVar("T")


def normalize_url(db: str | os.PathLike[str]) -> str:
    """Turn a file path or SQLAlchemy URL into a URL (paths become sqlite:/// URLs)."""
    raw = os.fspath(db)
    if not raw.strip():
        raise InvalidInputError("database location is empty: give a file path or a URL")
    if raw == ":memory:":
        return "sqlite:///:memory:"  # SQLite's own name for a database in memory, not a file
    if "://" not in raw:
        return "sqlite:///" + str(Path(raw).expanduser().resolve())
    try:
        url = make_url(raw)
    except ArgumentError as exc:
        raise InvalidInputError(f"not a database URL: {raw!r} ({exc})") from None
    if url.get_backend_name() not in ("sqlite", "postgresql"):
        raise InvalidInputError(
            f"unsupported database {url.render_as_string(hide_password=True)!r}: compactstore "
            f"stores sessions in SQLite (a file path or sqlite:///path) or PostgreSQL "
            f"(postgresql://user@host/dbname)"
        )
    if url.drivername == "postgresql":
        # psycopg 3 is the supported driver; plain postgresql:// would ask for psycopg2.
        url = url.set(drivername="postgresql+psycopg")
    return url.render_as_string(hide_password=False)


def describe(url: str) -> str:
    """How errors name a database: its file path, or its URL without the password."""
    path = sqlite_path(url)
    if path is not None:
        return str(path)
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        return "sqlite:///:memory:"
    return parsed.render_as_string(hide_password=True)


def no_database(location: object) -> str:
    """What to say when a command that never creates a database finds none."""
    return (
        f"no compactstore database at {location}: check the path (only `compactstore import`, "
        f"`demo`, `simulate --db`, `restore` and `db upgrade` create one; in Python, "
        f"CompactStore.open(create=True))"
    )


def sqlite_path(url: str) -> Path | None:
    """The file behind a SQLite URL, or None for other backends and in-memory SQLite."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database)


def create_engine_for(
    url: str,
    *,
    read_only: bool = False,
    pool: dict[str, Any] | None = None,
    create: bool = True,
) -> Engine:
    """An Engine with compactstore's connection setup for the URL's backend.

    ``pool`` holds the connection pool's ``pool_size``, ``max_overflow`` and
    ``pool_timeout`` a caller set (SQLAlchemy's defaults otherwise: 5, 10 and 30 s).

    A new SQLite file (and its directory) is created, unless ``read_only`` or not
    ``create``: then a missing file is a NotFoundError. A ``read_only`` engine's
    connections are all read-only (SQLite ``mode=ro``, PostgreSQL
    ``default_transaction_read_only``). It is the engine of a store closed earlier on the
    same URL with the same options, when one was kept (:func:`release_engine`).

    Raises:
        NotFoundError: no SQLite file at the path, and it may not be created.
        DatabaseError: the path is a directory, or the file cannot be created.
    """
    path = sqlite_path(url)
    if path is not None:
        _ensure_sqlite_file(path, read_only=read_only, create=create)
    try:
        sqlite = make_url(url).get_backend_name() == "sqlite"
        # In-memory SQLite has a single-connection pool of its own, and a new database on
        # each connection: it is never kept.
        sizing = {} if sqlite and path is None else pool or {}
        key = (url, read_only, repr(sorted(sizing.items())))
        with _PARKED_LOCK:
            engine = _PARKED.pop(key) if key in _PARKED else None
        if engine is None:
            engine = _new_engine(url, path, sqlite=sqlite, read_only=read_only, sizing=sizing)
            if not sqlite or path is not None:
                _PARK_KEYS[engine] = key
        if sqlite and path is not None and not read_only:
            # The lock file is opened again: the database may be another file than when the
            # engine was kept.
            _TURNS[engine] = WriterTurns(path)
        return engine
    except ImportError as exc:
        hint = " (pip install 'compactstore[postgres]')" if exc.name == "psycopg" else ""
        raise InvalidInputError(
            f"cannot open {make_url(url).render_as_string(hide_password=True)!r}: its database "
            f"driver is not installed: {exc}{hint}"
        ) from None


def _ensure_sqlite_file(path: Path, *, read_only: bool, create: bool) -> None:
    """Refuse a directory; create a missing file (and its directory) when allowed.

    Raises:
        NotFoundError: no file at the path, and it may not be created.
        DatabaseError: the path is a directory, or the file cannot be created.
    """
    # os.path, not Path: a path whose directories this user may not enter is "not there"
    # (and SQLite then says why it cannot open it), not a PermissionError traceback.
    if os.path.isdir(path):
        raise DatabaseError(
            f"{path} is a directory, not a database file: give the database file's path "
            f"(e.g. {path / 'compactstore.db'})"
        )
    if os.path.exists(path):
        return
    if read_only:
        raise NotFoundError(
            f"no database at {path}: check the path (reading never creates a database)"
        )
    if not create:
        raise NotFoundError(no_database(path))
    # Conversations are private: create the file readable by its owner only
    # (SQLite gives its -wal and -shm files the same mode).
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
    except OSError as exc:
        fix = {
            errno.ENOSPC: "free space on its disk",
            errno.EROFS: "its filesystem is mounted read-only: give a path on a writable one",
        }.get(exc.errno or 0, "check the path and that you may write there")
        reason = f"cannot create the database file {path}: {exc.strerror}; {fix}"
        raise DatabaseError(reason) from None


def _new_engine(
    url: str, path: Path | None, *, sqlite: bool, read_only: bool, sizing: dict[str, Any]
) -> Engine:
    if not sqlite:
        options = {"options": "-c default_transaction_read_only=on"} if read_only else {}
        return create_engine(url, pool_pre_ping=True, connect_args=options, **sizing)
    timeout = BUSY_TIMEOUT_MS / 1000
    if read_only and path is not None:
        engine = create_engine(url, creator=_read_only_sqlite(path, timeout), **sizing)
    else:
        engine = create_engine(url, connect_args={"timeout": timeout}, **sizing)
    _setup_sqlite(engine, read_only=read_only)
    return engine


def release_engine(engine: Engine) -> None:
    """Close every connection of a closed store's engine, and keep it for the next
    :func:`create_engine_for` of the same database and options (not an in-memory one)."""
    engine.dispose()
    _TURNS.pop(engine, None)
    key = _PARK_KEYS.get(engine)
    if key is None:
        return
    with _PARKED_LOCK:
        _PARKED[key] = engine
        _PARKED.move_to_end(key)
        while len(_PARKED) > _PARKED_LIMIT:
            _PARKED.popitem(last=False)


# How SQLite says it cannot create the -shm file a WAL database is read through.
_NO_SIDE_FILES = ("SQLITE_CANTOPEN", "SQLITE_READONLY_DIRECTORY")


def _read_only_sqlite(path: Path, timeout: float) -> Callable[[], sqlite3.Connection]:
    """Connections to a SQLite file that cannot write it (``mode=ro``).

    A WAL database can be read only through its -wal and -shm files; in a directory that
    cannot be written (a read-only directory or mount) SQLite cannot create them and fails
    to open. When no -wal file exists then, no process can be writing the database (a
    writer would have had to create it), so the file is read as ``immutable``.
    """
    uri = "file:" + urllib.parse.quote(str(path))

    def connect() -> sqlite3.Connection:
        connection = sqlite3.connect(f"{uri}?mode=ro", uri=True, timeout=timeout)
        try:
            connection.execute("SELECT count(*) FROM sqlite_master").fetchone()
            return connection
        except sqlite3.OperationalError as exc:
            connection.close()
            wal = path.with_name(path.name + "-wal")
            if exc.sqlite_errorname not in _NO_SIDE_FILES or wal.exists():
                raise
        return sqlite3.connect(f"{uri}?mode=ro&immutable=1", uri=True, timeout=timeout)

    return connect


def _setup_sqlite(engine: Engine, *, read_only: bool = False) -> None:
    if not read_only:
        _WRITERS[engine] = threading.RLock()

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy's begin event decide how transactions start (pysqlite recipe).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        if not read_only:
            # Incremental auto-vacuum, so that deleting sessions can give the space back
            # (db/space.py). It takes effect only in a file with no page yet (a new one,
            # before WAL is switched on), so it is set only there: on an existing file the
            # pragma waits for the write lock, and a connection opened while another one
            # writes would wait for that writer to finish.
            if cursor.execute("PRAGMA page_count").fetchone()[0] == 0:
                cursor.execute("PRAGMA auto_vacuum=INCREMENTAL")
            # WAL: readers never block the writer and a crash mid-write leaves the file
            # intact. (A reader finds the mode in the file; it may not change it.)
            cursor.execute("PRAGMA journal_mode=WAL")
        # Foreign keys are off by default in SQLite; the schema relies on them.
        cursor.execute("PRAGMA foreign_keys=ON")
        # NORMAL is crash-safe in WAL mode and avoids an fsync per commit.
        cursor.execute("PRAGMA synchronous=NORMAL")
        # Wait for a competing writer instead of failing with 'database is locked'.
        cursor.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Connection) -> None:
        # Writers take the write lock before reading, so read-modify-write cannot interleave.
        if connection.get_execution_options().get(_WRITE, False):
            _begin_immediate(connection)
        else:
            connection.exec_driver_sql("BEGIN")


# While a writer waits for another process's write lock, SQLite's busy handler sleeps 1, 2,
# 5, 10, 15, 20, 25, 25, 25, 50, 50 and then 100 ms between tries: a writer that has waited
# a while sleeps on long after the lock came free, and writers arriving meanwhile take it
# first. So BEGIN IMMEDIATE leaves the handler this long only, and tries again itself
# (every 1-2 ms) until BUSY_TIMEOUT_MS have passed. Measured beside 20 processes that each
# write four times a second (benchmarks/nonblocking.py, alternating runs at load 7-20):
# lock wait p99 157 and 233 ms against 328 and 786 ms, max 0.3-0.4 s against 1.2-2.0 s.
_BEGIN_POLL_MS = 5


def _begin_immediate(connection: Connection) -> None:
    raw = connection.connection.driver_connection
    assert raw is not None
    raw.execute(f"PRAGMA busy_timeout={_BEGIN_POLL_MS}")
    try:
        # The tries go to the driver itself: a refused one costs microseconds, not
        # SQLAlchemy's error handling.
        deadline = monotonic() + BUSY_TIMEOUT_MS / 1000
        while monotonic() < deadline:
            try:
                raw.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                if exc.sqlite_errorcode & 0xFF != sqlite3.SQLITE_BUSY:
                    break  # SQLAlchemy's try below raises it as it raises any error
        # The last try, through SQLAlchemy: what it raises is what callers expect.
        connection.exec_driver_sql("BEGIN IMMEDIATE")
    finally:
        raw.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")


@contextmanager
def write_tx(engine: Engine) -> Iterator[Connection]:
    """One write transaction: committed when the block ends, rolled back if it raises.

    On SQLite the threads of this process queue for their turn first, then the writers of
    every process (:mod:`compactstore.db.writer_turns`), without holding a pooled connection
    meanwhile; SQLite's own lock still decides who writes."""
    turn, turns = _WRITERS.get(engine), _TURNS.get(engine)
    # Past the busy timeout, go on anyway: SQLite's busy handler then decides (and fails).
    deadline = monotonic() + BUSY_TIMEOUT_MS / 1000
    held = turn is not None and turn.acquire(timeout=BUSY_TIMEOUT_MS / 1000)
    taken = held and turns is not None and turns.acquire(deadline)
    try:
        with engine.connect() as connection:
            connection.execution_options(**{_WRITE: True})
            with connection.begin():
                yield connection
    finally:
        if taken:
            assert turns is not None
            turns.release()
        if held:
            assert turn is not None
            turn.release()


@contextmanager
def read_tx(engine: Engine) -> Iterator[Connection]:
    """One consistent snapshot for reads that take several queries."""
    with engine.connect() as connection:
        if engine.dialect.name == "postgresql":
            connection.execution_options(isolation_level="REPEATABLE READ")
        with connection.begin():
            yield connection


def is_busy(exc: OperationalError) -> bool:
    """Whether the error says another transaction holds a lock this one needs."""
    text = str(exc.orig).lower()
    return "database is locked" in text or "database is busy" in text or "deadlock" in text


def with_retry(
    fn: Callable[[], T], *, attempts: int = 8, sleep: Callable[[float], object] | None = None
) -> T:
    """Run a whole transaction again, with bounded jittered backoff, when the DB is busy
    (``sleep`` waits between tries: the async driver's never blocks its event loop)."""
    for attempt in range(attempts):
        try:
            return fn()
        except OperationalError as exc:
            if not is_busy(exc) or attempt == attempts - 1:
                raise
            pause = min(2.0, 0.05 * 2**attempt) * (0.5 + random.random())
            (time.sleep if sleep is None else sleep)(pause)
    raise AssertionError("unreachable")


def database_errors(location: str, fn: Callable[[], T]) -> T:
    """Run fn; turn what the database or its stored rows raise into DatabaseError, naming
    the database and saying what to do."""
    try:
        return fn()
    except sa_exc.TimeoutError:
        # The pool had no free connection in time: too many threads for pool_size +
        # max_overflow, or connections held elsewhere. Not a broken database.
        raise DatabaseError(
            f"the database {location} is busy: no connection of the pool was free in time "
            f"(every one of pool_size + max_overflow was in use for pool_timeout); open the "
            f"store with a larger pool_size/max_overflow or pool_timeout, or use fewer threads"
        ) from None
    except (sa_exc.DataError, sa_exc.IntegrityError) as exc:
        # Validation should have caught it; say what the database refused, not that it broke.
        raise DatabaseError(f"the database {location} refused the data: {exc.orig}") from None
    except sa_exc.DatabaseError as exc:
        advice = _advice(exc, location)
        raise DatabaseError(f"cannot use the database {location}: {advice}") from None
    except (json.JSONDecodeError, UnicodeDecodeError, ValidationError) as exc:
        # JSON or settings stored in a row that do not parse, or (UnicodeDecodeError) a
        # damaged SQLite schema whose error message the driver cannot even decode.
        if isinstance(exc, ValidationError):
            first = exc.errors()[0]
            what = f"{'.'.join(str(part) for part in first['loc']) or 'value'}: {first['msg']}"
        else:
            what = " ".join(str(exc).split())[:200]
        raise DatabaseError(
            f"the database {location} holds data this compactstore cannot read ({what}); it is "
            f"damaged or was written by a newer compactstore: upgrade compactstore, or restore "
            f"the database from a backup"
        ) from None


def _advice(exc: sa_exc.DatabaseError, location: str) -> str:
    """The driver's message and what to do about it, by the kind of failure."""
    reason = " ".join(str(exc.orig).split())  # drivers' messages may span lines
    stop = "" if reason.endswith((".", "?", "!")) else "."
    if isinstance(exc, sa_exc.OperationalError) and is_busy(exc):
        return (
            f"{reason}: another process kept it locked through every retry "
            f"({BUSY_TIMEOUT_MS / 1000:g} s each); try again when that process is done"
        )
    cause = _write_refused(exc.orig)
    if cause == "read-only":
        return (
            f"{reason}{stop} Nothing was written and nothing is damaged: the database can only "
            f"be read here. Check the permissions of the file and its directory, and whether "
            f"its filesystem is mounted read-only"
        )
    if cause == "full":
        return (
            f"{reason}{stop} Nothing was written and nothing is damaged: the disk that holds "
            f"the database is full. Free space on it and try again"
        )
    server = not type(exc.orig).__module__.startswith("sqlite3")
    if isinstance(exc, sa_exc.OperationalError) and server:
        return (
            f"{reason}{stop} Check that the server is running and reachable, and the URL's host, "
            f"port, user, password and database name"
        )
    if "unable to open database file" in reason:
        return f"{reason}: {_cannot_open(Path(location))}"
    return (
        f"{reason}{stop} If it is not a compactstore database or is damaged, restore it from a "
        f"backup or open another file"
    )


def _cannot_open(path: Path) -> str:
    """Why SQLite could not open the file at ``path``, found by looking at the path."""
    directory = path.parent
    if path.is_dir():
        return (
            f"{path} is a directory, not a database file; give the database file's path "
            f"(e.g. {path / 'compactstore.db'})"
        )
    if not directory.is_dir():
        return f"its directory {directory} does not exist; check the path"
    try:
        read_only_mount = bool(os.statvfs(directory).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):  # AttributeError: no statvfs (Windows)
        read_only_mount = False
    beside = (
        "nothing is damaged, but SQLite must create its -wal and -shm files beside the "
        "database to write it"
    )
    if read_only_mount:
        return (
            f"the filesystem holding {directory} is mounted read-only; {beside}: commands "
            f"that only read (show, history, export, ...) work, writing needs a writable mount"
        )
    if not os.access(directory, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        return (
            f"you may not write {path if path.exists() else directory}; {beside}: check the "
            f"permissions of the file and its directory"
        )
    return "check the permissions of the file and its directory, and that you may write there"


# SQLSTATEs of PostgreSQL's read_only_sql_transaction and disk_full.
_PG_READ_ONLY, _PG_DISK_FULL = "25006", "53100"


def _write_refused(orig: BaseException | None) -> str | None:
    """ "read-only" or "full" when the database refused a write for that cause, else None."""
    sqlite_code = getattr(orig, "sqlite_errorcode", None)
    if sqlite_code is not None:
        primary = sqlite_code & 0xFF  # extended codes keep the primary one in the low byte
        if primary == sqlite3.SQLITE_READONLY:
            return "read-only"
        if primary == sqlite3.SQLITE_FULL:
            return "full"
        return None
    sqlstate = getattr(orig, "sqlstate", None)
    return {_PG_READ_ONLY: "read-only", _PG_DISK_FULL: "full"}.get(sqlstate or "")
