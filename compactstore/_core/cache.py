"""Active contexts this process has read, kept per session with the versions they were
read at, so a step of an agent does not rebuild its whole context from the rows.

A session some handle (``Session``, ``AsyncSession``) of this store still refers to stays:
``cache_sessions`` bounds the others, least recently used out. An agent holds its handle
for its whole run, so its steps never rebuild a context another agent's steps evicted,
however many agents one process runs at once. (Measured, benchmarks/asyncapi.py: 100
sessions on one event loop with the default 64 evicted each other's contexts at every
step, 8-10 ms of CPU each, 0.85-0.89x the sync store's throughput; the loop lagged
up to 36 ms outside collections.)
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sqlalchemy import Connection

from compactstore._context.active import ActiveContext, ContextMessage
from compactstore._context.tokens import TokenCounter
from compactstore._core.assembling import appended_messages, load_context, with_session
from compactstore.capabilities import (
    MODEL_CAPABILITIES,
    EditPolicy,
    ModelCapabilities,
    resolve_policy,
)
from compactstore.db import repository as repo
from compactstore.errors import NotFoundError
from compactstore.formats import MessageFormat

__all__ = ["CachedContext", "ContextCache", "read_context"]


@dataclass(frozen=True, slots=True)
class CachedContext:
    context_version: int
    version: int
    base: ActiveContext  # as rebuilt from the rows
    answered: ActiveContext  # with synthetic results for crash-orphaned calls

    @classmethod
    def of(cls, base: ActiveContext, version: int, context_version: int) -> CachedContext:
        return cls(context_version, version, base, base.answered())

    def extended(
        self,
        added: Sequence[ContextMessage],
        row: repo.SessionRow,
        policy: tuple[EditPolicy, bool],
    ) -> CachedContext:
        """This entry with messages appended, at the row's versions and ``policy``: what
        is new is all the work, also while a crash-orphaned call's synthetic result stands in
        the context.

        An orphaned call never gets a real result later (the pairing rules refuse one), so
        the answered context stays valid with the messages appended to it; its answered()
        only starts over when the new messages orphan another call.
        """
        base = with_session(self.base, added, row, policy)
        if self.answered is self.base:
            answered = base.answered()
        else:
            answered = with_session(self.answered, added, row, policy).answered()
        return CachedContext(row.context_version, row.version, base, answered)


class ContextCache:
    """Reused as is while the session is unchanged, extended with the new messages while
    only appends happened; any compaction, rollback or config change (in any process)
    bumps context_version and forces a rebuild from the rows. ``capabilities`` is the
    store's model capability table: a context's edit policy is resolved with it."""

    def __init__(
        self,
        max_sessions: int = 64,
        capabilities: Mapping[str, ModelCapabilities] = MODEL_CAPABILITIES,
    ) -> None:
        self.capabilities = capabilities
        # Reentrant: a handle's finalizer (unpin) may run in a collection inside put().
        self._lock = threading.RLock()
        self._entries: OrderedDict[str, CachedContext] = OrderedDict()
        self._max = max_sessions
        self._handles: dict[str, int] = {}  # live handles per session id

    def pin(self, handle: object, session_id: str) -> None:
        """Keep the session's entry while ``handle`` lives (see the module docstring)."""
        with self._lock:
            self._handles[session_id] = self._handles.get(session_id, 0) + 1
        weakref.finalize(handle, self._unpin, session_id).atexit = False

    def _unpin(self, session_id: str) -> None:
        with self._lock:
            left = self._handles.pop(session_id) - 1
            if left:
                self._handles[session_id] = left
            else:
                self._evict()

    def policy(self, row: repo.SessionRow) -> tuple[EditPolicy, bool]:
        """The edit policy the session's compactions run under and whether its model checks
        thinking prefixes, as its context follows them."""
        return resolve_policy(row.config.edit_policy, row.model, self.capabilities)

    def get(self, session_id: str) -> CachedContext | None:
        with self._lock:
            entry = self._entries.get(session_id)
            if entry is not None:
                self._entries.move_to_end(session_id)
            return entry

    def put(self, session_id: str, entry: CachedContext) -> None:
        with self._lock:
            self._entries[session_id] = entry
            self._entries.move_to_end(session_id)
            self._evict()

    def _evict(self) -> None:
        """Keep at most ``max_sessions`` entries no handle refers to (called locked)."""
        entries = self._entries
        if len(entries) > self._max:
            held = self._handles
            idle = [sid for sid in entries if sid not in held]  # oldest first
            for sid in idle[: len(idle) - self._max]:
                del entries[sid]

    def drop(self, session_id: str) -> None:
        """Forget a session (deleted: a new one under its id must not meet its context)."""
        with self._lock:
            self._entries.pop(session_id, None)


def read_context(
    connection: Connection,
    cache: ContextCache,
    session_id: str,
    adapter: MessageFormat,
    count_tokens: TokenCounter,
    *,
    location: str,
    row: repo.SessionRow | None = None,
) -> ActiveContext:
    """The session's active context, from the cache when only appends happened since.

    ``row`` is the session as the caller's transaction locked it; without it this is a
    read, and when nothing changed since the cached entry, the versions alone say so.
    """
    cached = cache.get(session_id)
    if row is None and cached is not None:
        versions = repo.session_versions(connection, session_id)
        if versions == (cached.version, cached.context_version):
            return cached.answered
    row = row or repo.get_session(connection, session_id)
    if row is None:
        raise NotFoundError(f"session {session_id!r} no longer exists in {location}")
    if cached is not None and cached.context_version == row.context_version:
        if cached.version == row.version:
            return cached.answered
        added = appended_messages(connection, cached.base, row)
        entry = cached.extended(added, row, cache.policy(row))
    else:
        base = load_context(connection, row, adapter, count_tokens, policy=cache.policy(row))
        entry = CachedContext.of(base, row.version, row.context_version)
    cache.put(session_id, entry)
    return entry.answered
