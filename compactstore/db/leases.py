"""Compaction leases: one compaction that may cut per session at a time.

A lease is a row: its owner's token and when it lapses, on the database's clock (never a
caller's ``now=``, so a test clock cannot keep a dead owner's lease alive). The owner's
commit checks the token, so a lease taken over is a refused commit, never a second cut.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from sqlalchemy import Connection, delete, func, insert, literal, select, update

from compactstore.db.common import SID
from compactstore.db.schema import compaction_leases

__all__ = ["LeaseRow", "acquire_lease", "database_now", "get_lease", "owns_lease", "release_lease"]


class LeaseRow(NamedTuple):
    owner: str
    acquired_at: float
    expires_at: float
    now: float  # the database clock when the row was read

    @property
    def live(self) -> bool:
        return self.expires_at > self.now


# Epoch seconds on the database's clock, per dialect.
_NOW = {
    "postgresql": func.extract("epoch", func.clock_timestamp()),
    "sqlite": (func.julianday(literal("now")) - 2440587.5) * 86400.0,
}
# Built once per dialect: building a statement costs more than running it (every
# compaction's plan reads the lease).
_LEASE = {
    dialect: select(
        compaction_leases.c.owner,
        compaction_leases.c.acquired_at,
        compaction_leases.c.expires_at,
        now.label("now"),
    ).where(compaction_leases.c.session_id == SID)
    for dialect, now in _NOW.items()
}


def _now_expression(connection: Connection) -> Any:
    """Epoch seconds on the database's clock."""
    return _NOW["postgresql" if connection.dialect.name == "postgresql" else "sqlite"]


def database_now(connection: Connection) -> float:
    """The database's clock, in epoch seconds."""
    return float(connection.execute(select(_now_expression(connection))).scalar_one())


def get_lease(connection: Connection, session_id: str) -> LeaseRow | None:
    """The session's lease (live or lapsed), with the database clock; None when free."""
    dialect = "postgresql" if connection.dialect.name == "postgresql" else "sqlite"
    row = connection.execute(_LEASE[dialect], {"sid": session_id}).one_or_none()
    if row is None:
        return None
    return LeaseRow(row.owner, float(row.acquired_at), float(row.expires_at), float(row.now))


def acquire_lease(
    connection: Connection, session_id: str, owner: str, seconds: float, *, take_over: bool
) -> bool:
    """Take the lease for ``seconds`` from now (database clock) when it is free, lapsed,
    already ``owner``'s, or ``take_over``; False when another owner holds it.

    Call it in a write transaction with the session locked.
    """
    current = get_lease(connection, session_id)
    now = current.now if current is not None else database_now(connection)
    values = {"owner": owner, "acquired_at": now, "expires_at": now + seconds}
    if current is None:
        connection.execute(insert(compaction_leases).values(session_id=session_id, **values))
        return True
    if current.owner != owner and current.live and not take_over:
        return False
    connection.execute(
        update(compaction_leases).where(compaction_leases.c.session_id == session_id),
        values,
    )
    return True


def owns_lease(connection: Connection, session_id: str, owner: str) -> bool:
    """Whether ``owner`` still holds the lease (lapsed but not taken counts: nobody else
    compacted meanwhile)."""
    current = get_lease(connection, session_id)
    return current is not None and current.owner == owner


def release_lease(connection: Connection, session_id: str, owner: str) -> None:
    """Give the lease up, if ``owner`` still holds it."""
    connection.execute(
        delete(compaction_leases).where(
            compaction_leases.c.session_id == session_id, compaction_leases.c.owner == owner
        )
    )
