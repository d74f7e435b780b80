"""The compactstore command line. Commands only call the library: no SQL here.

Every command takes ``--db`` (after the command or before it; default ``$COMPACTSTORE_DB``,
else ``compactstore.db``) and ``-h``; every command whose output is data takes ``--json``
and then prints one JSON document with stable keys to stdout. Progress bars and prompts go
to stderr, so ``--json`` output stays clean. A failing command prints one ``Error: ...``
line (under ``--json``: one JSON object) to stderr and exits 1, 2 for a usage error (see
:mod:`compactstore._cli.errors`); each command that writes does so in one transaction, so a
failure leaves the database as it was. Commands that only read open the database read-only.

Modules: ``options`` (the shared options and arguments), ``errors`` (how failures are
shown), ``files`` (progress, ``-o`` outputs, config files), ``render`` (the text tables and
JSON documents, pure), and the commands: ``reading``, ``compaction``, ``transcripts``,
``schema``, ``report``, ``transfer``. A new command is written in one of those (or a new
module) and added to ``COMMANDS`` below (each is imported only when it runs);
tests/test_docs.py then asks for its section in the documentation.

JSON shapes (``compaction`` is a CompactionResult without its messages, plus ``effective``;
``boundary`` is a CompactBoundary; ``edit_state`` is an EditState: {model, edit_policy,
effective_policy, prefix_checks, thinking_binding, thinking_binding_at, dropped:
[{call_seq, created_at, count, transformations}], dropped_total})::

    sessions     [{id, format, context_window, created_at, message_count}]
    show         {session, format, context_window, usage, boundary_id, edit_state, message_count,
                  not_shown, messages: [{seq, role, kind, tokens, state, text, message}]}
                  (usage and message_count: the whole context; messages: its newest
                  --limit, not_shown: how many older ones are left out; text: a one-line
                  preview, whole with --full; message: the verbatim message with --full,
                  else null)
    history      {session, edit_state, compactions: [compaction]}
    compact      compaction
    rollback     {session, rolled_back: [boundary], compactions: [id], usage}
                  (compactions: every compaction id the rollback undid)
    replay       {session, boundary_id, applied, summary_source, identical, diff,
                  recorded: {kept, messages_removed, tokens_before, tokens_after, summary_text},
                  replayed: {... the same keys, or null when the replay cut nothing},
                  result: compaction, rolled_back: [id], usage}
                  (rolled_back and usage: what --apply rolled back and the active
                  context's tokens after it; [] and null without --apply)
    blob         {session, blob_id, bytes, sha256, output, content}
    breaker      {session, consecutive_failures, tripped, reactive_attempts,
                  last_microcompact_at, consecutive_fallbacks, reset}
    worker       one {id, session_id, state, started_by, compaction_id, created_at,
                  finished_at, error} per line, per job run
    import       {session, format, context_window, messages, boundaries}
    demo         {report: {session_id, steps, messages, fired, compactions, tokens_freed,
                  peak_usage, peak_sent, context_window}, compactions: [compaction],
                  audit_queries: [{title, sql}]}
    cost         see compactstore._ledger.SessionCost.as_json
    stats        see compactstore._store.admin.StoreStats.as_json
    backup       {location, file, sessions, rows: {table: count}, ids: {table: {old: new}}}
    restore      {location, file, sessions, rows: {table: count}, ids: {table: {old: new}}}
    delete       {location, session, deleted, freed_bytes}
    prune        {older_than_days, dry_run, sessions, freed_bytes (null: nothing deleted)}
    db current   {current, head, up_to_date}
    db upgrade   {location, revision}
    db vacuum    {location, bytes_before, bytes_after, freed_bytes}
"""

from __future__ import annotations

import importlib
from typing import Any

import click

from compactstore._cli.errors import CompactstoreGroup
from compactstore._cli.options import root_db_option
from compactstore._cli.render import one_line
from compactstore.errors import CompactStoreError

__all__ = ["cli", "main"]

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"]}

# Every command, in one place: its name, then the module (under compactstore._cli) and the
# name it has there. A new command is written in its module and added here. A command's
# module is imported when the command runs (or help lists it), so ``compactstore cost``
# does not pay for importing what ``simulate`` or ``report`` need.
COMMANDS: dict[str, tuple[str, str]] = {
    "backup": ("transfer", "backup"),
    "blob": ("reading", "blob"),
    "breaker": ("reading", "breaker"),
    "compact": ("compaction", "compact"),
    "cost": ("reading", "cost"),
    "db": ("schema", "db_group"),
    "delete": ("transfer", "delete"),
    "demo": ("transcripts", "demo"),
    "export": ("reading", "export"),
    "history": ("reading", "history"),
    "import": ("transcripts", "import_"),
    "prune": ("transfer", "prune"),
    "replay": ("compaction", "replay"),
    "report": ("report", "report"),
    "restore": ("transfer", "restore"),
    "rollback": ("compaction", "rollback"),
    "sessions": ("reading", "sessions"),
    "show": ("reading", "show"),
    "simulate": ("transcripts", "simulate"),
    "stats": ("reading", "stats"),
    "worker": ("compaction", "worker"),
}


class LazyGroup(CompactstoreGroup):
    """The top-level group, its commands imported from :data:`COMMANDS` when asked for."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*COMMANDS, *self.commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            module, name = COMMANDS[cmd_name]
            command: Any = getattr(importlib.import_module(f"{__name__}.{module}"), name)
            self.add_command(command, cmd_name)
        return self.commands.get(cmd_name)


@click.group(cls=LazyGroup, context_settings=CONTEXT_SETTINGS)
@click.version_option(package_name="compactstore")
@root_db_option
def cli(db: str | None) -> None:
    """compactstore: keep an agent's conversation in a database and compact it safely.

    Example: compactstore demo && compactstore history demo
    """


def main() -> None:
    """Entry point of the compactstore console script."""
    try:
        cli(prog_name="compactstore", standalone_mode=True)
    except CompactStoreError as exc:  # pragma: no cover - commands convert their own errors
        click.echo(f"Error: {one_line(str(exc))}", err=True)
        raise SystemExit(1) from None
