"""A session handle as the core's functions see it.

A :class:`~compactstore._store.session.Session` is a handle: the session's id, its format's
adapter, its settings as last read, and the store (the driver) it belongs to. The
functions here take one (any object with these attributes: :class:`Handle`) and do what
every part of compactstore that works on a session starts with: lock its row (and follow
the stored settings), read its active context, check a message, aim a compaction at it.
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import Executor
from typing import Any, Protocol

from sqlalchemy import Connection

from compactstore._context.active import ActiveContext
from compactstore._context.tokens import TokenCounter
from compactstore._core import checks, compaction
from compactstore._core.cache import ContextCache, read_context
from compactstore._core.checks import PendingMessage
from compactstore._core.driver import Driver
from compactstore._core.sessions import require
from compactstore.capabilities import ModelCapabilities
from compactstore.db import repository as repo
from compactstore.formats import MessageFormat
from compactstore.formats.block_types import BlockTypeExtension
from compactstore.formats.sdk_objects import has_sdk_object
from compactstore.formats.sdk_types import to_request
from compactstore.models import CompactionConfig
from compactstore.pricing import PriceTable

__all__ = ["Handle", "Store", "context", "locked", "prepare", "target"]


class Store(Driver, Protocol):
    """A driver with the settings a session's work reads from its store."""

    @property
    def location(self) -> str: ...

    @property
    def cache(self) -> ContextCache: ...

    @property
    def token_counter(self) -> TokenCounter: ...

    @property
    def allow_block_types(self) -> BlockTypeExtension: ...

    @property
    def model_capabilities(self) -> Mapping[str, ModelCapabilities]: ...

    @property
    def prices(self) -> PriceTable: ...

    @property
    def plugins(self) -> compaction.Plugins:
        """The caller's code compactions run (the store's)."""
        ...

    def summarizer_executor(self) -> Executor:
        """Where sync summarizers run (a bounded pool)."""
        ...

    def submit_job(
        self, job_id: int, plugins: compaction.Plugins, owner: str | None = None
    ) -> None:
        """Run a background compaction job in this process."""
        ...

    def warn_once(self, session_id: str, what: str) -> bool:
        """True the first time ``what`` happens to a session in this store."""
        ...


class Handle(Protocol):
    """What the functions here read (and, after a lock, update) of a session handle."""

    id: str
    format: str
    adapter: MessageFormat
    config: CompactionConfig
    model: str | None
    thinking_binding: str | None

    @property
    def store(self) -> Store: ...


def locked(handle: Handle, connection: Connection) -> repo.SessionRow:
    """Lock the session's row for the caller's write transaction; the handle follows the
    stored settings (another handle may have changed them)."""
    row = require(connection, handle.id, handle.store.location, lock=True)
    handle.config = row.config
    handle.model = row.model
    handle.thinking_binding = row.thinking_binding
    return row


def context(
    handle: Handle, connection: Connection, row: repo.SessionRow | None = None
) -> ActiveContext:
    """The session's active context in the caller's transaction (from the store's cache
    while only appends happened; ``row``: as the transaction locked it)."""
    store = handle.store
    return read_context(
        connection,
        store.cache,
        handle.id,
        handle.adapter,
        store.token_counter,
        location=store.location,
        row=row,
    )


def prepare(
    handle: Handle,
    message: Any,
    timestamp: Any,
    *,
    pinned: bool = False,
    index: int | None = None,
) -> PendingMessage:
    """A message checked and counted for the session, before its write transaction opens;
    an SDK object (or a dict holding some) becomes the request ``Param`` it stands for."""
    if has_sdk_object(message):
        message = to_request(handle.format, message)
    store = handle.store
    return checks.prepare_message(
        handle.adapter,
        handle.config,
        store.token_counter,
        message,
        timestamp,
        pinned=pinned,
        index=index,
        allow_block_types=store.allow_block_types,
    )


def target(store: Store, session_id: str, adapter: MessageFormat) -> compaction.Target:
    """A session of ``store`` as a compaction call aims at it."""
    return compaction.Target(
        session_id,
        adapter,
        store.cache,
        store.location,
        prices=store.prices,
    )
