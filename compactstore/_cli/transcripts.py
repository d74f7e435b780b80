"""Commands that bring conversations in: import, simulate, demo."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import BinaryIO

import click

from compactstore._cli import render, render_stats
from compactstore._cli.errors import library_errors, library_warnings
from compactstore._cli.files import progress, read_config
from compactstore._cli.options import config_option, db_option, json_option, own_db_option
from compactstore._store.store import CompactStore
from compactstore.db import model_calls

__all__ = ["demo", "import_", "simulate"]

_transcript_argument = click.argument(
    "file", type=click.Path(exists=True, dir_okay=False, allow_dash=True, path_type=Path)
)


def _transcript_source(file: Path) -> Path | BinaryIO:
    """The transcript to read: the file, or standard input for ``-``."""
    return sys.stdin.buffer if str(file) == "-" else file


def _transcript_name(file: Path) -> str:
    return "stdin" if str(file) == "-" else file.name


@click.command("import", short_help="Import a transcript as a new session.")
@_transcript_argument
@click.option("--session", "session_id", metavar="ID", help="Session id (default: from the file).")
@click.option(
    "--format",
    "format_",
    metavar="FORMAT",
    help="The transcript's source (claude-code, codex, swe-agent, openhands, mini-swe-agent, "
    "copilot-cli, jsonl) or the message format of plain JSONL (anthropic, openai, minicode); "
    "responses imports a Codex rollout as Responses items (reasoning and compaction items "
    "kept) instead of openai messages; default: detected from the content.",
)
@click.option(
    "--context-window",
    "--window",
    "context_window",
    type=click.IntRange(min=1_000),
    help="Context window of the new session, in tokens (--window is the same option).",
)
@click.option(
    "--strict",
    is_flag=True,
    help="Refuse a transcript whose last line is cut short (still being written) instead of "
    "importing the lines before it with a warning.",
)
@click.option(
    "--force",
    is_flag=True,
    help="Add compactstore's tables to a database that already holds other tables.",
)
@db_option
@json_option
@library_errors
def import_(
    file: Path,
    session_id: str | None,
    format_: str | None,
    context_window: int | None,
    strict: bool,
    force: bool,
    db: str,
    as_json: bool,
) -> None:
    """Import a transcript as a new session: Claude Code or Codex JSONL, a SWE-agent or
    mini-swe-agent trajectory, an OpenHands event stream, a Copilot CLI events.jsonl, or
    JSONL of messages in any of the three formats; gzip files too, and `-` for standard
    input (with --session).

    All or nothing: a malformed line stops the import with its line number and stores
    nothing. A last line cut short (the agent is still writing the file) is left out with a
    warning, or refused with --strict.

    Example: compactstore import ~/.claude/projects/app/1234.jsonl --session app
    """
    from compactstore._importers import SOURCES, import_file
    from compactstore.formats import FORMAT_NAMES

    if format_ is not None and format_ not in (*SOURCES, *FORMAT_NAMES):
        raise click.BadParameter(
            f"{format_!r} is not one of: {', '.join((*SOURCES, *FORMAT_NAMES))}",
            param_hint="'--format'",
        )
    with CompactStore.open(db, allow_other_tables=force) as store, library_warnings():
        with progress(f"Importing {_transcript_name(file)}") as report:
            sess = import_file(
                store,
                _transcript_source(file),
                session_id=session_id,
                format=format_,
                context_window=context_window,
                progress=report,
                strict=strict,
            )
        count = sess.message_count()
        boundaries = len(sess.boundaries())
        usage = sess.token_usage()
        calls = store.read(lambda c: model_calls.calls_of(c, sess.id))
        subagents = sess.subagents()
    last = next((call for call in reversed(calls) if call.real_tokens), None)
    if as_json:
        found = {
            "session": sess.id,
            "format": sess.format,
            "context_window": sess.context_window,
            "messages": count,
            "boundaries": boundaries,
            "usage": usage,
            "last_real_count": None if last is None else last.real_tokens,
            "subagents": render.link_json(None, None, subagents)["subagents"],
        }
        click.echo(render.json_text(found))
        return
    click.echo(
        f"imported {render.plural(count, 'message')} into session {sess.id} ({sess.format}, "
        f"{sess.context_window:,} tokens, {render.plural(boundaries, 'boundary')})"
    )
    for line in render.link_lines(None, None, subagents):
        click.echo(line)
    if last is not None and last.real_tokens:
        note = usage_note(usage, last.real_tokens)
        if note:
            click.echo(note)


def usage_note(usage: int, real: int) -> str | None:
    """A line saying why the store's usage of an imported session differs from the
    transcript's last real count (None when they agree within 5%)."""
    gap = real - usage
    if abs(gap) <= 0.05 * real:
        return None
    if gap > 0:
        why = (
            f"the provider also counted {gap:,} tokens the active context does not hold "
            "(system prompt, tool definitions and reminders the client sent, messages the "
            "agent kept through its own compaction)"
        )
    else:
        why = (
            f"the active context holds {-gap:,} tokens more (messages after that call, "
            "a compaction of the agent's that the import does not record, or the store's "
            "estimate running above the provider's count)"
        )
    return (
        f"usage {usage:,} tokens (the store's count of the active context); the transcript's "
        f"last model call counted {real:,}: {why}"
    )


@click.command(short_help="Replay a transcript through compaction and measure it.")
@_transcript_argument
@click.option(
    "--window",
    "--context-window",
    "window",
    type=click.IntRange(min=1_000),
    default=200_000,
    show_default=True,
    help="Context window of the simulated model, in tokens (--context-window is the same option).",
)
@click.option(
    "--session",
    "session_id",
    metavar="ID",
    help="With --db: the id of the session kept there (default: the first free simulate-N).",
)
@click.option(
    "--format",
    "format_",
    metavar="FORMAT",
    help="The transcript's source or plain-JSONL message format; default: detected.",
)
@config_option("A CompactionConfig as JSON (or TOML for a .toml file).")
@click.option(
    "--no-usage",
    is_flag=True,
    help="Ignore the provider's token counts in the transcript: the window then applies to "
    "the messages as the store estimates them.",
)
@click.option(
    "--force",
    is_flag=True,
    help="Replay even when the window is smaller than what the transcript needs before any "
    "compaction (system prompt, tools, opening messages).",
)
@click.option(
    "--model",
    metavar="MODEL",
    help="Price the replay at this model's prices (compactstore.pricing); default: the "
    "model the transcript's usage names.",
)
@own_db_option("Keep the simulated session in this database (default: a temporary file).")
@json_option
@library_errors
def simulate(
    file: Path,
    window: int,
    session_id: str | None,
    format_: str | None,
    config_file: Path | None,
    no_usage: bool,
    force: bool,
    model: str | None,
    db: str | None,
    as_json: bool,
) -> None:
    """Replay a transcript as a live agent would have produced it, compacting before every
    model call, and print what compaction did and how good the contexts were.

    Prints every compaction as it happens, tokens freed per stage, peak usage, and the
    quality of every model call's context: validity (pairs by id, SDK request types when
    installed), fit, the original request kept, file recall, agreement with the agent's own
    compactions, and the store's token count against the provider's; and the cost of the
    calls (prompt caching on the transcript's clock) under the store's policy, with
    compaction off, and as the transcript's own usage recorded it.

    Example: compactstore simulate ~/.claude/projects/app/1234.jsonl --window 64000
    """
    from compactstore import _simulate as sim
    from compactstore._importers import read_transcript

    if session_id is not None and db is None:
        raise click.UsageError(
            "--session names the session kept with --db; without --db nothing is kept"
        )
    config = read_config(config_file) if config_file is not None else None

    def show(event: sim.CompactionEvent) -> None:
        if not as_json:
            click.echo(sim.stage_rows([event])[0])

    with progress(f"Reading {_transcript_name(file)}") as report, library_warnings():
        transcript = read_transcript(_transcript_source(file), format=format_, progress=report)
    store = CompactStore.open(db) if db is not None else None
    try:
        with progress(f"Simulating {_transcript_name(file)}") as report:
            result = sim.simulate_transcript(
                transcript,
                name=str(file),
                window=window,
                config=config,
                progress=report,
                on_compaction=show,
                store=store,
                use_usage=not no_usage,
                session_id=session_id,
                force=force,
                model=model,
            )
        location = None if store is None else store.location
    finally:
        if store is not None:
            store.close()
    if as_json:
        click.echo(render.json_text(result.to_dict()))
        return
    click.echo("\n".join(sim.summary_lines(result)))
    if result.session is not None:
        click.echo(
            f"kept as session {result.session} in {location}: compactstore history "
            f"{shlex.quote(result.session)} --db {shlex.quote(str(db))}"
        )


@click.command(short_help="Simulate a long agent session, then audit it.")
@click.option("--session", "session_id", default="demo", show_default=True, metavar="ID")
@click.option("--steps", type=click.IntRange(min=1), default=300, show_default=True)
@db_option
@json_option
@library_errors
def demo(session_id: str, steps: int, db: str, as_json: bool) -> None:
    """Simulate a long coding-agent session, then show its history and how to audit it.

    Example: compactstore demo --db demo.db && sqlite3 demo.db
    """
    from compactstore._demo import audit_queries, run_demo

    with CompactStore.open(db) as store:
        with progress(f"Simulating {steps} agent steps") as report:
            result = run_demo(store, session_id=session_id, steps=steps, progress=report)
        compactions = store.get_session(result.session_id).compactions()
        location, backend = store.location, store.engine.dialect.name
    queries = audit_queries()
    if as_json:
        click.echo(render.json_text(render_stats.demo_json(result, compactions, queries)))
    else:
        lines = render_stats.demo_lines(
            result, compactions, queries, location=location, backend=backend, db=db
        )
        click.echo("\n".join(lines))
