"""The steps of a compaction call and the driver that runs them.

:func:`compactstore._core.compaction.compaction_steps` is a generator of :data:`Op` values
so that one copy of the rules serves every driver: :func:`drive` runs each step here (the
sync store) or hands it on through the store's hooks (the async store runs ``Read`` and
``Write`` in its step threads, ``Compute`` in its decide threads, ``Wait`` with
``asyncio.sleep``). With ``pause=True`` it stops before a step that waits, so a call can
start in one thread and go on in another (:class:`Paused`).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy import Connection

__all__ = ["Compute", "Op", "Paused", "Read", "Wait", "Write", "drive"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Read:
    """Run ``fn`` in a read transaction; its value is sent back."""

    fn: Callable[[Connection], Any]


@dataclass(frozen=True, slots=True)
class Write:
    """Run ``fn`` in one write transaction; its value is sent back."""

    fn: Callable[[Connection], Any]


@dataclass(frozen=True, slots=True)
class Compute:
    """Run ``fn`` with no transaction open (the engines and the caller's summarizer; an
    async driver runs it off the event loop). ``waits``: it calls the caller's summarizer,
    so it may take seconds."""

    fn: Callable[[], Any]
    waits: bool = False


@dataclass(frozen=True, slots=True)
class Wait:
    """Sleep this many seconds (waiting for another caller's lease)."""

    seconds: float


Op = Read | Write | Compute | Wait


class Paused(Exception):  # a signal to the driver's caller, not an error
    """Raised by :func:`drive` with ``pause=True`` before a step that waits (a Compute
    that calls the summarizer, a Wait for another caller's lease), without running it:
    ``drive(paused.steps, ..., first=paused.op)`` goes on from there, in another thread
    if need be (the async store hands the rest of a call from a step thread to its loop)."""

    def __init__(self, steps: Generator[Op, Any, Any], op: Op) -> None:
        super().__init__("the compaction call paused before a step that waits")
        self.steps = steps
        self.op = op


def drive(
    steps: Generator[Op, Any, T],
    read: Callable[[Callable[[Connection], Any]], Any],
    write: Callable[[Callable[[Connection], Any]], Any],
    sleep: Callable[[float], object],
    compute: Callable[[Callable[[], Any]], Any] | None = None,
    *,
    first: Op | None = None,
    pause: bool = False,
) -> T:
    """Run a generator of steps; an error of a step is thrown into it. ``compute`` runs a
    Compute step (default: here; the async store's runs it off its event loop).
    ``first``: the step a :class:`Paused` stopped before; ``pause``: raise :class:`Paused`
    before a step that waits."""
    value: Any = None
    error: BaseException | None = None
    op: Op | None = first
    while True:
        if op is None:
            try:
                op = steps.throw(error) if error is not None else steps.send(value)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
        if pause and (isinstance(op, Wait) or (isinstance(op, Compute) and op.waits)):
            raise Paused(steps, op)
        value, error = None, None
        try:
            if isinstance(op, Read):
                value = read(op.fn)
            elif isinstance(op, Write):
                value = write(op.fn)
            elif isinstance(op, Compute):
                value = op.fn() if compute is None else compute(op.fn)
            else:
                sleep(op.seconds)
        except BaseException as exc:  # handed to the steps, which re-raise it
            error = exc
        op = None
