"""The report command: a session seen as one self-contained HTML page."""

from __future__ import annotations

from pathlib import Path

import click

from compactstore._cli.errors import library_errors
from compactstore._cli.files import progress, write_output
from compactstore._cli.options import db_option
from compactstore._store.store import CompactStore

__all__ = ["report"]


@click.command(short_help="Write a session's report: one self-contained HTML file.")
@click.argument("session_id", metavar="[SESSION]", required=False)
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path),
    help="The file to write (default: a name made from SESSION, here); with --all, the directory.",
)
@click.option(
    "--all", "all_sessions", is_flag=True, help="Every session: DIR/index.html and a page each."
)
@db_option
@library_errors
def report(session_id: str | None, output: Path | None, all_sessions: bool, db: str) -> None:
    """Write a session's report: one HTML file that loads nothing and runs only its own script.

    The usage per model call against the window and the auto-compact threshold, with a
    marker per compaction; what the calls cost (totals, cost per call and cumulative,
    cache reads and writes against uncached input, the cache each compaction made the
    provider write again); a card per compaction that cut or recovered the context (what
    was lost, the summary and what changed in it); one line per other compaction; the
    active context now; the circuit breaker. Needs the 'report' extra (Jinja2):
    pip install 'compactstore[report]'.

    Example: compactstore report demo -o demo.html && compactstore report --all -o reports
    """
    from compactstore.report import safe_filename, session_page, write_all

    if all_sessions == (session_id is not None):
        raise click.UsageError("give a SESSION, or --all with -o DIR")
    if all_sessions and output is None:
        raise click.UsageError("--all writes a directory: give it with -o DIR")
    with CompactStore.open(db, read_only=True) as store:
        if session_id is not None:
            page = session_page(store, session_id).encode("utf-8")
            target = output or Path(safe_filename(session_id))
            write_output(target, page, db=db)
            click.echo(f"Wrote {target} ({len(page):,} bytes)")
            return
        assert output is not None
        with progress("Writing reports") as report_progress:
            index = write_all(
                store,
                output,
                progress=report_progress,
                write=lambda path, data: write_output(path, data, db=db),
            )
    click.echo(f"Wrote {index} and one page per session beside it")
