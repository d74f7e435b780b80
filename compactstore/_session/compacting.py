"""A session's compaction calls (process, background, reactive, manual) as plan -> decide
-> commit, and its memory entries and recall."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from sqlalchemy import Connection

from compactstore._core import background, checks, compaction, handle
from compactstore._core import recall as recalling
from compactstore._core.checks import now_or_clock
from compactstore._core.driver import committed
from compactstore._core.recording import boundary_model
from compactstore._core.sessions import require
from compactstore._recall import parse_arguments
from compactstore._session.history import rollback
from compactstore._session.state import HandleState, SessionHandle
from compactstore.db import repository as repo
from compactstore.errors import InvalidInputError
from compactstore.formats.base import storable_text
from compactstore.models import CompactionResult, CompactStrategy
from compactstore.providers import refuses_provider_object

__all__ = ["compact", "process_request", "reactive_recover", "recall", "remember"]


def process_request(
    session: SessionHandle,
    state: HandleState,
    now: float | None,
    switches: dict[str, bool],
    background_call: bool,
) -> CompactionResult:
    """Session.process_request(): the registered stages with their ``enable_<name>``
    switches (checked against the registry by :func:`compaction.process_request`)."""
    request = compaction.process_request(
        now_or_clock(now), **{name: bool(value) for name, value in switches.items()}
    )
    if background_call and switches.get("enable_auto_compact", True):
        plugins = state.plugins(session.store)
        if plugins.summarizer is not None:
            target = handle.target(session.store, session.id, session.adapter)
            result, state.seen_job = background.call(
                session.store,
                target,
                request,
                plugins,
                lambda each: compaction_call(session, state, each),
                state.seen_job,
            )
            return result
        # No summarizer: nothing to write in the background.
    decided = compaction_call(session, state, request)
    assert decided is not None, "the pipeline always decides"
    return decided


def reactive_recover(
    session: SessionHandle, state: HandleState, error_message: str, now: float | None
) -> CompactionResult | None:
    """Session.reactive_recover()."""
    if not isinstance(error_message, str):
        raise InvalidInputError("error_message must be the API's error text (a string)")
    # Recorded in a text column: a NUL in it must not stop the recovery.
    error = storable_text(error_message)
    at = now_or_clock(now)
    if refuses_provider_object(error):
        # The provider refused the compaction block the wire view sends (its signature, or
        # a model that cannot read it): that boundary is rolled back (the readable turns
        # return) and the range compacted on the client, the error recorded.
        live = session.store.read(
            lambda c: repo.boundary_rows(c, session.id, include_rolled_back=False)
        )
        last = boundary_model(live[-1]) if live else None
        if last is not None and last.strategy == CompactStrategy.PROVIDER:
            rollback(session, last.id, None, at)
            plugins = replace(state.plugins(session.store), compactor=None)
            request = compaction.reactive_request(at, error)
            return compaction_call(session, state, request, plugins)
    return compaction_call(session, state, compaction.reactive_request(at, error))


def compact(
    session: SessionHandle,
    state: HandleState,
    instructions: str | None,
    up_to_seq: int | None,
    now: float | None,
) -> CompactionResult:
    """Session.compact()."""
    if instructions is not None and not isinstance(instructions, str):
        raise InvalidInputError("instructions must be a string")
    if instructions is not None:
        # Recorded in a text column, and sent to the summarizer, as stored.
        instructions = storable_text(instructions)
    if up_to_seq is not None:
        checks.check_whole(up_to_seq, "up_to_seq (a message seq)")
    request = compaction.manual_request(now_or_clock(now), instructions, up_to_seq)
    result = compaction_call(session, state, request)
    assert result is not None, "a manual compaction always decides"
    return result


def compaction_call(
    session: SessionHandle,
    state: HandleState,
    request: compaction.Request,
    plugins: compaction.Plugins | None = None,
) -> CompactionResult | None:
    """plan -> decide -> commit: a read transaction, the engines and the summarizer with
    none open, then one short write transaction."""
    store = session.store
    steps = compaction.compaction_steps(
        handle.target(store, session.id, session.adapter),
        request,
        plugins if plugins is not None else state.plugins(store),
        store.summarizer_executor(),
    )
    return committed(store, store.cache, session.id, steps)


def remember(session: SessionHandle, kind: str, text: str, scope: str, now: float | None) -> int:
    """Session.remember()."""
    text = checks.check_memory(kind, text, scope)
    created = now_or_clock(now)
    tokens = session.store.token_counter(text)

    def tx(connection: Connection) -> int:
        handle.locked(session, connection)
        entry_id = repo.insert_memory(
            connection,
            session.id,
            kind=kind,
            text=text,
            tokens=tokens,
            created_at=created,
            scope=scope,
        )
        repo.update_session(connection, session.id)
        return entry_id

    return session.store.write(tx)


def recall(session: SessionHandle, arguments: dict[str, Any] | str) -> str:
    """Session.recall()."""
    request = parse_arguments(arguments)
    store = session.store
    return store.read(
        lambda c: recalling.recall(
            c, require(c, session.id, store.location), session.adapter, store.token_counter, request
        )
    )
