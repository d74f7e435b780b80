"""Appending messages: read what the rules need, apply them, write the rows.

Runs inside the caller's write transaction with the session locked; raises before writing
anything, so a refused batch leaves the log as it was. Messages are counted before that
transaction (the documentation: the token counter is the caller's code).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from sqlalchemy import Connection

from compactstore._context.tokens import TokenCounter, message_tokens
from compactstore._core import recording
from compactstore._core.checks import (
    MAX_NAME,
    NewToolResult,
    PendingMessage,
    check_column_text,
    check_size,
    prepare_message,
)
from compactstore._core.pairing import Conversation, PinRules, StoredCall
from compactstore._engines import read_dedup
from compactstore.db import repository as repo
from compactstore.errors import InvalidInputError, InvalidMessageError, NotFoundError
from compactstore.formats import MessageFormat
from compactstore.formats.base import ResultContent, ToolCall, ToolResult, storage_json
from compactstore.models import CompactionConfig, CompactionResult

__all__ = [
    "dedup_candidate",
    "dedup_of",
    "insert_messages",
    "store_tool_result",
    "tool_result_message",
]


def insert_messages(
    connection: Connection,
    session: repo.SessionRow,
    adapter: MessageFormat,
    pending: Sequence[PendingMessage],
) -> list[int]:
    """Number, pin, pair-check and store messages; returns their seqs.

    Raises:
        InvalidMessageError: a message breaks the pairing rules (nothing is written).
    """
    sid = session.id
    calls = [[*adapter.tool_calls(p.message)] for p in pending]
    results = [[*adapter.tool_results(p.message)] for p in pending]
    _check_ids(pending, calls, results)
    mentioned = {c.id for group in calls for c in group} | {
        r.tool_use_id for group in results for r in group
    }
    stored = {
        call_id: StoredCall(row.call_seq, row.result_seq is not None)
        for call_id, row in repo.known_calls(connection, sid, mentioned).items()
    }
    conversation = _conversation(connection, session, adapter, stored, any(results))
    rows: list[repo.MessageRow] = []
    new_calls: list[tuple[str, str, int]] = []
    answers: list[tuple[str, int, int]] = []  # (tool-use id, call seq, result seq)
    for offset, item in enumerate(pending):
        try:
            # Checked again with the stored config: another handle may have changed it.
            check_size(item.size, session.config)
            admitted = conversation.admit(item.message, pinned=item.pinned)
        except InvalidMessageError as exc:
            raise InvalidMessageError(f"{_where(offset, pending)}{exc}") from None
        new_calls.extend((call.id, call.name, admitted.seq) for call in admitted.calls)
        answers.extend((call_id, call_seq, admitted.seq) for call_id, call_seq in admitted.answers)
        rows.append(
            repo.MessageRow(
                seq=admitted.seq,
                role=str(item.message.get("role")),
                kind=admitted.kind,
                payload=item.payload,
                tokens=item.tokens,
                created_at=item.created_at,
                pinned=admitted.pin,
                dedup_of_seq=item.dedup_of_seq,
                # The context it answered: the session is locked, so
                # this is the version every message of the batch was written against.
                context_version=(session.context_version if admitted.kind == "assistant" else None),
            )
        )
    repo.insert_messages(connection, sid, rows)
    repo.insert_calls(connection, sid, new_calls)
    repo.mark_results(connection, sid, answers)
    pins = conversation.pins
    repo.update_session(
        connection,
        sid,
        request_seq=pins.request_seq,
        real_request_seq=pins.real_request_seq,
        last_seq=rows[-1].seq,
    )
    return [row.seq for row in rows]


def _conversation(
    connection: Connection,
    session: repo.SessionRow,
    adapter: MessageFormat,
    stored: dict[str, StoredCall],
    has_results: bool,
) -> Conversation:
    """The stored conversation the new messages join: the next seq, the calls it has, the
    turn in progress, the live boundary and the pin rules."""
    sid = session.id
    last = repo.last_message(connection, sid)
    boundary = repo.live_boundary(connection, sid) if has_results else None
    return Conversation(
        adapter,
        next_seq=0 if last is None else last.seq + 1,
        stored=stored,
        last_turn_seq=(
            repo.last_turn_seq(connection, sid, grouped=adapter.groups_turns) if stored else -1
        ),
        in_turn=last is not None and adapter.groups_turns and last.kind == "assistant",
        first_kept_seq=boundary.first_kept_seq if boundary is not None else 0,
        pins=PinRules(
            leading_system=last is None or last.pinned == "system",
            request_seq=session.request_seq,
            real_request_seq=session.real_request_seq,
            boilerplate_patterns=session.config.boilerplate_patterns,
        ),
        session_id=sid,
    )


def _check_ids(
    pending: Sequence[PendingMessage],
    calls: Sequence[Sequence[ToolCall]],
    results: Sequence[Sequence[ToolResult]],
) -> None:
    """Ids are checked before they are used in a query: PostgreSQL refuses a NUL in text."""
    for offset in range(len(pending)):
        try:
            for result in results[offset]:
                check_column_text(result.tool_use_id, "tool result id", MAX_NAME)
            for call in calls[offset]:
                check_column_text(call.id, "tool call id", MAX_NAME)
                check_column_text(call.name, "tool name", MAX_NAME)
        except InvalidInputError as exc:
            raise InvalidMessageError(f"{_where(offset, pending)}{exc}") from None


def _where(offset: int, pending: Sequence[PendingMessage]) -> str:
    return f"message {offset}: " if len(pending) > 1 else ""


def dedup_of(
    connection: Connection, session_id: str, file_path: str, content_hash: str
) -> tuple[str, int] | None:
    """(path, seq) of an earlier read of the same content still in the context in full,
    which the new read can point at instead of repeating it; None when there is none."""
    earlier = repo.dedup_entry(connection, session_id, file_path)
    if earlier is None:
        return None
    boundary = repo.live_boundary(connection, session_id)
    in_full = not (boundary is not None and earlier.seq < boundary.first_kept_seq) and (
        not repo.has_live_edit(connection, session_id, earlier.seq)
    )
    if not read_dedup.should_deduplicate(
        earlier.content_hash, content_hash, previous_in_context_in_full=in_full
    ):
        return None
    return earlier.file_path, earlier.seq


def dedup_candidate(
    connection: Connection, session_id: str, location: str, result: NewToolResult
) -> tuple[str, int] | None:
    """(path, seq) of the earlier read a new tool result would point at (read transaction)."""
    session = repo.get_session(connection, session_id)
    if session is None:
        raise NotFoundError(f"session {session_id!r} no longer exists in {location}")
    if not _dedups(session, result) or result.file_path is None:
        return None
    digest = read_dedup.content_hash(_hashed(result))
    return dedup_of(connection, session_id, result.file_path, digest)


def _hashed(result: NewToolResult) -> str:
    """The text a read's hash is taken of (the blocks' JSON for a list)."""
    content = result.content
    return content if isinstance(content, str) else storage_json(content)


def _dedups(session: repo.SessionRow, result: NewToolResult) -> bool:
    return (
        result.file_path is not None and not result.is_error and session.config.read_dedup_enabled
    )


def tool_result_message(
    adapter: MessageFormat,
    config: CompactionConfig,
    count_tokens: TokenCounter,
    result: NewToolResult,
    earlier: tuple[str, int] | None,
    timestamp: float | None,
) -> PendingMessage:
    """The tool result message built in the session's format and counted: the content, or
    a stub pointing at ``earlier`` (no transaction: the token counter is the caller's)."""
    text: ResultContent = result.content if earlier is None else read_dedup.dedup_stub(*earlier)
    message = adapter.tool_result_message(
        result.tool_use_id, text, tool_name=result.tool_name, is_error=result.is_error
    )
    pending = prepare_message(adapter, config, count_tokens, message, timestamp)
    if earlier is None:
        return pending
    # What the stub saves, recorded with it (a read_dedup compaction).
    whole = adapter.tool_result_message(
        result.tool_use_id, result.content, tool_name=result.tool_name, is_error=result.is_error
    )
    return replace(
        pending,
        dedup_of_seq=earlier[1],
        tokens_in_full=message_tokens(adapter, whole, count_tokens),
    )


def store_tool_result(
    connection: Connection,
    session: repo.SessionRow,
    adapter: MessageFormat,
    result: NewToolResult,
    pending: PendingMessage,
    *,
    expected: tuple[str, int] | None,
    final: bool,
    edit_policy: str | None = None,
) -> tuple[int, CompactionResult | None] | None:
    """Store a tool result prepared for ``expected`` (the earlier read it points at, or
    None for the whole content): its seq, and the read_dedup compaction recorded when it
    is a stub. None when that is no longer the read to point at, so the caller prepares it
    again. With ``final`` the whole content is stored in any case."""
    sid, path = session.id, result.file_path
    dedup = _dedups(session, result) and path is not None
    digest = read_dedup.content_hash(_hashed(result))
    if not final:
        now = dedup_of(connection, sid, path, digest) if dedup and path is not None else None
        if now != expected:
            return None
    seq = insert_messages(connection, session, adapter, [pending])[0]
    if dedup and path is not None and expected is None:
        repo.set_dedup_entry(connection, sid, path, digest, seq, pending.created_at)
    if expected is None:
        return seq, None
    return seq, recording.record_read_dedup(
        connection, session, seq, expected, pending, edit_policy=edit_policy
    )
