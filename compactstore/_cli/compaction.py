"""Commands that change a session's compactions: compact, rollback, replay."""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from compactstore._cli import render
from compactstore._cli.errors import CommandError, library_errors
from compactstore._cli.files import progress, read_config
from compactstore._cli.options import (
    config_option,
    db_option,
    json_option,
    session_argument,
)
from compactstore._store.store import CompactStore, Session
from compactstore.errors import InvalidInputError, NotFoundError
from compactstore.models import (
    CompactBoundary,
    CompactionConfig,
    CompactionResult,
    CompactStrategy,
)

__all__ = ["compact", "replay", "rollback", "worker"]


def _summarizer(spec: str, model: str | None) -> Any:
    """The summarizer ``--summarizer`` names; ``module:callable`` is looked for in the
    current directory too, as ``python -m`` would (the console script's path lacks it)."""
    from compactstore.summarizers import resolve  # the SDKs load only when one is named

    here = os.getcwd()
    if ":" in spec and here not in sys.path and "" not in sys.path:
        sys.path.append(here)
    return resolve(spec, model)


def _rolled_back_ids(sess: Session) -> set[int]:
    return {c.id for c in sess.compactions() if c.id is not None and c.rolled_back_at is not None}


def _newly_rolled_back(sess: Session, before: set[int]) -> list[CompactionResult]:
    """The compactions rolled back since ``before`` (the ids rolled back then) was read."""
    return [
        c
        for c in sess.compactions()
        if c.id is not None and c.rolled_back_at is not None and c.id not in before
    ]


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
        sess = store.get_session(session_id)
        try:
            result = sess.compact(instructions=instructions, up_to_seq=up_to)
        except InvalidInputError as exc:
            # The library names its argument; here it is the --up-to option.
            message = str(exc)
            if up_to is not None and message.startswith("up_to_seq "):
                message = "--up-to " + message.removeprefix("up_to_seq ")
            raise InvalidInputError(message) from None
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
        before = _rolled_back_ids(sess)
        if compaction_id is not None:
            undone = sess.rollback(compaction_id=compaction_id)
        else:
            undone = sess.rollback(boundary_id)
        compactions = _newly_rolled_back(sess, before)
        usage = sess.token_usage()
    if as_json:
        found = {
            "session": sess.id,
            "rolled_back": [b.model_dump(mode="json") for b in undone],
            "compactions": [c.id for c in compactions],
            "usage": usage,
        }
        click.echo(render.json_text(found))
    else:
        lines = render.rolled_back_lines(compactions, usage, sess.context_window)
        click.echo("\n".join(lines))
    _warn_over_window(sess.id, usage, sess.context_window)


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
@click.option("--yes", "-y", is_flag=True, help="With --apply: do not ask before rolling back.")
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
    yes: bool,
    db: str,
    as_json: bool,
) -> None:
    """Run a recorded compaction again and diff it against the recording.

    Prints a unified diff of the recorded and the replayed summary and kept range, or
    says they are identical, and how the summary was written: the recorded text reused
    (whenever the replayed cut removes exactly the recorded messages), rule-based, or
    by the summarizer again (--resummarize --summarizer ...).

    --apply records the replayed result in place of the boundary. Applied to a live
    boundary it first rolls back that boundary and every compaction recorded after it: it
    says which and asks (unless --yes), then prints them and the active context's size, with
    a warning when that exceeds the window. A --resummarize whose summarizer fails exits 1.

    Example: compactstore replay s1 --boundary 3 --resummarize --summarizer openai --model gpt-5
    """
    summarizer = _replay_summarizer(resummarize, summarizer_spec, model)
    config = read_config(config_file) if config_file is not None else None
    with CompactStore.open(db, summarizer=summarizer, create=False) as store:
        done = _replay_boundary(
            store.get_session(session_id), boundary_id, config, apply, resummarize, yes
        )
    result = done.result
    source, failed, reason = _summary_outcome(result, resummarize)
    if as_json:
        click.echo(render.json_text(done.json(source)))
    else:
        _print_replay(done, source, reason if failed else None)
    if apply and done.usage is not None:
        _warn_over_window(done.session_id, done.usage, done.window)
    if failed:
        applied = f"; compaction {result.id} was recorded with it" if apply else ""
        raise CommandError(
            f"--resummarize could not re-summarise boundary {boundary_id}: {reason}{applied}",
            "SummarizerError",
        )


def _replay_summarizer(resummarize: bool, summarizer_spec: str | None, model: str | None) -> Any:
    """The summarizer ``replay --resummarize`` asks (None: none), its options checked."""
    if resummarize and summarizer_spec is None:
        raise InvalidInputError(
            "--resummarize needs --summarizer anthropic|openai (with --model) or module:callable"
        )
    if not resummarize and (summarizer_spec is not None or model is not None):
        raise InvalidInputError("--summarizer and --model only apply with --resummarize")
    return None if summarizer_spec is None else _summarizer(summarizer_spec, model)


@dataclass(frozen=True, slots=True)
class _Replayed:
    """What ``replay`` did: the boundary recorded, the result, and with --apply the
    compactions it rolled back and the active context's size after."""

    session_id: str
    boundary_id: int
    applied: bool
    recorded: CompactBoundary
    result: CompactionResult
    undone: list[CompactionResult]
    usage: int | None
    window: int

    @property
    def diff(self) -> str:
        return render.replay_diff(self.recorded, self.result.boundary)

    def json(self, source: str) -> dict[str, Any]:
        diff = self.diff
        return {
            "session": self.session_id,
            "boundary_id": self.boundary_id,
            "applied": self.applied,
            "summary_source": source,
            "identical": not diff,
            "diff": diff,
            "recorded": render.boundary_json(self.recorded),
            "replayed": render.boundary_json(self.result.boundary),
            "result": render.compaction_json(self.result),
            "rolled_back": [c.id for c in self.undone],
            "usage": self.usage,
        }


def _replay_boundary(
    sess: Session,
    boundary_id: int,
    config: CompactionConfig | None,
    apply: bool,
    resummarize: bool,
    yes: bool,
) -> _Replayed:
    known = sess.boundaries(include_rolled_back=True)
    recorded = next((b for b in known if b.id == boundary_id), None)
    if recorded is None:
        raise NotFoundError(f"no boundary {boundary_id} in session {sess.id!r}")
    before = _rolled_back_ids(sess) if apply else set()
    live = [b.id for b in known if b.rolled_back_at is None]
    if apply and live and live[-1] == boundary_id and not yes:
        # (on any other live boundary the library refuses --apply with its own error)
        _confirm_replacing(sess, boundary_id)
    with progress(f"Replaying boundary {boundary_id}") as report:
        report(0, 1)
        result = sess.replay(boundary_id, config=config, apply=apply, resummarize=resummarize)
        report(1, 1)
    undone = _newly_rolled_back(sess, before) if apply else []
    usage = sess.token_usage() if apply else None
    return _Replayed(
        sess.id, boundary_id, apply, recorded, result, undone, usage, sess.context_window
    )


def _summary_outcome(result: CompactionResult, resummarize: bool) -> tuple[str, bool, str]:
    """How the replayed summary was written, whether that fails --resummarize (which
    asked for the summarizer: a rule-based summary instead is a failure), and why."""
    source = result.summary.source if result.summary is not None else "rule"
    failed = resummarize and result.boundary is not None and source != "summarizer"
    if result.summary is None:
        what = result.strategy.value if result.strategy is not None else "this"
        reason = f"a {what} compaction's summary is not written by a summarizer"
    else:
        reason = result.summary.reason or "the summarizer failed"
    return source, failed, reason


def _print_replay(done: _Replayed, source: str, failure: str | None) -> None:
    result, diff = done.result, done.diff
    if diff:
        click.echo(diff)
    else:
        click.echo(
            f"identical: the replay of boundary {done.boundary_id} gives the recorded summary "
            f"and kept range"
        )
    line = f"summary: {render.SUMMARY_SOURCES[source]}"
    if result.summary is None and result.strategy is CompactStrategy.SESSION_MEMORY:
        line = "summary: the session memory's notes (no summarizer writes them)"
    elif failure is not None:
        line += f" ({failure})"
    click.echo(line)
    if done.applied:
        usage = done.usage or 0
        if done.undone:
            click.echo("\n".join(render.rolled_back_lines(done.undone, usage, done.window)[:-1]))
        click.echo(f"applied: {render.describe(result)}")
        click.echo(f"active context: {render.usage_of(usage, done.window)}")


def _warn_over_window(session_id: str, usage: int, window: int) -> None:
    """After a rollback: say so on stderr when the active context no longer fits."""
    if usage > window:
        click.echo(
            f"Warning: the active context is now {render.usage_of(usage, window)}: the "
            f"compactions rolled back no longer shrink it. The agent's next "
            f"process_request() compacts it again, or run: compactstore compact {session_id}",
            err=True,
        )


def _confirm_replacing(sess: Session, boundary_id: int) -> None:
    """Ask before ``replay --apply`` rolls back a live boundary and what came after it."""
    compactions = sess.compactions()
    own = next(
        (c for c in compactions if c.boundary is not None and c.boundary.id == boundary_id), None
    )
    if own is None or own.id is None:
        return  # the library refuses such a boundary with its own error
    later = [c for c in compactions if c.id is not None and c.id > own.id and not c.rolled_back_at]
    question = f"Replace boundary {boundary_id} (compaction {own.id}) of session {sess.id}"
    if later:
        strategies: dict[str, int] = {}
        for c in later:
            name = c.strategy.value if c.strategy is not None else "failed"
            strategies[name] = strategies.get(name, 0) + 1
        kinds = ", ".join(f"{name} {count}" for name, count in strategies.items())
        question += (
            f" and roll back the {render.plural(len(later), 'compaction')} recorded after it "
            f"({render.ranges(c.id for c in later if c.id is not None)}: {kinds})"
        )
    click.confirm(question + "?", abort=True, err=True)


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
    summarizer = _summarizer(summarizer_spec, model)
    with CompactStore.open(db, summarizer=summarizer, create=False) as store:
        ran = 0
        while True:
            for pending in store.pending_jobs():
                job = store.run_job(pending.id)
                if job is None:
                    continue  # another worker took it
                ran += 1
                if as_json:
                    click.echo(json.dumps(job.model_dump(mode="json"), sort_keys=True))
                else:
                    click.echo(
                        f"job {job.id} session {job.session_id}: {job.state}"
                        + (f" (compaction {job.compaction_id})" if job.compaction_id else "")
                        + (f": {job.error}" if job.error else "")
                    )
            if once:
                if not ran and not as_json:
                    click.echo(f"no background compaction pending in {store.location}")
                return
            time.sleep(poll)
