"""Token estimation (SPEC §6): CJK characters / 1.5 + other characters / 4."""

from __future__ import annotations

import math
import re
from collections.abc import Callable

__all__ = ["TokenCounter", "estimate_tokens", "learn_factor"]

TokenCounter = Callable[[str], int]

# Han ideographs (incl. extension A and compatibility), kana, Hangul syllables and jamo.
_CJK = re.compile(
    "[\u1100-\u11ff\u3040-\u30ff\u31f0-\u31ff\u3130-\u318f\u3400-\u4dbf"
    "\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\uff66-\uff9f]"
)


def estimate_tokens(text: str) -> int:
    """Estimate the tokens of ``text`` the way the MiniCode article does.

    Args:
        text: any string.

    Returns:
        ceil(CJK characters / 1.5 + other characters / 4); 0 for the empty string.
    """
    if not text:
        return 0
    cjk = len(_CJK.findall(text)) if not text.isascii() else 0
    return math.ceil(cjk / 1.5 + (len(text) - cjk) / 4)


# Calibration (SPEC §6). Growth smaller than this says little about the ratio.
MIN_CALIBRATION_GROWTH = 200
# Ratios outside these bounds are not the density of the new messages but content the
# messages do not show (reminders or reasoning the client added or dropped): not learnt.
MIN_FACTOR, MAX_FACTOR = 0.5, 4.0
# Weight, in estimated tokens, of the configured factor before any growth was seen, and the
# decay applied to older evidence at each new real count.
PRIOR_WEIGHT = 1_000.0
DECAY = 0.9


def learn_factor(
    factor: float, weight: float, grown_real: int, grown_estimate: int
) -> tuple[float, float] | None:
    """Update the correction factor with the growth between two real counts.

    The factor is a ratio of sums — real growth over estimated growth, older intervals
    decayed — so a large interval counts for more than a small, noisy one.

    Args:
        factor: the current factor (the configured default before any evidence).
        weight: the estimated tokens behind it (PRIOR_WEIGHT before any evidence).
        grown_real: growth of the provider's count since the previous real count.
        grown_estimate: growth of the store's raw estimate over the same messages.

    Returns:
        The new (factor, weight), or None when the interval teaches nothing.
    """
    if grown_estimate < MIN_CALIBRATION_GROWTH or grown_real <= 0:
        return None
    if not MIN_FACTOR <= grown_real / grown_estimate <= MAX_FACTOR:
        return None
    kept = DECAY * weight
    new_weight = kept + grown_estimate
    return (kept * factor + grown_real) / new_weight, new_weight
