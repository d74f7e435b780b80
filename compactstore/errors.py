"""Errors raised by compactstore.

Every error is a subclass of :class:`CompactStoreError` and carries a message a person can
act on. The tree::

    CompactStoreError
    ├── InvalidInputError (ValueError)        bad argument or message; nothing was stored
    │   └── InvalidMessageError               a message that its session's format rejects
    ├── NotFoundError (LookupError)           unknown session, boundary, blob or compaction
    ├── ConflictError                         the request contradicts stored state
    ├── SchemaError                           the database schema does not match this code
    ├── DatabaseError                         the database cannot be opened or read
    ├── MissingExtraError (ImportError)       a feature's optional extra is not installed
    ├── PluginError                           a token counter or memory provider failed
    └── SummarizerError                       a custom summarizer or counter failed hard

    CompactStoreWarning (UserWarning)         something was done, but not all as asked
"""

from __future__ import annotations

__all__ = [
    "CompactStoreError",
    "CompactStoreWarning",
    "ConflictError",
    "DatabaseError",
    "InvalidInputError",
    "InvalidMessageError",
    "MissingExtraError",
    "NotFoundError",
    "PluginError",
    "SchemaError",
    "SummarizerError",
]


class CompactStoreError(Exception):
    """Base class of every error compactstore raises on purpose."""


class InvalidInputError(CompactStoreError, ValueError):
    """An argument or message is malformed; the store is unchanged."""


class InvalidMessageError(InvalidInputError):
    """A message does not fit its session's format (roles, content, tool pairing, size)."""


class NotFoundError(CompactStoreError, LookupError):
    """A session, boundary, blob or compaction does not exist (in this session)."""


class ConflictError(CompactStoreError):
    """The request contradicts what is stored, e.g. reopening a session with another format."""


class SchemaError(CompactStoreError):
    """The database schema is older or newer than this version of compactstore expects."""


class DatabaseError(CompactStoreError):
    """The database file or server cannot be used (not a database, damaged, unreachable)."""


class MissingExtraError(CompactStoreError, ImportError):
    """A feature needs an optional extra that is not installed; the message names it."""


class SummarizerError(CompactStoreError):
    """Raised by a summarizer or token counter to abort the whole call instead of falling back."""


class PluginError(CompactStoreError):
    """A plug-in given to the store (``token_counter``, ``memory_provider``) raised or
    returned something unusable; nothing was stored."""


class CompactStoreWarning(UserWarning):
    """Work was done with a caveat the caller should hear about (e.g. an import that left
    out a transcript's cut last line, or a real token count too small to use)."""
