"""A session's memory entries (for session-memory compact) and recall of what compaction
removed."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection

from compactstore._core import checks, handle
from compactstore._core import recall as recalling
from compactstore._core.checks import now_or_clock
from compactstore._core.sessions import require
from compactstore._recall import parse_arguments, tool_definition
from compactstore._store.session_base import SessionBase
from compactstore.db import repository as repo
from compactstore.models import MemoryEntry

__all__ = ["SessionMemory"]


class SessionMemory(SessionBase):
    """Memory entries and the ``recall`` tool."""

    def remember(
        self, kind: str, text: str, *, scope: str = "session", now: float | None = None
    ) -> int:
        """Add a memory entry for session-memory compact; returns its id."""
        text = checks.check_memory(kind, text, scope)
        created = now_or_clock(now)
        tokens = self.store.token_counter(text)

        def tx(connection: Connection) -> int:
            handle.locked(self, connection)
            entry_id = repo.insert_memory(
                connection,
                self.id,
                kind=kind,
                text=text,
                tokens=tokens,
                created_at=created,
                scope=scope,
            )
            repo.update_session(connection, self.id)
            return entry_id

        return self.store.write(tx)

    def memories(self) -> list[MemoryEntry]:
        """The stored memory entries, oldest first."""
        return self.store.read(lambda c: repo.memories(c, self.id))

    def recall_tool(self) -> dict[str, Any]:
        """The ``recall`` tool's definition in the session's format, to offer the model.

        anthropic and minicode: ``{"name", "description", "input_schema"}``; openai: a Chat
        Completions function tool; responses: a Responses function tool. Calling it turns on
        the summary's recall line (``recall_enabled`` in the session's stored config).
        """
        definition = tool_definition(self.format)
        if not self.config.recall_enabled:
            self.config = self.store.write(lambda c: recalling.enable(c, handle.locked(self, c)))
        return definition

    def recall(self, arguments: dict[str, Any] | str) -> str:
        """Answer a ``recall`` call: the original of what is not in the context in full.

        ``arguments`` is the call's input (or its JSON text): ``{"from_seq": a, "to_seq": b}``,
        ``{"query": "..."}``, ``{"blob_id": n}`` or ``{"cursor": "..."}`` from the last line
        of an answer cut at ``recall_max_tokens``. A read only: append the answer with
        ``append_tool_result(call_id, answer, tool_name="recall")`` (exempt from the
        tool-result budget).

        Raises:
            InvalidInputError: the arguments, naming what is wrong with them.
            NotFoundError: no blob with that id in this session.
        """
        request = parse_arguments(arguments)
        store = self.store
        return store.read(
            lambda c: recalling.recall(
                c, require(c, self.id, store.location), self.adapter, store.token_counter, request
            )
        )
