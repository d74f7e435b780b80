"""The provider's real token count of any context of a replay, learnt from the usage a
transcript reports (see :mod:`compactstore._simulate`)."""

from __future__ import annotations

from compactstore._context.active import ActiveContext
from compactstore._context.tokens import MAX_FACTOR, MIN_FACTOR
from compactstore._importers import Transcript

__all__ = ["RealTokens"]


class RealTokens:
    """The provider's token count of any context, learnt from the transcript's usage."""

    def __init__(self, transcript: Transcript, estimates: list[int]) -> None:
        self.real: list[float | None] = [None] * len(transcript.messages)
        # Content the provider counted that the messages do not show (reminders a client
        # adds, reasoning it keeps or drops), as (from message index, tokens) steps.
        self.hidden: list[tuple[int, float]] = []
        calls = [(i, u) for i, u in enumerate(transcript.usage) if u is not None]
        self.overhead: float | None = None
        self.ratio = 1.0
        if not calls:
            return
        boundaries = sorted(b.first_kept_index for b in transcript.boundaries)
        growth_real = growth_est = 0.0
        previous_index, previous_usage = calls[0]
        for index, usage in calls[1:]:
            if any(previous_index < b <= index for b in boundaries):
                previous_index, previous_usage = index, usage
                continue
            span = range(previous_index, index)
            est = sum(estimates[k] for k in span)
            grown = usage - previous_usage
            share = min(MAX_FACTOR, max(MIN_FACTOR, grown / est)) if est > 0 else 0.0
            for k in span:
                self.real[k] = estimates[k] * share
            if grown - est * share:
                self.hidden.append((index, grown - est * share))
            if est > 0 and MIN_FACTOR <= grown / est <= MAX_FACTOR:
                growth_real += grown
                growth_est += est
            previous_index, previous_usage = index, usage
        self.ratio = growth_real / growth_est if growth_est else 1.0
        # The first call's excess over its messages is the fixed overhead (system prompt
        # and tool definitions).
        first_index, first_usage = calls[0]
        self.overhead = max(0.0, first_usage - self.ratio * sum(estimates[:first_index]))
        for k in range(len(self.real)):
            if self.real[k] is None:
                self.real[k] = estimates[k] * self.ratio

    @property
    def known(self) -> bool:
        return self.overhead is not None

    def of(self, context: ActiveContext, index_of_seq: dict[int, int], at: int) -> int:
        """Real prompt size of a context of ours, for the call producing message ``at``."""
        assert self.overhead is not None
        # Hidden content the client dropped again cannot make the prompt smaller than shown.
        total = self.overhead + max(
            0.0, sum(tokens for index, tokens in self.hidden if index <= at)
        )
        for item in context.items:
            source = index_of_seq.get(item.seq) if item.seq is not None else None
            if source is not None and item.state in ("original", "pinned"):
                real = self.real[source]
                total += real if real is not None else item.tokens * self.ratio
            else:
                total += item.tokens * self.ratio
        return max(0, round(total))
