"""compactstore: a context-compaction store for LLM agents.

Conversations live in SQL tables; every compaction is one transaction you can audit,
roll back and replay. Start with :meth:`CompactStore.open`.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from compactstore._context.tokens import estimate_tokens
    from compactstore._engines.base import Summarizer, SummaryResult
    from compactstore._ledger import CacheRewrite, CallUsage, SessionCost
    from compactstore._store.store import CompactStore, Session
    from compactstore.aio import AsyncCompactStore, AsyncSession
    from compactstore.errors import (
        CompactStoreError,
        CompactStoreWarning,
        ConflictError,
        DatabaseError,
        InvalidInputError,
        InvalidMessageError,
        MissingExtraError,
        NotFoundError,
        PluginError,
        SchemaError,
        SummarizerError,
    )
    from compactstore.models import (
        BreakerState,
        CompactBoundary,
        CompactionConfig,
        CompactionResult,
        CompactionStep,
        CompactStrategy,
        CompactTrigger,
        JobInfo,
        MemoryEntry,
        SessionInfo,
        SummaryInfo,
    )
    from compactstore.pricing import ModelPrice

__all__ = [
    "AsyncCompactStore",
    "AsyncSession",
    "BreakerState",
    "CacheRewrite",
    "CallUsage",
    "CompactBoundary",
    "CompactStore",
    "CompactStoreError",
    "CompactStoreWarning",
    "CompactStrategy",
    "CompactTrigger",
    "CompactionConfig",
    "CompactionResult",
    "CompactionStep",
    "ConflictError",
    "DatabaseError",
    "InvalidInputError",
    "InvalidMessageError",
    "JobInfo",
    "MemoryEntry",
    "MissingExtraError",
    "ModelPrice",
    "NotFoundError",
    "PluginError",
    "SchemaError",
    "Session",
    "SessionCost",
    "SessionInfo",
    "Summarizer",
    "SummarizerError",
    "SummaryInfo",
    "SummaryResult",
    "__version__",
    "estimate_tokens",
]

__version__ = "0.1.0"


# The names above are imported when first used (PEP 562), so a program that needs one
# part of the package (the command line's ``cost``, a format adapter) does not pay for
# importing all of it.
_LAZY = {
    "AsyncCompactStore": "compactstore.aio",
    "AsyncSession": "compactstore.aio",
    "BreakerState": "compactstore.models",
    "CacheRewrite": "compactstore._ledger",
    "CallUsage": "compactstore._ledger",
    "CompactBoundary": "compactstore.models",
    "CompactStore": "compactstore._store.store",
    "CompactStoreError": "compactstore.errors",
    "CompactStoreWarning": "compactstore.errors",
    "CompactStrategy": "compactstore.models",
    "CompactTrigger": "compactstore.models",
    "CompactionConfig": "compactstore.models",
    "CompactionResult": "compactstore.models",
    "CompactionStep": "compactstore.models",
    "ConflictError": "compactstore.errors",
    "DatabaseError": "compactstore.errors",
    "InvalidInputError": "compactstore.errors",
    "InvalidMessageError": "compactstore.errors",
    "JobInfo": "compactstore.models",
    "MemoryEntry": "compactstore.models",
    "MissingExtraError": "compactstore.errors",
    "ModelPrice": "compactstore.pricing",
    "NotFoundError": "compactstore.errors",
    "PluginError": "compactstore.errors",
    "SchemaError": "compactstore.errors",
    "Session": "compactstore._store.store",
    "SessionCost": "compactstore._ledger",
    "SessionInfo": "compactstore.models",
    "Summarizer": "compactstore._engines.base",
    "SummarizerError": "compactstore.errors",
    "SummaryInfo": "compactstore.models",
    "SummaryResult": "compactstore._engines.base",
    "estimate_tokens": "compactstore._context.tokens",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        try:  # a submodule, as an eager import of everything would have made it available
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
