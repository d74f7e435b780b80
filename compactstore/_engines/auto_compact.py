"""Stage 5, the auto-compact check and dispatcher, with its circuit breaker.

Auto-compact fires when estimated usage reaches ``auto_compact_threshold`` of the window,
unless the breaker is tripped. It tries session memory first, then a full compact on top
of whatever that left. A run that leaves usage at or above the threshold counts as a
failure even when it freed tokens, so an un-compactable context trips the breaker after
``breaker_max_failures`` consecutive failures instead of compacting on every turn.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from compactstore._context.active import ActiveContext
from compactstore._engines import full_compact, session_memory
from compactstore._engines.base import EngineInputs, StageResult
from compactstore.models import CompactTrigger

__all__ = ["Dispatch", "background_threshold", "dispatch", "should_trigger", "threshold"]


@dataclass(frozen=True, slots=True)
class Dispatch:
    stages: list[StageResult]
    context: ActiveContext
    consecutive_failures: int
    tripped: bool


def threshold(context: ActiveContext) -> int:
    """Usage at which auto-compact fires: the smallest whole count >= 85% of the window."""
    # Rounded first so float noise (0.85 * 20000 = 17000.000000000004) cannot add a token.
    return math.ceil(round(context.context_window * context.config.auto_compact_threshold, 6))


def should_trigger(context: ActiveContext, inputs: EngineInputs) -> bool:
    """Usage is at the threshold and the breaker is not tripped; on a model that checks
    thinking prefixes, not while a tool loop with thinking is in progress, unless usage has
    reached ``auto_compact_wait_limit`` (a cut then would invalidate the loop's thinking,
    which the next request must send: the end of the loop is the place for it)."""
    if inputs.tripped or context.usage < threshold(context):
        return False
    if inputs.prefix_checks and context.continues_thinking:
        return context.usage >= wait_limit(context)
    return True


def wait_limit(context: ActiveContext) -> int:
    """Usage at which auto-compact stops waiting for a tool loop to end."""
    limit = max(context.config.auto_compact_wait_limit, context.config.auto_compact_threshold)
    return math.ceil(round(context.context_window * limit, 6))


def background_threshold(context: ActiveContext) -> int:
    """Usage at which a background compaction starts."""
    return math.ceil(round(context.context_window * context.config.background_threshold, 6))


def dispatch(context: ActiveContext, inputs: EngineInputs, *, limit: int | None = None) -> Dispatch:
    """Session memory, then full compact if still needed; the breaker counts the outcome.

    ``limit`` is the usage the compaction must get below (default :func:`threshold`; a
    background compaction's is :func:`background_threshold`)."""
    limit = threshold(context) if limit is None else limit
    stages: list[StageResult] = []
    current = context
    memory = session_memory.run(context, inputs, trigger=CompactTrigger.AUTO)
    if memory is not None:
        stages.append(memory)
        if memory.effective:
            current = memory.context
            assert memory.cut is not None
            inputs = replace(
                inputs, summary_state=full_compact.continuing(memory.cut.summary_state)
            )
    if current.usage >= limit:
        full = full_compact.run(current, inputs, trigger=CompactTrigger.AUTO)
        stages.append(full)
        current = full.context
    succeeded = any(stage.effective for stage in stages) and current.usage < limit
    failures = 0 if succeeded else inputs.consecutive_failures + 1
    return Dispatch(
        stages=stages,
        context=current,
        consecutive_failures=failures,
        tripped=failures >= context.config.breaker_max_failures,
    )
