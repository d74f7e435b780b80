"""Text and JSON as the store writes them (a leaf: no compactstore imports)."""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["storable_text", "storage_json"]


def storage_json(value: Any) -> str:
    """JSON as messages are stored: key order kept, non-ASCII kept, NaN refused."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


_SURROGATE = re.compile("[\ud800-\udfff]")


def storable_text(text: str) -> str:
    """Text the store derives (a summary, a reason, a path key) as every backend can store
    it in a text column: PostgreSQL text cannot hold NUL, and no UTF-8 column can hold a
    lone surrogate (a summarizer or an exception may still give one), so each becomes
    U+FFFD, the replacement character. Messages never go through this: their JSON spells
    NUL as an escape and reads back exactly, and a message with a lone surrogate is refused."""
    if "\x00" in text:
        text = text.replace("\x00", "\ufffd")
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            text = _SURROGATE.sub("\ufffd", text)
    return text
