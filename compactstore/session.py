"""Session: one agent conversation, as the sync driver serves it.

Each method checks its arguments (:mod:`compactstore.core.checks`), opens one transaction
through its store and lets :mod:`compactstore.core` do the work: append under the pairing
and pin rules, compact as plan -> decide -> commit, roll back, replay.
"""

from __future__ import annotations

import functools
import json
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, cast

from pydantic import BaseModel
from sqlalchemy import Connection

from compactstore.context import ActiveContext
from compactstore.core import background, checks, compaction, edits, replay
from compactstore.core import recall as recalling
from compactstore.core.appending import (
    dedup_candidate,
    insert_messages,
    store_tool_result,
    tool_result_message,
)
from compactstore.core.cache import read_context
from compactstore.core.checks import PendingMessage, now_or_clock
from compactstore.core.recording import boundary_model, compaction_model, unrecorded_result
from compactstore.core.sessions import require
from compactstore.core.summarizing import SummaryCall, summarizer_name
from compactstore.core.usage import Calibration, calibrate
from compactstore.db import repository as repo
from compactstore.engines.base import Summarizer
from compactstore.errors import CompactStoreWarning, InvalidInputError, NotFoundError
from compactstore.formats import MessageFormat, get_format
from compactstore.formats.request import build_request_params
from compactstore.formats.sdk_objects import has_sdk_object, response_turn
from compactstore.formats.sdk_types import to_request
from compactstore.frozen import freeze
from compactstore.models import (
    BreakerState,
    CompactBoundary,
    CompactionConfig,
    CompactionResult,
    CompactTrigger,
    MemoryEntry,
)
from compactstore.recall import parse_arguments, tool_definition

if TYPE_CHECKING:
    from compactstore.store import CompactStore

__all__ = ["Session"]


class Session:
    """One agent conversation: its log, its active context and its compactions."""

    def __init__(
        self, store: CompactStore, row: repo.SessionRow, summarizer: Summarizer | None = None
    ) -> None:
        self.store = store
        # This handle's summarizer (store.session(..., summarizer=)); the store's otherwise.
        self._summarizer = summarizer
        self.id = row.id
        self.format = row.format
        self.context_window = row.context_window
        self.config = row.config
        self.created_at = row.created_at
        # The format's adapter: how this session's messages spell calls and results.
        self.adapter: MessageFormat = get_format(row.format)
        # The context version this handle last handed out (context(), active_context()): a
        # real count measured on an older one is not used for calibration (SPEC §9.1).
        self._handed_version: int | None = None
        # The newest finished background job this handle has reported (None: not looked).
        self._seen_job: int | None = None
        # The last read-only wire view, with the context tuple and config it was built from.
        self._view: tuple[Any, CompactionConfig, tuple[Mapping[str, Any], ...]] | None = None

    def __repr__(self) -> str:
        return f"Session({self.id!r}, format={self.format!r}, context_window={self.context_window})"

    def _locked(self, connection: Connection) -> repo.SessionRow:
        row = require(connection, self.id, self.store.location, lock=True)
        # Another handle may have changed the config: this one follows the stored one.
        self.config = row.config
        return row

    def _context(self, connection: Connection, row: repo.SessionRow | None = None) -> ActiveContext:
        store = self.store
        return read_context(
            connection,
            store._cache,
            self.id,
            self.adapter,
            store.token_counter,
            location=store.location,
            row=row,
        )

    def _prepare(
        self, message: Any, timestamp: Any, *, pinned: bool = False, index: int | None = None
    ) -> PendingMessage:
        if has_sdk_object(message):
            # An SDK object (or a dict holding some, as a reply's content): stored as its
            # model_dump keeping only what the request Param type declares (SPEC §9.4).
            message = to_request(self.format, message)
        return checks.prepare_message(
            self.adapter,
            self.config,
            self.store.token_counter,
            message,
            timestamp,
            pinned=pinned,
            index=index,
        )

    # -- appending ----------------------------------------------------------------------

    def append(
        self,
        message: dict[str, Any] | BaseModel,
        timestamp: float | None = None,
        pinned: bool = False,
    ) -> int:
        """Append one message; returns its seq (0-based, per session).

        ``message`` is a dict in the session's format, or an SDK object (or a dict holding
        some), stored as its request ``Param`` (see the README).

        Raises:
            InvalidMessageError: the message does not fit the session's format, its tool
                result has no call, a call id repeats, or it is over max_message_bytes.
        """
        pending = self.store._compute(
            functools.partial(self._prepare, message, timestamp, pinned=pinned)
        )
        return self.store._write(
            lambda c: insert_messages(c, self._locked(c), self.adapter, [pending])[0]
        )

    def extend(
        self,
        messages: Sequence[dict[str, Any] | BaseModel],
        timestamps: Sequence[float | None] | None = None,
    ) -> list[int]:
        """Append several messages atomically: all are stored, or none."""
        if isinstance(messages, dict | str | bytes) or not isinstance(messages, Sequence):
            raise InvalidInputError("extend() takes a list of messages")
        if timestamps is not None and (
            not isinstance(timestamps, Sequence) or len(timestamps) != len(messages)
        ):
            raise InvalidInputError("timestamps must be a list as long as messages")
        stamps = list(timestamps) if timestamps is not None else [None] * len(messages)
        pending = self.store._compute(
            lambda: [
                self._prepare(m, stamp, index=i)
                for i, (m, stamp) in enumerate(zip(messages, stamps, strict=True))
            ]
        )
        if not pending:
            return []
        return self.store._write(
            lambda c: insert_messages(c, self._locked(c), self.adapter, pending)
        )

    def append_response(
        self, response: Any, *, timestamp: float | None = None, now: float | None = None
    ) -> list[int]:
        """Store the assistant turn of a provider response and record its usage, atomically.

        ``response`` is the SDK object of the session's format: an Anthropic ``Message``
        (anthropic), an OpenAI ``ChatCompletion`` (openai: its first choice), or a Responses
        ``Response`` (responses: every output item). The turn is stored as
        :meth:`append` stores SDK objects; the prompt size it reports is recorded as
        :meth:`record_usage` records it, at time ``now`` (Anthropic: ``input_tokens +
        cache_creation_input_tokens + cache_read_input_tokens``; OpenAI: ``prompt_tokens``;
        Responses: ``input_tokens``), before the turn is counted as appended. Returns the
        seqs of the stored messages.

        Raises:
            InvalidInputError: not a response object of the session's format.
            InvalidMessageError: the turn does not fit the session (nothing is stored).
        """
        messages, count = response_turn(self.format, response)
        pending = [
            self._prepare(m, timestamp, index=i if len(messages) > 1 else None)
            for i, m in enumerate(messages)
        ]
        called = now_or_clock(now)
        measured_on = self._handed_version

        def tx(connection: Connection) -> tuple[Calibration | None, list[int]]:
            row = self._locked(connection)
            calibration = None
            if count is not None:
                context = self._context(connection, row)
                calibration = calibrate(
                    connection, row, context, count, called, measured_on=measured_on
                )
                row = self._locked(connection)
            seqs = insert_messages(connection, row, self.adapter, pending) if pending else []
            return calibration, seqs

        calibration, seqs = self.store._write(tx)
        if calibration is not None and count is not None:
            self._usage_warnings(calibration, count)
        return seqs

    def request_params(self, cache_control: bool = False) -> dict[str, Any]:
        """Keyword arguments for the provider call (SPEC §9.4), from the wire view.

        anthropic: ``{"system": ..., "messages": [...]}`` (``system`` only when the session
        has system messages: their text, joined by blank lines, or their blocks); openai:
        ``{"messages": [...]}``; responses: ``{"input": [...]}``. With ``cache_control=True``
        (anthropic; the other APIs cache prefixes by themselves and ignore it) an ephemeral
        cache breakpoint is set on the system prompt, on the last pinned message and on the
        summary message, so the stable prefix is read from the cache on every call.

        Raises:
            InvalidInputError: a minicode session (no provider API takes its messages).
        """
        if not isinstance(cache_control, bool):
            raise InvalidInputError("cache_control must be True or False")
        if self.format == "minicode":
            raise InvalidInputError(
                "request_params() needs a provider format (anthropic, openai, responses); "
                "minicode messages go to no provider API as they are"
            )
        context = self.context()
        items = context.items
        messages = context.messages()
        return build_request_params(
            self.adapter, self.config, items, messages, cache_control=cache_control
        )

    def append_tool_result(
        self,
        tool_use_id: str,
        content: str,
        *,
        tool_name: str,
        file_path: str | None = None,
        is_error: bool = False,
        timestamp: float | None = None,
    ) -> int:
        """Append the result of a tool call, built in the session's format.

        When ``file_path`` is given the result is a read of that file: an unchanged re-read
        whose earlier content is still in the active context in full is stored as a short
        stub pointing at it (read dedup). Returns the new message's seq.
        """
        result = checks.check_tool_result(
            tool_use_id, content, tool_name=tool_name, file_path=file_path, is_error=is_error
        )
        store = self.store
        # The read to point at is looked up first and the message counted with no write
        # transaction open (SPEC §9.1); the write stores it only if that read is still the
        # one to point at, else looks again (the last try stores the content whole).
        for attempt in range(3):
            last = attempt == 2
            earlier = (
                None
                if last
                else store._read(lambda c: dedup_candidate(c, self.id, store.location, result))
            )
            pending = store._compute(
                functools.partial(
                    tool_result_message,
                    self.adapter,
                    self.config,
                    store.token_counter,
                    result,
                    earlier,
                    timestamp,
                )
            )
            seq = store._write(
                functools.partial(
                    self._store_tool_result,
                    result=result,
                    pending=pending,
                    expected=earlier,
                    final=last,
                )
            )
            if seq is not None:
                return seq
        raise AssertionError("the last try always stores the result")

    def _store_tool_result(
        self,
        connection: Connection,
        *,
        result: checks.NewToolResult,
        pending: PendingMessage,
        expected: tuple[str, int] | None,
        final: bool,
    ) -> int | None:
        return store_tool_result(
            connection,
            self._locked(connection),
            self.adapter,
            result,
            pending,
            expected=expected,
            final=final,
        )

    def invalidate(self, file_path: str) -> bool:
        """Forget the registered read of a path (after a write or edit of that file).

        Returns whether a read was registered.
        """
        path = checks.check_file_path(file_path)

        def tx(connection: Connection) -> bool:
            self._locked(connection)
            return repo.delete_dedup_entry(connection, self.id, path) > 0

        return self.store._write(tx)

    # -- reading ------------------------------------------------------------------------

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
            context = self._context(connection)
            entry = store._cache.get(self.id)
            if hand_out and entry is not None and entry.answered is context:
                self._handed_version = entry.context_version
            return context

        return store._read(read)

    def active_context(self) -> list[dict[str, Any]]:
        """What to send to the model, in the session's format: the wire view (fresh plain
        dicts and lists the caller may change: add ``cache_control``, hand them to an SDK).

        The wire view (SPEC §9.4, see the README): for anthropic, the tool results answering
        one assistant message are merged into the single user message after it; for
        responses without stored responses, reasoning items without ``encrypted_content``
        are left out. ``context().items`` keeps one item per seq.
        """
        return self.adapter.wire_view(self.context().messages(), self.config)

    def context_view(self) -> tuple[Mapping[str, Any], ...]:
        """The messages ``active_context()`` returns, read-only and shared: no copy is made.

        The cheap read for callers that only send or serialise the context (a provider
        call, ``request_params()``, an integration keeping its own list). The tuple and every
        dict and list inside it are the store's cached objects, the same for every caller
        until the context changes: ``dict`` and ``list`` subclasses
        (:class:`compactstore.frozen.FrozenDict`, ``FrozenList``) that serialise and compare
        like plain JSON values and raise ``TypeError`` on any change. Copy a message
        (``copy.deepcopy(message)``) before changing it, or use ``active_context()``. A
        step that only appended costs what is new, not the size of the context. It is the
        same wire view as ``active_context()``; messages the wire view builds (merged
        anthropic tool results) are frozen too.
        """
        wire = self.context().wire
        cached = self._view
        if cached is not None and cached[0] is wire and cached[1] is self.config:
            return cached[2]
        # The frozen messages are dicts (FrozenDict); the wire view never changes them.
        view = self.adapter.wire_view(list(cast("tuple[dict[str, Any], ...]", wire)), self.config)
        if len(view) == len(wire) and all(a is b for a, b in zip(view, wire, strict=True)):
            result = wire
        else:
            result = tuple(freeze(message) for message in view)  # frozen ones as they are
        self._view = (wire, self.config, result)
        return result

    def token_usage(self) -> int:
        """Estimated tokens of the active context (calibrated by record_usage)."""
        return self._current(hand_out=False).usage

    def message_count(self) -> int:
        """How many messages the log holds (one count; :meth:`messages` reads them all)."""
        return self.store._read(lambda c: repo.message_count(c, self.id))

    def messages(self) -> list[dict[str, Any]]:
        """The whole log, verbatim, including what compaction removed from the context."""
        return self.store._read(
            lambda c: [json.loads(row.payload) for row in repo.log_messages(c, self.id)]
        )

    def iter_messages(self, *, page: int = 100) -> Iterator[dict[str, Any]]:
        """The whole log as :meth:`messages` gives it, read ``page`` messages at a time so a
        long log is never in memory at once: the log as it stood when iteration began
        (messages appended meanwhile are left out; the log is append-only)."""
        last = self.store._read(lambda c: repo.last_message(c, self.id))
        after, end = -1, (-1 if last is None else last.seq)
        while after < end:
            rows = self.store._read(
                functools.partial(
                    repo.log_page, session_id=self.id, after_seq=after, up_to_seq=end, limit=page
                )
            )
            if not rows:
                return  # the session was deleted meanwhile
            for seq, payload in rows:
                after = seq
                yield json.loads(payload)

    def record_usage(self, input_tokens: int, *, now: float | None = None) -> bool:
        """Report the real prompt size the API counted for the current active context.

        Usage then follows the real count: the offset to the estimate is stored and the
        correction factor is learnt from consecutive real counts. A model call that went
        through also resets the reactive-recovery counter. The call is recorded in
        ``model_calls`` at time ``now`` (epoch seconds; default: the clock).

        A count below half the store's raw estimate of the context is not used (returns
        False, warns once per session): under prompt caching ``input_tokens`` alone is not
        the prompt size; pass input + cache_creation + cache_read tokens. A count whose
        overhead alone fills ``auto_compact_threshold`` of the window records one failed
        auto compaction, trips the breaker and warns (``reset_breaker()`` re-arms it).

        Returns:
            True when the count was used for calibration.
        """
        checks.check_whole(input_tokens, "input_tokens")
        called = now_or_clock(now)

        measured_on = self._handed_version

        def tx(connection: Connection) -> Calibration:
            row = self._locked(connection)
            context = self._context(connection, row)
            return calibrate(
                connection, row, context, input_tokens, called, measured_on=measured_on
            )

        calibration = self.store._write(tx)
        self._usage_warnings(calibration, input_tokens)
        return calibration.used

    def _usage_warnings(self, calibration: Calibration, input_tokens: int) -> None:
        if calibration.overhead_reason is not None:
            warnings.warn(
                f"session {self.id!r}: {calibration.overhead_reason}",
                CompactStoreWarning,
                stacklevel=3,
            )
        if (
            not calibration.used
            and not calibration.superseded
            and self.store._warn_once(self.id, "low count")
        ):
            warnings.warn(
                f"session {self.id!r}: record_usage({input_tokens}) is below half the store's "
                f"estimate of the context, so it was not used for calibration; with prompt "
                f"caching, report input_tokens + cache_creation_input_tokens + "
                f"cache_read_input_tokens",
                CompactStoreWarning,
                stacklevel=3,
            )

    # -- compaction ---------------------------------------------------------------------

    def process_request(
        self,
        *,
        now: float | None = None,
        enable_tool_budget: bool = True,
        enable_read_dedup: bool = True,
        enable_microcompact: bool = True,
        enable_auto_compact: bool = True,
        background: bool = False,
    ) -> CompactionResult:
        """Run the pipeline before a model call, in one transaction.

        Tool-result budget, microcompact, then the auto-compact check (session memory,
        then full compact). Read dedup happens when a tool result is appended, so
        ``enable_read_dedup`` only exists for symmetry (turn dedup off with
        ``CompactionConfig(read_dedup_enabled=False)``). Always returns a result; when
        nothing happened, success is False and strategy None.

        With ``background=True`` and a summarizer configured, the call never waits for a
        summary below ``reactive_blocking_ratio``: it runs the cheap stages, and once usage
        passes ``background_threshold`` it starts a compaction that a worker summarises and
        commits when ready (``result.background``: ``"started"``, ``"running"``,
        ``"applied"`` or None; the starting call always records its own row, which the
        background row's ``started_by`` names).
        """
        del enable_read_dedup  # dedup runs in append_tool_result
        request = compaction.process_request(
            now_or_clock(now),
            enable_tool_budget=bool(enable_tool_budget),
            enable_microcompact=bool(enable_microcompact),
            enable_auto_compact=bool(enable_auto_compact),
        )
        if background and enable_auto_compact:
            return self._background(request)
        result = self._compaction(request)
        assert result is not None, "the pipeline always decides"
        return result

    def _target(self) -> compaction.Target:
        store = self.store
        return compaction.Target(self.id, self.adapter, store._cache, store.location)

    def _background(self, request: compaction.Request) -> CompactionResult:
        """process_request(background=True): see :mod:`compactstore.core.background`."""
        store = self.store
        plugins = self._plugins()
        if plugins.summarizer is None:
            result = self._compaction(request)  # nothing to write in the background
            assert result is not None
            return result
        target = self._target()
        seen = store._read(
            functools.partial(background.probe, target=target, count_tokens=store.token_counter)
        )
        status: str | None = None
        finished = seen.finished
        if finished is not None:
            if self._seen_job is not None and finished.id > self._seen_job:
                status = "applied" if finished.state == "applied" else None
            self._seen_job = finished.id
        elif self._seen_job is None:
            self._seen_job = 0
        if seen.blocking and seen.active is None:
            # The agent is blocked anyway: compact now, as without background.
            result = self._compaction(request)
            assert result is not None
            return result if status is None else result.model_copy(update={"background": status})
        cheap = request.cheap()
        assert cheap is not None
        result = self._compaction(cheap)
        assert result is not None
        if seen.active is not None or result.background == "running":
            status = "running"
        else:
            usage = result.tokens_after if result.success else seen.context.usage
            if seen.passes(usage):
                started = store._write(
                    functools.partial(
                        background.start,
                        target=target,
                        started_by=result.id,
                        usage=usage,
                        at=request.now,
                    )
                )
                if started is None:
                    status = "running"
                else:
                    started_by, job_id = started
                    if result.id is None:
                        result = result.model_copy(
                            update={"id": started_by, "trigger": CompactTrigger.AUTO}
                        )
                    store._submit_job(job_id, plugins)
                    status = "started"
        return result.model_copy(update={"background": status})

    def reactive_recover(
        self, error_message: str, *, now: float | None = None
    ) -> CompactionResult | None:
        """Recover after the API said the prompt is too long; None once attempts run out.

        Attempt 1 forces a full compact; if usage is still not below 87.3% of the window,
        and on attempts 2 and 3, the kept messages are truncated to the newest 40/30/20%.
        The attempt counter resets on success and when record_usage() reports a call.
        """
        if not isinstance(error_message, str):
            raise InvalidInputError("error_message must be the API's error text (a string)")
        return self._compaction(compaction.reactive_request(now_or_clock(now), error_message))

    def compact(
        self,
        *,
        instructions: str | None = None,
        up_to_seq: int | None = None,
        now: float | None = None,
    ) -> CompactionResult:
        """Compact now (trigger manual): a full compact, or with ``up_to_seq`` a partial one
        that summarises only the messages up to that seq and keeps the rest verbatim.
        ``instructions`` go to the summarizer and are recorded.
        """
        if instructions is not None and not isinstance(instructions, str):
            raise InvalidInputError("instructions must be a string")
        if up_to_seq is not None:
            checks.check_whole(up_to_seq, "up_to_seq (a message seq)")
        result = self._compaction(
            compaction.manual_request(now_or_clock(now), instructions, up_to_seq)
        )
        assert result is not None, "a manual compaction always decides"
        return result

    def _compaction(
        self, request: compaction.Request, plugins: compaction.Plugins | None = None
    ) -> CompactionResult | None:
        """plan -> decide -> commit (SPEC §9.1): a read transaction, the engines and the
        summarizer with none open, then one short write transaction."""
        store = self.store
        steps = compaction.compaction_steps(
            self._target(),
            request,
            plugins if plugins is not None else self._plugins(),
            store._summarizer_executor(),
        )
        result, cached = compaction.drive(
            steps, store._read, store._write, store._sleep, store._compute
        )
        if cached is not None:
            # Only once committed: an entry for versions that were rolled back could match
            # another writer's later, different change.
            store._cache.put(self.id, cached)
        if result is not None and result.id is not None:
            store._notify(result)
        return result

    def _plugins(self) -> compaction.Plugins:
        """The store's plug-ins, with this handle's own summarizer when it was given one."""
        plugins = self.store.plugins
        if self._summarizer is None:
            return plugins
        return replace(
            plugins, summarizer=self._summarizer, summarizer_name=summarizer_name(self._summarizer)
        )

    # -- rollback and replay ------------------------------------------------------------

    def rollback(
        self,
        boundary_id: int | None = None,
        *,
        compaction_id: int | None = None,
        now: float | None = None,
    ) -> list[CompactBoundary]:
        """Undo the latest live boundary, or the given one and every compaction after it;
        with ``compaction_id``, compaction N (any strategy: ``clear`` and ``pop`` included)
        and every compaction recorded after it, boundaries included.

        Rows are marked rolled back, never deleted. Afterwards active_context() is exactly
        what it was before that compaction plus whatever was appended since. Returns the
        boundaries rolled back.

        Raises:
            InvalidInputError: both boundary_id and compaction_id given.
            NotFoundError: no such boundary or compaction in this session, or nothing to
                roll back.
            ConflictError: the boundary or compaction is already rolled back.
        """
        if boundary_id is not None:
            checks.check_id(boundary_id, "boundary", self.id)
        if compaction_id is not None:
            if boundary_id is not None:
                raise InvalidInputError("give boundary_id or compaction_id, not both")
            checks.check_id(compaction_id, "compaction", self.id)
        at = now_or_clock(now)

        def tx(connection: Connection) -> list[CompactBoundary]:
            self._locked(connection)
            if compaction_id is not None:
                return replay.rollback_compaction(connection, self.id, compaction_id, at)
            return replay.rollback(connection, self.id, boundary_id, at)

        return self.store._write(tx)

    def clear(self, *, now: float | None = None) -> int:
        """Empty the active context (the log keeps everything): a boundary with strategy
        ``clear`` (trigger manual) after the newest message that keeps nothing — no pinned
        messages, no summary. Returns the compaction id (``rollback(compaction_id=...)``
        undoes it)."""
        at = now_or_clock(now)

        def tx(connection: Connection) -> int:
            row = self._locked(connection)
            return edits.clear(connection, self._context(connection, row), at)

        return self.store._write(tx)

    def pop(self, *, now: float | None = None) -> dict[str, Any] | None:
        """Take the newest message of the context's kept part out of the context and return
        it as logged (verbatim); None when there is none. A recorded edit (strategy ``pop``,
        trigger manual) that ``rollback(compaction_id=...)`` undoes; the log keeps it."""
        at = now_or_clock(now)

        def tx(connection: Connection) -> dict[str, Any] | None:
            row = self._locked(connection)
            return edits.pop(connection, self._context(connection, row), at)

        return self.store._write(tx)

    def rollback_plan(self, boundary_id: int | None = None) -> list[CompactBoundary]:
        """The boundaries ``rollback(boundary_id)`` would undo, oldest first; changes nothing.

        The first is the target (the latest live boundary when boundary_id is None): a caller
        that asks for confirmation then rolls back exactly that id.

        Raises:
            NotFoundError, ConflictError: as :meth:`rollback` would.
        """
        if boundary_id is not None:
            checks.check_id(boundary_id, "boundary", self.id)

        def read(connection: Connection) -> list[repo.DbRow]:
            boundary = replay.live_target(connection, self.id, boundary_id)
            return replay.undone_by(connection, self.id, boundary)

        return [boundary_model(row) for row in self.store._read(read)]

    def replay(
        self,
        boundary_id: int,
        *,
        config: CompactionConfig | None = None,
        apply: bool = False,
        now: float | None = None,
        resummarize: bool = False,
    ) -> CompactionResult:
        """Run a recorded compaction again on the context as it stood just before it.

        With the recorded config (or ``config``) and the recorded time, the same inputs
        give a byte-identical boundary and summary: the recorded summary text (rule-based
        or a summarizer's) is reused whenever the replayed cut removes exactly the recorded
        seqs; otherwise the summary is rule-based, and with ``resummarize=True`` the
        summarizer is asked again. ``result.summary.source`` says which (``"recorded"``,
        ``"rule"`` or ``"summarizer"``). ``apply=True`` records the result as a new
        compaction: allowed on the latest live boundary (which it replaces) or on a
        rolled-back one whose parent is the live boundary again. The engines and the
        summary keep the recorded time; the new rows and the rollback they imply are dated
        ``now`` (epoch seconds; default: the clock).

        Raises:
            NotFoundError: no such boundary in this session.
            ConflictError: the boundary was imported from a transcript (nothing to run
                again), apply=True where the replayed result cannot take its place, or
                the session was compacted or rolled back while the replay ran.
            InvalidInputError: resummarize=True with no summarizer configured.
        """
        checks.check_id(boundary_id, "boundary", self.id)
        checks.check_config(config)
        at = now_or_clock(now)
        store = self.store
        service = None
        if resummarize:
            plugins = self._plugins()
            if plugins.summarizer is None:
                raise InvalidInputError(
                    "resummarize=True needs a summarizer: give one to CompactStore.open or "
                    "store.session"
                )
            service = SummaryCall(
                summarizer=plugins.summarizer,
                name=plugins.summarizer_name,
                recorded=None,
                executor=store._summarizer_executor(),
                timeout=(config or self.config).summarizer_timeout_seconds,
                calls_left=1,
                redactor=plugins.redactor,
                loop=plugins.loop,
            )

        def plan(connection: Connection) -> replay.ReplayPlan:
            row = require(connection, self.id, store.location)
            return replay.plan_replay(
                connection,
                row,
                self.adapter,
                store.token_counter,
                boundary_id,
                config=config,
                apply=apply,
                resummarize=service,
            )

        # Plan in a read transaction, run the engines (and any summarizer) with none open,
        # and record in one write transaction that checks nothing moved meanwhile.
        planned = store._read(plan)
        outcome = store._compute(functools.partial(replay.decide_replay, planned))
        if not apply:
            return unrecorded_result(outcome, planned.inputs.now, planned.compaction.instructions)

        def commit(connection: Connection) -> CompactionResult:
            self._locked(connection)
            return replay.commit_replay(connection, self.id, planned, outcome, at)

        result = store._write(commit)
        store._notify(result)
        return result

    # -- memory, breaker, blobs ---------------------------------------------------------

    def remember(
        self, kind: str, text: str, *, scope: str = "session", now: float | None = None
    ) -> int:
        """Add a memory entry for session-memory compact; returns its id."""
        checks.check_memory(kind, text, scope)
        created = now_or_clock(now)
        tokens = self.store.token_counter(text)

        def tx(connection: Connection) -> int:
            self._locked(connection)
            entry_id = repo.insert_memory(
                connection,
                self.id,
                kind=kind,
                text=text,
                tokens=tokens,
                created_at=created,
                scope=scope,
            )
            repo.update_session(connection, self.id)
            return entry_id

        return self.store._write(tx)

    def memories(self) -> list[MemoryEntry]:
        """The stored memory entries, oldest first."""
        return self.store._read(lambda c: repo.memories(c, self.id))

    def breaker(self) -> BreakerState:
        """The circuit-breaker and reactive-recovery counters."""
        row = self.store._read(lambda c: repo.get_breaker(c, self.id))
        return BreakerState(
            consecutive_failures=row.consecutive_failures,
            tripped=bool(row.tripped),
            reactive_attempts=row.reactive_attempts,
            last_microcompact_at=row.last_microcompact_at,
            consecutive_fallbacks=row.consecutive_fallbacks,
        )

    def reset_breaker(self) -> None:
        """Clear the breaker's failure count, the reactive-attempt counter and the count of
        consecutive summarizer fallbacks."""

        def tx(connection: Connection) -> None:
            self._locked(connection)
            repo.set_breaker(
                connection,
                self.id,
                consecutive_failures=0,
                tripped=False,
                reactive_attempts=0,
                consecutive_fallbacks=0,
            )
            repo.update_session(connection, self.id)

        self.store._write(tx)

    def get_blob(self, blob_id: int) -> str:
        """The full content of a persisted tool result, byte-exact.

        Raises:
            NotFoundError: no blob with that id belongs to this session.
        """
        checks.check_id(blob_id, "blob", self.id)

        def read(connection: Connection) -> str | None:
            row = repo.get_blob(connection, self.id, blob_id)
            # Decoded inside the read, so a damaged blob is a DatabaseError naming the file.
            return None if row is None else bytes(row.content).decode("utf-8")

        content = self.store._read(read)
        if content is None:
            raise NotFoundError(f"no blob {blob_id} in session {self.id!r}")
        return content

    # -- recall -------------------------------------------------------------------------

    def recall_tool(self) -> dict[str, Any]:
        """The ``recall`` tool's definition in the session's format, to offer the model.

        anthropic and minicode: ``{"name", "description", "input_schema"}``; openai: a Chat
        Completions function tool; responses: a Responses function tool. Calling it turns on
        the summary's recall line (``recall_enabled`` in the session's stored config).
        """
        definition = tool_definition(self.format)
        if not self.config.recall_enabled:
            self.config = self.store._write(lambda c: recalling.enable(c, self._locked(c)))
        return definition

    def recall(self, arguments: dict[str, Any] | str) -> str:
        """Answer a ``recall`` call: the original of what is not in the context in full.

        ``arguments`` is the call's input (or its JSON text): ``{"from_seq": a, "to_seq": b}``,
        ``{"query": "..."}``, ``{"blob_id": n}`` or ``{"cursor": "..."}`` from the last line
        of an answer cut at ``recall_max_tokens``. A read only: append the answer with
        ``append_tool_result(call_id, answer, tool_name="recall")`` (exempt from the
        tool-result budget).

        Raises:
            InvalidInputError: the arguments, naming what is wrong with them.
            NotFoundError: no blob with that id in this session.
        """
        request = parse_arguments(arguments)
        store = self.store
        return store._read(
            lambda c: recalling.recall(
                c, require(c, self.id, store.location), self.adapter, store.token_counter, request
            )
        )

    # -- history ------------------------------------------------------------------------

    def boundaries(self, include_rolled_back: bool = False) -> list[CompactBoundary]:
        """The recorded boundaries, oldest first."""
        rows = self.store._read(
            lambda c: repo.boundary_rows(c, self.id, include_rolled_back=include_rolled_back)
        )
        return [boundary_model(row) for row in rows]

    def compactions(self) -> list[CompactionResult]:
        """The recorded compactions, oldest first (rolled-back ones included, marked)."""

        def read(connection: Connection) -> list[CompactionResult]:
            boundaries = {
                row.id: boundary_model(row)
                for row in repo.boundary_rows(connection, self.id, include_rolled_back=True)
            }
            return [
                compaction_model(row, boundaries)
                for row in repo.compaction_rows(connection, self.id)
            ]

        return self.store._read(read)
