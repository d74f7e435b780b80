"""Queries of the ``message_origins`` table: an integration's own form of its messages.

An integration (LangChain) stores each message twice in one transaction: in the session's
format in ``messages`` (what compaction reads) and in the framework's form here, keyed by
seq and findable by the framework's message id. Functions take the connection of a
transaction the store opened; none of them commits.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sqlalchemy import Connection, insert, select

from compactstore.db.schema import message_origins

__all__ = ["Origin", "insert_origins", "known_source_ids", "origins_of"]

# Ids per IN (...) list: well under every backend's bound-parameter limit.
_CHUNK = 500


@dataclass(frozen=True, slots=True)
class Origin:
    """One message as the framework gave it: its seq in the log, its id and its JSON."""

    seq: int
    source_id: str
    payload: str


def insert_origins(
    connection: Connection, session_id: str, source: str, origins: Sequence[Origin]
) -> None:
    if origins:
        connection.execute(
            insert(message_origins),
            [
                {
                    "session_id": session_id,
                    "seq": origin.seq,
                    "source": source,
                    "source_id": origin.source_id,
                    "payload": origin.payload,
                }
                for origin in origins
            ],
        )


def known_source_ids(
    connection: Connection, session_id: str, source: str, source_ids: Iterable[str]
) -> set[str]:
    """Which of ``source_ids`` are stored already."""
    wanted = sorted(set(source_ids))
    known: set[str] = set()
    t = message_origins.c
    for start in range(0, len(wanted), _CHUNK):
        rows = connection.execute(
            select(t.source_id).where(
                t.session_id == session_id,
                t.source == source,
                t.source_id.in_(wanted[start : start + _CHUNK]),
            )
        )
        known.update(row.source_id for row in rows)
    return known


def origins_of(
    connection: Connection, session_id: str, source: str, seqs: Iterable[int]
) -> dict[int, Origin]:
    """The stored origins of these seqs (seqs without one are left out)."""
    wanted = sorted(set(seqs))
    found: dict[int, Origin] = {}
    t = message_origins.c
    for start in range(0, len(wanted), _CHUNK):
        rows = connection.execute(
            select(t.seq, t.source_id, t.payload).where(
                t.session_id == session_id,
                t.source == source,
                t.seq.in_(wanted[start : start + _CHUNK]),
            )
        )
        found.update({row.seq: Origin(row.seq, row.source_id, row.payload) for row in rows})
    return found
