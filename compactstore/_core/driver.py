"""The driver protocol: how a session's work reaches its database.

A :class:`~compactstore._store.session.Session` checks its arguments, then hands its work to a
driver: transactions (``read``, ``write``), CPU work and the caller's plug-ins with no
transaction open (``compute``), a compaction call's steps (``drive``, over
:func:`compactstore._core.steps.drive`) and the ``on_compaction`` callback once a compaction
is committed (``notify``). :class:`~compactstore.CompactStore` is the sync driver; the async
store's threaded store (:mod:`compactstore._store.threads`) is the same driver with each hook
run off its event loop. The rules are the same for both: they live in the core's functions,
never in a driver.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any, Protocol, TypeVar

from sqlalchemy import Connection

from compactstore._core.cache import CachedContext, ContextCache
from compactstore._core.steps import Op
from compactstore.models import CompactionResult

__all__ = ["Driver", "committed"]

T = TypeVar("T")


class Driver(Protocol):
    """The five hooks every store implements (see the module docstring)."""

    def read(self, fn: Callable[[Connection], T]) -> T:
        """Run ``fn`` in one read transaction (one consistent snapshot)."""
        ...

    def write(self, fn: Callable[[Connection], T]) -> T:
        """Run ``fn`` in one write transaction, again from the start while the database
        is busy."""
        ...

    def compute(self, fn: Callable[[], T]) -> T:
        """Run CPU work or the caller's code with no transaction open."""
        ...

    def drive(self, steps: Generator[Op, Any, T], first: Op | None = None) -> T:
        """Run a compaction call's steps with this driver's hooks."""
        ...

    def notify(self, result: CompactionResult) -> None:
        """Hand a recorded compaction to ``on_compaction`` (no transaction is open)."""
        ...


def committed(
    driver: Driver,
    cache: ContextCache,
    session_id: str,
    steps: Generator[Op, Any, tuple[CompactionResult | None, CachedContext | None]],
    first: Op | None = None,
) -> CompactionResult | None:
    """Run a compaction call's steps to the end, then cache the context it left and hand
    a recorded result to ``on_compaction``: the one way every caller finishes a compaction
    (a session's call, a background job, a call the async store resumed)."""
    result, cached = driver.drive(steps, first)
    if cached is not None:
        # Only once committed: an entry for versions that were rolled back could match
        # another writer's later, different change.
        cache.put(session_id, cached)
    if result is not None and result.id is not None:
        driver.notify(result)
    return result
