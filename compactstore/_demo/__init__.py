"""A deterministic coding-agent session that drives every compaction stage.

:func:`run_demo` plays an agent refactoring the error handling of a payments service:
it reads, greps, edits and tests a simulated repository (``src/payments/*.py``), answers
follow-up requests from the user and writes down memory. Tool results are generated from
the simulated files, so an unchanged re-read returns byte-identical text and an edit
changes it. Everything comes from one seeded ``random.Random`` and a simulated clock that
starts at :data:`START_EPOCH`: the store is always given ``timestamp=`` / ``now=``, so two
runs produce the same rows, summaries and active context.

The window is small (:data:`DEMO_CONTEXT_WINDOW`) so a few hundred steps show every stage:

- tool-result budget: big file reads, grep dumps and test logs (> 4,000 characters);
- read dedup: re-reads of files that did not change since they were read;
- microcompact: the clock passes 3,600 s, and the user takes a two-hour break;
- auto-compact: the first one runs before any memory exists (a full compact); memory is
  written afterwards, so later ones are session-memory compacts;
- reactive recovery: a burst of parallel test runs is sent without the pre-call
  pipeline, the API answers "prompt is too long", and ``reactive_recover`` takes over;
- a manual ``compact(instructions=...)`` near the end, which the user then rolls back.

:data:`DEMO_CONFIG` scales the session-memory tail to the small window (the defaults are
sized for 200,000 tokens, where a 40,000-token tail fits); every other threshold is the
default. :func:`audit_queries` gives SQL to inspect the result with ``sqlite3`` or ``psql``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from compactstore._core.checks import check_session_id
from compactstore._demo.agent import (
    DEMO_CONTEXT_WINDOW,
    DEMO_SEED,
    FIRED_KEYS,
    STAGE_KEYS,
    START_EPOCH,
    Agent,
)
from compactstore._demo.script import USER_REQUEST
from compactstore._store.store import CompactStore
from compactstore.db.stats import stage_counts
from compactstore.errors import InvalidInputError
from compactstore.models import CompactionConfig
from compactstore.transfer import staging

__all__ = [
    "DEMO_CONFIG",
    "DEMO_CONTEXT_WINDOW",
    "DEMO_SEED",
    "FIRED_KEYS",
    "START_EPOCH",
    "DemoReport",
    "audit_queries",
    "run_demo",
]

DEMO_CONFIG = CompactionConfig(
    session_memory_max_tokens=1_500,
    session_memory_min_tail_tokens=3_000,
    session_memory_max_tail_tokens=9_000,
)


@dataclass(frozen=True)
class DemoReport:
    """What a demo run did."""

    session_id: str
    steps: int
    messages: int
    # Per stage (STAGE_KEYS: the session's compaction_steps rows that acted, by strategy;
    # the manual compact counts under "full" too) and per event ("manual", "rollback").
    fired: dict[str, int]
    compactions: int
    tokens_freed: dict[str, int]  # the same keys but "rollback" (it frees nothing)
    peak_usage: int  # the largest context, the staged "prompt is too long" included
    context_window: int
    peak_sent: int = 0  # the largest context the pre-call pipeline handed to the model


def audit_queries() -> list[tuple[str, str]]:
    """Three (title, SQL) queries to audit the demo; portable to SQLite and PostgreSQL.

    Paste one into ``sqlite3 compactstore.db`` (or ``psql``). The first reads what each
    stage did (``compaction_steps``), the second the ``compaction_history`` view, the third
    the persisted tool results.
    """
    return [
        (
            "What each stage did and freed (the figures of the summary and of stats)",
            """SELECT s.session_id, s.strategy,
       COUNT(*) AS times,
       SUM(s.tokens_freed) AS tokens_freed,
       SUM(s.results_cleared) AS results_cleared,
       SUM(s.results_persisted) AS results_persisted,
       SUM(CASE WHEN c.rolled_back_at IS NULL THEN 0 ELSE 1 END) AS rolled_back
FROM compaction_steps AS s
JOIN compactions AS c ON c.id = s.compaction_id
WHERE s.success
GROUP BY s.session_id, s.strategy
ORDER BY s.session_id, SUM(s.tokens_freed) DESC, s.strategy;""",
        ),
        (
            "What each boundary removed",
            """SELECT session_id, compaction_id, boundary_id, parent_boundary_id, created,
       trigger, strategy, messages_removed, first_kept_seq, last_kept_seq,
       tokens_before, tokens_after, tokens_freed,
       CASE WHEN rolled_back IS NULL THEN 'live' ELSE 'rolled back' END AS state
FROM compaction_history
WHERE boundary_id IS NOT NULL
ORDER BY session_id, compaction_id;""",
        ),
        (
            "Largest persisted tool results",
            """SELECT t.session_id, t.id AS blob_id, t.tool_name, t.size AS bytes,
       t.seq AS message_seq, t.tool_use_id,
       c.strategy AS persisted_by, c.trigger
FROM tool_result_blobs AS t
JOIN compactions AS c ON c.id = t.compaction_id
ORDER BY t.size DESC, t.session_id, t.id
LIMIT 10;""",
        ),
    ]


def _fresh_id(store: CompactStore, wanted: str) -> str:
    taken = {info.id for info in store.sessions()}
    if wanted not in taken:
        return wanted
    number = 2
    while f"{wanted}-{number}" in taken:
        number += 1
    return f"{wanted}-{number}"


def run_demo(
    store: CompactStore,
    *,
    session_id: str = "demo",
    steps: int = 300,
    progress: Callable[[int, int], None] | None = None,
) -> DemoReport:
    """Play the demo session into ``store`` and report what every stage did.

    Args:
        store: where the session is copied, in one transaction, once it is complete.
        session_id: the session's id; when it is taken, the first free of
            ``<id>-2``, ``<id>-3``, ... is used (see the report's ``session_id``).
        steps: model turns to play. Around 150 or more reach every stage; 300 is the default.
        progress: called with (steps done, steps) after each turn.

    Raises:
        InvalidInputError: steps is not a positive whole number.

    Returns:
        A :class:`DemoReport`; the same ``steps`` always give the same report and rows.
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise InvalidInputError(f"steps must be a positive whole number, got {steps!r}")
    sid = _fresh_id(store, check_session_id(session_id))  # (NFC, as the store keeps it)
    # Played into a temporary database and copied into the store when complete: a demo
    # that is stopped (Ctrl-C, kill, a full disk) leaves no half session there.
    with staging(store) as stage:
        session = stage.session(
            sid,
            context_window=DEMO_CONTEXT_WINDOW,
            format="anthropic",
            config=DEMO_CONFIG,
            now=START_EPOCH,
        )
        agent = Agent(stage, session, steps)
        agent.say(USER_REQUEST)
        for index in range(steps):
            agent.step(index)
            if progress is not None:
                progress(index + 1, steps)
        # What each stage did, as the rows say (and `compactstore stats` counts it): every
        # stage of a call counted, the manual compact among the full ones.
        stages = stage.read(lambda connection: stage_counts(connection, sid))
        for key in STAGE_KEYS:
            agent.fired[key], agent.freed[key] = stages.get(key, (0, 0))
        compactions = len(session.compactions())
    return DemoReport(
        session_id=sid,
        steps=steps,
        messages=agent.messages,
        fired=agent.fired,
        compactions=compactions,
        tokens_freed=agent.freed,
        peak_usage=agent.peak,
        context_window=DEMO_CONTEXT_WINDOW,
        peak_sent=agent.peak_sent,
    )
