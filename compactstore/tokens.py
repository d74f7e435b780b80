"""Token estimation (SPEC §6): CJK characters / 1.5 + other characters / 4."""

from __future__ import annotations

import math
import re
from collections.abc import Callable

__all__ = ["TokenCounter", "estimate_tokens"]

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
