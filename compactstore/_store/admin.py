"""Store-wide statistics for operators (``compactstore stats``).

The queries are :mod:`compactstore.db.stats`'s, read in one snapshot; nothing is written.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from compactstore._store.store import CompactStore
from compactstore.db import space as db_space
from compactstore.db.engine import database_errors, sqlite_path
from compactstore.db.space import Space
from compactstore.db.stats import store_counts

__all__ = ["Space", "StoreStats", "VacuumReport", "database_space", "store_stats", "vacuum"]


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
    # Recorded compactions per strategy (a call's heaviest stage); "none" counts attempts
    # that did nothing (failures).
    compactions_by_strategy: dict[str, int] = field(default_factory=dict)
    # Per stage: (times it acted, tokens it freed), each stage of a call counted.
    stages: dict[str, tuple[int, int]] = field(default_factory=dict)
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
                "stages": {
                    name: {"count": count, "tokens_freed": freed}
                    for name, (count, freed) in self.stages.items()
                },
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
    counts = store.read(store_counts)
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


def database_space(store: CompactStore) -> Space:
    """How many bytes the database takes and, on SQLite, how many of them are free pages
    (left by deleted rows, reused by new ones; :func:`vacuum` gives them back)."""
    return store.read(db_space.space)


@dataclass(frozen=True, slots=True)
class VacuumReport:
    """The database's space before and after :func:`vacuum`."""

    location: str
    before: Space
    after: Space

    @property
    def freed_bytes(self) -> int:
        """Bytes given back (never negative)."""
        return max(0, self.before.bytes - self.after.bytes)


def vacuum(store: CompactStore) -> VacuumReport:
    """Give the space deleted sessions left back: SQLite ``VACUUM`` (the file is rebuilt;
    it needs free disk space about its size and waits for writers), PostgreSQL ``VACUUM
    (ANALYZE)`` of compactstore's tables (outside any transaction: the space becomes
    reusable, and trailing empty pages go back to the system).

    Raises:
        DatabaseError: the database is busy or cannot be written (a read-only store).
    """
    before = database_space(store)
    database_errors(store.location, lambda: db_space.vacuum(store.engine))
    return VacuumReport(store.location, before, database_space(store))
