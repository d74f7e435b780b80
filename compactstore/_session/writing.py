"""Writing to a session beyond a plain append: a provider response (its turn, usage and
any compaction or edits the provider did), a tool result (with read dedup) and a reported
usage."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel
from sqlalchemy import Connection

from compactstore._core import checks, handle
from compactstore._core.appending import (
    dedup_candidate,
    insert_messages,
    store_tool_result,
    tool_result_message,
)
from compactstore._core.checks import PendingMessage, now_or_clock
from compactstore._core.recording import record_provider_compaction, record_server_edits
from compactstore._core.usage import Calibration, calibrate
from compactstore._ledger import CallUsage, response_usage, usage_cost
from compactstore._session.state import HandleState, SessionHandle
from compactstore.capabilities import resolve_policy
from compactstore.db import repository as repo
from compactstore.errors import CompactStoreWarning, InvalidInputError
from compactstore.formats.sdk_objects import (
    applied_edits,
    cleared_tokens,
    response_model,
    response_turn,
)
from compactstore.models import CompactionResult, SummaryInfo
from compactstore.providers import check_provided, provided_note, provided_text, split_provided

__all__ = ["append_response", "append_tool_result", "extend", "invalidate", "record_usage"]

# warnings.warn's stacklevel for the caller of a Session method that calls a function here.
_CALLER = 4


def extend(
    session: SessionHandle,
    messages: Sequence[dict[str, Any] | BaseModel],
    timestamps: Sequence[float | None] | None,
) -> list[int]:
    """Session.extend(): every message checked and counted first, then one write."""
    if isinstance(messages, dict | str | bytes) or not isinstance(messages, Sequence):
        raise InvalidInputError("extend() takes a list of messages")
    if timestamps is not None and (
        not isinstance(timestamps, Sequence) or len(timestamps) != len(messages)
    ):
        raise InvalidInputError("timestamps must be a list as long as messages")
    stamps = list(timestamps) if timestamps is not None else [None] * len(messages)
    pending = session.store.compute(
        lambda: [
            handle.prepare(session, m, stamp, index=i)
            for i, (m, stamp) in enumerate(zip(messages, stamps, strict=True))
        ]
    )
    if not pending:
        return []
    return session.store.write(
        lambda c: insert_messages(c, handle.locked(session, c), session.adapter, pending)
    )


def invalidate(session: SessionHandle, file_path: str) -> bool:
    """Session.invalidate()."""
    path = checks.check_file_path(file_path)

    def tx(connection: Connection) -> bool:
        handle.locked(session, connection)
        return repo.delete_dedup_entry(connection, session.id, path) > 0

    return session.store.write(tx)


def append_response(
    session: SessionHandle,
    state: HandleState,
    response: Any,
    timestamp: float | None,
    now: float | None,
) -> list[int]:
    """Session.append_response(): the turn, its usage and what the provider did, in one
    write transaction."""
    messages, count = response_turn(session.format, response)
    # A compaction the provider did on its own: an Anthropic reply starting with its
    # threshold compaction block, a Responses output starting with a server-side
    # compaction item. It becomes a boundary (strategy provider, trigger server); the
    # rest is the turn.
    provided, messages = split_provided(session.format, messages, response)
    ledger = response_usage(session.format, response)
    store = session.store
    cost = None if ledger is None else usage_cost(store.prices, ledger)
    model = response_model(response)
    edits = applied_edits(response) if session.format == "anthropic" else []
    # The real count measures the provider's copy after its server-side edits; what
    # they cleared is added back, so it measures this context (which they left alone).
    full_count = None if count is None else count + cleared_tokens(edits)
    pending = [
        handle.prepare(session, m, timestamp, index=i if len(messages) > 1 else None)
        for i, m in enumerate(messages)
    ]
    called = now_or_clock(now)
    measured_on = state.handed_version

    def tx(connection: Connection) -> tuple[Calibration | None, list[int]]:
        row = handle.locked(session, connection)
        calibration = None
        if model is not None and model != row.model:
            repo.update_session(connection, session.id, model=model)
            row = handle.locked(session, connection)
        if provided is not None:
            check_provided(connection, session.id, provided)
            record_provider_compaction(
                connection,
                session.id,
                handle.context(session, connection, row),
                provided,
                provided_text(provided),
                called,
                note=provided_note(provided),
                info=SummaryInfo(source="provider", model=model),
            )
            row = handle.locked(session, connection)
        if edits:
            policy, _ = resolve_policy(row.config.edit_policy, row.model, store.model_capabilities)
            record_server_edits(
                connection,
                session.id,
                handle.context(session, connection, row),
                edits,
                edit_policy=policy,
                at=called,
            )
        if full_count is not None:
            calibration = calibrate(
                connection,
                row,
                handle.context(session, connection, row),
                full_count,
                called,
                measured_on=measured_on,
                ledger=ledger,
                cost_usd=cost,
            )
            row = handle.locked(session, connection)
        seqs = insert_messages(connection, row, session.adapter, pending) if pending else []
        return calibration, seqs

    calibration, seqs = store.write(tx)
    if calibration is not None and full_count is not None:
        _usage_warnings(session, calibration, full_count)
    return seqs


def append_tool_result(
    session: SessionHandle,
    tool_use_id: str,
    content: str | list[dict[str, Any]],
    tool_name: str,
    file_path: str | None,
    is_error: bool,
    timestamp: float | None,
) -> int:
    """Session.append_tool_result().

    The read to point at is looked up first and the message counted with no write
    transaction open; the write stores it only if that read is still the one to point
    at, else looks again (the last try stores the content whole)."""
    result = checks.check_tool_result(
        tool_use_id,
        content,
        tool_name=tool_name,
        file_path=file_path,
        is_error=is_error,
        format_name=session.adapter.name,
    )
    store = session.store
    for attempt in range(3):
        last = attempt == 2
        earlier = (
            None
            if last
            else store.read(lambda c: dedup_candidate(c, session.id, store.location, result))
        )
        pending = store.compute(
            functools.partial(
                tool_result_message,
                session.adapter,
                session.config,
                store.token_counter,
                result,
                earlier,
                timestamp,
            )
        )
        stored = store.write(
            functools.partial(
                _store_tool_result,
                session,
                result=result,
                pending=pending,
                expected=earlier,
                final=last,
            )
        )
        if stored is not None:
            seq, dedup = stored
            if dedup is not None:
                store.notify(dedup)  # a read_dedup compaction was recorded
            return seq
    raise AssertionError("the last try always stores the result")


def _store_tool_result(
    session: SessionHandle,
    connection: Connection,
    *,
    result: checks.NewToolResult,
    pending: PendingMessage,
    expected: tuple[str, int] | None,
    final: bool,
) -> tuple[int, CompactionResult | None] | None:
    row = handle.locked(session, connection)
    policy, _ = resolve_policy(row.config.edit_policy, row.model, session.store.model_capabilities)
    return store_tool_result(
        connection,
        row,
        session.adapter,
        result,
        pending,
        expected=expected,
        final=final,
        edit_policy=policy,
    )


def record_usage(
    session: SessionHandle, state: HandleState, ledger: CallUsage, now: float | None
) -> bool:
    """Session.record_usage() once the usage is checked: calibrate and record the call."""
    cost = usage_cost(session.store.prices, ledger)
    prompt = ledger.prompt_tokens
    called = now_or_clock(now)
    measured_on = state.handed_version

    def tx(connection: Connection) -> Calibration:
        row = handle.locked(session, connection)
        return calibrate(
            connection,
            row,
            handle.context(session, connection, row),
            prompt,
            called,
            measured_on=measured_on,
            ledger=ledger,
            cost_usd=cost,
        )

    calibration = session.store.write(tx)
    _usage_warnings(session, calibration, prompt)
    return calibration.used


def _usage_warnings(session: SessionHandle, calibration: Calibration, input_tokens: int) -> None:
    if calibration.overhead_reason is not None:
        warnings.warn(
            f"session {session.id!r}: {calibration.overhead_reason}",
            CompactStoreWarning,
            stacklevel=_CALLER,
        )
    if (
        not calibration.used
        and not calibration.superseded
        and session.store.warn_once(session.id, "low count")
    ):
        warnings.warn(
            f"session {session.id!r}: record_usage({input_tokens}) is below half the store's "
            f"estimate of the context, so it was not used for calibration; with prompt "
            f"caching, pass the cache figures too: cache_read_tokens and "
            f"cache_write_5m_tokens/cache_write_1h_tokens (Anthropic's "
            f"cache_read_input_tokens and cache_creation_input_tokens)",
            CompactStoreWarning,
            stacklevel=_CALLER,
        )
