"""Calibration from the provider's real prompt counts.

After ``record_usage(n)`` the session's usage is ``n`` plus the factor times what was
appended since; the factor itself is learnt from the growth between consecutive counts.
Two counts are not taken at their word:

- a count below half the store's raw estimate of the context (no factor, no overhead) is
  not used: the usual cause is ``input_tokens`` alone under prompt caching, which would
  make the store believe the context is nearly empty and never compact it;
- a count whose overhead (the count minus the factor times the raw estimate: the system
  prompt and tool definitions) fills the auto-compact threshold of the window by itself
  says that no compaction can help: one failed ``auto`` compaction is recorded with the
  numbers, and the breaker trips at once instead of compacting on every turn.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Connection

from compactstore._context.active import ActiveContext
from compactstore._context.tokens import PRIOR_WEIGHT, learn_factor
from compactstore._core.recording import record_attempt
from compactstore._core.replay_inputs import UsageCheck
from compactstore._ledger import CallUsage
from compactstore.db import model_calls
from compactstore.db import repository as repo
from compactstore.models import CompactTrigger

__all__ = ["Calibration", "calibrate"]


@dataclass(frozen=True, slots=True)
class Calibration:
    """What a real count did: ``used`` for calibration; ``overhead_reason`` when the
    overhead alone fills the window (a failed compaction was recorded with it)."""

    used: bool
    overhead_reason: str | None = None
    # Measured on a context version this session has left (a compaction, rollback or
    # config change since the handle handed its context out).
    superseded: bool = False


def calibrate(
    connection: Connection,
    session: repo.SessionRow,
    context: ActiveContext,
    input_tokens: int,
    called_at: float,
    *,
    measured_on: int | None = None,
    ledger: CallUsage | None = None,
    cost_usd: float | None = None,
) -> Calibration:
    """Store the real count of ``context`` and learn the factor from it; record the call
    in ``model_calls`` with what it was billed (``ledger``, ``cost_usd``), against the
    context version it sent. A model call that went through resets the reactive-recovery
    counter whether or not its count is used.
    """
    sid = session.id
    sent = session.context_version if measured_on is None else measured_on

    def call(real_tokens: int | None) -> list[model_calls.ModelCall]:
        return [
            model_calls.ModelCall(
                session.last_seq,
                context.usage,
                real_tokens,
                called_at,
                ledger=ledger,
                cost_usd=cost_usd,
                context_version=sent,
            )
        ]

    raw = context.raw_tokens
    repo.set_breaker(connection, sid, reactive_attempts=0)
    superseded = measured_on is not None and measured_on != session.context_version
    if superseded or input_tokens < raw / 2:
        model_calls.insert_calls(connection, sid, call(None))
        repo.update_session(connection, sid)
        return Calibration(used=False, superseded=superseded)
    factor, weight = session.config.token_factor, PRIOR_WEIGHT
    if session.token_factor is not None and session.token_factor_weight is not None:
        factor, weight = session.token_factor, session.token_factor_weight
    if session.real_tokens is not None and session.real_estimate is not None:
        learnt = learn_factor(
            factor, weight, input_tokens - session.real_tokens, raw - session.real_estimate
        )
        if learnt is not None:
            factor, weight = learnt
            repo.update_session(connection, sid, token_factor=factor, token_factor_weight=weight)
    offset = input_tokens - session.config.fixed_overhead_tokens - round(factor * raw)
    repo.update_session(
        connection, sid, usage_offset=offset, real_tokens=input_tokens, real_estimate=raw
    )
    model_calls.insert_calls(connection, sid, call(input_tokens))
    return Calibration(
        used=True,
        overhead_reason=_check_overhead(
            connection, session, context, input_tokens, round(factor * raw), called_at
        ),
    )


def _check_overhead(
    connection: Connection,
    session: repo.SessionRow,
    context: ActiveContext,
    input_tokens: int,
    estimate: int,
    at: float,
) -> str | None:
    """Record the window as full of overhead (once, until the breaker is reset)."""
    config = session.config
    overhead = input_tokens - estimate
    limit = config.auto_compact_threshold * session.context_window
    breaker = repo.get_breaker(connection, session.id)
    if overhead < limit or breaker.tripped:
        return None
    reason = (
        f"the overhead outside the messages (system prompt, tool definitions) is {overhead:,} "
        f"tokens: the real count {input_tokens:,} minus {estimate:,} for the messages; that "
        f"is at least {config.auto_compact_threshold:.0%} of the {session.context_window:,}-"
        f"token window ({limit:,.0f}), so no compaction can make room; the breaker is tripped "
        f"(reset_breaker() re-arms it)"
    )
    usage = input_tokens
    record_attempt(
        connection,
        session.id,
        trigger=CompactTrigger.AUTO,
        reason=reason,
        tokens=usage,
        config=config,
        inputs=UsageCheck(
            call="usage", now=at, last_seq=context.last_seq, real_tokens=input_tokens
        ).model_dump_json(),
        at=at,
    )
    repo.set_breaker(
        connection,
        session.id,
        consecutive_failures=max(breaker.consecutive_failures + 1, config.breaker_max_failures),
        tripped=True,
    )
    return reason
