"""The suite closes an event loop a test leaves set, so it is never collected later, inside
another test, with a ResourceWarning (pytest's filterwarnings=error makes that a failure of
whichever test runs when the garbage collector does)."""

from __future__ import annotations

import asyncio
import gc
import warnings

import pytest

from tests.conftest import close_event_loop_left_set


def _leave_a_loop_set() -> asyncio.AbstractEventLoop:
    """What pydantic-ai's run_sync does: a new loop, set on the thread, never closed."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    loop.run_until_complete(asyncio.sleep(0))
    return loop


def test_a_loop_left_set_is_closed_and_unset() -> None:
    loop = _leave_a_loop_set()
    assert close_event_loop_left_set()
    assert loop.is_closed()
    with pytest.raises(RuntimeError), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        asyncio.get_event_loop_policy().get_event_loop()


def test_a_loop_left_open_warns_when_collected() -> None:
    """Why the suite closes it: the warning the collector raises for an open loop."""
    loop = _leave_a_loop_set()
    asyncio.set_event_loop(None)
    with pytest.warns(ResourceWarning, match="unclosed event loop"):
        del loop
        gc.collect()


def test_nothing_is_closed_when_no_loop_was_left() -> None:
    asyncio.run(asyncio.sleep(0))  # asyncio.run closes and unsets its own loop
    assert not close_event_loop_left_set()
