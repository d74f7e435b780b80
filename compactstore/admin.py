"""Store-wide statistics for operators (``compactstore stats``).

The queries are :mod:`compactstore.db.stats`'s, read in one snapshot; nothing is written.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from compactstore.db.engine import sqlite_path
from compactstore.db.stats import store_counts
from compactstore.store import CompactStore

__all__ = ["StoreStats", "store_stats"]


@dataclass(frozen=True, slots=True)
class StoreStats:
    """Counts and sizes of everything a store holds."""

    location: str
    backend: str
    sessions: int
    messages: int
    message_tokens: int
    compactions: int
    compactions_rolled_back: int
    # Recorded compactions per strategy; "none" counts attempts that did nothing (failures).
    compactions_by_strategy: dict[str, int] = field(default_factory=dict)
    boundaries_live: int = 0
    boundaries_rolled_back: int = 0
    blobs: int = 0
    blob_bytes: int = 0
    memory_entries: int = 0
    # The ledger (model_calls): calls, those without a cost, tokens by kind, cost in US
    # dollars of the priced calls (None when none has a price).
    model_calls: int = 0
    model_calls_unpriced: int = 0
    call_tokens: dict[str, int] = field(default_factory=dict)
    cost_usd: float | None = None
    # SQLite only: size of the database file and of its write-ahead log (None elsewhere).
    db_file_bytes: int | None = None
    wal_file_bytes: int | None = None

    def as_json(self) -> dict[str, Any]:
        """The documented JSON shape of ``compactstore stats --json``."""
        return {
            "location": self.location,
            "backend": self.backend,
            "sessions": self.sessions,
            "messages": {"count": self.messages, "tokens": self.message_tokens},
            "compactions": {
                "total": self.compactions,
                "rolled_back": self.compactions_rolled_back,
                "by_strategy": dict(self.compactions_by_strategy),
            },
            "boundaries": {
                "live": self.boundaries_live,
                "rolled_back": self.boundaries_rolled_back,
            },
            "blobs": {"count": self.blobs, "bytes": self.blob_bytes},
            "memory_entries": self.memory_entries,
            "model_calls": {
                "count": self.model_calls,
                "unpriced": self.model_calls_unpriced,
                "tokens": dict(self.call_tokens),
                "cost_usd": self.cost_usd,
            },
            "db_file_bytes": self.db_file_bytes,
            "wal_file_bytes": self.wal_file_bytes,
        }


def store_stats(store: CompactStore) -> StoreStats:
    """Count sessions, messages, compactions, boundaries, blobs and memory of a store.

    Args:
        store: an open store.

    Returns:
        The counts, read in one consistent snapshot, and the file sizes for SQLite.
    """
    counts = store._read(store_counts)
    db_bytes = wal_bytes = None
    path = sqlite_path(store.engine.url.render_as_string(hide_password=False))
    if path is not None:
        db_bytes = path.stat().st_size if path.exists() else 0
        wal = path.with_name(path.name + "-wal")
        wal_bytes = wal.stat().st_size if wal.exists() else 0
    return StoreStats(
        location=store.location,
        backend=store.engine.dialect.name,
        db_file_bytes=db_bytes,
        wal_file_bytes=wal_bytes,
        **counts,
    )
