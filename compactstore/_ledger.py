"""The cost and cache ledger: what each model call was billed for, and what a session cost.

A model call's usage (:class:`CallUsage`) splits its prompt the way providers bill it:
uncached input, cache reads, cache writes kept for the provider's short lifetime
(``cache_write_5m_tokens``: Anthropic 5 minutes, OpenAI 30 minutes) or its long one
(``cache_write_1h_tokens``: 1 hour, 12 hours), and output; with the model, the provider's
``iterations`` and, when the response reports them, why the cache missed and what the API
changed in the input. ``model_calls`` stores one row per call with its cost
(:mod:`compactstore.pricing`); :class:`SessionCost` is a session's sum.

The readers here turn what each provider reports into a :class:`CallUsage`:

- an Anthropic ``Message`` (or a Claude Code record's ``message.usage``): ``input_tokens``
  is already uncached; ``cache_creation`` splits ``cache_creation_input_tokens`` into 5-minute
  and 1-hour writes (all of it is a 5-minute write when the split is missing);
  ``usage.iterations``, ``input_transformations`` and ``diagnostics.cache_miss_reason`` are
  kept as reported;
- an OpenAI ``ChatCompletion``: ``prompt_tokens`` includes ``prompt_tokens_details.
  cached_tokens`` and ``cache_write_tokens``; the rest is uncached input;
- a Responses ``Response``: ``input_tokens`` includes ``input_tokens_details.cached_tokens``
  and ``cache_write_tokens`` (split into 30-minute and 12-hour writes when
  ``cache_write_tokens_details`` says); ``input_transformations`` and
  ``prompt_cache_diagnostics`` are kept as reported;
- a Codex ``token_count`` event's ``last_token_usage``: ``input_tokens`` includes
  ``cached_input_tokens``.

Token counts must be whole numbers >= 0; a usage object of another provider's shape is
refused (:class:`~compactstore.errors.InvalidInputError`), before anything is stored.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError

from compactstore.errors import InvalidInputError
from compactstore.pricing import PriceTable, call_cost

__all__ = [
    "CacheRewrite",
    "CallUsage",
    "LedgerTotals",
    "SessionCost",
    "TokenCounts",
    "call_usage",
    "claude_code_usage",
    "codex_usage",
    "response_usage",
    "usage_cost",
]

_Tokens = Annotated[StrictInt, Field(ge=0)]


class TokenCounts(BaseModel):
    """Prompt and output tokens by the kind they are billed as: one call's, or a sum."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    input_tokens: _Tokens = 0  # uncached input: neither read from nor written to the cache
    cache_read_tokens: _Tokens = 0
    cache_write_5m_tokens: _Tokens = 0  # the provider's short-lived cache write
    cache_write_1h_tokens: _Tokens = 0  # the long-lived cache write
    output_tokens: _Tokens = 0

    @property
    def cache_write_tokens(self) -> int:
        return self.cache_write_5m_tokens + self.cache_write_1h_tokens

    @property
    def prompt_tokens(self) -> int:
        """The whole prompt: input, cache reads and cache writes."""
        return self.input_tokens + self.cache_read_tokens + self.cache_write_tokens

    @property
    def cache_read_share(self) -> float | None:
        """The share of the prompt read from the cache; None for no prompt."""
        total = self.prompt_tokens
        return self.cache_read_tokens / total if total else None

    def tokens_json(self) -> dict[str, int]:
        """The counts as ``compactstore cost --json`` and ``stats --json`` give them."""
        return {
            "input": self.input_tokens,
            "cache_read": self.cache_read_tokens,
            "cache_write_5m": self.cache_write_5m_tokens,
            "cache_write_1h": self.cache_write_1h_tokens,
            "output": self.output_tokens,
        }


class CallUsage(TokenCounts):
    """What one model call was billed for (see the module docstring)."""

    model: str | None = None
    # As the provider reported them (JSON-ready), when it did.
    iterations: list[dict[str, Any]] | None = None
    cache_miss_reason: dict[str, Any] | None = None
    input_transformations: list[dict[str, Any]] | None = None


class CacheRewrite(BaseModel):
    """The cache a compaction made the provider write again: the cache-write tokens of the
    first model call after it (see :meth:`compactstore.Session.cost`)."""

    model_config = ConfigDict(frozen=True)

    compaction_id: int
    call_seq: int  # the newest seq of the log when that call was made
    cache_write_5m_tokens: int
    cache_write_1h_tokens: int
    tokens: int  # both kinds of write
    cost_usd: float | None  # the price of those writes; None when the model has no price


class LedgerTotals(TokenCounts):
    """The sums of model calls' ledger rows: a session's, or a whole store's."""

    calls: int = 0
    # Calls recorded with a prompt size only (before the ledger had its columns).
    calls_without_usage: int = 0
    # Calls whose cost is unknown: no model given, a model the price table does not have,
    # or no usage split; their tokens are in the totals, their cost is not.
    unpriced_calls: int = 0
    # The sum over the priced calls; None when no call has a cost.
    cost_usd: float | None = None


class SessionCost(LedgerTotals):
    """What a session's model calls cost, summed from ``model_calls``."""

    session_id: str
    cache_rewrites: list[CacheRewrite] = Field(default_factory=list)

    @property
    def cache_rewrite_tokens(self) -> int:
        """Tokens the session's compactions made the cache write again."""
        return sum(r.tokens for r in self.cache_rewrites)

    @property
    def cache_rewrite_cost_usd(self) -> float | None:
        """Their price (the priced ones); None when none is priced."""
        costs = [r.cost_usd for r in self.cache_rewrites if r.cost_usd is not None]
        return sum(costs) if costs else None

    def as_json(self) -> dict[str, Any]:
        """The documented JSON shape of ``compactstore cost --json``."""
        return {
            "session": self.session_id,
            "calls": self.calls,
            "calls_without_usage": self.calls_without_usage,
            "unpriced_calls": self.unpriced_calls,
            "tokens": self.tokens_json(),
            "cost_usd": self.cost_usd,
            "cache_rewrite": {
                "tokens": self.cache_rewrite_tokens,
                "cost_usd": self.cache_rewrite_cost_usd,
                "compactions": [r.model_dump(mode="json") for r in self.cache_rewrites],
            },
        }


def call_usage(**fields: Any) -> CallUsage:
    """A :class:`CallUsage` from keyword fields.

    Raises:
        InvalidInputError: a token count that is not a whole number >= 0, a field that is
            not one of CallUsage's, or JSON fields of the wrong shape.
    """
    try:
        usage = CallUsage(**fields)
    except ValidationError as exc:
        raise InvalidInputError(f"usage: {_problems(exc)}") from None
    for name in ("iterations", "cache_miss_reason", "input_transformations"):
        try:
            json.dumps(getattr(usage, name))
        except (TypeError, ValueError) as exc:
            raise InvalidInputError(f"usage: {name} is not JSON data ({exc})") from None
    return usage


def _problems(exc: ValidationError) -> str:
    found = []
    for error in exc.errors():
        where = ".".join(str(p) for p in error["loc"]) or "usage"
        if error["type"] == "extra_forbidden":
            found.append(f"unknown field {where!r}")
        else:
            found.append(f"{where}: {error['msg'].lower()}, got {error.get('input')!r}")
    return "; ".join(found)


# -- reading what providers report ------------------------------------------------------------


def _get(obj: Any, name: str) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(name)
    return getattr(obj, name, None)


def _has(obj: Any, name: str) -> bool:
    return _get(obj, name) is not None


def _json(value: Any) -> Any:
    """A reported object as plain JSON data (SDK objects dumped)."""
    if value is None:
        return None
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json", exclude_none=True)
    if isinstance(value, list):
        return [_json(item) for item in value]
    if isinstance(value, Mapping):
        return {str(k): _json(v) for k, v in value.items()}
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        raise InvalidInputError(f"usage: {value!r} is not JSON data") from None
    return value


def _count(usage: Any, name: str, *, where: str) -> int:
    value = _get(usage, name)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInputError(f"{where}.{name} must be a whole number >= 0, got {value!r}")
    return value


_SHAPES = {
    "anthropic": "an Anthropic usage (input_tokens, output_tokens, cache_*_input_tokens)",
    "openai": "a Chat Completions usage (prompt_tokens, completion_tokens)",
    "responses": "a Responses usage (input_tokens, input_tokens_details, output_tokens)",
}
# Fields only one provider's usage object has.
_MARKERS = {
    "anthropic": ("cache_creation_input_tokens", "cache_read_input_tokens", "cache_creation"),
    "openai": ("prompt_tokens", "completion_tokens", "prompt_tokens_details"),
    "responses": ("input_tokens_details",),
}
# The count each one always has.
_REQUIRED = {"anthropic": "input_tokens", "openai": "prompt_tokens", "responses": "input_tokens"}


def _check_shape(usage: Any, expected: str, *, where: str) -> None:
    """Refuse another provider's usage object (by the fields only it has)."""
    for other, markers in _MARKERS.items():
        if other != expected and any(_has(usage, name) for name in markers):
            raise InvalidInputError(
                f"{where} is not {_SHAPES[expected]}: it looks like {_SHAPES[other]}"
            )
    if not _has(usage, _REQUIRED[expected]):
        raise InvalidInputError(
            f"{where} is not {_SHAPES[expected]}: it has no {_REQUIRED[expected]}"
        )


def _validated(where: str, **fields: Any) -> CallUsage:
    try:
        return CallUsage(**fields)
    except ValidationError as exc:
        raise InvalidInputError(f"{where}: {_problems(exc)}") from None


def _anthropic(usage: Any, *, model: Any, where: str, **extra: Any) -> CallUsage:
    _check_shape(usage, "anthropic", where=where)
    written = _count(usage, "cache_creation_input_tokens", where=where)
    split = _get(usage, "cache_creation")
    five = hour = 0
    if split is not None:
        five = _count(split, "ephemeral_5m_input_tokens", where=f"{where}.cache_creation")
        hour = _count(split, "ephemeral_1h_input_tokens", where=f"{where}.cache_creation")
    if five + hour > written:
        raise InvalidInputError(
            f"{where}.cache_creation splits {five + hour:,} tokens but "
            f"cache_creation_input_tokens is {written:,}"
        )
    iterations = _get(usage, "iterations")
    return _validated(
        where,
        input_tokens=_count(usage, "input_tokens", where=where),
        cache_read_tokens=_count(usage, "cache_read_input_tokens", where=where),
        # A write the split does not cover is the default, 5-minute write.
        cache_write_5m_tokens=written - hour,
        cache_write_1h_tokens=hour,
        output_tokens=_count(usage, "output_tokens", where=where),
        model=model if isinstance(model, str) and model else None,
        # Claude Code writes [] when there was one plain call: nothing to keep.
        iterations=_json(iterations) if iterations else None,
        **extra,
    )


def _without(prompt: int, cached: int, written: int, *, where: str, total: str) -> int:
    uncached = prompt - cached - written
    if uncached < 0:
        raise InvalidInputError(
            f"{where}: cached ({cached:,}) and cache-write ({written:,}) tokens exceed "
            f"{total} ({prompt:,})"
        )
    return uncached


def response_usage(format_name: str, response: Any) -> CallUsage | None:
    """The usage of an SDK response of the session's format; None when it reports none.

    Raises:
        InvalidInputError: a usage object of another provider's shape, or a token count
            that is not a whole number >= 0.
    """
    usage = _get(response, "usage")
    if usage is None:
        return None
    where = "the response's usage"
    model = _get(response, "model")
    if format_name == "anthropic":
        diagnostics = _get(response, "diagnostics")
        miss = None if diagnostics is None else _get(diagnostics, "cache_miss_reason")
        return _anthropic(
            usage,
            model=model,
            where=where,
            cache_miss_reason=_json(miss),
            input_transformations=_json(_get(response, "input_transformations")),
        )
    if format_name == "openai":
        _check_shape(usage, "openai", where=where)
        details = _get(usage, "prompt_tokens_details")
        inner = f"{where}.prompt_tokens_details"
        cached = 0 if details is None else _count(details, "cached_tokens", where=inner)
        written = 0 if details is None else _count(details, "cache_write_tokens", where=inner)
        prompt = _count(usage, "prompt_tokens", where=where)
        return _validated(
            where,
            input_tokens=_without(prompt, cached, written, where=where, total="prompt_tokens"),
            cache_read_tokens=cached,
            cache_write_5m_tokens=written,
            output_tokens=_count(usage, "completion_tokens", where=where),
            model=model if isinstance(model, str) and model else None,
        )
    _check_shape(usage, "responses", where=where)
    details = _get(usage, "input_tokens_details")
    inner = f"{where}.input_tokens_details"
    cached = 0 if details is None else _count(details, "cached_tokens", where=inner)
    written = 0 if details is None else _count(details, "cache_write_tokens", where=inner)
    by_ttl = None if details is None else _get(details, "cache_write_tokens_details")
    long = 0
    if by_ttl is not None:
        long = _count(by_ttl, "ttl_12h_tokens", where=f"{inner}.cache_write_tokens_details")
        if long > written:
            raise InvalidInputError(
                f"{inner}: ttl_12h_tokens ({long:,}) exceed cache_write_tokens ({written:,})"
            )
    prompt = _count(usage, "input_tokens", where=where)
    return _validated(
        where,
        input_tokens=_without(prompt, cached, written, where=where, total="input_tokens"),
        cache_read_tokens=cached,
        cache_write_5m_tokens=written - long,
        cache_write_1h_tokens=long,
        output_tokens=_count(usage, "output_tokens", where=where),
        model=model if isinstance(model, str) and model else None,
        cache_miss_reason=_json(_get(response, "prompt_cache_diagnostics")),
        input_transformations=_json(_get(response, "input_transformations")),
    )


def claude_code_usage(message: Mapping[str, Any]) -> CallUsage | None:
    """The usage of a Claude Code assistant record's ``message``; None when it has none or
    reports no tokens at all (Claude Code's synthetic messages: no call was made)."""
    usage = message.get("usage")
    if not isinstance(usage, Mapping):
        return None
    found = _anthropic(usage, model=message.get("model"), where="message.usage")
    if not found.prompt_tokens and not found.output_tokens:
        return None
    return found


def codex_usage(last_token_usage: Mapping[str, Any], model: str | None) -> CallUsage | None:
    """The usage of a Codex ``token_count`` event (its ``info.last_token_usage``); None
    when it reports no input."""
    where = "token_count last_token_usage"
    prompt = _count(last_token_usage, "input_tokens", where=where)
    if not prompt:
        return None
    cached = _count(last_token_usage, "cached_input_tokens", where=where)
    return _validated(
        where,
        input_tokens=_without(prompt, cached, 0, where=where, total="input_tokens"),
        cache_read_tokens=cached,
        output_tokens=_count(last_token_usage, "output_tokens", where=where),
        model=model,
    )


def usage_cost(prices: PriceTable, usage: CallUsage) -> float | None:
    """The call's cost in US dollars at ``prices``; None when its model has no price.

    Anthropic bills a server-side compaction as a ``compaction`` entry of ``iterations``
    whose tokens are not in the top-level counts: it is added, at the call's model's
    prices.
    """
    price = prices.price(usage.model)
    total = call_cost(
        price,
        input_tokens=usage.input_tokens,
        cache_read_tokens=usage.cache_read_tokens,
        cache_write_5m_tokens=usage.cache_write_5m_tokens,
        cache_write_1h_tokens=usage.cache_write_1h_tokens,
        output_tokens=usage.output_tokens,
    )
    for entry in usage.iterations or []:
        if total is None or entry.get("type") != "compaction":
            continue
        extra = _anthropic(entry, model=None, where="usage.iterations[compaction]")
        more = call_cost(
            price,
            input_tokens=extra.input_tokens,
            cache_read_tokens=extra.cache_read_tokens,
            cache_write_5m_tokens=extra.cache_write_5m_tokens,
            cache_write_1h_tokens=extra.cache_write_1h_tokens,
            output_tokens=extra.output_tokens,
        )
        total = None if more is None else total + more
    return total
