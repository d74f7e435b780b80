"""The options and arguments several commands share, and how a command's errors are shown.

A new command takes its shared options from here, so every command spells them the same
way: ``@session_argument``, ``@db_option``, ``@json_option``, ``@output_option(help)``,
``@config_option(help)``, and ``@library_errors`` innermost.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
from sqlalchemy import exc as sa_exc

from compactstore.cli.render import one_line
from compactstore.errors import CompactStoreError

__all__ = [
    "config_option",
    "db_option",
    "json_option",
    "library_errors",
    "output_option",
    "session_argument",
]

F = TypeVar("F", bound=Callable[..., Any])


def library_errors(fn: F) -> F:
    """Turn library and database errors into one 'Error: ...' line and exit code 1."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except CompactStoreError as exc:
            raise click.ClickException(one_line(str(exc))) from None
        except sa_exc.SQLAlchemyError as exc:
            cause = getattr(exc, "orig", None) or exc
            raise click.ClickException(one_line(f"database error: {cause}")) from None

    return wrapper  # type: ignore[return-value]


def db_option(fn: F) -> F:
    """The --db option every command shares."""
    return click.option(
        "--db",
        envvar="COMPACTSTORE_DB",
        default="compactstore.db",
        show_default=True,
        help="Database file path or SQLAlchemy URL (env COMPACTSTORE_DB).",
    )(fn)


def json_option(fn: F) -> F:
    """The --json flag every data command shares."""
    return click.option(
        "--json", "as_json", is_flag=True, help="Print JSON to stdout instead of a table."
    )(fn)


def session_argument(fn: F) -> F:
    """The SESSION argument of the commands that act on one session."""
    return click.argument("session_id", metavar="SESSION")(fn)


def output_option(help: str) -> Callable[[F], F]:
    """``-o/--output FILE``: where a command writes its output instead of stdout."""
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
