"""The cache-aware cost rule of in-place edits: whether clearing or replacing content
already sent waits for the prompt cache to go cold.

Microcompact's clears and the tool-result budget's placeholders edit a message in place;
under the rewrite policy the provider then writes the cached prefix from the edit point
again. The rule (:func:`deferral`) weighs that write against the cache reads the edit
saves within the cache's lifetime (:func:`cache_ttl`), with
:func:`compactstore._context.caching.edit_cost`. Pure functions of (context, inputs): no database,
no clock.
"""

from __future__ import annotations

from compactstore._context.active import ActiveContext
from compactstore._context.caching import TTL_SECONDS, choose_ttl, edit_cost
from compactstore._engines.base import EngineInputs
from compactstore.models import CompactionConfig

__all__ = ["cache_age", "cache_ttl", "deferral", "first_unsent"]


def cache_ttl(config: CompactionConfig, inputs: EngineInputs) -> float:
    """How long the session's cached prefix stays warm, in seconds: ``cache_ttl_seconds``
    (the 5-minute cache when it is None), or an hour when the session's call rhythm makes
    ``request_params(cache_control=True)`` write 1-hour entries (calls 5 minutes to an
    hour apart): a prefix written for an hour is still warm at the next call."""
    ttl = config.cache_ttl_seconds or TTL_SECONDS["5m"]
    if choose_ttl(inputs.call_gap) == "1h":
        return max(ttl, TTL_SECONDS["1h"])
    return ttl


def cache_age(context: ActiveContext, inputs: EngineInputs) -> float | None:
    """Seconds since the provider last read or wrote the session's prefix: since the newest
    model call the ledger recorded, or, with none recorded, since the newest assistant
    message (a response comes right after its call); None when neither exists."""
    last = inputs.last_call_at
    if last is None:
        last = context.newest_assistant_at
    return None if last is None else inputs.now - last


def deferral(
    context: ActiveContext, after: ActiveContext, inputs: EngineInputs, *, first: int, what: str
) -> str | None:
    """Why an in-place edit of the kept part from index ``first`` (``context`` before it,
    ``after`` with it) waits, or None when it goes ahead.

    It waits only under the rewrite policy with ``cache_aware``, while the cache is warm (a
    model call within :func:`cache_ttl`), the window does not need the room (usage below
    ``auto_compact_threshold``), and the cache reads it saves within the TTL are worth
    less than writing again the cached prefix from the edit point (the messages the newest
    call sent, from ``first`` on). An edit of content not sent yet rewrites nothing and
    always goes ahead."""
    config = context.config
    if not config.cache_aware or inputs.edit_policy != "rewrite":
        return None
    if context.usage >= config.auto_compact_threshold * context.context_window:
        return None  # the window needs the room
    if inputs.last_call_at is None or inputs.sent_seq is None:
        return None  # nothing cached yet
    ttl = cache_ttl(config, inputs)
    if inputs.now - inputs.last_call_at >= ttl:
        return None  # cold: the prefix is written again anyway
    sent = inputs.sent_seq
    rewritten = sum(
        item.tokens for item in after.kept[first:] if item.seq is None or item.seq <= sent
    )
    freed = context.usage - after.usage
    cost = edit_cost(
        freed_tokens=freed,
        rewritten_tokens=rewritten,
        ttl_seconds=ttl,
        gap_seconds=inputs.call_gap,
        cache_read=inputs.cache_read,
        cache_write=2.0 if ttl >= TTL_SECONDS["1h"] else 1.25,
    )
    if cost.pays:
        return None
    return (
        f"deferred: {what} frees {freed:,} tokens, "
        f"{cost.saved:,.0f} input-token units of cache reads over {cost.calls:.1f} calls "
        f"within {ttl:g} s, against {cost.rewrite:,.0f} to write {rewritten:,} cached "
        "tokens again"
    )


def first_unsent(context: ActiveContext, inputs: EngineInputs) -> int:
    """Index in ``context.kept`` of the first message the newest model call did not send
    (0 when no call was recorded): an edit from there on rewrites no cached prefix."""
    sent = inputs.sent_seq
    if sent is None:
        return 0
    for index in range(len(context.kept) - 1, -1, -1):
        seq = context.kept[index].seq
        if seq is not None and seq <= sent:
            return index + 1
    return 0
