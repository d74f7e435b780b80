"""What a compaction call is given: the caller's plug-ins, the session it works on
(:class:`Target`) and the request, one per kind of call (process, background, reactive,
manual). :mod:`compactstore._core.compaction` runs it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Literal

from compactstore._context.active import ActiveContext
from compactstore._context.tokens import TokenCounter
from compactstore._core.cache import ContextCache
from compactstore._core.summarizing import Redactor
from compactstore._engines import pipeline
from compactstore._engines.base import EngineInputs, Summarizer
from compactstore._engines.pipeline import Outcome
from compactstore._engines.session_memory import MemoryProvider
from compactstore._engines.stages import PROCESS_STAGES, switches
from compactstore.errors import InvalidInputError
from compactstore.formats import MessageFormat
from compactstore.pricing import PriceTable

__all__ = [
    "LEASE_GRACE_SECONDS",
    "Decide",
    "Plugins",
    "Request",
    "Target",
    "background_request",
    "manual_request",
    "process_request",
    "reactive_request",
]

# Seconds added to summarizer_timeout_seconds for a lease's lifetime.
LEASE_GRACE_SECONDS = 30.0

# A pure decision: the pipeline to run on the snapshot; None when there is nothing to do
# (reactive recovery out of attempts).
Decide = Callable[[ActiveContext, EngineInputs], Outcome | None]


@dataclass(frozen=True, slots=True)
class Plugins:
    """The caller's code a compaction may run; none of it ever runs in a write
    transaction."""

    count_tokens: TokenCounter
    summarizer: Summarizer | None = None
    memory_provider: MemoryProvider | None = None
    summarizer_name: str | None = None
    executor: Executor | None = None  # bounded: where sync summarizers run
    redactor: Redactor | None = None
    loop: asyncio.AbstractEventLoop | None = None  # where async summarizers are awaited
    compactor: Any = None  # a provider compactor (compactstore.providers)


@dataclass(frozen=True, slots=True)
class Target:
    """The session a compaction works on, as the driver knows it."""

    session_id: str
    adapter: MessageFormat
    cache: ContextCache
    location: str
    # The store's prices (compactstore.pricing): a provider compaction's billed usage is
    # recorded as a model call with its cost, and the cost rule of in-place edits.
    prices: PriceTable | None = None


@dataclass(frozen=True, slots=True)
class Request:
    """One compaction call: what to decide, and what to record with it for replay."""

    call: Literal["process", "reactive", "manual", "background"]  # recorded for replay
    now: float
    decide: Decide
    options: dict[str, Any] = field(default_factory=dict)  # EngineRun fields of the call
    instructions: str | None = None
    error: str | None = None
    started_by: int | None = None  # a background compaction: the starting call's row

    def cuts(self, context: ActiveContext, inputs: EngineInputs) -> bool:
        """Whether deciding this call on this context may cut (and so may need the lease).
        The cheap stages only lower usage, so a process call whose context is below the
        auto-compact threshold never cuts."""
        if self.call != "process":
            return True
        return any(
            stage.cuts is not None
            and self.options.get(stage.switch, True)
            and stage.cuts(context, inputs)
            for stage in PROCESS_STAGES
        )

    def cheap(self) -> Request | None:
        """This call with the cheap stages only (tool budget, microcompact); None for calls
        that are a cut and nothing else."""
        if self.call != "process":
            return None
        cutting = {stage.switch: False for stage in PROCESS_STAGES if stage.cuts is not None}
        return process_request(self.now, **{**self.options, **cutting})


def process_request(now: float, **flags: bool) -> Request:
    """process_request(): the pre-call pipeline with its stage switches (the
    ``enable_<name>`` of a registered stage; any other keyword is a TypeError naming it,
    as Python's own for an unexpected keyword argument)."""
    known = switches()
    for name in flags:
        if name not in known:
            raise TypeError(f"process_request() got an unexpected keyword argument {name!r}")

    def decide(context: ActiveContext, inputs: EngineInputs) -> Outcome:
        return pipeline.process(context, inputs, **flags)

    return Request("process", now, decide, options=dict(flags))


def background_request(now: float, started_by: int | None) -> Request:
    """A background compaction a process_request(background=True) started."""
    return Request("background", now, pipeline.background, started_by=started_by)


def reactive_request(now: float, error: str) -> Request:
    """reactive_recover(): the next recovery attempt."""
    return Request("reactive", now, pipeline.recover, error=error)


def manual_request(now: float, instructions: str | None, up_to_seq: int | None) -> Request:
    """compact(): a full compact now, or a partial one up to a seq."""

    def decide(context: ActiveContext, inputs: EngineInputs) -> Outcome:
        if up_to_seq is not None and up_to_seq > context.last_seq:
            raise InvalidInputError(
                f"up_to_seq {up_to_seq} is past the last message (seq {context.last_seq})"
            )
        if up_to_seq is not None and up_to_seq < context.first_kept_seq:
            raise InvalidInputError(
                f"up_to_seq {up_to_seq} is already summarised: the active context starts "
                f"at seq {context.first_kept_seq}"
            )
        return pipeline.manual(context, inputs, up_to_seq=up_to_seq)

    return Request(
        "manual", now, decide, options={"up_to_seq": up_to_seq}, instructions=instructions
    )
