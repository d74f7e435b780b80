"""Provider compaction: the provider writes the summary of a range, compactstore keeps it as
a boundary.

:class:`AnthropicCompactor` asks the Messages API for on-demand compaction (beta
``compact-2026-09-04``): a request whose top-level ``compaction: {"type": "summarize"}``
makes the API summarise the messages sent and answer with one signed ``compaction`` block
(``stop_reason: "compaction"``), billed in ``usage.iterations``. Later requests send that
block first, unchanged, in place of the messages it summarised.

Set it like a summarizer (``store.session(..., compactor=)`` or
``CompactStore.open(..., compactor=)``): when auto-compact or ``compact()`` cuts, the store
chooses the cut as for a full compact and the compactor summarises the range, outside every
transaction, under the session's lease, within ``summarizer_timeout_seconds``. A 529 is
retried with backoff; a typed failure, any other error or a timeout falls back to the
client summary (the summarizer's, else the rule-based one) and the compaction records why.
"""

from __future__ import annotations

import inspect
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from compactstore.capabilities import BINDING_BETA, COMPACTION_BETA
from compactstore.errors import InvalidInputError, InvalidMessageError

__all__ = [
    "COMPACTION_BETA",
    "AnthropicCompactor",
    "ProviderCompaction",
    "ProviderCompactionError",
    "compaction_block",
    "compaction_text",
    "refuses_provider_object",
    "split_compaction",
]

# The fields a compaction block may carry (the SDK's BetaCompactionBlockParam).
_BLOCK_FIELDS = frozenset(
    {"type", "content", "encrypted_content", "signature", "tool_changes", "cache_control"}
)


class ProviderCompactionError(Exception):
    """The provider did not compact: ``kind`` is its typed error (e.g.
    ``compaction_nothing_to_summarize``, ``compaction_unavailable``) or ``failed`` (a
    documented failure: no block), ``error`` (any other error)."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class ProviderCompaction:
    """What a provider compaction gave: ``message`` (the message that stands for the range
    on the wire, its block exactly as returned), the block's readable ``text`` (None when
    opaque), the ``model``, the billed ``iterations`` (``usage.iterations``, as returned)
    and how many attempts it took."""

    message: dict[str, Any]
    text: str | None
    model: str
    iterations: list[dict[str, Any]] = field(default_factory=list)
    attempts: int = 1
    provider: str = "anthropic"

    @property
    def block(self) -> dict[str, Any]:
        block = compaction_block(self.message)
        assert block is not None
        return block

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


def compaction_block(message: Mapping[str, Any]) -> dict[str, Any] | None:
    """The compaction block a message starts with (an Anthropic message whose first content
    block has type ``compaction``), else None."""
    content = message.get("content")
    if not isinstance(content, list) or not content:
        return None
    first = content[0]
    if isinstance(first, dict) and first.get("type") == "compaction":
        return first
    return None


# Error types with which a provider refuses a compaction object it issued earlier.
_REFUSALS = ("compaction_signature_invalid", "invalid_encrypted_content")


def refuses_provider_object(error: str) -> bool:
    """Whether an API error text refuses a provider compaction object sent back (its
    signature no longer verifies, or the model cannot read it)."""
    return any(kind in error for kind in _REFUSALS)


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
    block = blocks[0]
    returned = getattr(response, "content", None)
    if isinstance(returned, list) and returned:
        first_block = returned[0]
        dump = getattr(first_block, "model_dump", None)
        whole = dump(mode="json", exclude_none=True) if callable(dump) else first_block
        if isinstance(whole, dict) and whole.get("type") == "compaction":
            block = whole
    block = check_block(block, "the reply's compaction block")
    if block.get("content") is None and block.get("encrypted_content") is None:
        raise InvalidMessageError("the reply's compaction block has no content (a failure)")
    rest = {**first, "content": blocks[1:]}
    turn = ([rest] if rest["content"] else []) + messages[1:]
    return {"role": "assistant", "content": [block]}, turn


def compaction_text(message: dict[str, Any]) -> str:
    """The readable summary of a provider's compaction message (a note when opaque)."""
    block = compaction_block(message) or {}
    text = block.get("content")
    if isinstance(text, str) and text:
        return text
    return "[compaction by the provider: opaque block, no readable summary]"


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
    """On-demand compaction through the official sync client (``anthropic.Anthropic``), on
    :class:`~compactstore.CompactStore` and :class:`~compactstore.AsyncCompactStore` alike
    (the compaction runs in the store's worker threads, never on the event loop).

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
        sleep: how to wait between retries (tests pass a no-op).
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
        messages = beta.messages
        if inspect.iscoroutinefunction(getattr(messages, "create", None)) or type(
            messages
        ).__name__.startswith("Async"):
            raise InvalidInputError(
                "AnthropicCompactor takes the sync client (anthropic.Anthropic), on either "
                "store: the compaction runs in the store's worker threads"
            )
        if instructions is not None and not isinstance(instructions, str):
            raise InvalidInputError(f"instructions must be a string, got {instructions!r}")
        self.client = client
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
        attempt = 0
        while True:
            attempt += 1
            try:
                raw = self.client.beta.messages.with_raw_response.create(**options)
            except Exception as exc:
                kind = _error_kind(exc)
                if kind == "compaction_unavailable" and attempt <= self.retries:
                    self.sleep(self.backoff * 2 ** (attempt - 1))
                    continue
                raise ProviderCompactionError(kind, f"{kind}: {_error_message(exc)}") from exc
            break
        return _answer(raw, use, attempt)


def _answer(raw: Any, model: str, attempts: int) -> ProviderCompaction:
    """The compaction the raw response holds: its JSON as sent (the block verbatim)."""
    try:
        body = json.loads(raw.http_response.text)
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
    usage = body.get("usage") if isinstance(body.get("usage"), dict) else {}
    iterations = [dict(i) for i in usage.get("iterations") or [] if isinstance(i, dict)]
    return ProviderCompaction(
        message={"role": "assistant", "content": [block]},
        text=block.get("content"),
        model=str(body.get("model") or model),
        iterations=iterations,
        attempts=attempts,
    )


def _error_kind(exc: Exception) -> str:
    """The typed error of an SDK exception (``error.type`` of its body), else ``error``."""
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        error = body.get("error") if isinstance(body.get("error"), dict) else body
        kind = error.get("type") if isinstance(error, dict) else None
        if isinstance(kind, str) and kind:
            if getattr(exc, "status_code", None) == 529 and kind == "overloaded_error":
                return "compaction_unavailable"
            return kind
    if getattr(exc, "status_code", None) == 529:
        return "compaction_unavailable"
    return "error"


def _error_message(exc: Exception) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        error = body.get("error") if isinstance(body.get("error"), dict) else body
        message = error.get("message") if isinstance(error, dict) else None
        if isinstance(message, str):
            return message
    return f"{type(exc).__name__}: {exc}"
