"""Session: one agent conversation, as a store (its driver) serves it.

One class: each method checks what is quick to check, then hands the work to the core
(:mod:`compactstore._core`: one transaction through the store, the rules inside it) or, for
the longer bodies, to a plain function of :mod:`compactstore._session` that takes the
session, its handle state and the call's arguments.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol

from pydantic import BaseModel
from sqlalchemy import Engine

from compactstore._context.active import ActiveContext
from compactstore._context.frozen import thaw
from compactstore._core import checks, edits, handle
from compactstore._core import recall as recalling
from compactstore._core.appending import insert_messages
from compactstore._core.checks import now_or_clock
from compactstore._core.cost import session_cost
from compactstore._core.recording import boundary_model
from compactstore._core.summarizing import Redactor
from compactstore._engines.base import Summarizer
from compactstore._ledger import SessionCost, call_usage
from compactstore._recall import tool_definition
from compactstore._session import compacting, history, reading, writing
from compactstore._session.state import HandleState
from compactstore.capabilities import EditPolicy
from compactstore.db import repository as repo
from compactstore.formats import MessageFormat, get_format
from compactstore.models import (
    BreakerState,
    CompactBoundary,
    CompactionConfig,
    CompactionResult,
    EditState,
    MemoryEntry,
    SessionInfo,
)

__all__ = ["Session", "SessionStore"]


class SessionStore(handle.Store, Protocol):
    """The store a session belongs to (a :class:`~compactstore.CompactStore`), as the
    session and its users reach it through ``session.store``."""

    engine: Engine
    redactor: Redactor | None

    def session(self, *args: Any, **kwargs: Any) -> Session: ...

    def get_session(self, session_id: str) -> Session: ...

    def sessions(self) -> list[SessionInfo]: ...


class Session:
    """One agent conversation: its log, its active context and its compactions."""

    def __init__(
        self,
        store: SessionStore,
        row: repo.SessionRow,
        summarizer: Summarizer | None = None,
        compactor: Any = None,
    ) -> None:
        # The store the session belongs to: the driver its work runs on.
        self.store = store
        self.id = row.id
        store.cache.pin(self, row.id)  # its context stays cached while this handle lives
        self.format = row.format
        self.context_window = row.context_window
        self.config = row.config
        self.created_at = row.created_at
        # The model the session talks to, as last recorded (session(model=), append_response).
        self.model = row.model
        # A subagent's session (an imported Claude Code sidechain): the session whose tool
        # call started it and that call's id; None for a top-level session.
        self.parent_session_id = row.parent_session_id
        self.parent_tool_use_id = row.parent_tool_use_id
        # "drop_block" once set for the session (sessions.thinking_binding): sticky; as this
        # handle last read it.
        self.thinking_binding = row.thinking_binding
        # The format's adapter: how this session's messages spell calls and results.
        self.adapter: MessageFormat = get_format(row.format)
        # This handle's own plug-ins (store.session(..., summarizer=, compactor=)) and what
        # it keeps between calls.
        self._state = HandleState(summarizer, compactor)

    def __repr__(self) -> str:
        return f"Session({self.id!r}, format={self.format!r}, context_window={self.context_window})"

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
        pending = self.store.compute(
            functools.partial(handle.prepare, self, message, timestamp, pinned=pinned)
        )
        return self.store.write(
            lambda c: insert_messages(c, handle.locked(self, c), self.adapter, [pending])[0]
        )

    def extend(
        self,
        messages: Sequence[dict[str, Any] | BaseModel],
        timestamps: Sequence[float | None] | None = None,
    ) -> list[int]:
        """Append several messages atomically: all are stored, or none."""
        return writing.extend(self, messages, timestamps)

    def append_response(
        self, response: Any, *, timestamp: float | None = None, now: float | None = None
    ) -> list[int]:
        """Store the assistant turn of a provider response and record its usage, atomically.

        ``response`` is the SDK object of the session's format: an Anthropic ``Message``
        (anthropic), an OpenAI ``ChatCompletion`` (openai: its first choice), or a Responses
        ``Response`` (responses: every output item). The turn is stored as
        :meth:`append` stores SDK objects; the prompt size and usage it reports are
        recorded as :meth:`record_usage` records them, at time ``now``, before the turn is
        counted as appended (see "Formats" in the docs). Returns the seqs of the stored
        messages.

        Raises:
            InvalidInputError: not a response object of the session's format, or a usage
                of another provider's shape or with a count that is not a whole number
                >= 0 (nothing is stored).
            InvalidMessageError: the turn does not fit the session (nothing is stored).
        """
        return writing.append_response(self, self._state, response, timestamp, now)

    def append_tool_result(
        self,
        tool_use_id: str,
        content: str | list[dict[str, Any]],
        *,
        tool_name: str,
        file_path: str | None = None,
        is_error: bool = False,
        timestamp: float | None = None,
    ) -> int:
        """Append the result of a tool call, built in the session's format.

        ``content`` is text, or a list of content blocks in the session format's own
        dialect: anthropic ``text``/``image``/``document`` blocks, responses
        ``input_text``/``input_image``/``input_file`` parts, openai text parts only. Images
        and documents count by their size, not their base64, and leave the context only by
        microcompact or ``CompactionConfig.max_media_in_context`` (persisted as a blob).

        When ``file_path`` is given the result is a read of that file: an unchanged re-read
        whose earlier content is still in the active context in full is stored as a short
        stub pointing at it (read dedup). Returns the new message's seq.

        Raises:
            InvalidInputError: bad arguments, or content the format cannot carry (a list
                with media in an openai session, a list in a minicode session, an image
                whose data does not decode); nothing is stored.
        """
        return writing.append_tool_result(
            self, tool_use_id, content, tool_name, file_path, is_error, timestamp
        )

    def invalidate(self, file_path: str) -> bool:
        """Forget the registered read of a path (after a write or edit of that file).

        Returns whether a read was registered.
        """
        return writing.invalidate(self, file_path)

    # -- usage --------------------------------------------------------------------------

    def record_usage(
        self,
        input_tokens: int,
        *,
        cache_read_tokens: int = 0,
        cache_write_5m_tokens: int = 0,
        cache_write_1h_tokens: int = 0,
        output_tokens: int = 0,
        model: str | None = None,
        iterations: list[dict[str, Any]] | None = None,
        cache_miss_reason: dict[str, Any] | None = None,
        input_transformations: list[dict[str, Any]] | None = None,
        now: float | None = None,
    ) -> bool:
        """Report what the API counted for the current active context.

        The prompt size is ``input_tokens + cache_read_tokens + cache_write_5m_tokens +
        cache_write_1h_tokens``: pass the split as the provider bills it (``input_tokens``
        uncached, as Anthropic reports it; the cache writes by lifetime: the provider's
        short one, Anthropic 5 minutes or OpenAI 30, and its long one, 1 hour or 12), or
        the whole prompt as ``input_tokens`` alone. Usage then follows the real count, and
        the reactive-recovery counter resets. The call is recorded in ``model_calls`` at
        time ``now`` (epoch seconds; default: the clock) with these fields, the model, and
        its cost at the store's prices (:mod:`compactstore.pricing`).

        A prompt below half the store's raw estimate of the context is not used (returns
        False, warns once per session): the usual cause is ``input_tokens`` alone under
        prompt caching. A count whose overhead alone fills ``auto_compact_threshold`` of
        the window records one failed auto compaction, trips the breaker and warns
        (``reset_breaker()`` re-arms it).

        Returns:
            True when the count was used for calibration.

        Raises:
            InvalidInputError: a count that is not a whole number >= 0, or JSON fields of
                the wrong shape (nothing is recorded).
        """
        checks.check_whole(input_tokens, "input_tokens")
        ledger = call_usage(
            input_tokens=input_tokens,
            cache_read_tokens=cache_read_tokens,
            cache_write_5m_tokens=cache_write_5m_tokens,
            cache_write_1h_tokens=cache_write_1h_tokens,
            output_tokens=output_tokens,
            model=model,
            iterations=iterations,
            cache_miss_reason=cache_miss_reason,
            input_transformations=input_transformations,
        )
        return writing.record_usage(self, self._state, ledger, now)

    def cost(self) -> SessionCost:
        """What the session's model calls cost, summed from ``model_calls`` in SQL.

        Totals by kind of token, the cost (of the calls with a price), how many calls there
        were and how many have no cost (no model, or one the price table does not have).
        ``cache_rewrites`` is what compaction made the provider write to the cache again:
        for each compaction that changed the active context, the cache-write tokens of the
        first model call after it, with their price at the store's prices (a call that
        follows several compactions counts once, for the newest of them).
        """
        store = self.store
        return store.read(lambda c: session_cost(c, self.id, store.location, store.prices))

    # -- reading ------------------------------------------------------------------------

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
        has system messages); openai: ``{"messages": [...]}``; responses: ``{"input": [...]}``.
        With ``cache_control=True`` (anthropic; the other APIs cache prefixes by themselves)
        up to four cache breakpoints where they pay, written for 5 minutes or an hour by the
        rhythm of the session's calls (see "Costs and caching" in the docs).

        anthropic: the caller's ``thinking`` settings and ``extra_headers`` come back merged
        with what the session needs, as keyword arguments ``messages.create`` (and
        ``beta.messages.create``) takes: under ``append_only``, microcompact as the
        server-side ``clear_tool_uses`` edit; once a cut inside a tool loop changed the
        thinking a request must send (a model that checks thinking prefixes), the
        ``drop_block`` thinking binding, on this and every later request (recorded at
        ``now``; see "How compaction works").

        The dict and its ``messages`` (``input``) list are the caller's; the messages in it
        are the store's read-only ones, shared with ``context_view()`` (copy one before
        changing it). A call after appends only costs what is new.

        Raises:
            InvalidInputError: a minicode session (no provider API takes its messages), or
                ``thinking`` / ``extra_headers`` that are not mappings.
        """
        return reading.request_params(
            self, self._state, cache_control, thinking, extra_headers, now
        )

    def edit_policy(self) -> tuple[EditPolicy, bool]:
        """(the edit policy this session's compactions run under, whether its model checks
        thinking prefixes): ``edit_policy`` "auto" is "append_only" for a model with prefix
        checks (compactstore.capabilities), else "rewrite"."""
        return reading.edit_policy(self)

    def edit_state(self) -> EditState:
        """The session's model, edit policy (configured and resolved), whether the
        ``drop_block`` thinking binding is set and since when, and the thinking blocks the
        API dropped, per model call (its responses' ``input_transformations``)."""
        return reading.edit_state(self)

    def context(self) -> ActiveContext:
        """The active context with per-message detail (seq, tokens, state).

        This is the store's own cached object, shared by later calls; its messages are
        read-only. ``active_context()`` returns copies that are the caller's to change.
        """
        return reading.current(self, self._state, hand_out=True)

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
        until the context changes: ``dict`` and ``list`` subclasses
        (``FrozenDict``, ``FrozenList``) that serialise and compare
        like plain JSON values and raise ``TypeError`` on any change. Copy a message
        (``copy.deepcopy(message)``) before changing it, or use ``active_context()``. A
        step that only appended costs what is new, not the size of the context. It is the
        same wire view as ``active_context()``; messages the wire view builds (merged
        anthropic tool results) are frozen too.
        """
        return reading.context_view(self, self._state)

    def token_usage(self) -> int:
        """Estimated tokens of the active context (calibrated by record_usage)."""
        return reading.current(self, self._state, hand_out=False).usage

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
        yield from reading.iter_messages(self, page)

    def subagents(self) -> list[tuple[str, str | None]]:
        """The sessions of the subagents this session's tool calls started (an imported
        Claude Code transcript's sidechains), and theirs: (session id, the id of the tool
        call that started it, None when the transcript does not say): its own in id order,
        then theirs."""
        return self.store.read(lambda connection: repo.subagents_of(connection, [self.id]))

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
        **switches: bool,
    ) -> CompactionResult:
        """Run the pipeline before a model call, in one transaction.

        Tool-result budget, microcompact, then the auto-compact check (session memory,
        then full compact). Read dedup happens when a tool result is appended, so
        ``enable_read_dedup`` only exists for symmetry (turn dedup off with
        ``CompactionConfig(read_dedup_enabled=False)``). A stage registered in
        :mod:`compactstore._engines.stages` is switched the same way, by its
        ``enable_<name>=`` keyword (recorded for replay); any other keyword is a
        ``TypeError``. Always returns a result; when nothing happened, success is False and
        strategy None.

        With ``background=True`` and a summarizer configured, the call never waits for a
        summary below ``reactive_blocking_ratio``: it runs the cheap stages, and once usage
        passes ``background_threshold`` it starts a compaction that a worker summarises and
        commits when ready (``result.background``: ``"started"``, ``"running"``,
        ``"applied"`` or None; the starting call always records its own row, which the
        background row's ``started_by`` names).
        """
        del enable_read_dedup  # dedup runs in append_tool_result
        switches.update(
            enable_tool_budget=enable_tool_budget,
            enable_microcompact=enable_microcompact,
            enable_auto_compact=enable_auto_compact,
        )
        return compacting.process_request(self, self._state, now, switches, background)

    def reactive_recover(
        self, error_message: str, *, now: float | None = None
    ) -> CompactionResult | None:
        """Recover after the API said the prompt is too long; None once attempts run out.

        Attempt 1 forces a full compact; if usage is still not below 87.3% of the window,
        and on attempts 2 and 3, the kept messages are truncated to the newest 40/30/20%.
        The attempt counter resets on success and when record_usage() reports a call.

        An error that refuses the provider's compaction block the session sends
        (``compaction_signature_invalid``, ``invalid_encrypted_content``) rolls that
        provider boundary back and compacts the range on the client instead, recording the
        error with the compaction: nothing is lost, the next request is valid.
        """
        return compacting.reactive_recover(self, self._state, error_message, now)

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
        return compacting.compact(self, self._state, instructions, up_to_seq, now)

    # -- history ------------------------------------------------------------------------

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
        return history.rollback(self, boundary_id, compaction_id, now)

    def clear(self, *, now: float | None = None) -> int:
        """Empty the active context (the log keeps everything): a boundary with strategy
        ``clear`` (trigger manual) after the newest message that keeps nothing — no pinned
        messages, no summary. Returns the compaction id (``rollback(compaction_id=...)``
        undoes it)."""
        at = now_or_clock(now)
        return self.store.write(
            lambda c: edits.clear(c, handle.context(self, c, handle.locked(self, c)), at)
        )

    def pop(self, *, now: float | None = None) -> dict[str, Any] | None:
        """Take the newest message of the context's kept part out of the context and return
        it as logged (verbatim); None when there is none. A recorded edit (strategy ``pop``,
        trigger manual) that ``rollback(compaction_id=...)`` undoes; the log keeps it."""
        at = now_or_clock(now)
        return self.store.write(
            lambda c: edits.pop(c, handle.context(self, c, handle.locked(self, c)), at)
        )

    def rollback_plan(
        self, boundary_id: int | None = None, *, compaction_id: int | None = None
    ) -> list[CompactBoundary]:
        """The boundaries ``rollback(boundary_id)`` (or ``rollback(compaction_id=...)``)
        would undo, oldest first; changes nothing.

        For a boundary the first is the target (the latest live boundary when boundary_id
        is None): a caller that asks for confirmation then rolls back exactly that id. For
        a compaction the list may be empty (an edit-only compaction such as ``pop``).

        Raises:
            InvalidInputError, NotFoundError, ConflictError: as :meth:`rollback` would.
        """
        return history.rollback_plan(self, boundary_id, compaction_id)

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
        summarizer is asked again (the session's provider compactor first, when it has
        one: a provider boundary is requested again). ``result.summary.source`` says which
        (``"recorded"``, ``"rule"``, ``"summarizer"`` or ``"provider"``). ``apply=True``
        records the result as a new compaction: allowed on the latest live boundary
        (which it replaces) or on a rolled-back one whose parent is the live boundary
        again. The engines and the summary keep the recorded time; the new rows and the
        rollback they imply are dated ``now`` (epoch seconds; default: the clock).

        Raises:
            NotFoundError: no such boundary in this session.
            ConflictError: the boundary was imported from a transcript (nothing to run
                again), apply=True where the replayed result cannot take its place, or
                the session was compacted or rolled back while the replay ran.
            InvalidInputError: resummarize=True with no summarizer configured.
        """
        return history.replay_boundary(
            self, self._state, boundary_id, config, apply, now, resummarize
        )

    def boundaries(self, include_rolled_back: bool = False) -> list[CompactBoundary]:
        """The recorded boundaries, oldest first."""
        rows = self.store.read(
            lambda c: repo.boundary_rows(c, self.id, include_rolled_back=include_rolled_back)
        )
        return [boundary_model(row) for row in rows]

    def compactions(self) -> list[CompactionResult]:
        """The recorded compactions, oldest first (rolled-back ones included, marked)."""
        return history.compactions(self)

    def breaker(self) -> BreakerState:
        """The circuit-breaker and reactive-recovery counters."""
        return history.breaker(self)

    def reset_breaker(self) -> None:
        """Clear the breaker's failure count, the reactive-attempt counter and the count of
        consecutive summarizer fallbacks."""
        history.reset_breaker(self)

    # -- memory, recall and blobs -------------------------------------------------------

    def remember(
        self, kind: str, text: str, *, scope: str = "session", now: float | None = None
    ) -> int:
        """Add a memory entry for session-memory compact; returns its id."""
        return compacting.remember(self, kind, text, scope, now)

    def memories(self) -> list[MemoryEntry]:
        """The stored memory entries, oldest first."""
        return self.store.read(lambda c: repo.memories(c, self.id))

    def recall_tool(self) -> dict[str, Any]:
        """The ``recall`` tool's definition in the session's format, to offer the model.

        anthropic and minicode: ``{"name", "description", "input_schema"}``; openai: a Chat
        Completions function tool; responses: a Responses function tool. Calling it turns on
        the summary's recall line (``recall_enabled`` in the session's stored config).
        """
        definition = tool_definition(self.format)
        if not self.config.recall_enabled:
            self.config = self.store.write(lambda c: recalling.enable(c, handle.locked(self, c)))
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
        return compacting.recall(self, arguments)

    def get_blob(self, blob_id: int) -> str:
        """The full content of a persisted tool result, byte-exact.

        Raises:
            NotFoundError: no blob with that id belongs to this session.
        """
        return reading.blob(self, blob_id)
