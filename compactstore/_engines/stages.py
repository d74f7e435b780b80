"""The stage registry: process_request()'s pipeline, declared once.

Each :class:`Stage` says everything the rest of the code needs of it: its name (the
``enable_<name>`` switch of process_request(), recorded for replay), where it runs in the
order, the strategies it records and their weights, and whether it may cut (a cut calls
the summarizer and takes the lease; the other stages are the cheap ones that still run
while another caller's summary is in flight). :func:`compactstore._engines.pipeline.process`
runs the registered stages in order, the compaction call reads which of them cut, and
replay passes the recorded switches back.

Adding a stage is its module (a pure ``run(context, inputs) -> Ran | None``) plus one
:func:`register` call (:func:`unregister` takes it out again). Its switch is a keyword of
``Session.process_request()`` (and the async session's), checked against this registry by the
compaction call's request (:func:`compactstore._core.calls.process_request`) and recorded for
replay (``EngineRun.stage_switches``). Its thresholds are
:class:`~compactstore.models.CompactionConfig` fields, and a strategy of its own is a
:class:`~compactstore.models.CompactStrategy` value: both are stored and documented.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from compactstore._context.active import ActiveContext
from compactstore._engines import auto_compact, microcompact, tool_budget
from compactstore._engines.base import EngineInputs, StageResult
from compactstore.models import CompactStrategy, CompactTrigger

__all__ = [
    "PROCESS_STAGES",
    "STRATEGY_WEIGHT",
    "Ran",
    "Stage",
    "register",
    "switches",
    "unregister",
    "weight_of",
]


@dataclass(frozen=True, slots=True)
class Ran:
    """What one stage did in a call: the attempts to record, the context it left, the blob
    ids it used, and the Outcome counters it sets (breaker, last microcompact)."""

    results: tuple[StageResult, ...]
    context: ActiveContext
    blobs: int = 0
    counters: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Stage:
    """One stage of process_request()'s pipeline."""

    name: str  # its switch: process_request(enable_<name>=False) skips it
    run: Callable[[ActiveContext, EngineInputs], Ran | None]  # pure; None: nothing to do
    weights: Mapping[CompactStrategy, int]  # the strategies it records, by weight
    # Whether it would cut on this context (None: it never cuts, a cheap stage).
    cuts: Callable[[ActiveContext, EngineInputs], bool] | None = None

    @property
    def switch(self) -> str:
        return f"enable_{self.name}"


def _tool_budget(context: ActiveContext, inputs: EngineInputs) -> Ran | None:
    stage = tool_budget.run(context, inputs)
    if not stage.attempted:
        return None
    return Ran((stage,), stage.context, len(stage.blobs))


def _microcompact(context: ActiveContext, inputs: EngineInputs) -> Ran | None:
    # Under append_only, microcompact is the provider's server-side edit, carried by
    # request_params(): nothing sent is cleared in place. On a model that checks thinking
    # prefixes it waits for the end of a tool loop with thinking (a clear inside one would
    # invalidate the loop's thinking, which the next request must send).
    if inputs.edit_policy == "append_only" or (inputs.prefix_checks and context.continues_thinking):
        return None
    micro = microcompact.run(context, inputs)
    if not micro.attempted:
        return None
    timed = micro.trigger == CompactTrigger.MICROCOMPACT_TIME
    counters = {"last_microcompact_at": inputs.now} if timed else {}
    if not micro.effective:  # clearing only results shorter than the placeholder grows
        return Ran((micro,), context, 0, counters)
    return Ran((micro,), micro.context, len(micro.blobs), counters)


def _auto_compact(context: ActiveContext, inputs: EngineInputs) -> Ran | None:
    if not auto_compact.should_trigger(context, inputs):
        return None
    result = auto_compact.dispatch(context, inputs)
    counters = {"consecutive_failures": result.consecutive_failures, "tripped": result.tripped}
    return Ran(tuple(result.stages), result.context, 0, counters)


# The pipeline, in order. read_dedup is no stage of it: it runs as each tool result is
# appended.
PROCESS_STAGES: list[Stage] = []

# Strategies no stage of the pipeline records, by weight: when several stages act in one
# call, the result's strategy is the heaviest of them.
_OTHER_WEIGHTS: dict[CompactStrategy, int] = {
    CompactStrategy.READ_DEDUP: 0,
    CompactStrategy.PARTIAL: 4,
    CompactStrategy.REACTIVE: 6,
    CompactStrategy.POP: 7,
    CompactStrategy.CLEAR: 8,
}
STRATEGY_WEIGHT: dict[CompactStrategy, int] = dict(_OTHER_WEIGHTS)


def register(stage: Stage, *, before: str | None = None) -> Stage:
    """Add ``stage`` to the pipeline, last or before the stage named ``before``."""
    names = [each.name for each in PROCESS_STAGES]
    if stage.name in names:
        raise ValueError(f"a stage named {stage.name!r} is registered already")
    place = len(names) if before is None else names.index(before)
    PROCESS_STAGES.insert(place, stage)
    STRATEGY_WEIGHT.update(stage.weights)
    return stage


def unregister(name: str) -> Stage:
    """Take the stage named ``name`` out of the pipeline (a stage added for a while, as a
    test does); the strategy weights are those of the stages left."""
    stage = next((each for each in PROCESS_STAGES if each.name == name), None)
    if stage is None:
        raise ValueError(f"no stage named {name!r} is registered")
    PROCESS_STAGES.remove(stage)
    STRATEGY_WEIGHT.clear()
    STRATEGY_WEIGHT.update(_OTHER_WEIGHTS)
    for each in PROCESS_STAGES:
        STRATEGY_WEIGHT.update(each.weights)
    return stage


def switches() -> frozenset[str]:
    """The ``enable_<name>`` switch of every registered stage."""
    return frozenset(stage.switch for stage in PROCESS_STAGES)


def weight_of(strategy: CompactStrategy) -> int:
    return STRATEGY_WEIGHT[strategy]


register(Stage("tool_budget", _tool_budget, {CompactStrategy.TOOL_BUDGET: 1}))
register(Stage("microcompact", _microcompact, {CompactStrategy.MICROCOMPACT: 2}))
register(
    Stage(
        "auto_compact",
        _auto_compact,
        {CompactStrategy.SESSION_MEMORY: 3, CompactStrategy.FULL: 5, CompactStrategy.PROVIDER: 5},
        cuts=auto_compact.should_trigger,
    )
)
