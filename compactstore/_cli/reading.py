"""Commands that read a store: sessions, show, history, blob, breaker, export, cost, stats."""

from __future__ import annotations

import hashlib
from pathlib import Path

import click

from compactstore._cli import render, render_stats
from compactstore._cli.errors import library_errors
from compactstore._cli.files import open_output, write_output
from compactstore._cli.options import (
    db_option,
    json_option,
    output_option,
    session_argument,
)
from compactstore._context.media import decoded_single_media
from compactstore._store.store import CompactStore

SHOW_LIMIT = 50  # rows `show` lists by default: the newest of the active context

__all__ = ["blob", "breaker", "cost", "export", "history", "sessions", "show", "stats"]


@click.command()
@db_option
@json_option
@library_errors
def sessions(db: str, as_json: bool) -> None:
    """List the sessions in the database.

    Example: compactstore sessions --db agent.db
    """
    with CompactStore.open(db, read_only=True) as store:
        infos = store.sessions()
    if as_json:
        click.echo(
            render.json_text([info.model_dump(mode="json", exclude={"config"}) for info in infos])
        )
    else:
        click.echo("\n".join(render.sessions_lines(infos)))


@click.command(short_help="Show a session's active context.")
@session_argument
@click.option("--full", is_flag=True, help="Print each message's whole content.")
@click.option(
    "--limit",
    type=click.IntRange(min=0),
    default=SHOW_LIMIT,
    show_default=True,
    help="Show only the newest N messages (0: all of them).",
)
@click.option("--all", "show_all", is_flag=True, help="Show every message (same as --limit 0).")
@db_option
@json_option
@library_errors
def show(session_id: str, full: bool, limit: int, show_all: bool, db: str, as_json: bool) -> None:
    """Show the active context of a session: what the model is sent next.

    One row per message: seq (- for the summary and synthetic results), role, tokens and
    state (original, persisted, cleared, deduplicated, summary, pinned, synthetic). Only
    the newest --limit messages are listed; the heading counts the whole context.

    Example: compactstore show s1 --full --limit 10
    """
    with CompactStore.open(db, read_only=True) as store:
        sess = store.get_session(session_id)
        context = sess.context()
        subagents = sess.subagents()
        state = sess.edit_state()
    links = (sess.parent_session_id, sess.parent_tool_use_id, subagents)
    shown = None if show_all or limit == 0 else limit
    if as_json:
        doc = render.show_json(context, full=full, limit=shown, state=state)
        click.echo(render.json_text(doc | render.link_json(*links)))
    else:
        heading, *rest = render.show_lines(context, full=full, limit=shown, state=state)
        click.echo("\n".join([heading, *render.link_lines(*links), *rest]))


@click.command(short_help="Show a session's compactions and boundaries.")
@session_argument
@db_option
@json_option
@library_errors
def history(session_id: str, db: str, as_json: bool) -> None:
    """Show a session's compactions and boundaries, oldest first.

    Above the table: the session's model, edit policy, whether the drop_block thinking
    binding is set (and since when), and the thinking blocks the API dropped per model
    call. Each row: id, time (UTC), trigger, strategy, edit policy, success, tokens
    before → after, tokens freed, boundary id, messages removed and when it was rolled
    back; under it, what was lost (removed seqs, cleared or persisted tool results, blob
    ids) and the kept range.

    Example: compactstore history s1
    """
    with CompactStore.open(db, read_only=True) as store:
        sess = store.get_session(session_id)
        compactions = sess.compactions()
        state = sess.edit_state()
    if as_json:
        found = [render.compaction_json(c) for c in compactions]
        document = {
            "session": sess.id,
            "edit_state": render.edit_state_json(state),
            "compactions": found,
        }
        click.echo(render.json_text(document))
    else:
        click.echo("\n".join(render.history_lines(compactions, state)))


@click.command(short_help="Print or save a persisted tool result.")
@session_argument
@click.argument("blob_id", metavar="BLOB_ID", type=int)
@output_option(
    "Write the content to this file (byte-exact) instead of stdout; a blob that is one "
    "image (or one PDF) is written decoded, as the image file."
)
@db_option
@json_option
@library_errors
def blob(session_id: str, blob_id: int, output: Path | None, db: str, as_json: bool) -> None:
    """Print (or save) the full content of a persisted tool result, byte-exact.

    A result with images or documents is persisted as the JSON of its content blocks; with
    -o, a blob holding exactly one image (or one PDF) with inline data is written decoded.

    Example: compactstore blob s1 3 -o result.txt
    """
    with CompactStore.open(db, read_only=True) as store:
        sess = store.get_session(session_id)
        content = sess.get_blob(blob_id)
    data = content.encode("utf-8")
    decoded = decoded_single_media(content) if output is not None else None
    if decoded is not None:
        data = decoded[1]
    if output is not None:
        write_output(output, data, db=db)
    if as_json:
        found = {
            "session": sess.id,
            "blob_id": blob_id,
            "bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
            "output": None if output is None else str(output),
            "decoded": None if decoded is None else decoded[0],
            "content": None if output is not None else content,
        }
        click.echo(render.json_text(found))
    elif output is not None:
        what = "" if decoded is None else f" ({decoded[0]}, decoded)"
        click.echo(f"wrote {len(data):,} bytes{what} to {output}")
    else:
        click.echo(data, nl=False)


@click.command(short_help="Show or reset a session's circuit breaker.")
@session_argument
@click.option("--reset", is_flag=True, help="Clear the failure count and reactive attempts.")
@db_option
@json_option
@library_errors
def breaker(session_id: str, reset: bool, db: str, as_json: bool) -> None:
    """Show (or reset) a session's circuit breaker and reactive-recovery counters.

    Example: compactstore breaker s1 --reset
    """
    with CompactStore.open(db, read_only=not reset, create=False) as store:
        sess = store.get_session(session_id)
        if reset:
            sess.reset_breaker()
        state = sess.breaker()
    if as_json:
        click.echo(
            render.json_text({"session": sess.id, **state.model_dump(mode="json"), "reset": reset})
        )
        return
    if reset:
        click.echo(f"breaker of session {sess.id} reset")
    click.echo("\n".join(render_stats.breaker_lines(state, sess.created_at)))


@click.command(short_help="Export a session as JSONL.")
@session_argument
@click.option("--active", is_flag=True, help="Export the active context, not the whole log.")
@output_option("Write to this file instead of stdout.")
@db_option
@library_errors
def export(session_id: str, active: bool, output: Path | None, db: str) -> None:
    """Export a session as JSONL: the whole log, or with --active what the model is sent.

    Example: compactstore export s1 --active > context.jsonl
    """
    from compactstore._store.export import export_lines

    with CompactStore.open(db, read_only=True) as store:
        sess = store.get_session(session_id)
        # Streamed a page of the log at a time; an output file appears only when complete.
        lines = export_lines(sess, active=active)
        if output is None:
            for line in lines:
                click.echo(line, nl=False)
            return
        with open_output(output, db=db) as out:
            for line in lines:
                out.write(line.encode("utf-8"))


@click.command(short_help="Show what a session's model calls cost.")
@session_argument
@db_option
@json_option
@library_errors
def cost(session_id: str, db: str, as_json: bool) -> None:
    """Show what a session's model calls cost: tokens by kind, cost, cache rewrites.

    Sums the session's ledger (model_calls): uncached input, cache reads, cache writes
    (5-minute and 1-hour), output, and the cost in US dollars at the store's prices (calls
    whose model has no price are counted apart). Under it, what each compaction made the
    cache write again: the cache writes of the first call after it, with their price.

    Example: compactstore cost s1 --json
    """
    with CompactStore.open(db, read_only=True) as store:
        found = store.get_session(session_id).cost()
    if as_json:
        click.echo(render.json_text(found.as_json()))
    else:
        click.echo("\n".join(render_stats.cost_lines(found)))


@click.command(short_help="Show store-wide counts and sizes.")
@db_option
@json_option
@library_errors
def stats(db: str, as_json: bool) -> None:
    """Show store-wide counts: sessions, messages, compactions, boundaries, blobs, size.

    Example: compactstore stats --json
    """
    from compactstore._store.admin import store_stats

    with CompactStore.open(db, read_only=True) as store:
        found = store_stats(store)
    if as_json:
        click.echo(render.json_text(found.as_json()))
    else:
        click.echo("\n".join(render_stats.stats_lines(found)))
