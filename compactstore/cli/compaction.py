"""Commands that change a session's compactions: compact, rollback, replay."""

from __future__ import annotations

import json
import time
from pathlib import Path

import click

from compactstore.cli import render
from compactstore.cli.errors import library_errors
from compactstore.cli.files import progress, read_config
from compactstore.cli.options import (
    config_option,
    db_option,
    json_option,
    session_argument,
)
from compactstore.errors import InvalidInputError, NotFoundError
from compactstore.store import CompactStore

__all__ = ["compact", "replay", "rollback", "worker"]


@click.command(short_help="Compact a session now.")
@session_argument
@click.option("--instructions", help="What the summary should focus on (recorded with it).")
@click.option(
    "--up-to",
    "up_to",
    type=click.IntRange(min=0),
    metavar="SEQ",
    help="Summarise only the messages up to this seq and keep the rest (partial compact).",
)
@db_option
@json_option
@library_errors
def compact(
    session_id: str, instructions: str | None, up_to: int | None, db: str, as_json: bool
) -> None:
    """Compact a session now (trigger manual): a full compact, or a partial one with --up-to.

    Example: compactstore compact s1 --instructions "keep the test failures" --up-to 40
    """
    with CompactStore.open(db, create=False) as store:
        result = store.get_session(session_id).compact(instructions=instructions, up_to_seq=up_to)
    if as_json:
        click.echo(render.json_text(render.compaction_json(result)))
    else:
        click.echo(render.describe(result))


@click.command(short_help="Undo the latest (or a given) boundary or compaction.")
@session_argument
@click.option(
    "--boundary",
    "boundary_id",
    type=int,
    metavar="ID",
    help="Roll back this boundary and every compaction after it (default: the latest).",
)
@click.option(
    "--compaction",
    "compaction_id",
    type=int,
    metavar="ID",
    help="Roll back this compaction (any strategy: clear and pop too) and every one after it.",
)
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@db_option
@json_option
@library_errors
def rollback(
    session_id: str,
    boundary_id: int | None,
    compaction_id: int | None,
    yes: bool,
    db: str,
    as_json: bool,
) -> None:
    """Undo the latest boundary (or --boundary ID and all after it), or --compaction ID and
    every compaction recorded after it. Nothing is deleted.

    Asks for confirmation unless --yes is given.

    Example: compactstore rollback s1 --boundary 3 --yes
    """
    if boundary_id is not None and compaction_id is not None:
        raise click.UsageError("give --boundary or --compaction, not both")
    with CompactStore.open(db, create=False) as store:
        sess = store.get_session(session_id)
        if compaction_id is not None:
            undoes = sess.rollback_plan(compaction_id=compaction_id)
            also = f", {len(undoes)} boundar{'y' if len(undoes) == 1 else 'ies'}"
            question = (
                f"Roll back compaction {compaction_id} and every compaction after it"
                f"{also if undoes else ''} of session {sess.id}?"
            )
        else:
            target, *later = sess.rollback_plan(boundary_id)
            boundary_id = target.id  # even if another process compacts meanwhile
            also = f" and {len(later)} later boundar{'y' if len(later) == 1 else 'ies'}"
            question = (
                f"Roll back boundary {target.id} ({target.strategy.value}, "
                f"{render.utc(target.timestamp)} UTC){also if later else ''} of session "
                f"{sess.id}?"
            )
        if not yes:
            click.confirm(question, abort=True, err=True)
        if compaction_id is not None:
            undone = sess.rollback(compaction_id=compaction_id)
        else:
            undone = sess.rollback(boundary_id)
        usage = sess.token_usage()
    if as_json:
        rolled_back = [b.model_dump(mode="json") for b in undone]
        click.echo(
            render.json_text({"session": sess.id, "rolled_back": rolled_back, "usage": usage})
        )
    else:
        click.echo("\n".join(render.rolled_back_lines(undone, usage)))


@click.command(short_help="Replay a compaction and diff it with the recording.")
@session_argument
@click.option(
    "--boundary", "boundary_id", type=int, required=True, metavar="ID", help="Boundary to replay."
)
@config_option(
    "Replay with this CompactionConfig (a JSON or .toml file; missing fields take the "
    "defaults) instead of the recorded one."
)
@click.option(
    "--apply",
    is_flag=True,
    help="Record the replayed result as a new compaction (latest live or rolled-back "
    "boundary only).",
)
@click.option(
    "--resummarize",
    is_flag=True,
    help="Ask a summarizer again instead of reusing the recorded summary text "
    "(needs --summarizer).",
)
@click.option(
    "--summarizer",
    "summarizer_spec",
    metavar="NAME",
    help="With --resummarize: anthropic, openai (needs --model) or module:callable.",
)
@click.option("--model", metavar="M", help="The model of the anthropic or openai summarizer.")
@db_option
@json_option
@library_errors
def replay(
    session_id: str,
    boundary_id: int,
    config_file: Path | None,
    apply: bool,
    resummarize: bool,
    summarizer_spec: str | None,
    model: str | None,
    db: str,
    as_json: bool,
) -> None:
    """Run a recorded compaction again and diff it against the recording.

    Prints a unified diff of the recorded and the replayed summary and kept range, or
    says they are identical, and how the summary was written: the recorded text reused
    (whenever the replayed cut removes exactly the recorded messages), rule-based, or
    by the summarizer again (--resummarize --summarizer ...).

    Example: compactstore replay s1 --boundary 3 --resummarize --summarizer openai --model gpt-5
    """
    if resummarize and summarizer_spec is None:
        raise InvalidInputError(
            "--resummarize needs --summarizer anthropic|openai (with --model) or module:callable"
        )
    if not resummarize and (summarizer_spec is not None or model is not None):
        raise InvalidInputError("--summarizer and --model only apply with --resummarize")
    summarizer = None
    if summarizer_spec is not None:
        from compactstore.summarizers import resolve  # the SDKs load only when one is named

        summarizer = resolve(summarizer_spec, model)
    config = read_config(config_file) if config_file is not None else None
    with CompactStore.open(db, summarizer=summarizer, create=False) as store:
        sess = store.get_session(session_id)
        known = sess.boundaries(include_rolled_back=True)
        recorded = next((b for b in known if b.id == boundary_id), None)
        if recorded is None:
            raise NotFoundError(f"no boundary {boundary_id} in session {sess.id!r}")
        with progress(f"Replaying boundary {boundary_id}") as report:
            report(0, 1)
            result = sess.replay(boundary_id, config=config, apply=apply, resummarize=resummarize)
            report(1, 1)
    diff = render.replay_diff(recorded, result.boundary)
    source = result.summary.source if result.summary is not None else "rule"
    if as_json:
        found = {
            "session": sess.id,
            "boundary_id": boundary_id,
            "applied": apply,
            "summary_source": source,
            "identical": not diff,
            "diff": diff,
            "recorded": render.boundary_json(recorded),
            "replayed": render.boundary_json(result.boundary),
            "result": render.compaction_json(result),
        }
        click.echo(render.json_text(found))
        return
    if diff:
        click.echo(diff)
    else:
        click.echo(
            f"identical: the replay of boundary {boundary_id} gives the recorded summary "
            f"and kept range"
        )
    click.echo(f"summary: {render.SUMMARY_SOURCES[source]}")
    if apply:
        click.echo(f"applied: {render.describe(result)}")


@click.command(short_help="Run pending background compactions.")
@click.option(
    "--summarizer",
    "summarizer_spec",
    required=True,
    metavar="NAME",
    help="The summarizer: anthropic, openai (needs --model) or module:callable.",
)
@click.option("--model", metavar="M", help="The model of the anthropic or openai summarizer.")
@click.option("--once", is_flag=True, help="Run the jobs pending now, then exit.")
@click.option(
    "--poll",
    type=click.FloatRange(min=0.1),
    default=2.0,
    show_default=True,
    metavar="SECONDS",
    help="How often to look for new jobs (without --once).",
)
@db_option
@json_option
@library_errors
def worker(
    summarizer_spec: str, model: str | None, once: bool, poll: float, db: str, as_json: bool
) -> None:
    """Run the background compactions agents started with process_request(background=True).

    For short-lived agents that exit before their summary is written: each pending job
    (or one whose worker died, once its lease lapsed) is claimed, summarised and committed
    as the agent's own process would have. One line per job: its id, session, state
    (applied, failed or superseded) and compaction id (under --json, one JSON object per
    line). Runs until interrupted, or with --once until no job is pending.

    Example: compactstore worker --db agents.db --summarizer anthropic --model claude-haiku-4-5
    """
    from compactstore.summarizers import resolve  # the SDKs load only when one is named

    summarizer = resolve(summarizer_spec, model)
    with CompactStore.open(db, summarizer=summarizer, create=False) as store:
        while True:
            for pending in store.pending_jobs():
                job = store.run_job(pending.id)
                if job is None:
                    continue  # another worker took it
                if as_json:
                    click.echo(json.dumps(job.model_dump(mode="json"), sort_keys=True))
                else:
                    click.echo(
                        f"job {job.id} session {job.session_id}: {job.state}"
                        + (f" (compaction {job.compaction_id})" if job.compaction_id else "")
                        + (f": {job.error}" if job.error else "")
                    )
            if once:
                return
            time.sleep(poll)
