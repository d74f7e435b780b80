"""The caller's code the store runs, guarded: a plug-in that raises or answers nonsense is
a :class:`PluginError` naming it, and the call it was part of stores nothing.

Errors compactstore defines (e.g. a :class:`SummarizerError` a counter raises to abort on
purpose) pass through unchanged.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

from compactstore._context.tokens import TokenCounter, estimate_tokens
from compactstore._engines.session_memory import MemoryProvider
from compactstore.errors import CompactStoreError, CompactStoreWarning, PluginError
from compactstore.models import MemoryEntry

__all__ = ["checked_counter", "checked_memory_provider", "warn_callback_failed"]


def _describe(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__


def checked_counter(counter: TokenCounter | None) -> TokenCounter:
    """The token counter to use: the default estimate, or ``counter`` guarded."""
    if counter is None:
        return estimate_tokens
    if not callable(counter):
        raise PluginError(f"token_counter must be a callable text -> int, got {counter!r}")
    name = _describe(counter)

    def count(text: str) -> int:
        try:
            tokens = counter(text)
        except CompactStoreError:
            raise
        except Exception as exc:
            raise PluginError(
                f"token_counter {name} raised {type(exc).__name__}: {exc}; nothing was stored"
            ) from exc
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
            raise PluginError(
                f"token_counter {name} returned {tokens!r} for a text of {len(text)} "
                f"characters; it must return a whole number of tokens >= 0; nothing was stored"
            )
        return tokens

    return count


def checked_memory_provider(provider: MemoryProvider | None) -> MemoryProvider | None:
    """``provider`` guarded (None stays None: the store selects memory itself)."""
    if provider is None:
        return None
    if not callable(provider):
        raise PluginError(f"memory_provider must be a callable, got {provider!r}")
    name = _describe(provider)

    def provide(session_id: str, entries: Sequence[MemoryEntry], max_tokens: int) -> str:
        try:
            text = provider(session_id, entries, max_tokens)
        except CompactStoreError:
            raise
        except Exception as exc:
            raise PluginError(
                f"memory_provider {name} raised {type(exc).__name__}: {exc}; nothing was stored"
            ) from exc
        if not isinstance(text, str):
            raise PluginError(
                f"memory_provider {name} returned {type(text).__name__}; it must return the "
                f"memory text (a string); nothing was stored"
            )
        return text

    return provide


def warn_callback_failed(exc: Exception, compaction_id: int | None, *, stacklevel: int) -> None:
    """``on_compaction`` raised: a warning, not an error, since the compaction is recorded
    all the same (the sync store's and the async store's callbacks alike)."""
    warnings.warn(
        f"on_compaction raised {type(exc).__name__}: {exc}; compaction {compaction_id} is recorded",
        CompactStoreWarning,
        stacklevel=stacklevel + 1,
    )
