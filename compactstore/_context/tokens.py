"""Token estimation: CJK characters / 1.5 + other characters / 4; media by size.

Text is estimated from its characters. Images and documents are never counted
as the characters of their base64: an image counts ``min(1600, width*height/750)`` when its
size is readable from the data, else 1,600; a document counts DOCUMENT_PAGE_TOKENS per
page. :func:`message_tokens` is the one place a message's estimate is made.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any, Protocol

__all__ = [
    "DOCUMENT_PAGE_TOKENS",
    "IMAGE_MAX_TOKENS",
    "IMAGE_PIXELS_PER_TOKEN",
    "PDF_BYTES_PER_PAGE",
    "TokenCounter",
    "TokenTexts",
    "document_tokens",
    "estimate_tokens",
    "image_tokens",
    "learn_factor",
    "message_tokens",
]

TokenCounter = Callable[[str], int]


class TokenTexts(Protocol):
    """What :func:`message_tokens` needs of a message format (its adapter)."""

    def message_tokens(self, message: dict[str, Any], count: TokenCounter) -> int: ...


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


# Images: Anthropic's published cost, width x height / 750, up to the 1,600 an
# image scaled to the API's limit costs; an image whose size cannot be read counts the most.
IMAGE_MAX_TOKENS = 1_600
IMAGE_PIXELS_PER_TOKEN = 750
# Documents: Anthropic bills each PDF page as its text (1,500-3,000 tokens a page, by its
# documentation) plus the page as an image; 3,000 is the top of the text range, so a
# document is not undercounted before a real count calibrates the session.
DOCUMENT_PAGE_TOKENS = 3_000
# A PDF whose pages cannot be counted (objects in compressed streams) counts one page per
# started 50 kB of data.
PDF_BYTES_PER_PAGE = 50_000


def image_tokens(width: int | None, height: int | None) -> int:
    """Tokens of an image: ceil(width x height / 750) up to 1,600; 1,600 when unknown."""
    if not width or not height:
        return IMAGE_MAX_TOKENS
    return min(IMAGE_MAX_TOKENS, math.ceil(width * height / IMAGE_PIXELS_PER_TOKEN))


def document_tokens(pages: int) -> int:
    """Tokens of a document of ``pages`` pages."""
    return max(1, pages) * DOCUMENT_PAGE_TOKENS


def message_tokens(fmt: TokenTexts, message: dict[str, Any], count: TokenCounter) -> int:
    """The estimate stored with a message: ``count`` (the session's token counter) over its
    text, calls and results, plus the figure of each image or document it carries (the
    format's ``message_tokens``, which knows where its media are)."""
    return fmt.message_tokens(message, count)


# Calibration. Growth smaller than this says little about the ratio.
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
