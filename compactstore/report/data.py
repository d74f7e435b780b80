"""What a report shows, read from the database in one snapshot.

Nothing here renders: :func:`collect` turns a session's rows (model calls, compactions,
boundaries, the active context, the breaker) into plain values the page is drawn from, so
a test can compare the page with the database.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy import Connection

from compactstore._context.media import media_markers
from compactstore._core import handle
from compactstore._core.cost import session_cost
from compactstore._core.recording import boundary_model, compaction_model
from compactstore._core.sessions import edit_state
from compactstore._ledger import CacheRewrite, SessionCost
from compactstore._store.store import CompactStore, Session
from compactstore.db import model_calls
from compactstore.db import repository as repo
from compactstore.db.model_calls import ModelCall
from compactstore.models import (
    BreakerState,
    CompactionResult,
    CompactStrategy,
    CompactTrigger,
    EditState,
)

__all__ = ["CompactionView", "ContextBar", "ReportData", "collect"]


@dataclass(frozen=True, slots=True)
class ContextBar:
    """One message of the active context now."""

    seq: int | None  # None: the summary or a synthetic result (not in the log)
    kind: str
    state: str  # original, persisted, cleared, deduplicated, summary, pinned, synthetic
    tokens: int
    # A marker per image or document it carries: [image png 1000×800, 80 kB].
    media: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class CompactionView:
    """One recorded compaction with where it happened and what it changed."""

    result: CompactionResult
    last_seq: int  # the newest seq of the log when it ran
    card: bool  # it cut or recovered the context: shown in full
    tripped_breaker: bool  # it was the failure that tripped the circuit breaker
    previous_summary: str | None  # the summary it folded in (its boundary's parent's)
    previous_id: int | None  # the compaction that wrote that summary
    summary_diff: list[tuple[str, str]] = field(default_factory=list)  # (" "|"+"|"-", line)
    # The cache it made the provider write again (the first model call after it), if priced.
    rewrite: CacheRewrite | None = None

    @property
    def id(self) -> int:
        assert self.result.id is not None  # recorded rows always have one
        return self.result.id

    @property
    def strategy(self) -> str:
        return self.result.strategy.value if self.result.strategy is not None else "none"

    @property
    def trigger(self) -> str:
        return self.result.trigger.value if self.result.trigger is not None else "none"

    @property
    def rolled_back(self) -> bool:
        return self.result.rolled_back_at is not None

    @property
    def on_chart(self) -> bool:
        """Whether it is drawn on the usage curve: a read dedup's tokens are the re-read's
        own, not the context's (it is listed with the others)."""
        return self.result.strategy != CompactStrategy.READ_DEDUP


@dataclass(frozen=True, slots=True)
class ReportData:
    """Everything one session's page shows."""

    session_id: str
    format: str
    context_window: int
    threshold: float  # the auto-compact threshold, a share of the window
    created_at: float
    message_count: int
    calls: list[ModelCall]
    compactions: list[CompactionView]
    context: list[ContextBar]
    usage: int  # the store's usage of the active context now
    breaker: BreakerState
    breaker_max_failures: int
    # A subagent's session: the session and tool call that started it; and this session's
    # subagents (session id, tool call id).
    parent_session_id: str | None = None
    parent_tool_use_id: str | None = None
    subagents: tuple[tuple[str, str | None], ...] = ()
    # The model, edit policy, thinking binding and the thinking blocks the API dropped.
    edit_state: EditState | None = None
    # What the model calls cost (the ledger's sums and each compaction's cache rewrite).
    cost: SessionCost | None = None

    @property
    def ledger_calls(self) -> list[ModelCall]:
        """The model calls that recorded what they were billed for."""
        return [call for call in self.calls if call.ledger is not None]

    @property
    def rewrites(self) -> list[CompactionView]:
        """The compactions after which the provider wrote cache again (the first call
        after them wrote something)."""
        return [c for c in self.compactions if c.rewrite is not None and c.rewrite.tokens]

    @property
    def cards(self) -> list[CompactionView]:
        return [c for c in self.compactions if c.card]

    @property
    def others(self) -> list[CompactionView]:
        return [c for c in self.compactions if not c.card]

    @property
    def reactive(self) -> list[CompactionView]:
        return [c for c in self.compactions if c.result.trigger == CompactTrigger.REACTIVE]

    @property
    def trips(self) -> list[CompactionView]:
        return [c for c in self.compactions if c.tripped_breaker]

    @property
    def peak(self) -> int:
        """The highest usage any model call or compaction saw."""
        seen = [c.usage for c in self.calls] + [c.real_tokens or 0 for c in self.calls]
        seen += [c.result.tokens_before for c in self.compactions if c.on_chart]
        return max([self.usage, *seen])


def collect(store: CompactStore, session_id: str) -> ReportData:
    """Read one session for its report, in one read transaction.

    Raises:
        NotFoundError: there is no such session.
    """
    session = store.get_session(session_id)
    data = store.read(lambda connection: _collect(connection, session))
    redactor = store.redactor
    if redactor is None:
        return data
    # Every text that leaves the process goes through the redactor.
    views = [
        replace(
            view,
            result=view.result.model_copy(
                update={"summary_text": redactor(view.result.summary_text)}
            ),
            previous_summary=None
            if view.previous_summary is None
            else redactor(view.previous_summary),
            summary_diff=[(mark, redactor(line)) for mark, line in view.summary_diff],
        )
        for view in data.compactions
    ]
    return replace(data, compactions=views)


def _collect(connection: Connection, session: Session) -> ReportData:
    row = repo.get_session(connection, session.id)
    assert row is not None  # get_session found it, and sessions are not deleted mid-read
    boundaries = {
        b.id: boundary_model(b)
        for b in repo.boundary_rows(connection, session.id, include_rolled_back=True)
    }
    rows = repo.compaction_rows(connection, session.id)
    compaction_of = {r.boundary_id: r.id for r in rows if r.boundary_id is not None}
    breaker_row = repo.get_breaker(connection, session.id)
    breaker = BreakerState(
        consecutive_failures=breaker_row.consecutive_failures,
        tripped=bool(breaker_row.tripped),
        reactive_attempts=breaker_row.reactive_attempts,
        last_microcompact_at=breaker_row.last_microcompact_at,
        consecutive_fallbacks=breaker_row.consecutive_fallbacks,
    )
    # Whether the breaker was tripped when each compaction ran, then now: the failure just
    # before a change from untripped to tripped is the one that tripped it.
    inputs = [json.loads(r.inputs) for r in rows]
    tripped = [bool(i.get("tripped", False)) for i in inputs] + [breaker.tripped]
    store = session.store
    cost = session_cost(connection, session.id, store.location, store.prices)
    rewrites = {rewrite.compaction_id: rewrite for rewrite in cost.cache_rewrites}
    views: list[CompactionView] = []
    for index, (compaction, recorded) in enumerate(zip(rows, inputs, strict=True)):
        result = compaction_model(compaction, boundaries)
        boundary = result.boundary
        parent = boundaries.get(boundary.parent_id) if boundary and boundary.parent_id else None
        previous = parent.summary_text if parent is not None else None
        # A card for what cut the context or recovered it; a failed attempt is one line.
        recovered = result.trigger == CompactTrigger.REACTIVE and result.success
        views.append(
            CompactionView(
                result=result,
                last_seq=int(recorded.get("last_seq", -1)),
                card=boundary is not None or recovered,
                tripped_breaker=not tripped[index] and tripped[index + 1],
                previous_summary=previous,
                previous_id=compaction_of.get(parent.id or 0) if parent is not None else None,
                summary_diff=_diff(previous, result.summary_text) if boundary else [],
                rewrite=rewrites.get(compaction.id),
            )
        )
    context = handle.context(session, connection, row)
    return ReportData(
        session_id=row.id,
        format=row.format,
        context_window=row.context_window,
        threshold=row.config.auto_compact_threshold,
        created_at=row.created_at,
        message_count=row.last_seq + 1,
        calls=model_calls.calls_of(connection, session.id),
        compactions=views,
        context=[
            ContextBar(i.seq, i.kind, i.state, i.tokens, tuple(media_markers(i.message)))
            for i in context.items
        ],
        usage=context.usage,
        breaker=breaker,
        breaker_max_failures=row.config.breaker_max_failures,
        parent_session_id=row.parent_session_id,
        parent_tool_use_id=row.parent_tool_use_id,
        subagents=tuple(repo.subagents_of(connection, [session.id])),
        edit_state=edit_state(
            connection, session.id, session.store.location, session.store.model_capabilities
        ),
        cost=cost,
    )


def _diff(previous: str | None, summary: str) -> list[tuple[str, str]]:
    """What changed from the summary folded in: changed lines with one line of context
    ("+" new, "-" gone, " " unchanged, "…" lines left out between two changes)."""
    if previous is None:
        return []
    before, after = previous.splitlines(), summary.splitlines()
    matcher = difflib.SequenceMatcher(None, before, after, autojunk=False)
    lines: list[tuple[str, str]] = []
    for number, group in enumerate(matcher.get_grouped_opcodes(1)):
        if number:
            lines.append(("…", ""))
        for op, b1, b2, a1, a2 in group:
            if op == "equal":
                lines += [(" ", line) for line in before[b1:b2]]
                continue
            lines += [("-", line) for line in before[b1:b2]]
            lines += [("+", line) for line in after[a1:a2]]
    return lines


def as_json(data: ReportData) -> dict[str, Any]:
    """The numbers the page's script draws its readouts from: per model call its seq, the
    store's usage and the provider's count; per call with a ledger its seq, uncached
    input, cache reads, cache writes, output, cost (None: no price) and the cumulative
    cost of the priced calls so far."""
    billed: list[list[Any]] = []
    total = 0.0
    for call in data.ledger_calls:
        usage = call.ledger
        assert usage is not None
        total += call.cost_usd or 0.0
        billed.append(
            [
                call.seq,
                usage.input_tokens,
                usage.cache_read_tokens,
                usage.cache_write_tokens,
                usage.output_tokens,
                call.cost_usd,
                round(total, 6),
            ]
        )
    return {
        "session": data.session_id,
        "window": data.context_window,
        "threshold": data.threshold,
        "calls": [[c.seq, c.usage, c.real_tokens] for c in data.calls],
        "billed": billed,
    }
