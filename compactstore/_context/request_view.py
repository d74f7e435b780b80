"""The messages of ``request_params()``, kept up to date step by step like the context view.

A step of an agent appends a few messages to a context of hundreds; the request it sends is
the one before with a new tail (the wire view of the messages from the format's restart
point on: merged tool results, thinking the context leaves out, text content as blocks
when breakpoints are placed) and its cache breakpoints moved (at most four messages, rebuilt
for each request). An edit (microcompact clearing a result near the tail) rebuilds from the
first message that changed; a cut or rollback that changed the first messages, a config
change or another ``cache_control`` builds the request again once from the whole context.

What the caller receives is a fresh ``dict`` and a fresh list of messages; the messages are
the store's read-only ones (:mod:`compactstore._context.frozen`), shared with
``context_view()``: the
provider SDKs copy what they send and change none of it (tests pass every format's request
through the real SDK clients), and a caller that tries gets a ``TypeError``, not a corrupted
cache. The result equals :func:`compactstore.formats.request.build_request_params` on fresh
copies of the context's messages (a property test compares them after any sequence of
appends, compactions, rollbacks and config changes).
"""

from __future__ import annotations

import operator
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, cast

from compactstore._context.caching import Ttl
from compactstore._context.frozen import freeze, thaw
from compactstore._context.incremental import CACHE_INDEX
from compactstore.formats.compaction import compaction_block
from compactstore.formats.request import (
    breakpoints,
    build_request_params,
    cache_control_of,
    marked_block,
    system_param,
)

if TYPE_CHECKING:
    from compactstore._context.active import ActiveContext
    from compactstore.formats import MessageFormat

__all__ = ["RequestView"]

Message = Mapping[str, Any]


@dataclass(frozen=True)
class _State:
    """The request as last built, and what it was built from. Never changed: a call builds
    the next one and swaps it in, so calls from two threads each see a whole one."""

    lineage: object
    config: object
    cache_control: bool
    wire: tuple[Message, ...] = ()
    at: tuple[int, ...] = ()  # wire index of each message of ``sent``
    sent: tuple[Message, ...] = ()  # prepared messages (anthropic: no system message)
    system: tuple[int, ...] = ()  # wire indexes of the system messages (anthropic)
    led: int | None = None  # position in ``sent`` of the first compaction block
    view: tuple[Message, ...] = ()  # the format's wire view of sent[led or 0:]


class RequestView:
    """One session's request messages, extended by appends (see the module docstring)."""

    def __init__(self) -> None:
        self.state: _State | None = None

    def params(
        self,
        context: ActiveContext,
        config: Any,
        *,
        cache_control: bool,
        ttl: Ttl = "5m",
        min_tokens: int = 0,
        server_clear: int | None = None,
    ) -> dict[str, Any]:
        """:func:`compactstore.formats.request.build_request_params` for ``context``."""
        fmt = context.fmt
        anthropic = fmt.name == "anthropic"
        cache_control = cache_control and anthropic
        try:
            state = self._update(context, config, cache_control, split=anthropic)
        except RecursionError:  # a message nested very deep: copies the long way cope
            self.state = None
            return build_request_params(
                fmt,
                config,
                context.items,
                context.messages(),
                cache_control=cache_control,
                ttl=ttl,
                min_tokens=min_tokens,
                server_clear=server_clear,
            )
        if not anthropic:
            return {"input" if fmt.name == "responses" else "messages": list(state.view)}
        messages = list(state.view)
        system_marked = False
        control = cache_control_of(ttl)
        if cache_control:
            marks = breakpoints(context.value(CACHE_INDEX), min_tokens, server_clear)
            system_marked = any(mark in state.system for mark in marks)
            if not all(_mark(state, messages, mark, control) for mark in marks):
                self.state = None  # not expected: the request the long way
                return build_request_params(
                    fmt,
                    config,
                    context.items,
                    context.messages(),
                    cache_control=cache_control,
                    ttl=ttl,
                    min_tokens=min_tokens,
                    server_clear=server_clear,
                )
        params: dict[str, Any] = {}
        if state.system:
            system = [state.wire[index] for index in state.system]
            params["system"] = thaw(system_param(system, control if system_marked else None))
        params["messages"] = messages
        return params

    def _update(
        self, context: ActiveContext, config: Any, cache_control: bool, *, split: bool
    ) -> _State:
        wire = context.wire
        state = self.state
        if state is None or state.config is not config or state.cache_control != cache_control:
            state = _State(context.lineage, config, cache_control)
            start = 0
        elif state.wire is wire:
            return state
        elif (
            state.lineage is context.lineage
            and len(wire) >= len(state.wire)
            and not context.carries_thinking
        ):
            start = len(state.wire)  # only appended since
        else:
            # Edited (microcompact clears a result near the tail), cut or rolled back: what
            # stands before the first message that is not the same object stands.
            start = _common(state.wire, wire)
        state = _extended(state, context.fmt, wire, start, config, split=split)
        state = replace(state, lineage=context.lineage)
        self.state = state
        return state


def _common(old: tuple[Message, ...], new: tuple[Message, ...]) -> int:
    """How many leading messages ``old`` and ``new`` share (the same objects: read-only,
    so the same content; ``old`` keeps them alive, so an id is not reused)."""
    same = list(map(operator.is_, old, new))
    try:
        return same.index(False)
    except ValueError:
        return len(same)


def _prepared(message: Message, cache_control: bool) -> Message:
    """The message as sent: with breakpoints placed, text content as one block on every
    message (a message whose bytes changed when a breakpoint moved on would make the next
    call miss the cache from it on)."""
    content = message.get("content")
    if cache_control and isinstance(content, str):
        prepared: Message = freeze({**message, "content": [{"type": "text", "text": content}]})
        return prepared
    return message


def _extended(
    state: _State,
    fmt: MessageFormat,
    wire: tuple[Message, ...],
    start: int,
    config: Any,
    *,
    split: bool,
) -> _State:
    """``state`` for ``wire``, whose messages before ``start`` are those it was built from."""
    keep, old_len = bisect_left(state.at, start), len(state.sent)
    at, sent = list(state.at[:keep]), list(state.sent[:keep])
    system = list(state.system[: bisect_left(state.system, start)])
    for index in range(start, len(wire)):
        message = wire[index]
        if split and message.get("role") == "system":
            system.append(index)
        else:
            at.append(index)
            sent.append(_prepared(message, state.cache_control))
    led = state.led
    if split and (led is None or led >= keep):
        # Nothing before ``keep`` starts with a compaction block but ``led``, if it is there.
        led = next((i for i in range(keep, len(sent)) if compaction_block(sent[i])), None)
    first = led or 0
    view: tuple[Message, ...] | None = None
    if led == state.led and keep > first:
        restart = first + fmt.wire_restart(sent[first:keep])
        kept: int | None = None
        if restart < keep:
            kept = _index(state.view, sent[restart])
        elif keep == old_len:
            kept = len(state.view)
        if kept is not None:
            view = state.view[:kept] + _view(fmt, sent[restart:], config)
    if view is None:
        view = _view(fmt, sent[first:], config)
    return replace(
        state,
        wire=wire,
        at=tuple(at),
        sent=tuple(sent),
        system=tuple(system),
        led=led,
        view=view,
    )


def _view(fmt: MessageFormat, messages: Sequence[Message], config: Any) -> tuple[Message, ...]:
    # The frozen messages are dicts (FrozenDict); the wire view never changes them.
    view = fmt.wire_view(list(cast("Sequence[dict[str, Any]]", messages)), config)
    return tuple(freeze(message) for message in view)


def _index(view: tuple[Message, ...], message: Message) -> int | None:
    """Where ``message`` itself (not an equal one) stands in ``view``, from the end."""
    for index in range(len(view) - 1, -1, -1):
        if view[index] is message:
            return index
    return None


def _mark(state: _State, messages: list[Message], mark: int, control: dict[str, str]) -> bool:
    """A breakpoint on the message at wire index ``mark`` (a system message's is placed on
    the system parameter), wherever the wire view put its block (merged tool results)."""
    position = bisect_left(state.at, mark)
    if position == len(state.at) or state.at[position] != mark:
        return True  # a system message
    if state.led is not None and position < state.led:
        return True  # before the provider's compaction block: not sent
    source = state.sent[position]
    at = marked_block(source)
    if at is None:
        return True
    block = source["content"][at]
    order = (
        range(len(messages) - 1, -1, -1) if 2 * position > len(state.at) else range(len(messages))
    )
    for index in order:
        content = messages[index].get("content")
        if isinstance(content, list) and any(b is block for b in content):
            marked = [{**b, "cache_control": dict(control)} if b is block else b for b in content]
            messages[index] = freeze({**messages[index], "content": marked})
            return True
    return False  # the wire view left the message out
