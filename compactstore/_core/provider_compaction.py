"""What every provider compactor shares: the answer (:class:`ProviderCompaction`), the
typed failure (:class:`ProviderCompactionError`), the SDK error reading and the retry of an
overloaded service, for sync and async clients alike.

The public names are re-exported by :mod:`compactstore.providers`.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection

from compactstore.db.history import boundaries_holding
from compactstore.errors import InvalidMessageError

__all__ = [
    "ProviderCompaction",
    "ProviderCompactionError",
    "async_client",
    "check_provided",
    "error_kind",
    "error_message",
    "is_async_compactor",
    "provider_key",
    "with_retries",
    "with_retries_async",
]

# The typed errors that say the provider is overloaded: retried with backoff first.
RETRIED = frozenset({"compaction_unavailable", "overloaded"})


class ProviderCompactionError(Exception):
    """The provider did not compact: ``kind`` is its typed error (e.g.
    ``compaction_nothing_to_summarize``, ``compaction_unavailable``) or ``failed`` (a
    documented failure: no block), ``error`` (any other error)."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class ProviderCompaction:
    """What a provider compaction gave: ``message`` (the message or item that stands for
    the range on the wire, exactly as returned), its readable ``text`` (None when opaque),
    the ``model``, the billed ``iterations`` (Anthropic's ``usage.iterations`` as returned;
    for OpenAI one ``compaction`` entry of the same shape made from its ``usage``), how
    many attempts it took, the ``provider`` and the item's ``created_by`` when given."""

    message: dict[str, Any]
    text: str | None
    model: str
    iterations: list[dict[str, Any]] = field(default_factory=list)
    attempts: int = 1
    provider: str = "anthropic"
    created_by: str | None = None

    @property
    def block(self) -> dict[str, Any]:
        """The provider's object: an Anthropic message's first block, an OpenAI item."""
        content = self.message.get("content")
        if isinstance(content, list) and content and isinstance(content[0], dict):
            return dict(content[0])
        return self.message

    @property
    def usage(self) -> dict[str, int]:
        """The compaction's own billed tokens, summed over its ``compaction`` iterations."""
        total = {
            "input_tokens": 0,
            "output_tokens": 0,
            "cache_read_input_tokens": 0,
            "cache_creation_input_tokens": 0,
        }
        for item in self.iterations:
            if item.get("type") != "compaction":
                continue
            for key in total:
                value = item.get(key)
                if isinstance(value, int) and not isinstance(value, bool):
                    total[key] += value
        return total


def async_client(resource: Any) -> bool:
    """Whether an SDK resource (``client.beta.messages``, ``client.responses``) belongs to
    an async client (``AsyncAnthropic``, ``AsyncOpenAI``)."""
    return type(resource).__name__.startswith("Async") or inspect.iscoroutinefunction(
        getattr(resource, "create", None)
    )


def is_async_compactor(compactor: Any) -> bool:
    """Whether a compactor is awaited (a compactor over an async client, or one whose
    call is a coroutine function)."""
    if getattr(compactor, "asynchronous", False) is True:
        return True
    call = getattr(compactor, "__call__", None)  # noqa: B004 - the method itself is inspected
    return inspect.iscoroutinefunction(compactor) or inspect.iscoroutinefunction(call)


def error_kind(exc: Exception, overloaded: frozenset[int] = frozenset({529})) -> str:
    """The typed error of an SDK exception: its body's ``error.code`` (OpenAI) or
    ``error.type`` (Anthropic), ``compaction_unavailable`` for an overloaded status
    (``overloaded``), else ``error``."""
    body = getattr(exc, "body", None)
    status = getattr(exc, "status_code", None)
    if isinstance(body, Mapping):
        error = body.get("error") if isinstance(body.get("error"), Mapping) else body
        if isinstance(error, Mapping):
            for key in ("code", "type"):
                kind = error.get(key)
                if isinstance(kind, str) and kind:
                    if status in overloaded and kind in ("overloaded_error", "server_error"):
                        return "compaction_unavailable"
                    return kind
    if status in overloaded:
        return "compaction_unavailable"
    return "error"


def error_message(exc: Exception) -> str:
    """The provider's message of an SDK exception, else the exception itself."""
    body = getattr(exc, "body", None)
    if isinstance(body, Mapping):
        error = body.get("error") if isinstance(body.get("error"), Mapping) else body
        message = error.get("message") if isinstance(error, Mapping) else None
        if isinstance(message, str):
            return message
    return f"{type(exc).__name__}: {exc}"


def _failed(exc: Exception, overloaded: frozenset[int]) -> tuple[str, ProviderCompactionError]:
    kind = error_kind(exc, overloaded)
    return kind, ProviderCompactionError(kind, f"{kind}: {error_message(exc)}")


def with_retries(
    call: Callable[[], Any],
    *,
    retries: int,
    backoff: float,
    sleep: Callable[[float], None],
    overloaded: frozenset[int] = frozenset({529}),
) -> tuple[Any, int]:
    """(what ``call`` returned, the attempts it took): an overloaded service is retried
    ``retries`` times, waiting ``backoff`` seconds doubled each time; any other error, or
    the last overload, raises ProviderCompactionError."""
    attempt = 0
    while True:
        attempt += 1
        try:
            return call(), attempt
        except Exception as exc:
            kind, error = _failed(exc, overloaded)
            if kind in RETRIED and attempt <= retries:
                sleep(backoff * 2 ** (attempt - 1))
                continue
            raise error from exc


async def with_retries_async(
    call: Callable[[], Awaitable[Any]],
    *,
    retries: int,
    backoff: float,
    overloaded: frozenset[int] = frozenset({529}),
) -> tuple[Any, int]:
    """:func:`with_retries` for an async client (waits with ``asyncio.sleep``)."""
    attempt = 0
    while True:
        attempt += 1
        try:
            return await call(), attempt
        except Exception as exc:
            kind, error = _failed(exc, overloaded)
            if kind in RETRIED and attempt <= retries:
                await asyncio.sleep(backoff * 2 ** (attempt - 1))
                continue
            raise error from exc


def provider_key(message: Mapping[str, Any]) -> str | None:
    """What names a provider compaction object uniquely: an OpenAI item's id (else its
    encrypted content), an Anthropic block's signature (else its opaque content)."""
    content = message.get("content")
    obj = content[0] if isinstance(content, list) and content else message
    if not isinstance(obj, Mapping):
        return None
    for key in ("id", "signature", "encrypted_content"):
        value = obj.get(key)
        if isinstance(value, str) and value:
            return value
    return None


def check_provided(connection: Connection, session_id: str, message: Mapping[str, Any]) -> None:
    """Refuse a provider compaction object another session already recorded, or this one
    holds in a live boundary: a compaction is of one conversation, once.

    Raises:
        InvalidMessageError: naming the session that holds it (nothing is stored).
    """
    key = provider_key(message)
    if key is None:
        return
    for owner, boundary_id, rolled_back in boundaries_holding(connection, key):
        if owner != session_id:
            raise InvalidMessageError(
                f"the provider's compaction object is session {owner!r}'s (boundary "
                f"{boundary_id}): a compaction of another session is not recorded here"
            )
        if rolled_back is None:
            raise InvalidMessageError(
                f"the provider's compaction object is already this session's boundary "
                f"{boundary_id}: a second copy is not recorded"
            )
