"""What compaction may still edit in a run of context messages: tool results and media in
the context whole (in the log, not pinned, not persisted or cleared yet)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

from compactstore.media import media_blocks, user_media

if TYPE_CHECKING:
    from compactstore.context import ContextMessage

__all__ = ["OpenMedia", "OpenResults", "open_media", "open_results_of"]


class OpenResults(NamedTuple):
    """The tool results compaction may still persist or clear: in the log (not synthetic),
    not pinned, not persisted or cleared already."""

    total: int
    longest: int  # characters of the longest; 0 when none

    def merged(self, other: OpenResults) -> OpenResults:
        """The open results of both runs of messages together."""
        return OpenResults(self.total + other.total, max(self.longest, other.longest))


def open_results_of(items: Sequence[ContextMessage]) -> OpenResults:
    lengths = [
        len(result.text)
        for item in items
        if item.seq is not None and not item.pinned
        for result in item.results
        if result.replaceable and result.tool_use_id not in item.edited_ids
    ]
    return OpenResults(len(lengths), max(lengths, default=0))


class OpenMedia(NamedTuple):
    """Media still in the context whole: in a tool result (``tool_use_id``) or at the top of
    a user message's content (``tool_use_id`` None)."""

    at: int  # index in the items given
    tool_use_id: str | None
    blocks: int
    # False for a pinned message, which never changes: it counts, but stays.
    movable: bool


def open_media(items: Sequence[ContextMessage]) -> list[OpenMedia]:
    """Every tool result and user message with media still in the context whole (in the
    log, not persisted or cleared), oldest first; what ``max_media_in_context`` limits."""
    found: list[OpenMedia] = []
    for index, item in enumerate(items):
        if item.seq is None:
            continue
        movable = not item.pinned
        for result in item.results:
            if (
                result.has_media
                and result.replaceable
                and result.tool_use_id not in item.edited_ids
            ):
                count = sum(1 for _ in media_blocks(result.blocks))
                found.append(OpenMedia(index, result.tool_use_id, count, movable))
        if item.kind != "assistant" and (count := len(user_media(item.message))):
            found.append(OpenMedia(index, None, count, movable))
    return found
