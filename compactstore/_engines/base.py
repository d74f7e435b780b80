"""What engines receive besides the context, and what they return.

An engine is a pure function of (active context, config, now, inputs) -> StageResult.
It reads no clock, touches no database and commits nothing: the store writes the
result's edits, blobs and cut, which is what makes replay exact.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from compactstore._context.active import ActiveContext, ContextMessage
from compactstore._context.media import user_media, user_media_note, without_user_media
from compactstore.capabilities import EditPolicy
from compactstore.formats.base import storable_text
from compactstore.models import CompactStrategy, CompactTrigger, SummaryInfo, SummaryState

__all__ = [
    "AsyncSummarizer",
    "Cut",
    "Edit",
    "EngineInputs",
    "NewBlob",
    "StageResult",
    "Summarizer",
    "SummaryAnswer",
    "SummaryRequest",
    "SummaryResult",
    "SummaryService",
    "nearest_legal_cut",
]


@dataclass(frozen=True, slots=True)
class SummaryResult:
    """What a summarizer may return instead of a plain string: the text, and what the
    model reported (recorded with the compaction)."""

    text: str
    input_tokens: int | None = None
    output_tokens: int | None = None
    model: str | None = None


class Summarizer(Protocol):
    """Replaces the rule-based summary, e.g. with an LLM call.

    Receives the messages being removed, the previous boundary's summary (or None) and the
    instructions given to ``compact()``; returns the summary text or a
    :class:`SummaryResult`. It runs with no database transaction open, in a bounded
    executor, for at most ``summarizer_timeout_seconds``. Raising anything (SummarizerError
    included), timing out or returning no text falls back to the rule-based summary and
    counts one fallback. Replay reuses the recorded text; it calls the summarizer again
    only with ``resummarize=True``.
    """

    def __call__(
        self,
        messages: list[dict[str, Any]],
        previous_summary: str | None,
        instructions: str | None,
        /,
    ) -> str | SummaryResult: ...


class AsyncSummarizer(Protocol):
    """A summarizer as ``async def`` (or an object with an async ``__call__``): only
    :class:`~compactstore.AsyncCompactStore` takes one; it is awaited on the store's loop."""

    def __call__(
        self,
        messages: list[dict[str, Any]],
        previous_summary: str | None,
        instructions: str | None,
        /,
    ) -> Awaitable[str | SummaryResult]: ...


@dataclass(frozen=True, slots=True)
class SummaryRequest:
    """What a cut asks of the summary service: the removed messages (copies) and their seqs."""

    messages: list[dict[str, Any]]
    previous_summary: str | None
    instructions: str | None
    removed_seqs: tuple[int, ...]
    # The range as the provider was sent it (a provider compactor summarises these): the
    # earlier provider summary first when there is one, then the removed messages with
    # their thinking, in the wire view's form.
    wire: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True, slots=True)
class SummaryAnswer:
    """The service's answer: the text to use, or None for the rule-based summary; ``info``
    is recorded with the compaction."""

    text: str | None
    info: SummaryInfo
    # A provider compaction: the message that stands for the range on the wire (its block
    # exactly as returned), and the compaction's billed usage (``usage.iterations``).
    message: dict[str, Any] | None = None
    iterations: tuple[dict[str, Any], ...] = ()


class SummaryService(Protocol):
    """How an engine gets a summary written by something other than its rules.

    The driver gives the engines one (:mod:`compactstore._core.summarizing`): it calls the
    caller's summarizer with a timeout, or reuses a recorded or earlier text. It never
    raises; failures come back as an answer without text.
    """

    def __call__(self, request: SummaryRequest) -> SummaryAnswer: ...


@dataclass(frozen=True, slots=True)
class EngineInputs:
    """Stored state an engine may need, loaded by the store in the same transaction."""

    now: float
    next_blob_id: int = 1
    memory_text: str = ""
    memory_count: int = 0
    last_microcompact_at: float = 0.0
    consecutive_failures: int = 0
    tripped: bool = False
    reactive_attempts: int = 0
    summary_state: SummaryState = field(default_factory=SummaryState)
    summarizer: SummaryService | None = None
    instructions: str | None = None
    # The session's edit policy, resolved ("auto" decided by its model), and whether its
    # model's API checks the prefix of every thinking block sent back.
    edit_policy: EditPolicy = "rewrite"
    prefix_checks: bool = False
    # The prompt cache as the ledger knows it: when the newest model call was recorded and
    # the seq its context ended at (None: no call yet), the median gap between recent
    # calls, and the model's cache read price (a multiple of its input price).
    last_call_at: float | None = None
    sent_seq: int | None = None
    call_gap: float | None = None
    cache_read: float = 0.1


@dataclass(frozen=True, slots=True)
class Edit:
    """New content for one message of the kept part (its original stays in the log)."""

    seq: int
    state: Literal["persisted", "cleared"]  # what the message becomes in the context
    tool_use_ids: tuple[str, ...]
    message: dict[str, Any]
    tokens: int

    @staticmethod
    def of_results(
        context: ActiveContext,
        item: ContextMessage,
        replacements: dict[str, str],
        state: Literal["persisted", "cleared"],
        *,
        user_media_blob: NewBlob | None = None,
    ) -> tuple[ContextMessage, Edit]:
        """``item`` with the results of ``replacements``' call ids replaced by their texts
        (and, given ``user_media_blob``, its own media by the note naming that blob), and
        the edit that records it."""
        assert item.seq is not None, "only logged messages are edited"
        message = context.fmt.replace_tool_results(item.message, replacements)
        if user_media_blob is not None:
            note = user_media_note(user_media(message), blob_id=user_media_blob.id)
            message = without_user_media(message, note)
        tokens = context.message_tokens(message)
        edited = ContextMessage.build(
            context.fmt,
            message,
            tokens=tokens,
            seq=item.seq,
            state=state,
            created_at=item.created_at,
            edited_ids=item.edited_ids | set(replacements),
        )
        return edited, Edit(item.seq, state, tuple(replacements), message, tokens)


@dataclass(frozen=True, slots=True)
class NewBlob:
    """A tool result persisted whole, under a per-session id chosen by the engine."""

    id: int
    seq: int
    tool_use_id: str
    tool_name: str
    content: str
    # The result carried media: ``content`` is the JSON of its blocks and the context
    # holds a media note instead of a preview.
    media: bool = False


@dataclass(frozen=True, slots=True)
class Cut:
    """A new boundary: everything before first_kept_seq is summarised."""

    first_kept_seq: int
    last_kept_seq: int | None
    summary_text: str
    summary_state: SummaryState
    removed_seqs: tuple[int, ...]
    summary: SummaryInfo | None = None  # how the text was written (None: rule-based)
    # A provider compaction's billed usage (its usage.iterations), recorded as a model call.
    iterations: tuple[dict[str, Any], ...] = ()

    @classmethod
    def of(
        cls,
        after: ActiveContext,
        removed: Sequence[ContextMessage],
        summary_text: str,
        summary_state: SummaryState,
        summary: SummaryInfo | None = None,
        iterations: Sequence[dict[str, Any]] = (),
    ) -> Cut:
        """The cut that produced ``after`` by summarising ``removed``. The summary text is
        kept as it is stored (and as ``after`` holds it): a NUL quoted from a message, or
        written by a summarizer, becomes U+FFFD."""
        return cls(
            first_kept_seq=after.first_kept_seq,
            last_kept_seq=after.last_seq if after.kept else None,
            summary_text=storable_text(summary_text),
            summary_state=summary_state,
            removed_seqs=tuple(item.seq for item in removed if item.seq is not None),
            summary=summary,
            iterations=tuple(iterations),
        )


@dataclass(frozen=True, slots=True)
class StageResult:
    """One stage's outcome. ``context`` is the context after it (unchanged on failure)."""

    strategy: CompactStrategy
    trigger: CompactTrigger
    applied: bool  # the stage changed the context (it may still have freed nothing)
    context: ActiveContext
    tokens_before: int
    tokens_after: int
    edits: tuple[Edit, ...] = ()
    blobs: tuple[NewBlob, ...] = ()
    cut: Cut | None = None
    detail: str = ""
    # False when the stage decided it had nothing to do: no step is recorded for it.
    attempted: bool = True

    @property
    def tokens_freed(self) -> int:
        return self.tokens_before - self.tokens_after

    @property
    def effective(self) -> bool:
        return self.applied and self.tokens_freed > 0


def nearest_legal_cut(
    legal: Sequence[bool], index: int, *, highest: int, lowest: int = 1
) -> int | None:
    """The legal cut closest to ``index`` within [lowest, highest], never splitting a pair.

    A cut at i removes the messages before i. Earlier cuts (keeping more) are tried first,
    down to ``lowest``, then later ones up to ``highest`` (which bounds how much may go, so a
    stage's minimum tail is always kept); a stage's soft cap on the tail (``lowest``) gives
    way last, below it. None when no legal cut in 1..highest exists.
    """
    highest = min(highest, len(legal) - 1)
    if highest < 1:
        return None
    lowest = max(1, min(lowest, highest))
    index = max(lowest, min(index, highest))
    for candidates in (
        range(index, lowest - 1, -1),
        range(index + 1, highest + 1),
        range(lowest - 1, 0, -1),
    ):
        for candidate in candidates:
            if legal[candidate]:
                return candidate
    return None


def removable(items: Sequence[ContextMessage]) -> list[int]:
    """Indexes of the messages a cut may remove (everything but pins and the summary)."""
    return [i for i, item in enumerate(items) if not item.pinned]
