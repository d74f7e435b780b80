"""Reading a session: the provider call's parameters and the wire view, each extended step
by step from what the handle built last, and the log a page at a time."""

from __future__ import annotations

import functools
import json
import operator
from collections.abc import Iterator, Mapping
from typing import Any, cast

from sqlalchemy import Connection

from compactstore._context.active import ActiveContext
from compactstore._context.caching import Ttl, call_gap, choose_ttl, min_cacheable_tokens
from compactstore._context.frozen import freeze
from compactstore._context.request_view import RequestView
from compactstore._core import handle, sessions
from compactstore._core.cache_inputs import RHYTHM_CALLS
from compactstore._core.checks import check_id, now_or_clock
from compactstore._session.state import HandleState, SessionHandle
from compactstore.capabilities import EditPolicy, capabilities_for, resolve_policy
from compactstore.db import model_calls
from compactstore.db import repository as repo
from compactstore.errors import InvalidInputError, NotFoundError
from compactstore.formats import PROVIDER_FORMATS
from compactstore.formats.compaction import compaction_block
from compactstore.formats.request import clear_trigger, session_fields
from compactstore.models import EditState

__all__ = [
    "blob",
    "context_view",
    "current",
    "edit_policy",
    "edit_state",
    "iter_messages",
    "request_params",
]


def request_params(
    session: SessionHandle,
    state: HandleState,
    cache_control: bool,
    thinking: Mapping[str, Any] | None,
    extra_headers: Mapping[str, str] | None,
    now: float | None,
) -> dict[str, Any]:
    """Session.request_params()."""
    if not isinstance(cache_control, bool):
        raise InvalidInputError("cache_control must be True or False")
    adapter = session.adapter
    if adapter.request_key is None:
        raise InvalidInputError(
            f"request_params() needs a provider format ({', '.join(PROVIDER_FORMATS)}); "
            f"{session.format} messages go to no provider API as they are"
        )
    for name, value in (("thinking", thinking), ("extra_headers", extra_headers)):
        if value is not None and not isinstance(value, Mapping):
            raise InvalidInputError(f"{name} must be a mapping, got {value!r}")
    context = current(session, state, hand_out=True)
    policy, prefix_checks = edit_policy(session)
    capabilities = capabilities_for(session.model, session.store.model_capabilities)
    ttl: Ttl = "5m"
    server_clear: int | None = None
    if cache_control and adapter.prompt_caching:
        ttl = choose_ttl(_call_gap(session))
        trigger = clear_trigger(session.context_window, session.config)
        if policy == "append_only" and capabilities.context_editing and context.usage >= trigger:
            server_clear = session.config.microcompact_keep_recent
    if state.requests is None:
        state.requests = RequestView()
    params = state.requests.params(
        context,
        session.config,
        cache_control=cache_control,
        ttl=ttl,
        min_tokens=min_cacheable_tokens(session.model),
        server_clear=server_clear,
    )
    if not adapter.prompt_caching:
        return params
    if session.thinking_binding is None and prefix_checks and context.continued_thinking_changed:
        _set_thinking_binding(session, now)
    params.update(
        session_fields(
            edit_policy=policy,
            capabilities=capabilities,
            config=session.config,
            context_window=session.context_window,
            drop_block=session.thinking_binding == "drop_block",
            thinking=thinking,
            extra_headers=extra_headers,
            provider_compaction=bool(params["messages"])
            and compaction_block(params["messages"][0]) is not None,
        )
    )
    return params


def edit_policy(session: SessionHandle) -> tuple[EditPolicy, bool]:
    """Session.edit_policy()."""
    return resolve_policy(
        session.config.edit_policy, session.model, session.store.model_capabilities
    )


def _call_gap(session: SessionHandle) -> float | None:
    """The median gap between the session's recent model calls (None: under two)."""
    calls = session.store.read(
        lambda connection: model_calls.recent_calls(connection, session.id, RHYTHM_CALLS)
    )
    return call_gap([at for _, at in calls])


def _set_thinking_binding(session: SessionHandle, now: float | None) -> None:
    at = now_or_clock(now)

    def tx(connection: Connection) -> None:
        row = handle.locked(session, connection)
        if row.thinking_binding is None:
            repo.update_session(
                connection, session.id, thinking_binding="drop_block", thinking_binding_at=at
            )

    session.store.write(tx)
    session.thinking_binding = "drop_block"


def current(session: SessionHandle, state: HandleState, *, hand_out: bool) -> ActiveContext:
    """The active context; ``hand_out``: the agent will send it, so a real count reported
    next is measured on its version."""
    store = session.store

    def read(connection: Connection) -> ActiveContext:
        context = handle.context(session, connection)
        entry = store.cache.get(session.id)
        if hand_out and entry is not None and entry.answered is context:
            state.handed_version = entry.context_version
        return context

    return store.read(read)


def context_view(session: SessionHandle, state: HandleState) -> tuple[Mapping[str, Any], ...]:
    """Session.context_view(): the wire view, extended from the handle's last one when the
    context only grew."""
    context = current(session, state, hand_out=True)
    adapter, config = session.adapter, session.config
    wire, lineage = context.wire, context.lineage
    cached = state.view
    if cached is not None and cached[1] is config:
        old, view_before = cached[0], cached[2]
        if old is wire:
            return view_before
        if cached[3] is lineage and len(wire) >= len(old):
            # Only appended since: the view of what stood before the restart point
            # stands, and only the rest is built again. With thinking, an append may
            # also leave out the thinking of earlier messages (the newest turn moved on):
            # then the view stands up to the first message that changed.
            same = len(old)
            if context.carries_thinking and not all(map(operator.is_, old, wire)):
                same = next(
                    i for i, (a, b) in enumerate(zip(old, wire, strict=False)) if a is not b
                )
            start = adapter.wire_restart(old if same == len(old) else old[:same])
            keep = len(view_before) if start == len(old) else _index(view_before, old[start])
            if keep is not None:
                tail = adapter.wire_view(
                    list(cast("tuple[dict[str, Any], ...]", wire[start:])), config
                )
                grown = view_before[:keep] + tuple(freeze(message) for message in tail)
                state.view = (wire, config, grown, lineage)
                return grown
    # The frozen messages are dicts (FrozenDict); the wire view never changes them.
    view = adapter.wire_view(list(cast("tuple[dict[str, Any], ...]", wire)), config)
    if len(view) == len(wire) and all(a is b for a, b in zip(view, wire, strict=True)):
        result = wire
    else:
        result = tuple(freeze(message) for message in view)  # frozen ones as they are
    state.view = (wire, config, result, lineage)
    return result


def _index(view: tuple[Mapping[str, Any], ...], message: Mapping[str, Any]) -> int | None:
    """Where ``message`` itself (not an equal one) stands in ``view``, looking from the end."""
    for index in range(len(view) - 1, -1, -1):
        if view[index] is message:
            return index
    return None


def iter_messages(session: SessionHandle, page: int) -> Iterator[dict[str, Any]]:
    """Session.iter_messages(): the log as it stood when iteration began, ``page``
    messages at a time."""
    store = session.store
    last = store.read(lambda c: repo.last_message(c, session.id))
    after, end = -1, (-1 if last is None else last.seq)
    while after < end:
        rows = store.read(
            functools.partial(
                repo.log_page, session_id=session.id, after_seq=after, up_to_seq=end, limit=page
            )
        )
        if not rows:
            return  # the session was deleted meanwhile
        for seq, payload in rows:
            after = seq
            yield json.loads(payload)


def edit_state(session: SessionHandle) -> EditState:
    """Session.edit_state()."""
    store = session.store
    return store.read(
        functools.partial(
            sessions.edit_state,
            session_id=session.id,
            location=store.location,
            capabilities=store.model_capabilities,
        )
    )


def blob(session: SessionHandle, blob_id: int) -> str:
    """Session.get_blob()."""
    check_id(blob_id, "blob", session.id)

    def read(connection: Connection) -> str | None:
        row = repo.get_blob(connection, session.id, blob_id)
        # Decoded inside the read, so a damaged blob is a DatabaseError naming the file.
        return None if row is None else bytes(row.content).decode("utf-8")

    content = session.store.read(read)
    if content is None:
        raise NotFoundError(f"no blob {blob_id} in session {session.id!r}")
    return content
