"""Prompt caching as a cost decision: where the cache breakpoints of a request go, which
lifetime their writes get, and whether an in-place edit of content already sent pays for
the cache it makes cold.

Pure functions (no database, no clock): ``request_params(cache_control=True)`` and the
engines call them with what the session knows.

Facts from the providers' "Prompt caching" documentation, as of :data:`AS_OF`:

- Anthropic caches the prefix of a request up to each block marked ``cache_control``, in
  the order tools, system, messages; at most four breakpoints a request; a breakpoint with
  the 1-hour lifetime never after one with the 5-minute lifetime. A prefix shorter than the
  model's minimum cacheable length is not cached (silently: no write, no read).
- A read refreshes the entry's lifetime; a write costs 1.25x the input price (5 minutes) or
  2x (1 hour); a read 0.025x to 0.1x by model (compactstore.pricing).
- OpenAI caches prefixes by itself: no breakpoints to place.
"""

from __future__ import annotations

import itertools
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "AS_OF",
    "MAX_BREAKPOINTS",
    "TTL_SECONDS",
    "EditCost",
    "Ttl",
    "call_gap",
    "choose_ttl",
    "edit_cost",
    "min_cacheable_tokens",
    "place_breakpoints",
    "plan_breakpoints",
]

AS_OF = "2026-12-04"
MAX_BREAKPOINTS = 4
Ttl = Literal["5m", "1h"]
TTL_SECONDS: dict[Ttl, float] = {"5m": 300.0, "1h": 3_600.0}

# The minimum cacheable prompt length (tokens) by model: 512 on Opus 5, Fable 5 and Mythos 5,
# 4,096 on Opus 4.5 / 4.6 / 4.7 and Haiku 4.5, 1,024 on Sonnet 5, Opus 4.8 and the older
# Sonnet 4.x and Opus 4 / 4.1 models. A model the table does not name (the 5.x point releases
# among them) gets the largest documented minimum, so a breakpoint is never placed where the
# provider might not cache.
_MIN_CACHEABLE: dict[str, int] = {
    "claude-opus-5": 512,
    "claude-fable-5": 512,
    "claude-mythos-5": 512,
    "claude-sonnet-5": 1_024,
    "claude-opus-4-8": 1_024,
    "claude-opus-4-7": 4_096,
    "claude-opus-4-6": 4_096,
    "claude-opus-4-5": 4_096,
    "claude-haiku-4-5": 4_096,
    "claude-opus-4-1": 1_024,
    "claude-opus-4": 1_024,
    "claude-sonnet-4-6": 1_024,
    "claude-sonnet-4-5": 1_024,
    "claude-sonnet-4": 1_024,
}
_UNKNOWN_MIN = 4_096
# A dated model id: the name, then -YYYYMMDD or -YYYY-MM-DD.
_DATED = re.compile(r"^(?P<name>.+?)-(?:\d{8}|\d{4}-\d{2}-\d{2})$")
# The gaps between recent calls the rhythm is read from.
_RHYTHM_CALLS = 6


def min_cacheable_tokens(model: str | None) -> int:
    """The shortest prefix (tokens) the provider caches for ``model``, by its name (a dated
    id without its date); unknown models get the largest documented minimum."""
    if model is None:
        return _UNKNOWN_MIN
    dated = _DATED.match(model)
    name = dated["name"] if dated is not None else model
    return _MIN_CACHEABLE.get(name, _UNKNOWN_MIN)


def call_gap(call_times: Sequence[float]) -> float | None:
    """The session's call rhythm: the median gap (seconds) between its recent model calls
    (``call_times`` oldest first); None with fewer than two calls."""
    recent = list(call_times)[-(_RHYTHM_CALLS + 1) :]
    gaps = [b - a for a, b in itertools.pairwise(recent) if b >= a]
    return statistics.median(gaps) if gaps else None


def choose_ttl(gap: float | None) -> Ttl:
    """The cache write lifetime that pays for calls ``gap`` seconds apart: the 5-minute
    write (1.25x) while the next call comes before it expires (each read refreshes it);
    the 1-hour write (2x, read on every later call) when calls are 5 minutes or more but
    less than an hour apart, where a 5-minute entry would be cold at every call; the
    cheaper 5-minute write when nothing survives the gap (or the rhythm is not known)."""
    if gap is None or gap < TTL_SECONDS["5m"] or gap >= TTL_SECONDS["1h"]:
        return "5m"
    return "1h"


def plan_breakpoints(
    tokens: Sequence[int],
    *,
    system: Sequence[int],
    stable: Sequence[int],
    previous_tail: int | None,
    min_tokens: int,
    limit: int = MAX_BREAKPOINTS,
    edit_marks: Sequence[int] = (),
) -> list[int]:
    """Indexes (into ``tokens``, the estimate of each message in request order) to mark,
    at most ``limit`` with the system prompt's own breakpoint counted, best first:

    1. the end of the system prompt (``system``: the indexes of the system messages);
    2. the newest message, so the next call reads this whole request from the cache;
    3. ``previous_tail``, the last message the previous call sent, so this call reads what
       the previous one wrote;
    4. ``stable`` marks (the pinned run, the summary), newest first: what is read after an
       edit made the tail cold.

    ``edit_marks`` (a server-side edit clears content from a point that moves on with each
    call: the end of the prefix it leaves as the previous call sent it, then the end of the
    one the next call will find) come before ``previous_tail``, which the edit makes cold.

    A mark whose prefix (everything up to and including it) is shorter than
    ``min_tokens`` is left out: the provider would not cache it. Returned sorted; the
    system prompt's mark, when chosen, is its last index."""
    cumulative: list[int] = []
    total = 0
    for count in tokens:
        total += max(0, count)
        cumulative.append(total)
    return place_breakpoints(
        cumulative,
        system=system,
        stable=stable,
        previous_tail=previous_tail,
        min_tokens=min_tokens,
        limit=limit,
        edit_marks=edit_marks,
    )


def place_breakpoints(
    cumulative: Sequence[int],
    *,
    system: Sequence[int],
    stable: Sequence[int],
    previous_tail: int | None,
    min_tokens: int,
    limit: int = MAX_BREAKPOINTS,
    edit_marks: Sequence[int] = (),
) -> list[int]:
    """:func:`plan_breakpoints` from the running token total (``cumulative[i]``: the
    estimates of messages 0..i, negative ones counted as 0), which a caller extending its
    messages step by step keeps instead of adding them up on every request."""
    tokens = cumulative
    wanted: list[int] = []
    if system:
        wanted.append(max(system))
    if tokens:
        wanted.append(len(tokens) - 1)
    wanted.extend(edit_marks)
    if previous_tail is not None:
        wanted.append(previous_tail)
    wanted.extend(sorted(stable, reverse=True))
    chosen: list[int] = []
    for index in wanted:
        if len(chosen) >= limit:
            break
        if 0 <= index < len(tokens) and index not in chosen and cumulative[index] >= min_tokens:
            chosen.append(index)
    return sorted(chosen)


@dataclass(frozen=True, slots=True)
class EditCost:
    """What an in-place edit of content already sent does to the bill, in input-token
    units (multiply by the model's input price): ``saved`` (the tokens it frees, read from
    the cache on each call expected before the cache goes cold), ``rewrite`` (the prefix
    after the edit point written to the cache again), ``calls`` (the calls expected within
    the TTL). ``pays``: the saving is at least the rewrite."""

    saved: float
    rewrite: float
    calls: float

    @property
    def pays(self) -> bool:
        return self.saved >= self.rewrite


def edit_cost(
    *,
    freed_tokens: int,
    rewritten_tokens: int,
    ttl_seconds: float,
    gap_seconds: float | None,
    cache_read: float,
    cache_write: float,
) -> EditCost:
    """The cost effect of clearing ``freed_tokens`` at an edit point with
    ``rewritten_tokens`` of cached context from it to the end of what was sent (the edited
    content, less what it frees, plus everything after it), within ``ttl_seconds``.

    Every later call sends the freed tokens no more; kept, they would be read from the
    cache (``cache_read``, a multiplier of the input price) on each of the calls expected
    before the cache goes cold: ``ttl_seconds / gap_seconds`` (at least one: the next
    call). The edit makes the provider write the prefix from the edit point again
    (``cache_write``), where it would have read it: the write less the read it replaces.
    With no call rhythm yet (``gap_seconds`` None), one call is expected."""
    known = gap_seconds is not None and gap_seconds > 0
    calls = max(1.0, ttl_seconds / gap_seconds) if known and gap_seconds else 1.0
    saved = freed_tokens * cache_read * calls
    rewrite = rewritten_tokens * max(0.0, cache_write - cache_read)
    return EditCost(saved=saved, rewrite=rewrite, calls=calls)
