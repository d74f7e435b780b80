"""compactstore: a context-compaction store for LLM agents.

Conversations live in SQL tables; every compaction is one transaction you can audit,
roll back and replay. Start with :meth:`CompactStore.open`.
"""

from compactstore.aio import AsyncCompactStore, AsyncSession
from compactstore.engines.base import Summarizer, SummaryResult
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
from compactstore.ledger import CacheRewrite, CallUsage, SessionCost
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
from compactstore.store import CompactStore, Session
from compactstore.tokens import estimate_tokens

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
