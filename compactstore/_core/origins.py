"""Messages given through an integration, stored with the framework's own form of each.

:func:`extend_with_origins` appends session-format messages and, in the same transaction,
the framework's form of each (``message_origins``), skipping any whose framework id is
stored already, so an integration that sees the same message twice stores it once.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection

from compactstore._core.appending import insert_messages
from compactstore._core.handle import Handle, locked, prepare
from compactstore.db.origins import Origin, insert_origins, known_source_ids, origins_of

__all__ = ["Given", "extend_with_origins", "known_ids", "read_origins"]


@dataclass(frozen=True, slots=True)
class Given:
    """One message as an integration gives it: the session-format message, the framework's
    id of it, and the framework's form as JSON text."""

    message: dict[str, Any]
    source_id: str
    payload: str


def extend_with_origins(session: Handle, source: str, given: Sequence[Given]) -> list[int]:
    """Append the messages not stored yet (by ``source_id``) with their origins, in one
    transaction; returns the new seqs.

    Raises:
        InvalidMessageError: a message does not fit the session's format or its pairing
            rules (nothing is written).
    """
    if not given:
        return []
    # Checked and counted before the write transaction opens.
    pending = [prepare(session, item.message, None, index=i) for i, item in enumerate(given)]

    def tx(connection: Connection) -> list[int]:
        row = locked(session, connection)
        known = known_source_ids(connection, session.id, source, (g.source_id for g in given))
        fresh = [(p, g) for p, g in zip(pending, given, strict=True) if g.source_id not in known]
        if not fresh:
            return []
        seqs = insert_messages(connection, row, session.adapter, [p for p, _ in fresh])
        insert_origins(
            connection,
            session.id,
            source,
            [Origin(seq, g.source_id, g.payload) for seq, (_, g) in zip(seqs, fresh, strict=True)],
        )
        return seqs

    return session.store.write(tx)


def read_origins(session: Handle, source: str, seqs: Iterable[int]) -> dict[int, Origin]:
    """The stored origins of these seqs (seqs given otherwise are left out)."""
    wanted = list(seqs)
    return session.store.read(lambda c: origins_of(c, session.id, source, wanted))


def known_ids(session: Handle, source: str, source_ids: Iterable[str]) -> set[str]:
    """Which of these framework ids are stored in the session."""
    wanted = list(source_ids)
    return session.store.read(lambda c: known_source_ids(c, session.id, source, wanted))
