"""Export a session as plain JSONL: one message per line, in the session's format.

The output imports back (``compactstore import``, format ``jsonl``) as the same messages.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import TYPE_CHECKING

from compactstore._core.summarizing import redact_message

if TYPE_CHECKING:
    from compactstore._store.store import Session

__all__ = ["export_lines"]


def export_lines(session: Session, *, active: bool = False) -> Iterator[str]:
    """The session's messages as JSONL lines, each ending with a newline.

    With ``active=False`` the whole log, verbatim (what compaction removed included), read
    a page at a time as the lines are consumed; with ``active=True`` the active context, as
    the model would be sent it now (bounded by the context window). The store's
    ``redactor`` is applied to every text (the stored messages are unchanged).
    """
    messages = session.active_context() if active else session.iter_messages()
    redactor = session.store.redactor
    for message in messages:
        if redactor is not None:  # every text that leaves the process
            message = redact_message(message, redactor)
        # Non-ASCII stays readable; the store has already refused lone surrogates.
        yield json.dumps(message, ensure_ascii=False, separators=(",", ":")) + "\n"
