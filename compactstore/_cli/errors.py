"""How the command line reports failures: one ``Error: ...`` line (or, under ``--json``, one
JSON object) on stderr, and an exit code.

- exit 1: a library error (its class name is the JSON ``kind``: ``NotFoundError``,
  ``DatabaseError``, ...), an output file that cannot be written (``OutputError``), or a
  refused confirmation;
- exit 2: a usage error (``UsageError``), also one line: the problem and the command's
  ``--help`` to read;
- exit 0 when stdout is closed early (``compactstore export s1 | head``): the reader has
  what it wanted, so nothing more is written and no traceback is shown.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import click
from sqlalchemy import exc as sa_exc

from compactstore._cli.render import one_line
from compactstore.errors import CompactStoreError, CompactStoreWarning

__all__ = [
    "CommandError",
    "CompactstoreGroup",
    "library_errors",
    "library_warnings",
    "usage_error_line",
]

F = TypeVar("F", bound=Callable[..., Any])


class CommandError(click.ClickException):
    """A failed command: its one-line message and its kind (see the module docstring)."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(one_line(message))
        self.kind = kind


def library_errors(fn: F) -> F:
    """Turn library and database errors into a CommandError (exit code 1)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except CompactStoreError as exc:
            raise CommandError(str(exc), type(exc).__name__) from None
        except sa_exc.SQLAlchemyError as exc:
            cause = getattr(exc, "orig", None) or exc
            raise CommandError(f"database error: {cause}", "DatabaseError") from None

    return wrapper  # type: ignore[return-value]


@contextmanager
def library_warnings() -> Iterator[None]:
    """Print the library's warnings (a CompactStoreWarning: something was done, not all as
    asked, or a stopped run's leftovers were removed) as ``Warning: ...`` lines on stderr;
    other warnings go on as they came."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", CompactStoreWarning)
        try:
            yield
        finally:
            for warning in caught:
                if issubclass(warning.category, CompactStoreWarning):
                    click.echo(f"Warning: {one_line(str(warning.message))}", err=True)
                else:
                    warnings.warn_explicit(
                        warning.message, warning.category, warning.filename, warning.lineno
                    )


def _wants_json(args: Sequence[str]) -> bool:
    options = list(args)
    if "--" in options:
        options = options[: options.index("--")]
    return "--json" in options


def _error_json(exc: click.ClickException) -> str:
    if isinstance(exc, CommandError):
        kind = exc.kind
    else:
        kind = "UsageError" if isinstance(exc, click.UsageError) else "Error"
    return json.dumps({"error": exc.format_message(), "kind": kind}, ensure_ascii=False)


def usage_error_line(exc: click.UsageError) -> str:
    """A usage error as one line, the command's help named at its end (click prints the
    usage, a hint and the error on three)."""
    message = one_line(exc.format_message()).rstrip(".")
    if exc.ctx is None:
        return f"Error: {message}"
    return f"Error: {message} (see '{exc.ctx.command_path} --help')"


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's last flush cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # not a real file (a test runner's buffer)
        pass


class CompactstoreGroup(click.Group):
    """The top-level group: JSON errors under ``--json``, quiet exit on a closed pipe."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            with library_warnings():
                return super().invoke(ctx)
        except OSError as exc:
            if exc.errno != errno.EPIPE:
                raise
            _silence_stdout()
            ctx.exit(0)

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        argv = list(sys.argv[1:] if args is None else args)
        if not standalone_mode:
            return super().main(argv, prog_name, complete_var, standalone_mode, **extra)
        try:
            code = super().main(argv, prog_name, complete_var, False, **extra)
        except click.ClickException as exc:
            if _wants_json(argv):
                click.echo(_error_json(exc), err=True)
            elif isinstance(exc, click.UsageError):
                click.echo(usage_error_line(exc), err=True)
            else:
                exc.show()
            sys.exit(exc.exit_code)
        except click.Abort:
            click.echo("Aborted!", err=True)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)
