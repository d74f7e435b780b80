"""The compactstore command line. Commands only call the library: no SQL here.

Every command takes ``--db`` (default ``compactstore.db`` or ``$COMPACTSTORE_DB``) and
``-h``; every command whose output is data takes ``--json`` and then prints one JSON
document with stable keys to stdout. Progress bars and prompts go to stderr, so
``--json`` output stays clean. A failing command prints one ``Error: ...`` line to stderr
and exits 1 (2 for a usage error); each command that writes does so in one transaction,
so a failure leaves the database as it was.

JSON shapes (``compaction`` is a CompactionResult without its messages, plus ``effective``;
``boundary`` is a CompactBoundary)::

    sessions     [{id, format, context_window, created_at, message_count}]
    show         {session, format, context_window, usage, boundary_id,
                  messages: [{seq, role, kind, tokens, state, text, message}]}
                  (text: a one-line preview, whole with --full; message: the verbatim
                  message with --full, else null)
    history      {session, compactions: [compaction]}
    compact      compaction
    rollback     {session, rolled_back: [boundary], usage}
    replay       {session, boundary_id, applied, identical, diff,
                  recorded: {kept, messages_removed, tokens_before, tokens_after, summary_text},
                  replayed: {... the same keys, or null when the replay cut nothing},
                  result: compaction}
    blob         {session, blob_id, bytes, sha256, output, content}
    breaker      {session, consecutive_failures, tripped, reactive_attempts,
                  last_microcompact_at, reset}
    import       {session, format, context_window, messages, boundaries}
    demo         {report: {session_id, steps, messages, fired, compactions, tokens_freed,
                  peak_usage, context_window}, compactions: [compaction],
                  audit_queries: [{title, sql}]}
    stats        see compactstore.admin.StoreStats.as_json
    db current   {current, head, up_to_date}
    db upgrade   {location, revision}
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import json
import os
import shlex
import sys
import tomllib
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

import click
from pydantic import ValidationError
from sqlalchemy import exc as sa_exc

from compactstore.errors import CompactStoreError, CompactStoreWarning, NotFoundError
from compactstore.models import CompactBoundary, CompactionConfig, CompactionResult
from compactstore.store import CompactStore, Session

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"]}
PREVIEW_CHARS = 72
F = TypeVar("F", bound=Callable[..., Any])
Progress = Callable[[int, int], None]


def _open(db: str | None) -> CompactStore:
    return CompactStore.open(db)


def _session(store: CompactStore, session_id: str) -> Session:
    # get_session, never session(): reading must not create a session.
    return store.get_session(session_id)


def _echo_json(data: Any) -> None:
    click.echo(json.dumps(data, ensure_ascii=False, indent=2, default=str))


def _one_line(message: str) -> str:
    return " ".join(part.strip() for part in message.splitlines() if part.strip())


def main() -> None:
    """Entry point of the compactstore console script."""
    try:
        cli(prog_name="compactstore", standalone_mode=True)
    except CompactStoreError as exc:  # pragma: no cover - commands convert their own errors
        click.echo(f"Error: {_one_line(str(exc))}", err=True)
        raise SystemExit(1) from None


def _library_errors(fn: F) -> F:
    """Turn library and database errors into one 'Error: ...' line and exit code 1."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except CompactStoreError as exc:
            raise click.ClickException(_one_line(str(exc))) from None
        except sa_exc.SQLAlchemyError as exc:
            cause = getattr(exc, "orig", None) or exc
            raise click.ClickException(_one_line(f"database error: {cause}")) from None

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


# -- small helpers: progress, files, formatting -------------------------------------------


@contextmanager
def _progress(label: str) -> Iterator[Progress]:
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


def _transcript_source(file: Path) -> Path | BinaryIO:
    """The transcript to read: the file, or standard input for ``-``."""
    return sys.stdin.buffer if str(file) == "-" else file


def _transcript_name(file: Path) -> str:
    return "stdin" if str(file) == "-" else file.name


@contextmanager
def _transcript_warnings() -> Iterator[None]:
    """Print the library's warnings about a transcript (a cut last line) as
    ``Warning: ...`` lines on stderr."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", CompactStoreWarning)
        try:
            yield
        finally:
            for warning in caught:
                if issubclass(warning.category, CompactStoreWarning):
                    click.echo(f"Warning: {warning.message}", err=True)
                else:
                    warnings.warn_explicit(
                        warning.message, warning.category, warning.filename, warning.lineno
                    )


def _write_file(path: Path, data: bytes | Iterable[bytes]) -> None:
    """Write a file whole or not at all (a temporary file renamed into place); ``data`` may
    come in chunks, written as they come."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("wb") as out:
            out.writelines([data] if isinstance(data, bytes) else data)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise click.ClickException(f"cannot write {path}: {exc.strerror or exc}") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _read_config(path: Path) -> CompactionConfig:
    """A CompactionConfig from a JSON or TOML file; fields not given take the defaults."""
    try:
        raw = path.read_text(encoding="utf-8")
        data = tomllib.loads(raw) if path.suffix.lower() == ".toml" else json.loads(raw)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise click.ClickException(_one_line(f"cannot read the config {path}: {exc}")) from None
    try:
        return CompactionConfig.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc']) or 'config'}: {error['msg']}"
            for error in exc.errors()
        )
        raise click.ClickException(_one_line(f"invalid config in {path}: {problems}")) from None


def _utc(timestamp: float | None) -> str:
    if timestamp is None:
        return "-"
    return datetime.fromtimestamp(timestamp, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")


def _ranges(seqs: Iterable[int]) -> str:
    """1, 2, 3, 5, 7, 8 -> '1-3, 5, 7-8'."""
    runs: list[list[int]] = []
    for seq in sorted(set(seqs)):
        if runs and seq == runs[-1][1] + 1:
            runs[-1][1] = seq
        else:
            runs.append([seq, seq])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs) or "-"


def _kept(segment: tuple[int, int] | None) -> str:
    return "nothing" if segment is None else f"seq {segment[0]}-{segment[1]}"


def _preview(text: str, width: int = PREVIEW_CHARS) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def _compaction_json(result: CompactionResult) -> dict[str, Any]:
    return {**result.model_dump(mode="json", exclude={"messages"}), "effective": result.effective}


def _why_not(result: CompactionResult) -> str:
    """Why a compaction call did not compact, from its error and its failed stages."""
    reasons = [step.detail for step in result.steps if not step.success and step.detail]
    if result.error:
        reasons.insert(0, result.error)
    return "; ".join(reasons) or "nothing to compact"


def _describe(result: CompactionResult) -> str:
    """One sentence about a compaction call's result."""
    head = "" if result.id is None else f"compaction {result.id}: "
    if result.strategy is None or not result.success:
        what = "" if result.strategy is None else f"{result.strategy.value} "
        trigger = f"({result.trigger.value}) " if result.trigger is not None else ""
        return f"{head}{what}{trigger}compacted nothing: {_why_not(result)}"
    trigger = result.trigger.value if result.trigger is not None else "-"
    text = (
        f"{head}{result.strategy.value} ({trigger}) freed {result.tokens_freed:,} tokens "
        f"({result.tokens_before:,} → {result.tokens_after:,})"
    )
    if result.boundary is not None:
        boundary = result.boundary
        name = "boundary" if boundary.id is None else f"boundary {boundary.id}"
        text += (
            f"; {name} summarised {boundary.messages_removed} messages and keeps "
            f"{_kept(boundary.preserved_segment)}"
        )
    return text


def _history_lines(compactions: list[CompactionResult]) -> list[str]:
    """The history table: one row per compaction and a line saying what was lost."""
    if not compactions:
        return ["no compactions recorded"]
    header = (
        f"{'id':>5}  {'time (UTC)':<19}  {'trigger':<19}  {'strategy':<14}  {'ok':<3}  "
        f"{'tokens before → after':>23}  {'freed':>8}  {'boundary':>8}  {'removed':>7}  "
        f"rolled back"
    )
    lines = [header]
    for c in compactions:
        boundary = c.boundary
        tokens = f"{c.tokens_before:,} → {c.tokens_after:,}"
        lines.append(
            f"{c.id if c.id is not None else '-':>5}  {_utc(c.created_at):<19}  "
            f"{c.trigger.value if c.trigger else '-':<19}  "
            f"{c.strategy.value if c.strategy else '-':<14}  {'yes' if c.success else 'no':<3}  "
            f"{tokens:>23}  {c.tokens_freed:>8,}  "
            f"{boundary.id if boundary is not None and boundary.id is not None else '-':>8}  "
            f"{boundary.messages_removed if boundary is not None else 0:>7}  "
            f"{_utc(c.rolled_back_at) if c.rolled_back_at is not None else '-'}"
        )
        lost = [f"seqs {_ranges(c.removed_seqs)}"]
        cleared = len(c.cleared_tool_use_ids)
        lost.append(f"{cleared} tool result{'' if cleared == 1 else 's'} cleared or persisted")
        lost.append(f"blobs {', '.join(str(i) for i in c.blob_ids) or '-'}")
        detail = f"{'':>7}lost: {'; '.join(lost)}"
        if boundary is not None:
            detail += f"; kept {_kept(boundary.preserved_segment)}"
        if not c.success:
            detail += f"; failed: {_preview(_why_not(c), 80)}"
        lines.append(detail)
    return lines


# -- the commands ---------------------------------------------------------------------------


@click.group(context_settings=CONTEXT_SETTINGS)
@click.version_option(package_name="compactstore")
def cli() -> None:
    """compactstore: keep an agent's conversation in a database and compact it safely.

    Example: compactstore demo && compactstore history demo
    """


@cli.command()
@db_option
@json_option
@_library_errors
def sessions(db: str, as_json: bool) -> None:
    """List the sessions in the database.

    Example: compactstore sessions --db agent.db
    """
    with _open(db) as store:
        infos = store.sessions()
    if as_json:
        _echo_json([info.model_dump(mode="json", exclude={"config"}) for info in infos])
        return
    click.echo(f"{'session':<32} {'format':<10} {'window':>9} {'messages':>9}")
    for info in infos:
        click.echo(
            f"{info.id:<32} {info.format:<10} {info.context_window:>9} {info.message_count:>9}"
        )


@cli.command(short_help="Show a session's active context.")
@click.argument("session_id", metavar="SESSION")
@click.option("--full", is_flag=True, help="Print each message's whole content.")
@db_option
@json_option
@_library_errors
def show(session_id: str, full: bool, db: str, as_json: bool) -> None:
    """Show the active context of a session: what the model is sent next.

    One row per message: seq (- for the summary and synthetic results), role, tokens and
    state (original, persisted, cleared, deduplicated, summary, pinned, synthetic).

    Example: compactstore show s1 --full
    """
    with _open(db) as store:
        sess = _session(store, session_id)
        context = sess.context()
    items = context.items
    texts = [sess.adapter.token_text(item.message) for item in items]
    boundary_id = context.boundary.id if context.boundary is not None else None
    if as_json:
        _echo_json(
            {
                "session": sess.id,
                "format": sess.format,
                "context_window": sess.context_window,
                "usage": context.usage,
                "boundary_id": boundary_id,
                "messages": [
                    {
                        "seq": item.seq,
                        "role": item.message.get("role"),
                        "kind": item.kind,
                        "tokens": item.tokens,
                        "state": item.state,
                        "text": text if full else _preview(text),
                        "message": item.message if full else None,
                    }
                    for item, text in zip(items, texts, strict=True)
                ],
            }
        )
        return
    share = context.usage / sess.context_window
    click.echo(
        f"session {sess.id} ({sess.format}): {len(items)} messages, {context.usage:,} of "
        f"{sess.context_window:,} tokens ({share:.0%}), "
        f"{'no boundary' if boundary_id is None else f'boundary {boundary_id}'}"
    )
    click.echo(f"{'seq':>6}  {'role':<11}  {'tokens':>7}  {'state':<12}  content")
    for item, text in zip(items, texts, strict=True):
        seq = "-" if item.seq is None else str(item.seq)
        role = str(item.message.get("role", item.kind))
        row = f"{seq:>6}  {role:<11}  {item.tokens:>7,}  {item.state:<12}"
        if full:
            click.echo(row.rstrip())
            for line in text.splitlines():
                click.echo(f"{'':>8}{line}".rstrip())
        else:
            click.echo(f"{row}  {_preview(text)}")


@cli.command(short_help="Show a session's compactions and boundaries.")
@click.argument("session_id", metavar="SESSION")
@db_option
@json_option
@_library_errors
def history(session_id: str, db: str, as_json: bool) -> None:
    """Show a session's compactions and boundaries, oldest first.

    Each row: id, time (UTC), trigger, strategy, success, tokens before → after, tokens
    freed, boundary id, messages removed and when it was rolled back; under it, what was
    lost (removed seqs, cleared or persisted tool results, blob ids) and the kept range.

    Example: compactstore history s1
    """
    with _open(db) as store:
        compactions = _session(store, session_id).compactions()
    if as_json:
        _echo_json(
            {"session": session_id, "compactions": [_compaction_json(c) for c in compactions]}
        )
        return
    for line in _history_lines(compactions):
        click.echo(line)


@cli.command(short_help="Compact a session now.")
@click.argument("session_id", metavar="SESSION")
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
@_library_errors
def compact(
    session_id: str, instructions: str | None, up_to: int | None, db: str, as_json: bool
) -> None:
    """Compact a session now (trigger manual): a full compact, or a partial one with --up-to.

    Example: compactstore compact s1 --instructions "keep the test failures" --up-to 40
    """
    with _open(db) as store:
        result = _session(store, session_id).compact(instructions=instructions, up_to_seq=up_to)
    if as_json:
        _echo_json(_compaction_json(result))
    else:
        click.echo(_describe(result))


@cli.command(short_help="Undo the latest (or a given) boundary.")
@click.argument("session_id", metavar="SESSION")
@click.option(
    "--boundary",
    "boundary_id",
    type=int,
    metavar="ID",
    help="Roll back this boundary and every compaction after it (default: the latest).",
)
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@db_option
@json_option
@_library_errors
def rollback(session_id: str, boundary_id: int | None, yes: bool, db: str, as_json: bool) -> None:
    """Undo the latest boundary (or --boundary ID and all after it). Nothing is deleted.

    Asks for confirmation unless --yes is given.

    Example: compactstore rollback s1 --boundary 3 --yes
    """
    with _open(db) as store:
        sess = _session(store, session_id)
        known = sess.boundaries(include_rolled_back=True)
        if boundary_id is None:
            live = [b for b in known if b.rolled_back_at is None]
            target = live[-1] if live else None
        else:
            target = next((b for b in known if b.id == boundary_id), None)
        # When the library is going to refuse (unknown or already rolled back boundary),
        # there is nothing to confirm: let it say why.
        if not yes and target is not None and target.rolled_back_at is None:
            later = sum(
                1 for b in known if b.rolled_back_at is None and (b.id or 0) > (target.id or 0)
            )
            also = f" and {later} later boundar{'y' if later == 1 else 'ies'}" if later else ""
            click.confirm(
                f"Roll back boundary {target.id} ({target.strategy.value}, "
                f"{_utc(target.timestamp)} UTC){also} of session {sess.id}?",
                abort=True,
                err=True,
            )
        # Roll back the boundary that was shown, even if another process compacts meanwhile.
        undone = sess.rollback(target.id if target is not None else boundary_id)
        usage = sess.token_usage()
    if as_json:
        _echo_json(
            {
                "session": sess.id,
                "rolled_back": [b.model_dump(mode="json") for b in undone],
                "usage": usage,
            }
        )
        return
    for b in undone:
        click.echo(
            f"rolled back boundary {b.id} ({b.strategy.value}, {b.trigger.value}, "
            f"{_utc(b.timestamp)} UTC, {b.messages_removed} messages summarised)"
        )
    click.echo(f"active context: {usage:,} tokens")


def _boundary_lines(boundary: CompactBoundary | None) -> list[str]:
    if boundary is None:
        return ["(no boundary: the replay cut nothing)"]
    return [
        f"kept: {_kept(boundary.preserved_segment)}",
        f"messages removed: {boundary.messages_removed}",
        f"tokens: {boundary.tokens_before} → {boundary.tokens_after}",
        "summary:",
        *boundary.summary_text.splitlines(),
    ]


def _boundary_json(boundary: CompactBoundary | None) -> dict[str, Any] | None:
    if boundary is None:
        return None
    return {
        "kept": list(boundary.preserved_segment) if boundary.preserved_segment else None,
        "messages_removed": boundary.messages_removed,
        "tokens_before": boundary.tokens_before,
        "tokens_after": boundary.tokens_after,
        "summary_text": boundary.summary_text,
    }


@cli.command(short_help="Replay a compaction and diff it with the recording.")
@click.argument("session_id", metavar="SESSION")
@click.option(
    "--boundary", "boundary_id", type=int, required=True, metavar="ID", help="Boundary to replay."
)
@click.option(
    "--config",
    "config_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Replay with this CompactionConfig (a JSON or .toml file; missing fields take "
    "the defaults) instead of the recorded one.",
)
@click.option(
    "--apply",
    is_flag=True,
    help="Record the replayed result as a new compaction (latest live or rolled-back "
    "boundary only).",
)
@db_option
@json_option
@_library_errors
def replay(
    session_id: str,
    boundary_id: int,
    config_file: Path | None,
    apply: bool,
    db: str,
    as_json: bool,
) -> None:
    """Run a recorded compaction again and diff it against the recording.

    Prints a unified diff of the recorded and the replayed summary and kept range, or
    says they are identical.

    Example: compactstore replay s1 --boundary 3 --config strict.json
    """
    config = _read_config(config_file) if config_file is not None else None
    with _open(db) as store:
        sess = _session(store, session_id)
        known = sess.boundaries(include_rolled_back=True)
        recorded = next((b for b in known if b.id == boundary_id), None)
        if recorded is None:
            raise NotFoundError(f"no boundary {boundary_id} in session {sess.id!r}")
        with _progress(f"Replaying boundary {boundary_id}") as report:
            report(0, 1)
            result = sess.replay(boundary_id, config=config, apply=apply)
            report(1, 1)
    before, after = _boundary_lines(recorded), _boundary_lines(result.boundary)
    diff = "\n".join(
        difflib.unified_diff(
            before,
            after,
            fromfile=f"recorded (boundary {boundary_id})",
            tofile="replayed",
            lineterm="",
        )
    )
    if as_json:
        _echo_json(
            {
                "session": sess.id,
                "boundary_id": boundary_id,
                "applied": apply,
                "identical": not diff,
                "diff": diff,
                "recorded": _boundary_json(recorded),
                "replayed": _boundary_json(result.boundary),
                "result": _compaction_json(result),
            }
        )
        return
    if diff:
        click.echo(diff)
    else:
        click.echo(
            f"identical: the replay of boundary {boundary_id} gives the recorded summary "
            f"and kept range"
        )
    if apply:
        click.echo(f"applied: {_describe(result)}")


@cli.command(short_help="Print or save a persisted tool result.")
@click.argument("session_id", metavar="SESSION")
@click.argument("blob_id", metavar="BLOB_ID", type=int)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    help="Write the content to this file (byte-exact) instead of stdout.",
)
@db_option
@json_option
@_library_errors
def blob(session_id: str, blob_id: int, output: Path | None, db: str, as_json: bool) -> None:
    """Print (or save) the full content of a persisted tool result, byte-exact.

    Example: compactstore blob s1 3 -o result.txt
    """
    with _open(db) as store:
        content = _session(store, session_id).get_blob(blob_id)
    data = content.encode("utf-8")
    if output is not None:
        _write_file(output, data)
    if as_json:
        _echo_json(
            {
                "session": session_id,
                "blob_id": blob_id,
                "bytes": len(data),
                "sha256": hashlib.sha256(data).hexdigest(),
                "output": None if output is None else str(output),
                "content": None if output is not None else content,
            }
        )
    elif output is not None:
        click.echo(f"wrote {len(data):,} bytes to {output}")
    else:
        click.echo(data, nl=False)


@cli.command(short_help="Show or reset a session's circuit breaker.")
@click.argument("session_id", metavar="SESSION")
@click.option("--reset", is_flag=True, help="Clear the failure count and reactive attempts.")
@db_option
@json_option
@_library_errors
def breaker(session_id: str, reset: bool, db: str, as_json: bool) -> None:
    """Show (or reset) a session's circuit breaker and reactive-recovery counters.

    Example: compactstore breaker s1 --reset
    """
    with _open(db) as store:
        sess = _session(store, session_id)
        if reset:
            sess.reset_breaker()
        state = sess.breaker()
    if as_json:
        _echo_json({"session": sess.id, **state.model_dump(mode="json"), "reset": reset})
        return
    if reset:
        click.echo(f"breaker of session {sess.id} reset")
    click.echo(f"consecutive failures: {state.consecutive_failures}")
    click.echo(f"tripped:              {'yes' if state.tripped else 'no'}")
    click.echo(f"reactive attempts:    {state.reactive_attempts}")
    last = state.last_microcompact_at
    click.echo(f"last microcompact:    {_utc(last)}{' UTC' if last is not None else ''}")


@cli.command("import", short_help="Import a transcript as a new session.")
@click.argument(
    "file", type=click.Path(exists=True, dir_okay=False, allow_dash=True, path_type=Path)
)
@click.option("--session", "session_id", metavar="ID", help="Session id (default: from the file).")
@click.option(
    "--format",
    "format_",
    metavar="FORMAT",
    help="The transcript's source (claude-code, codex, swe-agent, jsonl) or the message "
    "format of plain JSONL (anthropic, openai, minicode); default: detected from the content.",
)
@click.option(
    "--context-window", type=click.IntRange(min=1_000), help="Context window of the new session."
)
@click.option(
    "--strict",
    is_flag=True,
    help="Refuse a transcript whose last line is cut short (still being written) instead of "
    "importing the lines before it with a warning.",
)
@db_option
@json_option
@_library_errors
def import_(
    file: Path,
    session_id: str | None,
    format_: str | None,
    context_window: int | None,
    strict: bool,
    db: str,
    as_json: bool,
) -> None:
    """Import a transcript as a new session: Claude Code or Codex JSONL, a SWE-agent
    trajectory, or JSONL of messages in any of the three formats; gzip files too, and `-`
    for standard input (with --session).

    All or nothing: a malformed line stops the import with its line number and stores
    nothing. A last line cut short (the agent is still writing the file) is left out with a
    warning, or refused with --strict.

    Example: compactstore import ~/.claude/projects/app/1234.jsonl --session app
    """
    from compactstore.formats import FORMAT_NAMES
    from compactstore.importers import SOURCES, import_file

    if format_ is not None and format_ not in (*SOURCES, *FORMAT_NAMES):
        raise click.BadParameter(
            f"{format_!r} is not one of: {', '.join((*SOURCES, *FORMAT_NAMES))}",
            param_hint="'--format'",
        )
    with _open(db) as store, _transcript_warnings():
        with _progress(f"Importing {_transcript_name(file)}") as report:
            sess = import_file(
                store,
                _transcript_source(file),
                session_id=session_id,
                format=format_,
                context_window=context_window,
                progress=report,
                strict=strict,
            )
        count = next((i.message_count for i in store.sessions() if i.id == sess.id), 0)
        boundaries = len(sess.boundaries())
    if as_json:
        _echo_json(
            {
                "session": sess.id,
                "format": sess.format,
                "context_window": sess.context_window,
                "messages": count,
                "boundaries": boundaries,
            }
        )
        return
    click.echo(
        f"imported {count:,} messages into session {sess.id} ({sess.format}, "
        f"{sess.context_window:,} tokens, {boundaries} boundaries)"
    )


@cli.command(short_help="Replay a transcript through compaction and measure it.")
@click.argument(
    "file", type=click.Path(exists=True, dir_okay=False, allow_dash=True, path_type=Path)
)
@click.option(
    "--window",
    type=click.IntRange(min=1_000),
    default=200_000,
    show_default=True,
    help="Context window of the simulated model, in tokens.",
)
@click.option(
    "--format",
    "format_",
    metavar="FORMAT",
    help="The transcript's source or plain-JSONL message format; default: detected.",
)
@click.option(
    "--config",
    "config_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="A CompactionConfig as JSON (or TOML for a .toml file).",
)
@click.option(
    "--no-usage",
    is_flag=True,
    help="Ignore the provider's token counts in the transcript: the window then applies to "
    "the messages as the store estimates them.",
)
@click.option(
    "--db",
    default=None,
    metavar="URL",
    help="Keep the simulated session in this database (default: a temporary file).",
)
@json_option
@_library_errors
def simulate(
    file: Path,
    window: int,
    format_: str | None,
    config_file: Path | None,
    no_usage: bool,
    db: str | None,
    as_json: bool,
) -> None:
    """Replay a transcript as a live agent would have produced it, compacting before every
    model call, and print what compaction did and how good the contexts were.

    Prints every compaction as it happens, tokens freed per stage, peak usage, and the
    quality of every model call's context: validity (pairs by id, SDK request types when
    installed), fit, the original request kept, file recall, agreement with the agent's own
    compactions, and the store's token count against the provider's.

    Example: compactstore simulate ~/.claude/projects/app/1234.jsonl --window 64000
    """
    from compactstore import simulate as sim
    from compactstore.importers import read_transcript

    config = _read_config(config_file) if config_file is not None else None

    def show(event: sim.CompactionEvent) -> None:
        if not as_json:
            click.echo(sim.stage_rows([event])[0])

    with _progress(f"Reading {_transcript_name(file)}") as report, _transcript_warnings():
        transcript = read_transcript(_transcript_source(file), format=format_, progress=report)
    store = CompactStore.open(db) if db is not None else None
    try:
        with _progress(f"Simulating {_transcript_name(file)}") as report:
            result = sim.simulate_transcript(
                transcript,
                name=str(file),
                window=window,
                config=config,
                progress=report,
                on_compaction=show,
                store=store,
                use_usage=not no_usage,
            )
    finally:
        if store is not None:
            store.close()
    if as_json:
        _echo_json(result.to_dict())
        return
    for line in sim.summary_lines(result):
        click.echo(line)


@cli.command(short_help="Export a session as JSONL.")
@click.argument("session_id", metavar="SESSION")
@click.option("--active", is_flag=True, help="Export the active context, not the whole log.")
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    help="Write to this file instead of stdout.",
)
@db_option
@_library_errors
def export(session_id: str, active: bool, output: Path | None, db: str) -> None:
    """Export a session as JSONL: the whole log, or with --active what the model is sent.

    Example: compactstore export s1 --active > context.jsonl
    """
    from compactstore.export import export_lines

    with _open(db) as store:
        sess = _session(store, session_id)
        # Streamed a page of the log at a time; an output file appears only when complete.
        lines = export_lines(sess, active=active)
        if output is not None:
            _write_file(output, (line.encode("utf-8") for line in lines))
        else:
            for line in lines:
                click.echo(line, nl=False)


@cli.command(short_help="Simulate a long agent session, then audit it.")
@click.option("--session", "session_id", default="demo", show_default=True, metavar="ID")
@click.option("--steps", type=click.IntRange(min=1), default=300, show_default=True)
@db_option
@json_option
@_library_errors
def demo(session_id: str, steps: int, db: str, as_json: bool) -> None:
    """Simulate a long coding-agent session, then show its history and how to audit it.

    Example: compactstore demo --db demo.db && sqlite3 demo.db
    """
    from compactstore.demo import audit_queries, run_demo

    with _open(db) as store:
        with _progress(f"Simulating {steps} agent steps") as report:
            result = run_demo(store, session_id=session_id, steps=steps, progress=report)
        compactions = _session(store, result.session_id).compactions()
        location, backend = store.location, store.engine.dialect.name
    queries = audit_queries()
    if as_json:
        _echo_json(
            {
                "report": {
                    "session_id": result.session_id,
                    "steps": result.steps,
                    "messages": result.messages,
                    "fired": dict(result.fired),
                    "compactions": result.compactions,
                    "tokens_freed": dict(result.tokens_freed),
                    "peak_usage": result.peak_usage,
                    "context_window": result.context_window,
                },
                "compactions": [_compaction_json(c) for c in compactions],
                "audit_queries": [{"title": title, "sql": sql} for title, sql in queries],
            }
        )
        return
    peak = result.peak_usage / result.context_window if result.context_window else 0.0
    click.echo(
        f"Simulated {result.steps} steps into session {result.session_id} of {location}: "
        f"{result.messages:,} messages, {result.compactions} compactions, peak usage "
        f"{result.peak_usage:,} of {result.context_window:,} tokens ({peak:.0%})."
    )
    fired = ", ".join(f"{k} {v}" for k, v in result.fired.items()) or "none"
    freed = ", ".join(f"{k} {v:,}" for k, v in result.tokens_freed.items()) or "none"
    click.echo(f"Stages fired: {fired}")
    click.echo(f"Tokens freed: {freed}")
    click.echo("")
    for line in _history_lines(compactions):
        click.echo(line)
    client = f"sqlite3 {shlex.quote(location)}" if backend == "sqlite" else f"psql ({location})"
    click.echo("")
    click.echo(f"Audit it with SQL: paste these into {client}")
    for title, sql in queries:
        click.echo("")
        click.echo(f"-- {title}")
        click.echo(sql.strip().rstrip(";") + ";")


@cli.command(short_help="Show store-wide counts and sizes.")
@db_option
@json_option
@_library_errors
def stats(db: str, as_json: bool) -> None:
    """Show store-wide counts: sessions, messages, compactions, boundaries, blobs, size.

    Example: compactstore stats --json
    """
    from compactstore.admin import store_stats

    with _open(db) as store:
        found = store_stats(store)
    if as_json:
        _echo_json(found.as_json())
        return
    strategies = ", ".join(f"{k} {v}" for k, v in found.compactions_by_strategy.items())
    rows = [
        ("database", f"{found.location} ({found.backend})"),
        ("sessions", f"{found.sessions:,}"),
        ("messages", f"{found.messages:,} ({found.message_tokens:,} tokens)"),
        (
            "compactions",
            f"{found.compactions:,} ({found.compactions_rolled_back:,} rolled back)"
            + (f": {strategies}" if strategies else ""),
        ),
        (
            "boundaries",
            f"{found.boundaries_live:,} live, {found.boundaries_rolled_back:,} rolled back",
        ),
        ("blobs", f"{found.blobs:,} ({found.blob_bytes:,} bytes)"),
        ("memory entries", f"{found.memory_entries:,}"),
    ]
    if found.db_file_bytes is not None:
        rows.append(
            ("file size", f"{found.db_file_bytes:,} bytes (+{found.wal_file_bytes or 0:,} WAL)")
        )
    for name, value in rows:
        click.echo(f"{name + ':':<16}{value}")


@cli.group("db")
def db_group() -> None:
    """Schema management.

    Example: compactstore db current --db agent.db
    """


@db_group.command("upgrade")
@db_option
@json_option
@_library_errors
def db_upgrade(db: str, as_json: bool) -> None:
    """Create the database or upgrade its schema to this version's head.

    Example: compactstore db upgrade --db agent.db
    """
    from compactstore.db.migrate import head_revision

    with CompactStore.open(db, auto_migrate=True) as store:
        location = store.location
    if as_json:
        _echo_json({"location": location, "revision": head_revision()})
    else:
        click.echo(f"{location}: schema at {head_revision()}")


@db_group.command("current")
@db_option
@json_option
@_library_errors
def db_current(db: str, as_json: bool) -> None:
    """Show the database's schema revision and this version's head.

    Example: compactstore db current --db agent.db
    """
    from compactstore.db.migrate import head_revision, revision_of

    current = revision_of(db)
    head = head_revision()
    if as_json:
        _echo_json({"current": current, "head": head, "up_to_date": current == head})
    else:
        click.echo(f"current: {current or 'none'}\nhead:    {head}")
