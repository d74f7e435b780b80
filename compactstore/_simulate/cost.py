"""What a replay's model calls would cost (see :mod:`compactstore._simulate`): a prompt
cache at message granularity on the replay's clock, priced with compactstore.pricing.

Each call sends a list of units (the fixed overhead, then one per message of the context)
with a breakpoint on the newest one, as ``request_params(cache_control=True)`` places it:
the longest prefix that an earlier call wrote and that has not expired is read, the rest
is written with the lifetime the call rhythm picks (compactstore._context.caching.choose_ttl), and a
read refreshes the entry. A prompt under the model's minimum cacheable length is neither
read nor written. The output is billed as the transcript reports it (or as estimated).
"""

from __future__ import annotations

import hashlib
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from compactstore._context.caching import TTL_SECONDS, call_gap, choose_ttl, min_cacheable_tokens
from compactstore._ledger import CallUsage, TokenCounts, usage_cost
from compactstore.pricing import PriceTable

__all__ = ["CacheMeter", "PrefixChain", "transcript_cost"]

_RHYTHM_CALLS = 7
_COUNTS = tuple(TokenCounts.model_fields)


class PrefixChain:
    """The hash and token total of every prefix of a growing list of units."""

    def __init__(self) -> None:
        self._running = hashlib.sha256()
        self.hashes: list[str] = []
        self.cumulative: list[int] = []

    def add(self, identity: Hashable, tokens: int) -> None:
        self._running.update(repr(identity).encode())
        self.hashes.append(self._running.hexdigest())
        self.cumulative.append((self.cumulative[-1] if self.cumulative else 0) + max(0, tokens))


@dataclass
class CacheMeter:
    """A provider's prompt cache and the bill of the calls sent through it: ``total``, the
    tokens by kind, and ``cost_usd`` (None once a call has no price)."""

    model: str | None
    prices: PriceTable
    calls: int = 0
    total: TokenCounts = field(default_factory=TokenCounts)
    cost_usd: float | None = 0.0

    def __post_init__(self) -> None:
        self._cache: dict[str, tuple[float, float]] = {}  # prefix hash -> (expiry, ttl)
        self._times: list[float] = []
        self._minimum = min_cacheable_tokens(self.model)

    @property
    def cache_read_share(self) -> float | None:
        return self.total.cache_read_share

    def call(self, units: Sequence[tuple[Hashable, int]], now: float, output: int) -> None:
        """One model call sending ``units`` (identity, tokens) at ``now``."""
        hashes: list[str] = []
        cumulative: list[int] = []
        chain = PrefixChain()
        for identity, tokens in units:
            chain.add(identity, tokens)
        hashes, cumulative = chain.hashes, chain.cumulative
        self.call_prefixes(hashes, cumulative, now, output)

    def call_prefixes(
        self, hashes: Sequence[str], cumulative: Sequence[int], now: float, output: int
    ) -> None:
        """One model call, its units given as the hash and token total of each prefix."""
        self.calls += 1
        self._times = [*self._times[-_RHYTHM_CALLS:], now]
        total = cumulative[-1] if cumulative else 0
        read = 0
        for n in range(len(hashes) - 1, -1, -1):
            entry = self._cache.get(hashes[n])
            if entry is not None and entry[0] > now:
                read = cumulative[n]
                self._cache[hashes[n]] = (now + entry[1], entry[1])
                break
        written = 0
        ttl = choose_ttl(call_gap(self._times))
        if hashes and total >= self._minimum and total > read:
            lifetime = TTL_SECONDS[ttl]
            self._cache[hashes[-1]] = (now + lifetime, lifetime)
            written = total - read
        usage = CallUsage(
            input_tokens=total - read - written,
            cache_read_tokens=read,
            cache_write_5m_tokens=written if ttl == "5m" else 0,
            cache_write_1h_tokens=written if ttl == "1h" else 0,
            output_tokens=max(0, output),
            model=self.model,
        )
        self._add(usage)

    def _add(self, usage: CallUsage) -> None:
        self.total = TokenCounts(
            **{name: getattr(self.total, name) + getattr(usage, name) for name in _COUNTS}
        )
        cost = usage_cost(self.prices, usage)
        self.cost_usd = None if cost is None or self.cost_usd is None else self.cost_usd + cost


def transcript_cost(
    ledgers: Sequence[CallUsage | None], prices: PriceTable, model: str | None = None
) -> tuple[int, float | None]:
    """(calls with usage, their cost) from a transcript's own recorded usage, each at its
    model's prices (``model``: at that model's instead); cost None when a call with usage
    has no price or none has usage."""
    found = [ledger for ledger in ledgers if ledger is not None]
    if not found:
        return 0, None
    total: float | None = 0.0
    for ledger in found:
        priced = ledger if model is None else ledger.model_copy(update={"model": model})
        cost = usage_cost(prices, priced)
        total = None if cost is None or total is None else total + cost
    return len(found), total
