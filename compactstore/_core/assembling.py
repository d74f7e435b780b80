"""The active context, assembled from the rows :mod:`compactstore.db.context` reads.

The rule that puts the rows together is
:func:`compactstore._context.assembly.assemble`; the functions
here give it the rows of one transaction and build the
:class:`~compactstore._context.active.ActiveContext` (whole, or a cached one with what was appended
since).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from sqlalchemy import Connection

from compactstore._context.active import ActiveContext, BoundaryInfo, ContextMessage, MessageState
from compactstore._context.assembly import LiveEdit, StoredSummary, assemble, logged_message
from compactstore._context.tokens import TokenCounter
from compactstore.capabilities import EditPolicy
from compactstore.db.context import CLEAR, AsOf, EditRow, appended_rows, context_rows
from compactstore.db.sessions import SessionRow
from compactstore.formats import MessageFormat
from compactstore.models import SummaryState

__all__ = ["appended_messages", "live_edits", "load_context", "with_session"]


def load_context(
    connection: Connection,
    session: SessionRow,
    fmt: MessageFormat,
    count_tokens: TokenCounter,
    *,
    policy: tuple[EditPolicy, bool],
    as_of: AsOf | None = None,
) -> ActiveContext:
    """The session's active context from its rows: the live boundary, the pinned messages
    and every message from its first kept seq on, with their live edits; under the
    session's ``policy`` (its resolved edit policy and whether its model checks thinking
    prefixes: they choose the thinking rule). With ``as_of`` the
    context as it stood just before a recorded compaction (for replay: with the policy that
    compaction ran under)."""
    rows = context_rows(connection, session, as_of=as_of)
    boundary_row = rows.boundary
    summary = None
    boundary = None
    if boundary_row is not None:
        boundary = BoundaryInfo(
            boundary_row.id,
            boundary_row.first_kept_seq,
            boundary_row.summary_text,
            SummaryState.model_validate_json(boundary_row.summary_state),
        )
        if boundary_row.strategy != CLEAR:  # a clear boundary has no summary message
            summary = StoredSummary(
                boundary, boundary_row.summary_message, boundary_row.summary_tokens
            )
    head, kept = assemble(fmt, rows.messages, live_edits(rows.edits), summary)
    return ActiveContext(
        session_id=session.id,
        fmt=fmt,
        context_window=session.context_window,
        count_tokens=count_tokens,
        head=head,
        kept=kept,
        boundary=boundary,
        last_seq=rows.last_seq,
        usage_offset=session.usage_offset if as_of is None else as_of.usage_offset,
        token_factor=session.token_factor if as_of is None else as_of.token_factor,
        config=session.config if as_of is None else as_of.config,
        real_request_seq=session.real_request_seq,
        cwd=session.cwd,
        changes=rows.changes,
        edit_policy=policy[0],
        prefix_checks=policy[1],
    )


def live_edits(rows: Sequence[EditRow]) -> dict[int, LiveEdit]:
    """The latest live edit per seq (payload, tokens, state, the tool-use ids edited so far)
    from the edits oldest first."""
    out: dict[int, LiveEdit] = {}
    for row in rows:
        earlier = out[row.seq].edited_ids if row.seq in out else frozenset[str]()
        state: MessageState = (
            "persisted"
            if row.kind == "persisted"
            else "removed"
            if row.kind == "removed"
            else "cleared"
        )
        ids = earlier | set(json.loads(row.tool_use_ids))
        out[row.seq] = LiveEdit(row.payload, row.tokens, state, ids)
    return out


def appended_messages(
    connection: Connection, context: ActiveContext, session: SessionRow
) -> list[ContextMessage]:
    """The messages appended to the log since ``context`` was read, as the context holds them
    (appends never carry edits)."""
    rows = appended_rows(connection, session.id, context.last_seq, session.last_seq)
    return [logged_message(context.fmt, row, None) for row in rows]


def with_session(
    context: ActiveContext,
    added: Sequence[ContextMessage],
    session: SessionRow,
    policy: tuple[EditPolicy, bool],
) -> ActiveContext:
    """``context`` with ``added`` appended and the session's current values (its ``policy``,
    as for :func:`load_context`: a response from another model may change it)."""
    return context.extended(
        added,
        last_seq=session.last_seq,
        usage_offset=session.usage_offset,
        token_factor=session.token_factor,
        config=session.config,
        real_request_seq=session.real_request_seq,
        cwd=session.cwd,
        policy=policy,
    )
