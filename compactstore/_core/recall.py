"""Recall as the drivers run it: read what is out of the context, let
:mod:`compactstore._recall` render and page it. Reads only; runs in a read transaction."""

from __future__ import annotations

import json
from collections.abc import Iterator

from sqlalchemy import Connection

from compactstore._context.media import USER_MEDIA, blob_text
from compactstore._context.tokens import TokenCounter
from compactstore._recall import (
    BlobRequest,
    OutOfContext,
    RangeRequest,
    RecallRequest,
    answer_blob,
    answer_range,
    answer_search,
    render,
)
from compactstore.db import recall as reads
from compactstore.db import repository as repo
from compactstore.errors import DatabaseError, InvalidInputError, NotFoundError
from compactstore.formats import MessageFormat
from compactstore.models import CompactionConfig

__all__ = ["enable", "recall"]

# Messages read per query while an answer is paged or searched.
_PAGE = 100


def recall(
    connection: Connection,
    session: repo.SessionRow,
    fmt: MessageFormat,
    count: TokenCounter,
    request: RecallRequest,
) -> str:
    """The answer to one recall request, capped at the session's ``recall_max_tokens``.

    Raises:
        NotFoundError: no blob with that id in this session.
        InvalidInputError: a seq past the end of the log, or a cursor past the blob's end.
    """
    sid = session.id
    cap = session.config.recall_max_tokens
    if isinstance(request, BlobRequest):
        row = repo.get_blob(connection, sid, request.blob_id)
        if row is None:
            raise NotFoundError(f"no blob {request.blob_id} in session {sid!r}")
        # A result with media is recalled as its text and a note per image or document:
        # base64 is no text for the model to read (the image: get_blob, compactstore blob).
        content = blob_text(bytes(row.content).decode("utf-8"))
        if request.offset > len(content):
            raise InvalidInputError(
                f"recall: the cursor is past the end of blob {request.blob_id} "
                f"({len(content)} characters)"
            )
        tool_name = None if row.tool_use_id == USER_MEDIA else row.tool_name
        return answer_blob(request, row.seq, tool_name, content, count, cap)
    boundary = repo.live_boundary(connection, sid)
    first_kept = boundary.first_kept_seq if boundary is not None else 0
    if isinstance(request, RangeRequest):
        if request.first > session.last_seq:
            raise InvalidInputError(
                f"recall: seq {request.first} is past the end of the log "
                f"(its last seq is {session.last_seq})"
            )
        items = _out_of_context(
            connection, sid, fmt, first_kept, request.first, min(request.last, session.last_seq)
        )
        return answer_range(request, items, count, cap)
    query = request.query
    # The database narrows the search where the payload spells the text as the message does
    # (ASCII, nothing JSON escapes), and in any case the text is searched again.
    spelled_alike = query.isascii() and query.isprintable() and not {'"', "\\"} & set(query)
    coarse = query if spelled_alike else None
    items = _out_of_context(
        connection, sid, fmt, first_kept, 0, session.last_seq, newest_first=True, contains=coarse
    )
    return answer_search(request, items, count, cap)


def _out_of_context(
    connection: Connection,
    session_id: str,
    fmt: MessageFormat,
    first_kept: int,
    from_seq: int,
    to_seq: int,
    *,
    newest_first: bool = False,
    contains: str | None = None,
) -> Iterator[OutOfContext]:
    """The messages of a range not in the context in full, rendered, read a page at a time."""
    while from_seq <= to_seq:
        rows = reads.out_of_context(
            connection,
            session_id,
            first_kept,
            from_seq=from_seq,
            to_seq=to_seq,
            newest_first=newest_first,
            limit=_PAGE,
            contains=contains,
        )
        if not rows:
            return
        edited = [row.seq for row in rows if not row.removed]
        states = reads.edit_states(connection, session_id, edited)
        blobs = reads.live_blob_ids(connection, session_id, edited)
        answered = reads.answered_calls(connection, session_id, [row.seq for row in rows])
        for row in rows:
            try:
                message = json.loads(row.payload)
            except ValueError as exc:
                raise DatabaseError(
                    f"message {row.seq} of session {session_id!r} is damaged: {exc}"
                ) from None
            why = "removed" if row.removed else states.get(row.seq, "cleared")
            yield render(fmt, row.seq, message, why, blobs.get(row.seq, ()), answered.get(row.seq))
        if newest_first:
            to_seq = rows[-1].seq - 1
        else:
            from_seq = rows[-1].seq + 1


def enable(connection: Connection, session: repo.SessionRow) -> CompactionConfig:
    """Turn on the summary's recall line (``recall_enabled`` in the stored config); returns
    the config now stored."""
    if session.config.recall_enabled:
        return session.config
    config = session.config.model_copy(update={"recall_enabled": True})
    repo.update_session(connection, session.id, structural=True, config=config.model_dump_json())
    return config
