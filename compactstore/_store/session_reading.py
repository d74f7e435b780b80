"""Reading a session: its active context (the wire view, copied or shared read-only), the
provider call's parameters, usage and the log."""

from __future__ import annotations

import functools
import json
import operator
from collections.abc import Iterator, Mapping
from typing import Any, Literal, cast

from sqlalchemy import Connection

from compactstore._context.active import ActiveContext
from compactstore._context.caching import Ttl, call_gap, choose_ttl, min_cacheable_tokens
from compactstore._context.frozen import freeze, thaw
from compactstore._context.request_view import RequestView
from compactstore._core import handle
from compactstore._core.cache_inputs import RHYTHM_CALLS
from compactstore._core.checks import now_or_clock
from compactstore._core.sessions import edit_state
from compactstore._store.session_base import SessionBase
from compactstore.capabilities import capabilities_for, resolve_policy
from compactstore.db import model_calls
from compactstore.db import repository as repo
from compactstore.errors import InvalidInputError
from compactstore.formats import PROVIDER_FORMATS
from compactstore.formats.compaction import compaction_block
from compactstore.formats.request import clear_trigger, session_fields
from compactstore.models import EditState

__all__ = ["SessionReading"]


class SessionReading(SessionBase):
    """What the agent reads: the context to send, its size, and the log."""

    # request_params()'s messages, extended step by step (made on the first call).
    _requests: RequestView | None = None

    def request_params(
        self,
        cache_control: bool = False,
        *,
        thinking: Mapping[str, Any] | None = None,
        extra_headers: Mapping[str, str] | None = None,
        now: float | None = None,
    ) -> dict[str, Any]:
        """Keyword arguments for the provider call, from the wire view.

        anthropic: ``{"system": ..., "messages": [...]}`` (``system`` only when the session
        has system messages: their text, joined by blank lines, or their blocks); openai:
        ``{"messages": [...]}``; responses: ``{"input": [...]}``. With ``cache_control=True``
        (anthropic; the other APIs cache prefixes by themselves and ignore it) up to four
        cache breakpoints, best first: the end of the system prompt, the newest message
        (so the next call reads this whole request from the cache), the last message of
        the previous request (so this one reads what that one wrote), the last pinned
        message and the summary; none on a prefix shorter than the model's minimum
        cacheable length. Their writes last an hour when the session's recent calls came
        5 minutes to an hour apart (a 5-minute entry would be cold at each call), else 5
        minutes (compactstore._context.caching).

        anthropic: the caller's ``thinking`` settings and ``extra_headers`` come back merged
        with what the session needs, as keyword arguments ``messages.create`` (and
        ``beta.messages.create``) takes: under the ``append_only`` edit policy, microcompact
        as the server-side ``clear_tool_uses`` edit (``extra_body["context_management"]``
        and its beta header); on a model that checks thinking prefixes, once a cut inside a
        tool loop changed the prefix of thinking the request must send,
        ``thinking.block_binding.prefix_mismatch_behavior: "drop_block"`` with its beta
        header, on this and every later request of the session (recorded in
        ``sessions.thinking_binding`` at ``now``).

        The dict and its ``messages`` (``input``) list are the caller's; the messages in it
        are the store's read-only ones, shared with ``context_view()`` (the provider SDKs
        send them unchanged; copy one before changing it). A call after appends only costs
        what is new: the request is extended from the format's restart point.

        Raises:
            InvalidInputError: a minicode session (no provider API takes its messages), or
                ``thinking`` / ``extra_headers`` that are not mappings.
        """
        if not isinstance(cache_control, bool):
            raise InvalidInputError("cache_control must be True or False")
        if self.adapter.request_key is None:
            raise InvalidInputError(
                f"request_params() needs a provider format ({', '.join(PROVIDER_FORMATS)}); "
                f"{self.format} messages go to no provider API as they are"
            )
        for name, value in (("thinking", thinking), ("extra_headers", extra_headers)):
            if value is not None and not isinstance(value, Mapping):
                raise InvalidInputError(f"{name} must be a mapping, got {value!r}")
        context = self.context()
        ttl: Ttl = "5m"
        server_clear: int | None = None
        if cache_control and self.adapter.prompt_caching:
            ttl = choose_ttl(self._call_gap())
            policy, _ = self.edit_policy()
            editing = capabilities_for(self.model, self.store.model_capabilities).context_editing
            trigger = clear_trigger(self.context_window, self.config)
            if policy == "append_only" and editing and context.usage >= trigger:
                server_clear = self.config.microcompact_keep_recent
        if self._requests is None:
            self._requests = RequestView()
        params = self._requests.params(
            context,
            self.config,
            cache_control=cache_control,
            ttl=ttl,
            min_tokens=min_cacheable_tokens(self.model),
            server_clear=server_clear,
        )
        if not self.adapter.prompt_caching:
            return params
        policy, prefix_checks = self.edit_policy()
        if self.thinking_binding is None and prefix_checks and context.continued_thinking_changed:
            self._set_thinking_binding(now)
        params.update(
            session_fields(
                edit_policy=policy,
                capabilities=capabilities_for(self.model, self.store.model_capabilities),
                config=self.config,
                context_window=self.context_window,
                drop_block=self.thinking_binding == "drop_block",
                thinking=thinking,
                extra_headers=extra_headers,
                provider_compaction=bool(params["messages"])
                and compaction_block(params["messages"][0]) is not None,
            )
        )
        return params

    def _call_gap(self) -> float | None:
        """The median gap between the session's recent model calls (None: under two)."""
        calls = self.store.read(
            lambda connection: model_calls.recent_calls(connection, self.id, RHYTHM_CALLS)
        )
        return call_gap([at for _, at in calls])

    def edit_policy(self) -> tuple[Literal["rewrite", "append_only"], bool]:
        """(the edit policy this session's compactions run under, whether its model checks
        thinking prefixes): ``edit_policy`` "auto" is "append_only" for a model with prefix
        checks (compactstore.capabilities), else "rewrite"."""
        return resolve_policy(self.config.edit_policy, self.model, self.store.model_capabilities)

    def edit_state(self) -> EditState:
        """The session's model, edit policy (configured and resolved), whether the
        ``drop_block`` thinking binding is set and since when, and the thinking blocks the
        API dropped, per model call (its responses' ``input_transformations``)."""

        store = self.store
        return store.read(
            functools.partial(
                edit_state,
                session_id=self.id,
                location=store.location,
                capabilities=store.model_capabilities,
            )
        )

    def _set_thinking_binding(self, now: float | None) -> None:
        at = now_or_clock(now)

        def tx(connection: Connection) -> None:
            row = handle.locked(self, connection)
            if row.thinking_binding is None:
                repo.update_session(
                    connection, self.id, thinking_binding="drop_block", thinking_binding_at=at
                )

        self.store.write(tx)
        self.thinking_binding = "drop_block"

    def context(self) -> ActiveContext:
        """The active context with per-message detail (seq, tokens, state).

        This is the store's own cached object, shared by later calls; its messages are
        read-only. ``active_context()`` returns copies that are the caller's to change.
        """
        return self._current(hand_out=True)

    def _current(self, *, hand_out: bool) -> ActiveContext:
        """The active context; ``hand_out``: the agent will send it, so a real count
        reported next is measured on its version."""
        store = self.store

        def read(connection: Connection) -> ActiveContext:
            context = handle.context(self, connection)
            entry = store.cache.get(self.id)
            if hand_out and entry is not None and entry.answered is context:
                self._handed_version = entry.context_version
            return context

        return store.read(read)

    def active_context(self) -> list[dict[str, Any]]:
        """What to send to the model, in the session's format: the wire view (fresh plain
        dicts and lists the caller may change: add ``cache_control``, hand them to an SDK).

        The wire view (see the README): for anthropic, the tool results answering
        one assistant message are merged into the single user message after it; for
        responses without stored responses, reasoning items without ``encrypted_content``
        are left out. ``context().items`` keeps one item per seq.
        """
        try:
            # The same view context_view() keeps up to date step by step, copied.
            return [thaw(message) for message in self.context_view()]
        except RecursionError:  # one message nested very deep: context().messages() copes
            return self.adapter.wire_view(self.context().messages(), self.config)

    def context_view(self) -> tuple[Mapping[str, Any], ...]:
        """The messages ``active_context()`` returns, read-only and shared: no copy is made.

        The cheap read for callers that only send or serialise the context (a provider
        call, ``request_params()``, an integration keeping its own list). The tuple and every
        dict and list inside it are the store's cached objects, the same for every caller
        until the context changes: ``dict`` and ``list`` subclasses (``FrozenDict``,
        ``FrozenList``) that serialise and compare like plain JSON values and raise
        ``TypeError`` on any change. Copy a message (``copy.deepcopy(message)``) before
        changing it, or use ``active_context()``. A step that only appended costs what is
        new, not the size of the context. It is the
        same wire view as ``active_context()``; messages the wire view builds (merged
        anthropic tool results) are frozen too.
        """
        context = self.context()
        wire, lineage = context.wire, context.lineage
        cached = self._view
        if cached is not None and cached[1] is self.config:
            old, view_before = cached[0], cached[2]
            if old is wire:
                return view_before
            if cached[3] is lineage and len(wire) >= len(old):
                # Only appended since: the view of what stood before the restart point
                # stands, and only the rest is built again. With thinking, an append may
                # also leave out the thinking of earlier messages (the newest turn moved on,
                # ): then the view stands up to the first message that changed.
                same = len(old)
                if context.carries_thinking and not all(map(operator.is_, old, wire)):
                    same = next(
                        i for i, (a, b) in enumerate(zip(old, wire, strict=False)) if a is not b
                    )
                start = self.adapter.wire_restart(old if same == len(old) else old[:same])
                keep = len(view_before) if start == len(old) else _index(view_before, old[start])
                if keep is not None:
                    tail = self.adapter.wire_view(
                        list(cast("tuple[dict[str, Any], ...]", wire[start:])), self.config
                    )
                    grown = view_before[:keep] + tuple(freeze(message) for message in tail)
                    self._view = (wire, self.config, grown, lineage)
                    return grown
        # The frozen messages are dicts (FrozenDict); the wire view never changes them.
        view = self.adapter.wire_view(list(cast("tuple[dict[str, Any], ...]", wire)), self.config)
        if len(view) == len(wire) and all(a is b for a, b in zip(view, wire, strict=True)):
            result = wire
        else:
            result = tuple(freeze(message) for message in view)  # frozen ones as they are
        self._view = (wire, self.config, result, lineage)
        return result

    def token_usage(self) -> int:
        """Estimated tokens of the active context (calibrated by record_usage)."""
        return self._current(hand_out=False).usage

    def message_count(self) -> int:
        """How many messages the log holds (one count; :meth:`messages` reads them all)."""
        return self.store.read(lambda c: repo.message_count(c, self.id))

    def messages(self) -> list[dict[str, Any]]:
        """The whole log, verbatim, including what compaction removed from the context."""
        return self.store.read(
            lambda c: [json.loads(row.payload) for row in repo.log_messages(c, self.id)]
        )

    def iter_messages(self, *, page: int = 100) -> Iterator[dict[str, Any]]:
        """The whole log as :meth:`messages` gives it, read ``page`` messages at a time so a
        long log is never in memory at once: the log as it stood when iteration began
        (messages appended meanwhile are left out; the log is append-only)."""
        last = self.store.read(lambda c: repo.last_message(c, self.id))
        after, end = -1, (-1 if last is None else last.seq)
        while after < end:
            rows = self.store.read(
                functools.partial(
                    repo.log_page, session_id=self.id, after_seq=after, up_to_seq=end, limit=page
                )
            )
            if not rows:
                return  # the session was deleted meanwhile
            for seq, payload in rows:
                after = seq
                yield json.loads(payload)


def _index(view: tuple[Mapping[str, Any], ...], message: Mapping[str, Any]) -> int | None:
    """Where ``message`` itself (not an equal one) stands in ``view``, looking from the end."""
    for index in range(len(view) - 1, -1, -1):
        if view[index] is message:
            return index
    return None
