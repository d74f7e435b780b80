"""Provider compaction: the provider writes the summary of a range, compactstore keeps it as
a boundary.

:class:`AnthropicCompactor` asks the Messages API for on-demand compaction (beta
``compact-2026-09-04``): a request whose top-level ``compaction: {"type": "summarize"}``
makes the API summarise the messages sent and answer with one signed ``compaction`` block
(``stop_reason: "compaction"``), billed in ``usage.iterations``. Later requests send that
block first, unchanged, in place of the messages it summarised.

:class:`OpenAICompactor` asks the Responses API's ``responses.compact``: the answer's
opaque ``compaction`` item stands for the range on the wire, in its place, unchanged. A
Responses reply whose output starts with a ``compaction`` item (server-side compaction), like
an Anthropic reply starting with a threshold compaction block, is recorded by
``append_response`` as a boundary (strategy ``provider``, trigger ``server``).

Set a compactor like a summarizer (``store.session(..., compactor=)`` or
``CompactStore.open(..., compactor=)``): when auto-compact or ``compact()`` cuts, the store
chooses the cut as for a full compact and the compactor summarises the range, outside every
transaction, under the session's lease, within ``summarizer_timeout_seconds``. An
overloaded service (529; 503 for OpenAI) is retried with backoff; a typed failure, any
other error or a timeout falls back to the client summary (the summarizer's, else the
rule-based one) and the compaction records why. Both take the sync client on either store,
or the async client on :class:`~compactstore.AsyncCompactStore`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from compactstore._core.openai_compactor import OpenAICompactor, split_responses_compaction
from compactstore._core.provider_compaction import (
    ProviderCompaction,
    ProviderCompactionError,
    async_client,
    check_provided,
    with_retries,
    with_retries_async,
)
from compactstore.capabilities import BINDING_BETA, COMPACTION_BETA
from compactstore.errors import InvalidInputError, InvalidMessageError
from compactstore.formats.compaction import (
    compaction_block,
    compaction_text,
    provided_note,
    provided_text,
)

__all__ = [
    "COMPACTION_BETA",
    "AnthropicCompactor",
    "OpenAICompactor",
    "ProviderCompaction",
    "ProviderCompactionError",
    "check_provided",
    "compaction_block",
    "compaction_text",
    "provided_note",
    "provided_text",
    "refuses_provider_object",
    "split_compaction",
    "split_provided",
    "split_responses_compaction",
]

# The fields a compaction block may carry (the SDK's BetaCompactionBlockParam).
_BLOCK_FIELDS = frozenset(
    {"type", "content", "encrypted_content", "signature", "tool_changes", "cache_control"}
)


# Error types with which a provider refuses a compaction object it issued earlier.
_REFUSALS = ("compaction_signature_invalid", "invalid_encrypted_content")


def refuses_provider_object(error: str) -> bool:
    """Whether an API error text refuses a provider compaction object sent back (its
    signature no longer verifies, or the model cannot read it)."""
    if any(kind in error for kind in _REFUSALS):
        return True
    # The Responses API's message for invalid_encrypted_content, which the SDK's exception
    # text carries without the code: "The encrypted content ... could not be verified."
    lowered = error.lower()
    return "encrypted content" in lowered and "could not be verified" in lowered


def split_compaction(
    messages: list[dict[str, Any]], response: Any = None
) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """(the message a reply's compaction block stands in, the reply's messages without it).
    ``response`` is the SDK object: its block is taken from it whole (the request
    projection of an SDK that does not know the block type would lose its fields).

    Raises:
        InvalidMessageError: a malformed block, a second one, or one that is not the
            reply's first block (nothing is stored).
    """
    first = messages[0]
    content = first.get("content")
    blocks = [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []
    found = [i for i, b in enumerate(blocks) if b.get("type") == "compaction"]
    if not found:
        return None, messages
    if found != [0] or any(
        isinstance(m.get("content"), list)
        and any(isinstance(b, dict) and b.get("type") == "compaction" for b in m["content"])
        for m in messages[1:]
    ):
        raise InvalidMessageError(
            "the reply holds a compaction block that is not its first block, or more than "
            "one: a provider compaction is one block, first in the reply"
        )
    block = check_block(_returned_block(response) or blocks[0], "the reply's compaction block")
    if block.get("content") is None and block.get("encrypted_content") is None:
        raise InvalidMessageError("the reply's compaction block has no content (a failure)")
    rest = {**first, "content": blocks[1:]}
    turn = ([rest] if rest["content"] else []) + messages[1:]
    return {"role": "assistant", "content": [block]}, turn


def _returned_block(response: Any) -> dict[str, Any] | None:
    """The compaction block an SDK reply starts with, whole (every field as returned)."""
    returned = getattr(response, "content", None)
    if not isinstance(returned, list) or not returned:
        return None
    first_block = returned[0]
    dump = getattr(first_block, "model_dump", None)
    whole = dump(mode="json", exclude_none=True) if callable(dump) else first_block
    return whole if isinstance(whole, dict) and whole.get("type") == "compaction" else None


def split_provided(
    format_name: str, messages: list[dict[str, Any]], response: Any = None
) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """(the compaction a provider's response starts with, the rest to store as the turn):
    an Anthropic reply's threshold compaction block (:func:`split_compaction`), a Responses
    output's server-side compaction item (:func:`split_responses_compaction`); (None,
    ``messages``) for other formats or none.

    Raises:
        InvalidMessageError: a malformed block or item, a second one, or one out of place.
    """
    if not messages:
        return None, messages
    if format_name == "anthropic":
        return split_compaction(messages, response)
    if format_name == "responses":
        return split_responses_compaction(messages, response)
    return None, messages


def check_block(block: Any, where: str = "compaction block") -> dict[str, Any]:
    """A compaction block as the API returns it, or InvalidMessageError naming what is wrong
    (a malformed block never becomes a boundary)."""
    if not isinstance(block, dict) or block.get("type") != "compaction":
        raise InvalidMessageError(f"{where}: not a compaction block: {block!r:.200}")
    unknown = sorted(set(block) - _BLOCK_FIELDS)
    if unknown:
        raise InvalidMessageError(f"{where}: unknown field(s) {', '.join(unknown)}")
    content, opaque = block.get("content"), block.get("encrypted_content")
    if content is not None and (not isinstance(content, str) or not content):
        raise InvalidMessageError(f"{where}: content must be a non-empty string or null")
    if opaque is not None and not isinstance(opaque, str):
        raise InvalidMessageError(f"{where}: encrypted_content must be a string or null")
    signature = block.get("signature")
    if content is not None and (not isinstance(signature, str) or not signature):
        raise InvalidMessageError(f"{where}: a compaction block with content needs its signature")
    return block


class AnthropicCompactor:
    """On-demand compaction through the official client: the sync ``anthropic.Anthropic``
    (on either store: the compaction runs in the store's worker threads) or the async
    ``anthropic.AsyncAnthropic`` (on :class:`~compactstore.AsyncCompactStore`: awaited on
    its event loop).

    Args:
        client: the SDK client; ``client.beta.messages`` is called.
        instructions: replace the provider's summarisation prompt (``compact()``'s own
            instructions are appended to them).
        model: the model to compact with; by default the session's model.
        tools: the tool definitions the conversation's requests send (a request holding
            ``tool_use`` blocks needs them, and the block is bound to them).
        max_tokens: the compaction request's ``max_tokens``.
        retries: how many times a 529 ``compaction_unavailable`` is retried.
        backoff: seconds before the first retry, doubled for each next one.
        sleep: how a sync client waits between retries (tests pass a no-op); an async
            client waits with ``asyncio.sleep``.
    """

    name = "anthropic_compaction"
    provider = "anthropic"

    def __init__(
        self,
        client: Any,
        instructions: str | None = None,
        *,
        model: str | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        max_tokens: int = 4_096,
        retries: int = 2,
        backoff: float = 1.0,
        sleep: Callable[[float], None] = time.sleep,
    ):
        beta = getattr(client, "beta", None)
        if beta is None or not hasattr(beta, "messages"):
            raise InvalidInputError(
                f"AnthropicCompactor needs an anthropic client (client.beta.messages), got "
                f"{type(client).__name__}"
            )
        if instructions is not None and not isinstance(instructions, str):
            raise InvalidInputError(f"instructions must be a string, got {instructions!r}")
        self.client = client
        # An async client is awaited on the async store's event loop.
        self.asynchronous = async_client(beta.messages)
        self.instructions = instructions
        self.model = model
        self.tools = [dict(tool) for tool in tools] if tools is not None else None
        self.max_tokens = max_tokens
        self.retries = retries
        self.backoff = backoff
        self.sleep = sleep

    def __call__(
        self,
        messages: list[dict[str, Any]],
        *,
        model: str | None,
        system: Any = None,
        instructions: str | None = None,
        drop_block: bool = False,
    ) -> ProviderCompaction:
        """Summarise ``messages`` (the range, as sent on the wire: an earlier block first
        when there is one). ``drop_block``: the session's requests carry the thinking
        binding ``prefix_mismatch_behavior: "drop_block"``, and so does this one. Raises
        ProviderCompactionError when the provider did not."""
        if self.asynchronous:
            raise ProviderCompactionError(
                "error", "an async client's compactor is awaited: use AsyncCompactStore"
            )
        options, use = self._options(messages, model, system, instructions, drop_block)
        raw, attempts = with_retries(
            lambda: self.client.beta.messages.with_raw_response.create(**options),
            retries=self.retries,
            backoff=self.backoff,
            sleep=self.sleep,
        )
        return _answer(raw.http_response.text, use, attempts)

    async def acompact(
        self,
        messages: list[dict[str, Any]],
        *,
        model: str | None,
        system: Any = None,
        instructions: str | None = None,
        drop_block: bool = False,
    ) -> ProviderCompaction:
        """:meth:`__call__` with the async client."""
        options, use = self._options(messages, model, system, instructions, drop_block)
        create = self.client.beta.messages.with_raw_response.create
        raw, attempts = await with_retries_async(
            lambda: create(**options), retries=self.retries, backoff=self.backoff
        )
        return _answer(raw.http_response.text, use, attempts)

    def _options(
        self,
        messages: list[dict[str, Any]],
        model: str | None,
        system: Any,
        instructions: str | None,
        drop_block: bool,
    ) -> tuple[dict[str, Any], str]:
        """The compaction request's keyword arguments, and the model it asks."""
        use = self.model or model
        if not use:
            raise ProviderCompactionError(
                "error", "no model: pass model= or set the session's model"
            )
        prompt = "\n\n".join(p for p in (self.instructions, instructions) if p and p.strip())
        compaction: dict[str, Any] = {"type": "summarize"}
        if prompt:
            compaction["instructions"] = prompt
        options: dict[str, Any] = {
            "model": use,
            "max_tokens": self.max_tokens,
            "messages": messages,
            "compaction": compaction,
            "betas": [COMPACTION_BETA],
        }
        if system:
            options["system"] = system
        if self.tools is not None:
            options["tools"] = self.tools
        if drop_block:
            binding = {"prefix_mismatch_behavior": "drop_block"}
            options["thinking"] = {"type": "adaptive", "block_binding": binding}
            options["betas"] = [COMPACTION_BETA, BINDING_BETA]
        return options, use


def _answer(raw: str, model: str, attempts: int) -> ProviderCompaction:
    """The compaction the raw response holds: its JSON as sent (the block verbatim)."""
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise ProviderCompactionError("error", f"the response is not JSON: {exc}") from exc
    content = body.get("content") if isinstance(body, dict) else None
    stop = body.get("stop_reason") if isinstance(body, dict) else None
    blocks = [b for b in content or [] if isinstance(b, dict) and b.get("type") == "compaction"]
    if stop != "compaction" or not blocks:
        raise ProviderCompactionError(
            "failed", f"the provider returned no compaction (stop_reason {stop!r})"
        )
    if len(blocks) != 1 or len(content or []) != 1:
        raise ProviderCompactionError(
            "error", f"the provider returned {len(content or [])} blocks, not one compaction block"
        )
    try:
        block = check_block(blocks[0])
    except InvalidMessageError as exc:
        raise ProviderCompactionError("error", str(exc)) from exc
    if block.get("content") is None:
        raise ProviderCompactionError("failed", "the compaction block has no content")
    return ProviderCompaction(
        message={"role": "assistant", "content": [block]},
        text=block.get("content"),
        model=str(body.get("model") or model),
        iterations=_iterations(body),
        attempts=attempts,
    )


def _iterations(body: dict[str, Any]) -> list[dict[str, Any]]:
    """A reply's ``usage.iterations``, as returned."""
    usage = body.get("usage")
    found = usage.get("iterations") if isinstance(usage, dict) else None
    return [dict(i) for i in found or [] if isinstance(i, dict)]
