"""The options and arguments several commands share.

A new command takes its shared options from here, so every command spells them the same
way: ``@session_argument``, ``@db_option``, ``@json_option``, ``@output_option(help)``,
``@config_option(help)``, and ``@library_errors`` (from :mod:`compactstore._cli.errors`)
innermost.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

__all__ = [
    "config_option",
    "db_option",
    "json_option",
    "output_option",
    "own_db_option",
    "root_db_option",
    "session_argument",
]

F = TypeVar("F", bound=Callable[..., Any])


DEFAULT_DB = "compactstore.db"


def _given_before_the_command(ctx: click.Context) -> str | None:
    db: str | None = ctx.find_root().params.get("db")
    return db


def _resolve_db(ctx: click.Context, _param: click.Parameter, value: str | None) -> str:
    return (
        value or _given_before_the_command(ctx) or os.environ.get("COMPACTSTORE_DB") or DEFAULT_DB
    )


def db_option(fn: F) -> F:
    """The --db option every command shares: given after the command, else before it
    (``compactstore --db X COMMAND``), else $COMPACTSTORE_DB, else compactstore.db."""
    return click.option(
        "--db",
        default=None,
        metavar="PATH|URL",
        callback=_resolve_db,
        help="Database file path or SQLAlchemy URL; default: the --db given before the "
        f"command, else $COMPACTSTORE_DB, else {DEFAULT_DB}.",
    )(fn)


def root_db_option(fn: F) -> F:
    """``compactstore --db X COMMAND``: the database of the command that follows."""
    return click.option(
        "--db",
        default=None,
        metavar="PATH|URL",
        help="Database for the command that follows (as its own --db; env COMPACTSTORE_DB).",
    )(fn)


def own_db_option(help: str) -> Callable[[F], F]:
    """A --db without a default database (``simulate``: none means a temporary file); the
    --db given before the command still counts."""
    return click.option(
        "--db",
        default=None,
        metavar="PATH|URL",
        callback=lambda ctx, _param, value: value or _given_before_the_command(ctx),
        help=help,
    )


def json_option(fn: F) -> F:
    """The --json flag every data command shares."""
    return click.option(
        "--json", "as_json", is_flag=True, help="Print JSON to stdout instead of a table."
    )(fn)


def session_argument(fn: F) -> F:
    """The SESSION argument of the commands that act on one session."""
    return click.argument("session_id", metavar="SESSION")(fn)


def output_option(help: str) -> Callable[[F], F]:
    """``-o/--output FILE``: where a command writes its output instead of stdout (write it
    with :func:`compactstore._cli.files.write_output`)."""
    return click.option(
        "-o",
        "--output",
        type=click.Path(dir_okay=False, writable=True, path_type=Path),
        help=help,
    )


def config_option(help: str) -> Callable[[F], F]:
    """``--config FILE``: a CompactionConfig as JSON, or TOML for a .toml file."""
    return click.option(
        "--config",
        "config_file",
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        help=help,
    )
