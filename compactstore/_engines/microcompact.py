"""Stage 4, microcompact: clear old tool results, keep the newest few.

Time-based: once ``microcompact_interval_seconds`` have passed since the last time-based
microcompact (the clock starts when the session is created). Cache-aware: when the gap
since the newest model call (the newest assistant message when no call was recorded)
exceeds the cache's lifetime (``cache_ttl_seconds``, an hour when the session's calls
write 1-hour entries; see :mod:`compactstore._engines.cache_rule`) the provider's prompt
cache has expired anyway, so clearing costs no cache hit. On a warm cache a clear of
content already sent waits while it costs more than it saves (the same rule). Results
already persisted or cleared are not candidates; with ``microcompact_keep_recent`` or fewer
candidates nothing happens.
A result carrying media is not cleared but persisted whole as a blob, behind a
note naming it, so ``get_blob`` still returns the image.
"""

from __future__ import annotations

from typing import Literal

from compactstore._context.active import ActiveContext, ContextMessage
from compactstore._context.editable import open_results_in
from compactstore._engines import cache_rule
from compactstore._engines.base import Edit, EngineInputs, NewBlob, StageResult
from compactstore._engines.tool_budget import new_blob
from compactstore.models import CompactStrategy, CompactTrigger

__all__ = ["CLEARED_TEXT", "due", "run"]

CLEARED_TEXT = "[Old tool result content cleared by time-based microcompact]"


def due(context: ActiveContext, inputs: EngineInputs) -> CompactTrigger | None:
    """Which microcompact trigger fires now, if any."""
    config = context.config
    if inputs.now - inputs.last_microcompact_at >= config.microcompact_interval_seconds:
        return CompactTrigger.MICROCOMPACT_TIME
    if config.cache_ttl_seconds is not None:
        age = cache_rule.cache_age(context, inputs)
        if age is not None and age > cache_rule.cache_ttl(config, inputs):
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
    deferred = cache_rule.deferral(
        context, after, inputs, first=min(by_index), what=f"clearing {len(to_clear)} tool results"
    )
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
