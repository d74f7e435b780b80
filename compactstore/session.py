"""Session: one agent conversation, as the sync driver serves it.

Each method checks its arguments (:mod:`compactstore.core.checks`), opens one transaction
through its store and lets :mod:`compactstore.core` do the work: append under the pairing
and pin rules, compact as plan -> decide -> commit. Reading, history (rollback, replay) and
memory (with recall) are in the classes it inherits: :mod:`compactstore.session_base`.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Protocol

from pydantic import BaseModel
from sqlalchemy import Connection, Engine

from compactstore.capabilities import resolve_policy
from compactstore.core import background, checks, compaction, handle
from compactstore.core.appending import (
    dedup_candidate,
    insert_messages,
    store_tool_result,
    tool_result_message,
)
from compactstore.core.checks import PendingMessage, now_or_clock
from compactstore.core.cost import session_cost
from compactstore.core.driver import committed
from compactstore.core.handle import Store
from compactstore.core.recording import record_provider_compaction, record_server_edits
from compactstore.core.summarizing import Redactor
from compactstore.core.usage import Calibration, calibrate
from compactstore.db import repository as repo
from compactstore.errors import CompactStoreWarning, InvalidInputError, NotFoundError
from compactstore.formats.base import storable_text
from compactstore.formats.sdk_objects import (
    applied_edits,
    cleared_tokens,
    response_model,
    response_turn,
)
from compactstore.ledger import SessionCost, call_usage, response_usage, usage_cost
from compactstore.models import (
    CompactionResult,
    CompactStrategy,
    SessionInfo,
    SummaryInfo,
)
from compactstore.providers import (
    check_provided,
    provided_note,
    provided_text,
    refuses_provider_object,
    split_provided,
)
from compactstore.session_history import SessionHistory
from compactstore.session_memory import SessionMemory
from compactstore.session_reading import SessionReading

__all__ = ["Session", "SessionStore"]


class SessionStore(Store, Protocol):
    """The store a session belongs to (a :class:`~compactstore.CompactStore`), as the
    session and its users reach it through ``session.store``."""

    engine: Engine
    redactor: Redactor | None

    def session(self, *args: Any, **kwargs: Any) -> Session: ...

    def get_session(self, session_id: str) -> Session: ...

    def sessions(self) -> list[SessionInfo]: ...


class Session(SessionReading, SessionHistory, SessionMemory):
    """One agent conversation: its log, its active context and its compactions."""

    # The store the session belongs to: the driver its work runs on.
    store: SessionStore

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
        if isinstance(messages, dict | str | bytes) or not isinstance(messages, Sequence):
            raise InvalidInputError("extend() takes a list of messages")
        if timestamps is not None and (
            not isinstance(timestamps, Sequence) or len(timestamps) != len(messages)
        ):
            raise InvalidInputError("timestamps must be a list as long as messages")
        stamps = list(timestamps) if timestamps is not None else [None] * len(messages)
        pending = self.store.compute(
            lambda: [
                handle.prepare(self, m, stamp, index=i)
                for i, (m, stamp) in enumerate(zip(messages, stamps, strict=True))
            ]
        )
        if not pending:
            return []
        return self.store.write(
            lambda c: insert_messages(c, handle.locked(self, c), self.adapter, pending)
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
        Responses: ``input_tokens``), before the turn is counted as appended. The call's
        row in ``model_calls`` gets the usage split as billed, the model, the provider's
        iterations, cache-miss reason and input transformations, and the cost (see
        :mod:`compactstore.ledger`). Returns the seqs of the stored messages.

        Raises:
            InvalidInputError: not a response object of the session's format, or a usage
                of another provider's shape or with a count that is not a whole number
                >= 0 (nothing is stored).
            InvalidMessageError: the turn does not fit the session (nothing is stored).
        """
        messages, count = response_turn(self.format, response)
        # A compaction the provider did on its own: an Anthropic reply starting with its
        # threshold compaction block, a Responses output starting with a server-side
        # compaction item. It becomes a boundary (strategy provider, trigger server); the
        # rest is the turn.
        provided, messages = split_provided(self.format, messages, response)
        ledger = response_usage(self.format, response)
        cost = None if ledger is None else usage_cost(self.store.prices, ledger)
        model = response_model(response)
        edits = applied_edits(response) if self.format == "anthropic" else []
        # The real count measures the provider's copy after its server-side edits; what
        # they cleared is added back, so it measures this context (which they left alone).
        full_count = None if count is None else count + cleared_tokens(edits)
        pending = [
            handle.prepare(self, m, timestamp, index=i if len(messages) > 1 else None)
            for i, m in enumerate(messages)
        ]
        called = now_or_clock(now)
        measured_on = self._handed_version

        def tx(connection: Connection) -> tuple[Calibration | None, list[int]]:
            row = handle.locked(self, connection)
            calibration = None
            if model is not None and model != row.model:
                repo.update_session(connection, self.id, model=model)
                row = handle.locked(self, connection)
            if provided is not None:
                check_provided(connection, self.id, provided)
                record_provider_compaction(
                    connection,
                    self.id,
                    handle.context(self, connection, row),
                    provided,
                    provided_text(provided),
                    called,
                    note=provided_note(provided),
                    info=SummaryInfo(source="provider", model=model),
                )
                row = handle.locked(self, connection)
            if edits:
                policy, _ = resolve_policy(
                    row.config.edit_policy, row.model, self.store.model_capabilities
                )
                record_server_edits(
                    connection,
                    self.id,
                    handle.context(self, connection, row),
                    edits,
                    edit_policy=policy,
                    at=called,
                )
            if full_count is not None:
                context = handle.context(self, connection, row)
                calibration = calibrate(
                    connection,
                    row,
                    context,
                    full_count,
                    called,
                    measured_on=measured_on,
                    ledger=ledger,
                    cost_usd=cost,
                )
                row = handle.locked(self, connection)
            seqs = insert_messages(connection, row, self.adapter, pending) if pending else []
            return calibration, seqs

        calibration, seqs = self.store.write(tx)
        if calibration is not None and full_count is not None:
            self._usage_warnings(calibration, full_count)
        return seqs

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
        result = checks.check_tool_result(
            tool_use_id,
            content,
            tool_name=tool_name,
            file_path=file_path,
            is_error=is_error,
            format_name=self.adapter.name,
        )
        store = self.store
        # The read to point at is looked up first and the message counted with no write
        # transaction open; the write stores it only if that read is still the
        # one to point at, else looks again (the last try stores the content whole).
        for attempt in range(3):
            last = attempt == 2
            earlier = (
                None
                if last
                else store.read(lambda c: dedup_candidate(c, self.id, store.location, result))
            )
            pending = store.compute(
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
            stored = store.write(
                functools.partial(
                    self._store_tool_result,
                    result=result,
                    pending=pending,
                    expected=earlier,
                    final=last,
                )
            )
            if stored is not None:
                seq, dedup = stored
                if dedup is not None:
                    store.notify(dedup)  # a read_dedup compaction was recorded
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
    ) -> tuple[int, CompactionResult | None] | None:
        row = handle.locked(self, connection)
        policy, _ = resolve_policy(row.config.edit_policy, row.model, self.store.model_capabilities)
        return store_tool_result(
            connection,
            row,
            self.adapter,
            result,
            pending,
            expected=expected,
            final=final,
            edit_policy=policy,
        )

    def invalidate(self, file_path: str) -> bool:
        """Forget the registered read of a path (after a write or edit of that file).

        Returns whether a read was registered.
        """
        path = checks.check_file_path(file_path)

        def tx(connection: Connection) -> bool:
            handle.locked(self, connection)
            return repo.delete_dedup_entry(connection, self.id, path) > 0

        return self.store.write(tx)

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
        the whole prompt as ``input_tokens`` alone. Usage then follows the real count: the
        offset to the estimate is stored and the correction factor is learnt from
        consecutive real counts. A model call that went through also resets the
        reactive-recovery counter. The call is recorded in ``model_calls`` at time ``now``
        (epoch seconds; default: the clock) with these fields, the model, and its cost at
        the store's prices (None for a model without a price: see
        :mod:`compactstore.pricing`).

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
        cost = usage_cost(self.store.prices, ledger)
        prompt = ledger.prompt_tokens
        called = now_or_clock(now)

        measured_on = self._handed_version

        def tx(connection: Connection) -> Calibration:
            row = handle.locked(self, connection)
            context = handle.context(self, connection, row)
            return calibrate(
                connection,
                row,
                context,
                prompt,
                called,
                measured_on=measured_on,
                ledger=ledger,
                cost_usd=cost,
            )

        calibration = self.store.write(tx)
        self._usage_warnings(calibration, prompt)
        return calibration.used

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
            and self.store.warn_once(self.id, "low count")
        ):
            warnings.warn(
                f"session {self.id!r}: record_usage({input_tokens}) is below half the store's "
                f"estimate of the context, so it was not used for calibration; with prompt "
                f"caching, pass the cache figures too: cache_read_tokens and "
                f"cache_write_5m_tokens/cache_write_1h_tokens (Anthropic's "
                f"cache_read_input_tokens and cache_creation_input_tokens)",
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
        **switches: bool,
    ) -> CompactionResult:
        """Run the pipeline before a model call, in one transaction.

        Tool-result budget, microcompact, then the auto-compact check (session memory,
        then full compact). Read dedup happens when a tool result is appended, so
        ``enable_read_dedup`` only exists for symmetry (turn dedup off with
        ``CompactionConfig(read_dedup_enabled=False)``). A stage registered in
        :mod:`compactstore.engines.stages` is switched the same way, by its
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
        request = compaction.process_request(
            now_or_clock(now),
            enable_tool_budget=bool(enable_tool_budget),
            enable_microcompact=bool(enable_microcompact),
            enable_auto_compact=bool(enable_auto_compact),
            **{name: bool(value) for name, value in switches.items()},
        )
        if background and enable_auto_compact:
            return self._background(request)
        result = self._compaction(request)
        assert result is not None, "the pipeline always decides"
        return result

    def _background(self, request: compaction.Request) -> CompactionResult:
        """process_request(background=True): see :mod:`compactstore.core.background`."""
        plugins = self._plugins()
        if plugins.summarizer is None:
            result = self._compaction(request)  # nothing to write in the background
            assert result is not None
            return result
        target = handle.target(self.store, self.id, self.adapter)
        result, self._seen_job = background.call(
            self.store, target, request, plugins, self._compaction, self._seen_job
        )
        return result

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
        if not isinstance(error_message, str):
            raise InvalidInputError("error_message must be the API's error text (a string)")
        # Recorded in a text column: a NUL in it must not stop the recovery.
        error = storable_text(error_message)
        at = now_or_clock(now)
        if refuses_provider_object(error):
            # The provider refused the compaction block the wire view sends (its signature,
            # or a model that cannot read it): that boundary is rolled back (the readable
            # turns return) and the range compacted on the client, the error recorded.
            live = self.boundaries()
            if live and live[-1].strategy == CompactStrategy.PROVIDER:
                self.rollback(live[-1].id, now=at)
                plugins = replace(self._plugins(), compactor=None)
                return self._compaction(compaction.reactive_request(at, error), plugins)
        return self._compaction(compaction.reactive_request(at, error))

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
        if instructions is not None:
            # Recorded in a text column, and sent to the summarizer, as stored.
            instructions = storable_text(instructions)
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
        """plan -> decide -> commit: a read transaction, the engines and the
        summarizer with none open, then one short write transaction."""
        store = self.store
        steps = compaction.compaction_steps(
            handle.target(self.store, self.id, self.adapter),
            request,
            plugins if plugins is not None else self._plugins(),
            store.summarizer_executor(),
        )
        return committed(store, store.cache, self.id, steps)

    # -- blobs --------------------------------------------------------------------------

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

        content = self.store.read(read)
        if content is None:
            raise NotFoundError(f"no blob {blob_id} in session {self.id!r}")
        return content
