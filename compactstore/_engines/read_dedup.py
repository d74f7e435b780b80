"""Stage 3, read dedup. It runs at tool-execution time, in append_tool_result.

A read of a path whose content hash matches the last registered read of that path is
answered with a stub pointing at the earlier message instead of the content again —
but only while that earlier content is still in the active context in full; once it was
cleared, persisted or summarised away, the read goes through and becomes the new reference.
"""

from __future__ import annotations

import hashlib

__all__ = ["content_hash", "dedup_stub", "should_deduplicate"]


def content_hash(content: str) -> str:
    """MD5 of the content: a fingerprint for equality, not a security measure."""
    return hashlib.md5(content.encode("utf-8"), usedforsecurity=False).hexdigest()


def should_deduplicate(
    previous_hash: str | None, new_hash: str, *, previous_in_context_in_full: bool
) -> bool:
    """Whether a read can be replaced by a stub."""
    return previous_hash == new_hash and previous_in_context_in_full


def dedup_stub(file_path: str, seq: int) -> str:
    """The text that stands for an unchanged re-read."""
    return (
        f"[Read deduplicated: {file_path}]\n"
        "File unchanged since last read. The content from the earlier read tool result "
        "in this conversation is still current — refer to that instead.\n"
        f"(Original content at message seq {seq})"
    )
