"""The stage registry (compactstore._engines.stages): the pipeline's order, switches and
weights come from its declarations, and a registered stage runs in the pipeline, is
switched off by its switch and, when it may cut, is left out of the cheap stages."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from compactstore._core.calls import process_request
from compactstore._core.replay_inputs import EngineRun
from compactstore._engines import pipeline, stages
from compactstore._engines.base import EngineInputs
from compactstore._engines.stages import PROCESS_STAGES, STRATEGY_WEIGHT, Ran, Stage, register
from compactstore.models import CompactStrategy
from tests.engines.builder import ContextBuilder
from tests.helpers import words

NOW = 1_700_010_000.0


@pytest.fixture
def registry() -> Iterator[None]:
    """The registry restored after the test, in place (the pipeline reads that list)."""
    saved, weights = list(PROCESS_STAGES), dict(STRATEGY_WEIGHT)
    yield
    PROCESS_STAGES[:] = saved
    STRATEGY_WEIGHT.clear()
    STRATEGY_WEIGHT.update(weights)


def test_the_pipeline_is_the_registered_stages_and_every_strategy_has_a_weight() -> None:
    assert [stage.name for stage in PROCESS_STAGES] == [
        "tool_budget",
        "microcompact",
        "auto_compact",
    ]
    assert set(STRATEGY_WEIGHT) == set(CompactStrategy)
    order = sorted(CompactStrategy, key=stages.weight_of)
    assert order[0] == CompactStrategy.READ_DEDUP and order[-1] == CompactStrategy.CLEAR
    # Only auto-compact cuts: the others are the cheap stages.
    assert [stage.name for stage in PROCESS_STAGES if stage.cuts is not None] == ["auto_compact"]


def test_an_unknown_switch_is_refused() -> None:
    context = ContextBuilder().request("Hi.").build()
    with pytest.raises(TypeError, match="enable_nothing"):
        pipeline.process(context, EngineInputs(now=NOW), enable_nothing=False)


@pytest.mark.usefixtures("registry")
def test_a_registered_stage_runs_in_its_place_and_its_switch_turns_it_off() -> None:
    seen: list[str] = []

    def first(context: object, inputs: EngineInputs) -> Ran | None:
        seen.append("first")
        return None  # nothing to do

    register(Stage("first", first, {CompactStrategy.TOOL_BUDGET: 1}), before="tool_budget")
    assert PROCESS_STAGES[0].name == "first"
    long = words(9_000, "long")
    context = ContextBuilder().request("Read.").tool("read_file", {"path": "a"}, long).build()
    inputs = EngineInputs(now=NOW, last_microcompact_at=NOW)
    outcome = pipeline.process(context, inputs)
    assert seen == ["first"]
    assert outcome.strategy == CompactStrategy.TOOL_BUDGET
    pipeline.process(context, inputs, enable_first=False)
    assert seen == ["first"]
    with pytest.raises(ValueError, match="registered already"):
        register(Stage("first", first, {}))


@pytest.mark.usefixtures("registry")
def test_a_stage_that_may_cut_is_left_out_of_the_cheap_stages_and_decides_whether_a_call_cuts() -> (
    None
):
    def budget_again(context: object, inputs: EngineInputs) -> Ran | None:
        raise AssertionError("switched off in the cheap stages")

    register(
        Stage(
            "heavy",
            budget_again,
            {CompactStrategy.TOOL_BUDGET: 1},
            cuts=lambda context, inputs: context.usage > 0,
        )
    )
    context = ContextBuilder().request("Hi.").chatter(2).build()
    inputs = EngineInputs(now=NOW, last_microcompact_at=NOW)
    request = process_request(NOW)
    assert request.cuts(context, inputs)  # the new stage would cut
    cheap = request.cheap()
    assert cheap is not None
    assert cheap.options == {"enable_auto_compact": False, "enable_heavy": False}
    assert not cheap.cuts(context, inputs)
    assert cheap.decide(context, inputs) is not None  # runs without the heavy stage


@pytest.mark.usefixtures("registry")
def test_a_registered_stages_switch_is_recorded_for_replay() -> None:
    register(Stage("first", lambda context, inputs: None, {}), before="tool_budget")
    context = ContextBuilder().request("Hi.").build()
    inputs = EngineInputs(now=NOW)
    flags = {"enable_first": False, "enable_microcompact": False}
    recorded = EngineRun.of("process", inputs, context, flags)
    again = EngineRun.model_validate_json(recorded.model_dump_json())
    assert again.switches() == {
        "enable_first": False,
        "enable_tool_budget": True,
        "enable_microcompact": False,
        "enable_auto_compact": True,
    }
    # A row recorded before the stage was registered: the stage ran.
    older = EngineRun.of("process", inputs, context, {})
    assert older.switches()["enable_first"] is True
