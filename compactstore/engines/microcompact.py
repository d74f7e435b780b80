"""Stage 4, microcompact: clear old tool results, keep the newest few.

Time-based: once ``microcompact_interval_seconds`` have passed since the last time-based
microcompact (the clock starts when the session is created). Cache-aware: when the gap
since the last assistant message exceeds ``cache_ttl_seconds`` the provider's prompt cache
has expired anyway, so clearing costs no cache hit. Results already persisted or cleared
are not candidates; with ``microcompact_keep_recent`` or fewer candidates nothing happens.
A result carrying media is not cleared but persisted whole as a blob, behind a
note naming it, so ``get_blob`` still returns the image.
"""

from __future__ import annotations

from typing import Literal

from compactstore.caching import TTL_SECONDS, edit_cost
from compactstore.context import ActiveContext, ContextMessage
from compactstore.editable import open_results_in
from compactstore.engines.base import Edit, EngineInputs, NewBlob, StageResult
from compactstore.engines.tool_budget import new_blob
from compactstore.models import CompactStrategy, CompactTrigger

__all__ = ["CLEARED_TEXT", "deferral", "due", "run"]

CLEARED_TEXT = "[Old tool result content cleared by time-based microcompact]"


def due(context: ActiveContext, inputs: EngineInputs) -> CompactTrigger | None:
    """Which microcompact trigger fires now, if any."""
    config = context.config
    if inputs.now - inputs.last_microcompact_at >= config.microcompact_interval_seconds:
        return CompactTrigger.MICROCOMPACT_TIME
    if config.cache_ttl_seconds is not None:
        last_assistant = context.newest_assistant_at  # carried from step to step
        if last_assistant is not None and inputs.now - last_assistant > config.cache_ttl_seconds:
            return CompactTrigger.MICROCOMPACT_CACHED
    return None


def candidates(kept: tuple[ContextMessage, ...]) -> list[tuple[int, str]]:
    """(kept index, tool-use id) of every result that can still be cleared, oldest first."""
    return [(index, result.tool_use_id) for index, _, result in open_results_in(kept)]


def run(context: ActiveContext, inputs: EngineInputs) -> StageResult:
    """Clear all but the newest results when a trigger is due."""
    before = context.usage
    trigger = due(context, inputs)
    # Counted as the context grows: a trigger that stays due while there is nothing to
    # clear (a session with few tool results) costs no pass over every message.
    count = context.open_results.total if trigger is not None else 0
    keep = context.config.microcompact_keep_recent
    if trigger is None or count <= keep:
        return StageResult(
            strategy=CompactStrategy.MICROCOMPACT,
            trigger=trigger or CompactTrigger.MICROCOMPACT_TIME,
            applied=False,
            context=context,
            tokens_before=before,
            tokens_after=before,
            attempted=False,
            detail="" if trigger is None else f"only {count} tool results, keeping {keep}",
        )
    found = candidates(context.kept)
    to_clear = found[: len(found) - keep]
    by_index: dict[int, list[str]] = {}
    for index, tool_use_id in to_clear:
        by_index.setdefault(index, []).append(tool_use_id)
    kept = list(context.kept)
    edits: list[Edit] = []
    blobs: list[NewBlob] = []
    names = context.call_names(to_clear)
    for index, ids in sorted(by_index.items()):
        item = kept[index]
        assert item.seq is not None
        replacements = dict.fromkeys(ids, CLEARED_TEXT)
        persisted = False
        for result in item.results:
            if result.has_media and result.tool_use_id in replacements:
                blob, text = new_blob(
                    result,
                    seq=item.seq,
                    tool_name=names.get((index, result.tool_use_id), "unknown"),
                    blob_id=inputs.next_blob_id + len(blobs),
                    config=context.config,
                )
                blobs.append(blob)
                replacements[result.tool_use_id] = text
                persisted = True
        state: Literal["persisted", "cleared"] = "persisted" if persisted else "cleared"
        kept[index], edit = Edit.of_results(context, item, replacements, state)
        edits.append(edit)
    after = context.with_kept(kept)
    deferred = _deferral(context, after, inputs, first=min(by_index), count=len(to_clear))
    if deferred is not None:
        return StageResult(
            strategy=CompactStrategy.MICROCOMPACT,
            trigger=trigger,
            applied=False,
            context=context,
            tokens_before=before,
            tokens_after=before,
            detail=deferred,
        )
    return StageResult(
        strategy=CompactStrategy.MICROCOMPACT,
        trigger=trigger,
        applied=True,
        context=after,
        tokens_before=before,
        tokens_after=after.usage,
        edits=tuple(edits),
        blobs=tuple(blobs),
        detail=f"cleared {len(to_clear)} tool results, kept the newest {keep}"
        + (f"; {len(blobs)} with media persisted as blobs" if blobs else ""),
    )


def _deferral(
    context: ActiveContext, after: ActiveContext, inputs: EngineInputs, *, first: int, count: int
) -> str | None:
    return deferral(context, after, inputs, first=first, what=f"clearing {count} tool results")


def deferral(
    context: ActiveContext, after: ActiveContext, inputs: EngineInputs, *, first: int, what: str
) -> str | None:
    """Why an in-place edit of the kept part from index ``first`` (``context`` before it,
    ``after`` with it) waits, or None when it goes ahead: under the rewrite policy with
    ``cache_aware``, while the cache is warm (a model call within ``cache_ttl_seconds``),
    the window does not need the room (usage below ``auto_compact_threshold``), and the
    cache reads it saves within the TTL are worth less than the cached prefix from the edit
    point it makes the provider write again (compactstore.caching.edit_cost)."""
    config = context.config
    if not config.cache_aware or inputs.edit_policy != "rewrite":
        return None
    if context.usage >= config.auto_compact_threshold * context.context_window:
        return None  # the window needs the room
    ttl = config.cache_ttl_seconds or TTL_SECONDS["5m"]
    if inputs.last_call_at is None or inputs.sent_seq is None:
        return None  # nothing cached yet
    if inputs.now - inputs.last_call_at >= ttl:
        return None  # cold: the prefix is written again anyway
    sent = inputs.sent_seq
    rewritten = sum(
        item.tokens for item in after.kept[first:] if item.seq is None or item.seq <= sent
    )
    write = 2.0 if ttl >= TTL_SECONDS["1h"] else 1.25
    cost = edit_cost(
        freed_tokens=context.usage - after.usage,
        rewritten_tokens=rewritten,
        ttl_seconds=ttl,
        gap_seconds=inputs.call_gap,
        cache_read=inputs.cache_read,
        cache_write=write,
    )
    if cost.pays:
        return None
    return (
        f"deferred: {what} frees {context.usage - after.usage:,} tokens, "
        f"{cost.saved:,.0f} input-token units of cache reads over {cost.calls:.1f} calls "
        f"within {ttl:g} s, against {cost.rewrite:,.0f} to write {rewritten:,} cached "
        "tokens again"
    )
