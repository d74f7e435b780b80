"""OpenAI Responses compaction: :class:`OpenAICompactor` (``responses.compact``) and the
``compaction`` item a response carries when the server compacted on its own
(``context_management: [{"type": "compaction", "compact_threshold": N}]``).

A compaction item is opaque (``encrypted_content``): the boundary keeps it verbatim as its
summary message and sends it in place of the items it replaced; its readable summary is a
note naming it plus the rule-based summary of the same range. The public names are
re-exported by :mod:`compactstore.providers`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any

from compactstore._core.provider_compaction import (
    ProviderCompaction,
    ProviderCompactionError,
    async_client,
    with_retries,
    with_retries_async,
)
from compactstore.errors import InvalidInputError, InvalidMessageError

__all__ = [
    "OpenAICompactor",
    "check_item",
    "compacted",
    "compaction_iterations",
    "split_responses_compaction",
]

# The fields a compaction item may carry (the SDK's ResponseCompactionItem: ``created_by``
# is output-only, kept because output items are sent back as they came).
_ITEM_FIELDS = frozenset({"type", "id", "encrypted_content", "created_by"})
# The statuses with which the Responses API says it is overloaded: retried first.
_OVERLOADED = frozenset({503, 529})


def check_item(item: Any, where: str = "compaction item") -> dict[str, Any]:
    """A compaction item as the API returns it, or InvalidMessageError naming what is
    wrong (a malformed item never becomes a boundary)."""
    if not isinstance(item, Mapping) or item.get("type") != "compaction":
        raise InvalidMessageError(f"{where}: not a compaction item: {item!r:.200}")
    unknown = sorted(set(item) - _ITEM_FIELDS)
    if unknown:
        raise InvalidMessageError(f"{where}: unknown field(s) {', '.join(unknown)}")
    opaque = item.get("encrypted_content")
    if not isinstance(opaque, str) or not opaque:
        raise InvalidMessageError(f"{where}: encrypted_content must be a non-empty string")
    for key in ("id", "created_by"):
        value = item.get(key)
        if value is not None and (not isinstance(value, str) or not value):
            raise InvalidMessageError(f"{where}: {key} must be a non-empty string or null")
    return dict(item)


def split_responses_compaction(
    items: list[dict[str, Any]], response: Any = None
) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """(the compaction item a response's output starts with, the output without it).
    ``response`` is the SDK object: the item is taken from it whole, as returned.

    Raises:
        InvalidMessageError: a malformed item, a second one, or one that is not the
            response's first output item (nothing is stored).
    """
    found = [i for i, item in enumerate(items) if item.get("type") == "compaction"]
    if not found:
        return None, items
    if found != [0]:
        raise InvalidMessageError(
            "the response holds a compaction item that is not its first output item, or "
            "more than one: a server-side compaction is one item, first in the output"
        )
    item = items[0]
    output = getattr(response, "output", None)
    if isinstance(output, list) and output:
        dump = getattr(output[0], "model_dump", None)
        whole = dump(mode="json", exclude_none=True) if callable(dump) else output[0]
        if isinstance(whole, dict) and whole.get("type") == "compaction":
            item = whole
    return check_item(item, "the response's compaction item"), items[1:]


def compaction_iterations(usage: Any) -> list[dict[str, Any]]:
    """A compaction's ``usage`` (Responses shape) as one ``compaction`` iteration of the
    shape the ledger bills: uncached input, cache reads, output."""
    if not isinstance(usage, Mapping):
        return []
    details = usage.get("input_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, Mapping) else 0
    counts = [usage.get("input_tokens"), cached, usage.get("output_tokens")]
    whole = [n for n in counts if isinstance(n, int) and not isinstance(n, bool) and n >= 0]
    if len(whole) != len(counts):
        return []
    total, read, out = whole
    return [
        {
            "type": "compaction",
            "input_tokens": max(0, total - read),
            "cache_read_input_tokens": min(read, total),
            "cache_creation_input_tokens": 0,
            "output_tokens": out,
        }
    ]


class OpenAICompactor:
    """Compaction through the Responses API's ``responses.compact``, with the official
    client: the sync ``openai.OpenAI`` (on either store: the compaction runs in the store's
    worker threads) or the async ``openai.AsyncOpenAI`` (on
    :class:`~compactstore.AsyncCompactStore`: awaited on its event loop).

    The store sends the range it cut (an earlier compaction item first when there is one);
    the answer's ``compaction`` item stands for it on the wire, verbatim, in its place.
    The endpoint takes no summarisation prompt: ``compact()``'s instructions are recorded
    with the compaction, not sent.

    Args:
        client: the SDK client; ``client.responses.compact`` is called.
        model: the model to compact with (required: the item is bound to its model).
        retries: how many times an overloaded service (503, 529) is retried.
        backoff: seconds before the first retry, doubled for each next one.
        sleep: how a sync client waits between retries (tests pass a no-op); an async
            client waits with ``asyncio.sleep``.
    """

    name = "openai_compaction"
    provider = "openai"

    def __init__(
        self,
        client: Any,
        *,
        model: str,
        retries: int = 2,
        backoff: float = 1.0,
        sleep: Callable[[float], None] = time.sleep,
    ):
        responses = getattr(client, "responses", None)
        if responses is None or not hasattr(responses, "compact"):
            raise InvalidInputError(
                f"OpenAICompactor needs an openai client with the Responses API "
                f"(client.responses.compact), got {type(client).__name__}"
            )
        if not isinstance(model, str) or not model:
            raise InvalidInputError(f"model must be a model id, got {model!r}")
        self.client = client
        self.asynchronous = async_client(responses)
        self.model = model
        self.retries = retries
        self.backoff = backoff
        self.sleep = sleep

    def _options(self, messages: list[dict[str, Any]], system: Any) -> dict[str, Any]:
        options: dict[str, Any] = {"model": self.model, "input": messages}
        if isinstance(system, str) and system:
            options["instructions"] = system
        return options

    def __call__(
        self,
        messages: list[dict[str, Any]],
        *,
        model: str | None = None,
        system: Any = None,
        instructions: str | None = None,
        drop_block: bool = False,
    ) -> ProviderCompaction:
        """Compact ``messages`` (items as sent on the wire). Raises
        ProviderCompactionError when the provider did not."""
        if self.asynchronous:
            raise ProviderCompactionError(
                "error", "an async client's compactor is awaited: use AsyncCompactStore"
            )
        options = self._options(messages, system)
        raw, attempts = with_retries(
            lambda: self.client.responses.with_raw_response.compact(**options),
            retries=self.retries,
            backoff=self.backoff,
            sleep=self.sleep,
            overloaded=_OVERLOADED,
        )
        return compacted(raw.http_response.text, self.model, attempts)

    async def acompact(
        self,
        messages: list[dict[str, Any]],
        *,
        model: str | None = None,
        system: Any = None,
        instructions: str | None = None,
        drop_block: bool = False,
    ) -> ProviderCompaction:
        """:meth:`__call__` with the async client."""
        options = self._options(messages, system)
        compact = self.client.responses.with_raw_response.compact
        raw, attempts = await with_retries_async(
            lambda: compact(**options),
            retries=self.retries,
            backoff=self.backoff,
            overloaded=_OVERLOADED,
        )
        return compacted(raw.http_response.text, self.model, attempts)


def compacted(raw: str, model: str, attempts: int) -> ProviderCompaction:
    """The compaction a ``responses.compact`` answer holds (its JSON as sent): the new
    window is the retained items and one ``compaction`` item, last; the item is kept
    verbatim."""
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise ProviderCompactionError("error", f"the response is not JSON: {exc}") from exc
    output = body.get("output") if isinstance(body, dict) else None
    if not isinstance(output, list):
        raise ProviderCompactionError("failed", "the provider returned no output")
    found = [
        i
        for i, item in enumerate(output)
        if isinstance(item, dict) and item.get("type") == "compaction"
    ]
    if len(found) != 1 or found[0] != len(output) - 1:
        raise ProviderCompactionError(
            "failed" if not found else "error",
            f"the provider returned {len(found)} compaction items, not one last item",
        )
    try:
        item = check_item(output[-1], "the provider's compaction item")
    except InvalidMessageError as exc:
        raise ProviderCompactionError("error", str(exc)) from exc
    creator = item.get("created_by")
    return ProviderCompaction(
        message=item,
        text=None,
        model=str(body.get("model") or model),
        iterations=compaction_iterations(body.get("usage")),
        attempts=attempts,
        provider="openai",
        created_by=creator if isinstance(creator, str) else None,
    )
