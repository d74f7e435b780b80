"""process_request() takes the switch of every registered stage: a stage added to
compactstore._engines.stages is switched by its ``enable_<name>=`` keyword through the public
API, the sync and async session alike, the switch is recorded for replay, and any other
keyword is a TypeError naming it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from compactstore import AsyncCompactStore, CompactStore
from compactstore._context.active import ActiveContext
from compactstore._engines import full_compact
from compactstore._engines.base import EngineInputs
from compactstore._engines.stages import (
    PROCESS_STAGES,
    STRATEGY_WEIGHT,
    Ran,
    Stage,
    register,
    unregister,
)
from compactstore.models import CompactStrategy, CompactTrigger
from tests.conftest import Snapshot
from tests.helpers import T0, Chat, new_session, opened

# The toy stage cuts a context of more than this many kept messages, whatever its usage.
_MOST = 12


def _squashes(context: ActiveContext, inputs: EngineInputs) -> bool:
    return len(context.kept) > _MOST


@pytest.fixture
def squash() -> Iterator[list[float]]:
    """A toy stage ``squash`` registered first in the pipeline for the test (a full compact
    of any context longer than twelve messages); yields the times it ran at."""
    ran: list[float] = []
    weights = dict(STRATEGY_WEIGHT)

    def run(context: ActiveContext, inputs: EngineInputs) -> Ran | None:
        ran.append(inputs.now)
        if not _squashes(context, inputs):
            return None
        stage = full_compact.run(context, inputs, trigger=CompactTrigger.AUTO)
        return Ran((stage,), stage.context)

    register(Stage("squash", run, {CompactStrategy.FULL: 5}, cuts=_squashes), before="tool_budget")
    try:
        yield ran
    finally:
        unregister("squash")
    assert [stage.name for stage in PROCESS_STAGES] == [
        "tool_budget",
        "microcompact",
        "auto_compact",
    ]
    assert weights == STRATEGY_WEIGHT


def _talk(store: CompactStore, sid: str, context_window: int = 200_000) -> Chat:
    chat = new_session(store, sid=sid, context_window=context_window)
    chat.request("Port the parser to Rust, keeping the tests green.")
    chat.chatter(20, chars=400)
    return chat


def test_a_registered_stage_is_switched_by_its_keyword_and_replay_runs_it_again(
    store: CompactStore, squash: list[float]
) -> None:
    off = _talk(store, "off").sess
    nothing = off.process_request(now=T0 + 100, enable_squash=False)
    assert squash == []  # switched off: not run
    assert not nothing.success and nothing.strategy is None
    assert off.compactions() == []

    on = _talk(store, "on").sess
    before = len(on.context().items)
    result = on.process_request(now=T0 + 100, enable_auto_compact=False)
    assert squash == [T0 + 100]  # on by default: it ran, and cut
    assert result.success and result.strategy == CompactStrategy.FULL
    assert result.boundary is not None and result.boundary.id is not None
    assert len(on.context().items) < before
    (recorded,) = on.compactions()
    assert recorded.id == result.id and recorded.removed_seqs == result.removed_seqs

    again = on.replay(result.boundary.id)
    assert squash == [T0 + 100, T0 + 100]  # replay ran it, at the recorded time
    assert again.summary_text == result.summary_text
    assert again.removed_seqs == result.removed_seqs


def test_a_stage_recorded_off_stays_off_in_replay(store: CompactStore, squash: list[float]) -> None:
    # A window the talk overfills: auto-compact cuts, the toy stage being off.
    sess = _talk(store, "s", context_window=2_400).sess
    result = sess.process_request(now=T0 + 100, enable_squash=False)
    assert squash == []
    assert result.success and result.boundary is not None and result.boundary.id
    # Replayed with the recorded switches: the toy stage (first in the pipeline, it
    # would cut before auto-compact and leave it nothing to do) stays off.
    again = sess.replay(result.boundary.id)
    assert squash == []
    assert again.removed_seqs == result.removed_seqs
    assert again.summary_text == result.summary_text


def test_an_unknown_switch_or_keyword_is_a_type_error_naming_it(
    store: CompactStore, db_snapshot: Snapshot, squash: list[float]
) -> None:
    sess = _talk(store, "s").sess
    before = db_snapshot(store)
    with pytest.raises(TypeError, match="unexpected keyword argument 'enable_nothing'"):
        sess.process_request(now=T0 + 100, enable_nothing=False)
    with pytest.raises(TypeError, match="unexpected keyword argument 'squash'"):
        sess.process_request(now=T0 + 100, squash=False)  # not a switch's spelling
    assert squash == []
    assert db_snapshot(store) == before


def test_a_switch_goes_with_its_stage(store: CompactStore) -> None:
    register(Stage("squash", lambda context, inputs: None, {}))
    unregister("squash")
    sess = _talk(store, "s").sess
    with pytest.raises(TypeError, match="'enable_squash'"):
        sess.process_request(now=T0 + 100, enable_squash=True)
    with pytest.raises(ValueError, match="no stage named 'squash'"):
        unregister("squash")


@pytest.mark.slow
def test_the_async_session_takes_the_same_switches(tmp_path: Path, squash: list[float]) -> None:
    pytest.importorskip("greenlet", reason="the async extra is not installed")
    url = str(tmp_path / "s.db")
    with opened(url) as store:
        _talk(store, "s")

    async def main() -> tuple[bool, bool]:
        async with await AsyncCompactStore.open(url) as aio:
            sess = await aio.get_session("s")
            off = await sess.process_request(now=T0 + 100, enable_squash=False)
            on = await sess.process_request(now=T0 + 101, enable_auto_compact=False)
            with pytest.raises(TypeError, match="'enable_nothing'"):
                await sess.process_request(now=T0 + 102, enable_nothing=True)
            return off.success, on.success and on.strategy == CompactStrategy.FULL

    assert asyncio.run(main()) == (False, True)
    assert squash == [T0 + 101]
