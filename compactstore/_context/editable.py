"""What compaction may still edit in a run of context messages: tool results and media in
the context whole (in the log, not pinned, not persisted or cleared yet)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, NamedTuple

from compactstore._context.media import media_blocks, user_media

if TYPE_CHECKING:
    from compactstore._context.message import ContextMessage
    from compactstore.formats import ToolResult

__all__ = ["OpenMedia", "OpenResults", "open_media", "open_results_in", "open_results_of"]


def open_results_in(
    items: Sequence[ContextMessage],
) -> Iterator[tuple[int, ContextMessage, ToolResult]]:
    """(index, message, result) of every tool result an engine may still persist or clear:
    in the log (not synthetic), not pinned, not persisted or cleared already."""
    for index, item in enumerate(items):
        if item.seq is not None and not item.pinned:
            for result in item.results:
                if result.replaceable and result.tool_use_id not in item.edited_ids:
                    yield index, item, result


class OpenResults(NamedTuple):
    """How many tool results :func:`open_results_in` finds, and the longest."""

    total: int
    longest: int  # characters of the longest; 0 when none

    def merged(self, other: OpenResults) -> OpenResults:
        """The open results of both runs of messages together."""
        return OpenResults(self.total + other.total, max(self.longest, other.longest))


def open_results_of(items: Sequence[ContextMessage]) -> OpenResults:
    lengths = [len(result.text) for _, _, result in open_results_in(items)]
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
