"""What a model call costs: a dated price table per model.

Prices are US dollars per million tokens for uncached input and for output; the cache
prices are multipliers of the input price, as the providers publish them: a cache read,
a cache write kept for the provider's short lifetime (Anthropic: 5 minutes; OpenAI: 30
minutes) and one kept for the long lifetime (Anthropic: 1 hour; OpenAI: 12 hours).
``model_calls`` keeps the two kinds of write apart as ``cache_write_5m_tokens`` (short) and
``cache_write_1h_tokens`` (long). Some models bill a whole request at higher rates once its
prompt (input, cache reads and cache writes together) is longer than a threshold:
``long_prompt_tokens`` with the factors that apply to the input-side and output prices.

The table, as published on 2026-12-04:

- Anthropic: the model overview pages of platform.claude.com (``/docs/en/models/<model>/
  overview``, "Pricing") and the pricing page (``/docs/en/about-claude/pricing``, "Model
  pricing"). Cache writes are 1.25x (5 minutes) and 2x (1 hour) of input on every model;
  cache reads are 0.025x on Fable and Mythos 5.1 and 5.2, 0.05x on Opus 5.5 and on Sonnet
  5.5 (cut from 0.1x on 2026-10-07; overview snapshots from before that date still show
  $0.20), 0.1x elsewhere. Haiku 5.5 bills a request whose prompt is over 100,000 tokens at
  5x every rate.
- OpenAI: the model pages of developers.openai.com (``/api/docs/models/<model>``, "Text
  tokens") and the pricing page (``/api/docs/pricing``). From the GPT-5.6 family on, a cache
  write costs 1.25x the input rate (30-minute retention); gpt-6.2-sol prices a 12-hour
  write at $5 (2.5x); a request with more than 272K input tokens costs 2x on input and
  cache rates and 1.5x on output. Where a page gives no 12-hour price, none is assumed.

A model is found by its exact name or by its name with a date suffix (``-20250929`` or
``-2026-09-22``). A model the table does not have, or a token kind it has no price for,
makes the call's cost None: never a guess. ``CompactStore.open(..., prices=)`` adds models
or replaces their prices.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from compactstore.errors import InvalidInputError

__all__ = [
    "PRICES",
    "PRICES_AS_OF",
    "ModelPrice",
    "PriceTable",
    "Prices",
    "cache_write_cost",
    "call_cost",
    "price_table",
]

# The date the table below was read from the providers' pages.
PRICES_AS_OF = "2026-12-04"

_Rate = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class ModelPrice(BaseModel):
    """One model's prices (see the module docstring)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    input_per_mtok: _Rate
    output_per_mtok: _Rate
    cache_read: _Rate  # multiplier of input
    cache_write_5m: _Rate | None = 1.25  # the provider's short-lived write; multiplier of input
    cache_write_1h: _Rate | None = 2.0  # the long-lived write; None: not priced
    # A prompt longer than this many tokens bills the whole request at higher rates.
    long_prompt_tokens: Annotated[int, Field(gt=0)] | None = None
    long_input_factor: _Rate = 1.0  # input, cache read and cache write rates
    long_output_factor: _Rate = 1.0


def _anthropic(input_: float, output: float, read: float) -> ModelPrice:
    return ModelPrice(input_per_mtok=input_, output_per_mtok=output, cache_read=read)


def _openai(
    input_: float, output: float, read: float, *, write_12h: float | None = None
) -> ModelPrice:
    return ModelPrice(
        input_per_mtok=input_,
        output_per_mtok=output,
        cache_read=read,
        cache_write_5m=1.25,
        cache_write_1h=write_12h,
        long_prompt_tokens=272_000,
        long_input_factor=2.0,
        long_output_factor=1.5,
    )


PRICES: Mapping[str, ModelPrice] = {
    # Anthropic: Mythos-class
    "claude-fable-5-2": _anthropic(8, 40, 0.025),
    "claude-mythos-5-2": _anthropic(8, 40, 0.025),
    "claude-fable-5-1": _anthropic(10, 50, 0.025),
    "claude-mythos-5-1": _anthropic(10, 50, 0.025),
    "claude-fable-5": _anthropic(10, 50, 0.1),
    "claude-mythos-5": _anthropic(10, 50, 0.1),
    # Anthropic: Opus
    "claude-opus-5-5": _anthropic(4, 20, 0.05),
    "claude-opus-5": _anthropic(5, 25, 0.1),
    "claude-opus-4-8": _anthropic(5, 25, 0.1),
    "claude-opus-4-7": _anthropic(5, 25, 0.1),
    "claude-opus-4-6": _anthropic(5, 25, 0.1),
    "claude-opus-4-5": _anthropic(5, 25, 0.1),
    "claude-opus-4-1": _anthropic(15, 75, 0.1),
    "claude-opus-4": _anthropic(15, 75, 0.1),
    # Anthropic: Sonnet
    "claude-sonnet-5-5": _anthropic(2, 10, 0.05),
    "claude-sonnet-5": _anthropic(2, 10, 0.1),
    "claude-sonnet-4-6": _anthropic(3, 15, 0.1),
    "claude-sonnet-4-5": _anthropic(3, 15, 0.1),
    "claude-sonnet-4": _anthropic(3, 15, 0.1),
    # Anthropic: Haiku
    "claude-haiku-5-5": ModelPrice(
        input_per_mtok=0.10,
        output_per_mtok=0.50,
        cache_read=0.1,
        long_prompt_tokens=100_000,
        long_input_factor=5.0,
        long_output_factor=5.0,
    ),
    "claude-haiku-4-5": _anthropic(1, 5, 0.1),
    # OpenAI
    "gpt-6-astra": _openai(10, 50, 0.1),
    "gpt-6.2-sol": _openai(2, 10, 0.05, write_12h=2.5),
    "gpt-6.1-sol": _openai(2, 10, 0.05),
    "gpt-6-sol": _openai(2, 10, 0.1),
    "gpt-6-luna": _openai(0.10, 0.50, 0.1),
    "gpt-5.6-luna": _openai(0.20, 1.20, 0.1),
}

# A dated model id: the name, then -YYYYMMDD or -YYYY-MM-DD.
_DATED = re.compile(r"^(?P<name>.+?)-(?:\d{8}|\d{4}-\d{2}-\d{2})$")


class PriceTable:
    """The prices a store uses: :data:`PRICES` with the caller's additions on top."""

    __slots__ = ("_prices",)

    def __init__(self, prices: Mapping[str, ModelPrice]) -> None:
        self._prices = dict(prices)

    def price(self, model: str | None) -> ModelPrice | None:
        """The model's prices, by exact name or by its name without a date suffix."""
        if model is None:
            return None
        found = self._prices.get(model)
        if found is None:
            dated = _DATED.match(model)
            if dated is not None:
                found = self._prices.get(dated["name"])
        return found

    def models(self) -> list[str]:
        """The models with a price, sorted."""
        return sorted(self._prices)


# What ``CompactStore.open(..., prices=)`` takes: model -> price (or its fields), or a table.
Prices = Mapping[str, ModelPrice | Mapping[str, object]] | PriceTable


def price_table(prices: Prices | None) -> PriceTable:
    """The shipped table with ``prices`` (model -> :class:`ModelPrice` or its fields as a
    dict) added or replacing the shipped entries; a :class:`PriceTable` as it is.

    Raises:
        InvalidInputError: ``prices`` is not a mapping of model names to prices, or a price
            has a negative, missing or unknown field.
    """
    if prices is None:
        return PriceTable(PRICES)
    if isinstance(prices, PriceTable):
        return prices
    if not isinstance(prices, Mapping):
        raise InvalidInputError(
            f"prices must be a mapping of model name to ModelPrice, got {type(prices).__name__}"
        )
    merged = dict(PRICES)
    for model, price in prices.items():
        if not isinstance(model, str) or not model:
            raise InvalidInputError(f"prices: a model name must be a non-empty string: {model!r}")
        if isinstance(price, ModelPrice):
            merged[model] = price
            continue
        if not isinstance(price, Mapping):
            raise InvalidInputError(
                f"prices[{model!r}] must be a ModelPrice or a mapping of its fields, "
                f"got {type(price).__name__}"
            )
        try:
            merged[model] = ModelPrice.model_validate(dict(price))
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'price'}: {e['msg']}" for e in exc.errors()
            )
            raise InvalidInputError(f"prices[{model!r}]: {problems}") from None
    return PriceTable(merged)


def call_cost(
    price: ModelPrice | None,
    *,
    input_tokens: int,
    cache_read_tokens: int,
    cache_write_5m_tokens: int,
    cache_write_1h_tokens: int,
    output_tokens: int,
) -> float | None:
    """The cost in US dollars of one request's tokens; None when ``price`` is None or a
    kind of token the call has is not priced."""
    if price is None:
        return None
    if (cache_write_5m_tokens and price.cache_write_5m is None) or (
        cache_write_1h_tokens and price.cache_write_1h is None
    ):
        return None
    prompt = input_tokens + cache_read_tokens + cache_write_5m_tokens + cache_write_1h_tokens
    long = price.long_prompt_tokens is not None and prompt > price.long_prompt_tokens
    input_rate = price.input_per_mtok * (price.long_input_factor if long else 1.0)
    output_rate = price.output_per_mtok * (price.long_output_factor if long else 1.0)
    input_side = (
        input_tokens
        + cache_read_tokens * price.cache_read
        + cache_write_5m_tokens * (price.cache_write_5m or 0.0)
        + cache_write_1h_tokens * (price.cache_write_1h or 0.0)
    )
    return (input_side * input_rate + output_tokens * output_rate) / 1_000_000


def cache_write_cost(
    price: ModelPrice | None,
    *,
    prompt_tokens: int,
    cache_write_5m_tokens: int,
    cache_write_1h_tokens: int,
) -> float | None:
    """The cost in US dollars of a request's cache writes alone (``prompt_tokens``: the
    whole prompt, which decides the long-prompt rates); None when not priced."""
    if price is None:
        return None
    if (cache_write_5m_tokens and price.cache_write_5m is None) or (
        cache_write_1h_tokens and price.cache_write_1h is None
    ):
        return None
    long = price.long_prompt_tokens is not None and prompt_tokens > price.long_prompt_tokens
    rate = price.input_per_mtok * (price.long_input_factor if long else 1.0)
    written = cache_write_5m_tokens * (price.cache_write_5m or 0.0) + cache_write_1h_tokens * (
        price.cache_write_1h or 0.0
    )
    return written * rate / 1_000_000
