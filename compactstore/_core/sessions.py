"""Sessions: opened or created, imported whole, listed.

Functions run inside the caller's transaction; they raise before writing anything when a
request contradicts what is stored.
"""

from __future__ import annotations

import re
import time
import unicodedata
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TypeVar

from sqlalchemy import Connection, Engine

from compactstore._context.tokens import TokenCounter
from compactstore._core.appending import insert_messages
from compactstore._core.assembling import load_context
from compactstore._core.checks import (
    PendingMessage,
    check_timestamp,
    check_whole,
    check_window,
    now_or_clock,
    prepare_message,
)
from compactstore._core.recording import record_imported
from compactstore._ledger import CallUsage, usage_cost
from compactstore._scratch import scratch_dir
from compactstore.capabilities import ModelCapabilities, resolve_policy
from compactstore.db import model_calls
from compactstore.db import repository as repo
from compactstore.db.engine import database_errors, describe, normalize_url, with_retry, write_tx
from compactstore.db.migrate import open_engine
from compactstore.db.model_calls import ModelCall
from compactstore.db.space import release_free_pages
from compactstore.db.transfer import copy_from
from compactstore.errors import (
    ConflictError,
    DatabaseError,
    InvalidInputError,
    InvalidMessageError,
    NotFoundError,
)
from compactstore.formats import MessageFormat
from compactstore.formats.block_types import NO_EXTENSION, BlockTypeExtension
from compactstore.models import (
    CompactionConfig,
    DroppedThinking,
    EditState,
    ImportedBoundary,
    ImportedMessage,
    SessionInfo,
)
from compactstore.pricing import PriceTable, price_table

T = TypeVar("T")

__all__ = [
    "DEFAULT_CONTEXT_WINDOW",
    "DEFAULT_FORMAT",
    "edit_state",
    "import_staged",
    "import_transcript",
    "named",
    "once",
    "open_session",
    "release_space",
    "require",
    "session_infos",
    "stored_id",
]

# What a new session takes when it is not given.
DEFAULT_FORMAT = "anthropic"
DEFAULT_CONTEXT_WINDOW = 200_000

# Messages of an import stored per insert (bounds the memory an import holds).
_IMPORT_BATCH = 500
# How an insert names a message of its batch: "message 3: problem".
_BATCH_PLACE = re.compile(r"message (\d+): (.*)", re.DOTALL)


def require(
    connection: Connection, session_id: str, location: str, *, lock: bool = False
) -> repo.SessionRow:
    """The session's row (locked for the transaction with ``lock``); NotFoundError if gone."""
    row = repo.get_session(connection, session_id, lock=lock)
    if row is None:
        raise NotFoundError(f"session {session_id!r} no longer exists in {location}")
    return row


def open_session(
    connection: Connection,
    session_id: str,
    *,
    format: str | None,
    context_window: int | None,
    config: CompactionConfig | None,
    created_at: float,
    cwd: str | None,
    location: str,
    model: str | None = None,
) -> repo.SessionRow:
    """Get or create a session; a new ``config`` replaces the stored one, a ``cwd`` fills
    a missing one.

    Raises:
        ConflictError: the session exists with another format, context window or cwd.
    """
    sid = session_id
    row = repo.get_session(connection, sid, lock=True)
    if row is None:
        check_window(sid, context_window or DEFAULT_CONTEXT_WINDOW, config or CompactionConfig())
        repo.create_session(
            connection,
            sid,
            format=format or DEFAULT_FORMAT,
            context_window=context_window or DEFAULT_CONTEXT_WINDOW,
            config=config or CompactionConfig(),
            created_at=created_at,
            cwd=cwd,
        )
        if model is not None:
            repo.update_session(connection, sid, model=model)
        return require(connection, sid, location)
    _check_reopened(row, format=format, context_window=context_window, cwd=cwd)
    if cwd is not None and row.cwd is None:
        repo.update_session(connection, sid, cwd=cwd)
    if model is not None and model != row.model:
        repo.update_session(connection, sid, model=model)
    if config is not None and config != row.config:
        check_window(sid, row.context_window, config)
        repo.update_session(connection, sid, structural=True, config=config.model_dump_json())
    return require(connection, sid, location)


def _check_reopened(
    row: repo.SessionRow, *, format: str | None, context_window: int | None, cwd: str | None
) -> None:
    """Refuse to reopen a session with another cwd, format or context window."""
    sid = row.id
    if cwd is not None and row.cwd is not None and cwd != row.cwd:
        raise ConflictError(
            f"session {sid!r} exists with cwd {row.cwd!r}; it cannot be reopened with {cwd!r}"
        )
    if format is not None and format != row.format:
        raise ConflictError(
            f"session {sid!r} exists with format {row.format!r}; it cannot be "
            f"reopened as {format!r} (use another session id)"
        )
    if context_window is not None and context_window != row.context_window:
        raise ConflictError(
            f"session {sid!r} exists with context_window {row.context_window}; "
            f"it cannot be reopened with {context_window}"
        )


def import_transcript(
    connection: Connection,
    session_id: str,
    adapter: MessageFormat,
    items: Iterable[ImportedMessage | ImportedBoundary],
    *,
    context_window: int,
    config: CompactionConfig,
    count_tokens: TokenCounter,
    location: str,
    allow_block_types: BlockTypeExtension = NO_EXTENSION,
    prices: PriceTable | None = None,
) -> repo.SessionRow:
    """Create a session holding a transcript and the compactions its agent did.

    ``items`` are the messages in order, each boundary coming just before the first
    message it keeps (or after the last): it cuts the context there, as the agent
    continued after it. A message's ``usage`` (the prompt size the transcript reports for
    the call that produced it) becomes a model_calls row, with its ``ledger`` (what the
    call was billed for) and its cost at ``prices`` when the transcript reports them.
    Items are checked, counted and stored a batch at a time as they come, so memory stays
    bounded however long the transcript; since tokens are counted inside this transaction,
    a long import runs on a staging database of its own (see
    :func:`compactstore._importers.import_file`). The session's creation time is the first
    timestamp of its first batch.

    Raises:
        ConflictError: the session already exists.
        InvalidMessageError: a message is refused; the error names its ``where`` (or index).
        InvalidInputError: a boundary is out of place.
    """
    sid = session_id
    if repo.get_session(connection, sid, lock=True) is not None:
        raise ConflictError(f"session {sid!r} already exists; import into a new session id")
    check_window(sid, context_window, config)
    batch: list[ImportedMessage] = []
    created = False
    stored = 0  # messages stored so far: the seq of the next one
    calls = _ImportedCalls(
        overhead=config.fixed_overhead_tokens,
        factor=config.token_factor,
        prices=prices or price_table(None),
    )

    def flush() -> None:
        nonlocal created, stored
        if not created:
            first = next((m.timestamp for m in batch if m.timestamp is not None), None)
            repo.create_session(
                connection,
                sid,
                format=adapter.name,
                context_window=context_window,
                config=config,
                created_at=now_or_clock(first),
            )
            created = True
        if not batch:
            return
        pending: list[PendingMessage] = []
        for offset, item in enumerate(batch):
            seq = stored + offset  # messages are numbered from 0 in transcript order
            try:
                pending.append(
                    prepare_message(
                        adapter,
                        config,
                        count_tokens,
                        item.message,
                        item.timestamp,
                        allow_block_types=allow_block_types,
                    )
                )
                usage = None if item.usage is None else check_whole(item.usage, "usage")
                ledger = item.ledger
                if ledger is not None and not isinstance(ledger, CallUsage):
                    raise InvalidInputError(
                        f"ledger must be a compactstore._ledger.CallUsage, got "
                        f"{type(ledger).__name__}"
                    )
                calls.message(seq, pending[-1].tokens, usage, pending[-1].created_at, ledger)
            except InvalidInputError as exc:
                raise type(exc)(f"{item.where or f'message {seq}'}: {exc}") from None
        try:
            insert_messages(connection, require(connection, sid, location), adapter, pending)
        except InvalidMessageError as exc:
            # The batch's own numbering ("message 3: ...") -> the message's place.
            found = _BATCH_PLACE.match(str(exc)) if len(batch) > 1 else None
            offset, problem = (int(found[1]), found[2]) if found else (0, str(exc))
            where = batch[offset].where or f"message {stored + offset}"
            raise InvalidMessageError(f"{where}: {problem}") from None
        stored += len(batch)
        batch.clear()
        model_calls.insert_calls(connection, sid, calls.take())

    for item in items:
        if isinstance(item, ImportedMessage):
            batch.append(item)
            if len(batch) >= _IMPORT_BATCH:
                flush()
            continue
        at_index = stored + len(batch)
        if not 0 < item.first_kept_index == at_index:
            raise InvalidInputError(
                f"imported boundary before message {item.first_kept_index} comes after "
                f"message {at_index - 1} of the transcript"
            )
        flush()
        row = require(connection, sid, location)
        policy = resolve_policy(row.config.edit_policy, row.model)
        context = load_context(connection, row, adapter, count_tokens, policy=policy)
        stamp = item.timestamp
        record_imported(
            connection, sid, context, item, check_timestamp(stamp) if stamp else time.time()
        )
        del context  # not held while the next segment is read: one segment at a time
        cut = repo.live_boundary(connection, sid)
        assert cut is not None, "record_imported wrote a boundary"
        calls.boundary(
            cut.first_kept_seq,
            repo.pinned_tokens_before(connection, sid, cut.first_kept_seq) + cut.summary_tokens,
            require(connection, sid, location).context_version,
        )
    flush()
    return require(connection, sid, location)


@dataclass
class _ImportedCalls:
    """The model calls of a transcript being imported, figured as it streams in: a call's
    ``usage`` is the store's estimate of the context it sent (the pinned messages before the
    imported boundary then in force, its summary, the messages after it), as ``usage``
    would have said with no real count known yet. Memory holds the boundaries only."""

    overhead: int
    factor: float
    prices: PriceTable
    total: int = 0  # tokens of the messages seen so far
    version: int = 0  # the session's context version after the boundaries seen so far
    # Per boundary: (first kept seq, tokens before the messages it keeps - total before it).
    cuts: list[tuple[int, int]] = field(default_factory=list)
    ready: list[ModelCall] = field(default_factory=list)

    def message(
        self,
        seq: int,
        tokens: int,
        usage: int | None,
        created_at: float,
        ledger: CallUsage | None = None,
    ) -> None:
        """Message ``seq``; ``usage`` is the real count of the call that produced it, whose
        context ended one seq before, and ``ledger`` what that call was billed for."""
        last = seq - 1
        if usage is not None and last >= 0:
            base = next((b for first, b in reversed(self.cuts) if first <= last), 0)
            raw = base + self.total
            self.ready.append(
                ModelCall(
                    last,
                    self.overhead + round(self.factor * raw),
                    usage,
                    created_at,
                    ledger=ledger,
                    cost_usd=None if ledger is None else usage_cost(self.prices, ledger),
                    context_version=self.version,
                )
            )
        self.total += tokens

    def boundary(self, first_kept_seq: int, kept_before: int, version: int) -> None:
        """A boundary before ``first_kept_seq`` (all earlier messages seen); the context
        after it starts with ``kept_before`` tokens (pins and summary) and has context
        version ``version``."""
        self.cuts.append((first_kept_seq, kept_before - self.total))
        self.version = version

    def take(self) -> list[ModelCall]:
        ready, self.ready = self.ready, []
        return ready


def session_infos(connection: Connection) -> list[SessionInfo]:
    """Every session, oldest first, with its message count."""
    return [
        SessionInfo(
            id=row.id,
            format=row.format,
            context_window=row.context_window,
            created_at=row.created_at,
            message_count=count,
            config=row.config,
        )
        for row, count in repo.list_sessions(connection)
    ]


def stored_id(connection: Connection, given: str, normalized: str) -> str:
    """The id a session is stored under: ``normalized`` (NFC, as every session is written
    now), or, when a database written before ids were normalized holds the session in
    another form and not in NFC, that form (the one given, or NFD)."""
    if given == normalized and unicodedata.is_normalized("NFD", normalized):
        return normalized  # no other form to look for (an ASCII id): no extra read
    if repo.get_session(connection, normalized) is not None:
        return normalized
    for form in dict.fromkeys((given, unicodedata.normalize("NFD", normalized))):
        if form != normalized and repo.get_session(connection, form) is not None:
            return form
    return normalized


def import_staged(
    build: Callable[[Connection], object],
    write: Callable[[Callable[[Connection], object]], object],
    location: str,
) -> None:
    """Run ``build`` (an import: it counts tokens) in a staging database, a temporary
    SQLite file, then copy what it stored into the target in one short write transaction
    (``write``: the target's): the target is never locked while the import runs, and
    whatever stops it early leaves the target as it was."""
    with scratch_dir("compactstore-staging-") as tmp:
        url = normalize_url(Path(tmp) / "staging.db")
        stage = describe(url)
        engine = open_engine(url, location=stage, auto_migrate=True, read_only=False)
        try:

            def attempt() -> None:
                with write_tx(engine) as connection:
                    build(connection)

            database_errors(stage, lambda: with_retry(attempt))
            where = {"source_location": stage, "target_location": location}
            write(lambda connection: copy_from(engine, connection, None, **where))
        finally:
            engine.dispose()


def once(build: Callable[[Connection], T], location: str) -> Callable[[Connection], T]:
    """``build`` for a write transaction that may be tried again, when it consumes what it
    is given (a transcript's items): a second try raises instead of storing a part."""
    started = False

    def tx(connection: Connection) -> T:
        nonlocal started
        if started:  # the items were consumed by an attempt that failed
            raise DatabaseError(f"{location} was busy; the import was not stored")
        started = True
        return build(connection)

    return tx


def edit_state(
    connection: Connection,
    session_id: str,
    location: str,
    capabilities: Mapping[str, ModelCapabilities],
) -> EditState:
    """The session's model, edit policy (configured and resolved with ``capabilities``),
    its thinking binding, and the thinking blocks the API dropped per model call, in the
    caller's transaction."""
    row = require(connection, session_id, location)
    dropped = [
        DroppedThinking(call_seq=seq, created_at=at, count=len(listed), transformations=listed)
        for seq, at, listed in model_calls.transformations_of(connection, session_id)
    ]
    policy, prefix_checks = resolve_policy(row.config.edit_policy, row.model, capabilities)
    return EditState(
        model=row.model,
        edit_policy=row.config.edit_policy,
        effective_policy=policy,
        prefix_checks=prefix_checks,
        thinking_binding=row.thinking_binding,
        thinking_binding_at=row.thinking_binding_at,
        dropped=dropped,
    )


def named(
    connection: Connection,
    opening: Callable[..., repo.SessionRow],
    given: str,
    normalized: str,
    *,
    summarizer: str | None,
) -> repo.SessionRow:
    """``opening`` (:func:`open_session` with its settings) under the id the session is
    stored under (:func:`stored_id`), recording the name of the handle's own
    ``summarizer`` with the session."""
    row = opening(connection, stored_id(connection, given, normalized))
    if summarizer is not None and row.summarizer != summarizer:
        repo.update_session(connection, row.id, summarizer=summarizer)
        row = replace(row, summarizer=summarizer)
    return row


def release_space(engine: Engine, location: str) -> None:
    """Give the pages deleted rows left back to the disk, where the database can do it
    quickly (a SQLite file with incremental auto-vacuum: see compactstore.db.space)."""
    database_errors(location, lambda: with_retry(lambda: release_free_pages(engine)))
