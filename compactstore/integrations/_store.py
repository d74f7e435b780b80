"""The store and session id an integration is given, checked the same way by each."""

from __future__ import annotations

import os

from compactstore._store.store import CompactStore
from compactstore.errors import InvalidInputError

__all__ = ["checked_store"]


def checked_store(
    store: CompactStore | str | os.PathLike[str], session_id: object, who: str
) -> CompactStore:
    """``store`` as a CompactStore (a path or URL is opened), after checking it and the
    session id; ``who`` names the integration's class in the errors.

    Raises:
        InvalidInputError: a store that is not a CompactStore, path or URL, or no session id.
    """
    if isinstance(store, str | os.PathLike):
        store = CompactStore.open(store)
    if not isinstance(store, CompactStore):
        raise InvalidInputError(
            f"{who} needs a CompactStore or a database path or URL, got {type(store).__name__}"
        )
    if not isinstance(session_id, str) or not session_id:
        raise InvalidInputError(f"{who} needs a session id (a string)")
    return store
