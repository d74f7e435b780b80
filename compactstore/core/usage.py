"""Calibration from the provider's real prompt counts (SPEC §6, §9.4).

After ``record_usage(n)`` the session's usage is ``n`` plus the factor times what was
appended since; the factor itself is learnt from the growth between consecutive counts.
"""

from __future__ import annotations

from sqlalchemy import Connection

from compactstore.context import ActiveContext
from compactstore.db import model_calls
from compactstore.db import repository as repo
from compactstore.tokens import PRIOR_WEIGHT, learn_factor

__all__ = ["calibrate"]


def calibrate(
    connection: Connection,
    session: repo.SessionRow,
    context: ActiveContext,
    input_tokens: int,
    called_at: float,
) -> None:
    """Store the real count of ``context`` and learn the factor from it; record the call
    in ``model_calls``.

    A model call that went through also resets the reactive-recovery counter.
    """
    sid = session.id
    raw = context.raw_tokens
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
    repo.set_breaker(connection, sid, reactive_attempts=0)
    model_calls.insert_calls(
        connection,
        sid,
        [model_calls.ModelCall(session.last_seq, context.usage, input_tokens, called_at)],
    )
