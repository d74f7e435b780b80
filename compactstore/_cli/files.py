"""What commands read and write besides the database: progress on stderr, output files,
config files."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import tomllib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

import click
from pydantic import ValidationError

from compactstore._cli.errors import CommandError
from compactstore.db.engine import normalize_url, sqlite_path
from compactstore.errors import InvalidInputError
from compactstore.models import CompactionConfig

__all__ = ["Progress", "open_output", "progress", "read_config", "write_output"]

Progress = Callable[[int, int], None]


@contextmanager
def progress(label: str) -> Iterator[Progress]:
    """A progress callback ``(done, total)`` for long work, drawn on stderr.

    On a terminal it draws a click progress bar, created at the first report when the total
    is known. Elsewhere (a pipe, a log, a test) a bar cannot redraw itself, so one line
    ``LABEL: done of total`` is written when the work succeeds; a failure then leaves only
    its one ``Error: ...`` line.
    """
    live = sys.stderr.isatty()
    bar: Any = None
    done, total = 0, 0

    def report(now_done: int, now_total: int) -> None:
        nonlocal bar, done, total
        if live:
            if bar is None:
                bar = click.progressbar(length=max(now_total, 1), label=label, file=sys.stderr)
                bar.__enter__()
            bar.length = max(now_total, 1)
            if now_done > done:
                bar.update(now_done - done)
        done, total = max(done, now_done), now_total

    try:
        yield report
    finally:
        if bar is not None:
            bar.__exit__(None, None, None)
    if not live and total:
        click.echo(f"{label}: {done:,} of {total:,}", err=True)


_SQLITE_HEADER = b"SQLite format 3\x00"
_SIDE_FILES = ("-wal", "-shm", "-journal", "-writer")  # files beside a database


def _refuse_database(path: Path, db: str | None) -> None:
    """An output must not overwrite the database (or its -wal/-shm files) nor any SQLite
    file: an export written over it would destroy conversations."""
    database = sqlite_path(normalize_url(db)) if db is not None else None
    if database is not None:
        for part in (database, *(database.with_name(database.name + s) for s in _SIDE_FILES)):
            if path.resolve() == part.resolve() or (
                path.exists() and part.exists() and os.path.samefile(path, part)
            ):
                raise CommandError(
                    f"refusing to write {path}: it is the database this command reads "
                    f"({database}); choose another output file",
                    "InvalidInputError",
                )
    try:
        with path.open("rb") as existing:
            header = existing.read(len(_SQLITE_HEADER))
    except OSError:
        return  # not there (or unreadable: writing it will say why)
    if header == _SQLITE_HEADER:
        raise CommandError(
            f"refusing to write {path}: it is a SQLite database, and an output would replace "
            f"it; choose another output file",
            "InvalidInputError",
        )


@contextmanager
def open_output(path: Path, *, db: str | None) -> Iterator[BinaryIO]:
    """A file to write a command's ``-o`` output to, whole or not at all.

    The output goes to a temporary file in the same directory, which replaces ``path``
    (atomically: same filesystem) only when the block ends without an error; on any error,
    Ctrl-C included, the temporary file is removed and ``path`` is untouched. Like the
    database, the file is created readable by its owner only.

    Raises:
        CommandError: ``path`` is the database ``db`` or another SQLite file
            (InvalidInputError), or cannot be written (OutputError).
    """
    _refuse_database(path, db)
    try:
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise CommandError(f"cannot write {path}: {exc.strerror or exc}", "OutputError") from None
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb") as out:
            yield out
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise CommandError(f"cannot write {path}: {exc.strerror or exc}", "OutputError") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_output(path: Path, data: bytes, *, db: str | None) -> None:
    """Write ``data`` to ``path`` with :func:`open_output`."""
    with open_output(path, db=db) as out:
        out.write(data)


def read_config(path: Path) -> CompactionConfig:
    """A CompactionConfig from a JSON or TOML file; fields not given take the defaults."""
    try:
        raw = path.read_text(encoding="utf-8")
        data = tomllib.loads(raw) if path.suffix.lower() == ".toml" else json.loads(raw)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise InvalidInputError(f"cannot read the config {path}: {exc}") from None
    try:
        return CompactionConfig.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc']) or 'config'}: {error['msg']}"
            for error in exc.errors()
        )
        raise InvalidInputError(f"invalid config in {path}: {problems}") from None
