"""What commands read and write besides the database: progress on stderr, output files,
config files."""

from __future__ import annotations

import json
import os
import sys
import tomllib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click
from pydantic import ValidationError

from compactstore.cli.render import one_line
from compactstore.models import CompactionConfig

__all__ = ["Progress", "progress", "read_config", "write_output"]

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


def write_output(path: Path, data: bytes) -> None:
    """Write a file whole or not at all (a temporary file renamed into place)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise click.ClickException(f"cannot write {path}: {exc.strerror or exc}") from None


def read_config(path: Path) -> CompactionConfig:
    """A CompactionConfig from a JSON or TOML file; fields not given take the defaults."""
    try:
        raw = path.read_text(encoding="utf-8")
        data = tomllib.loads(raw) if path.suffix.lower() == ".toml" else json.loads(raw)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise click.ClickException(one_line(f"cannot read the config {path}: {exc}")) from None
    try:
        return CompactionConfig.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc']) or 'config'}: {error['msg']}"
            for error in exc.errors()
        )
        raise click.ClickException(one_line(f"invalid config in {path}: {problems}")) from None
