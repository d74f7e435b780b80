"""Stage 2, tool-result budget.

Every tool result longer than ``tool_result_max_chars`` is stored whole as a blob and
replaced in the active context by a preview stub of at most ``tool_result_preview_chars``:
a header with the original length, tool name and blob id, the first lines and, for long
results, the last lines with the count of lines left out. Answers of the ``recall`` tool
are exempt.

Results carrying media (images, documents) are exempt from the character budget
and never previewed: once the context holds more than ``max_media_in_context`` media blocks
(in tool results and at the top of user messages), the oldest are persisted, until the
newest ones fit: a tool result whole (the JSON of its blocks) behind a note naming the blob;
a user message's media (the JSON of its media blocks) behind a note in place of the first,
its text left as it was. A pinned message's media count but stay (pins never change).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from compactstore._context.active import ActiveContext, ContextMessage
from compactstore._context.editable import open_media, open_results_in
from compactstore._context.media import (
    USER_MEDIA,
    media_note,
    user_media,
    user_media_note,
)
from compactstore._engines import cache_rule
from compactstore._engines.base import Edit, EngineInputs, NewBlob, StageResult
from compactstore._recall import RECALL_TOOL_NAME
from compactstore.formats import ToolResult
from compactstore.formats.base import storage_json
from compactstore.models import CompactionConfig, CompactStrategy, CompactTrigger

__all__ = [
    "media_over_cap",
    "new_blob",
    "oversized",
    "persist_results",
    "preview",
    "run",
    "stub",
]


def preview(content: str, *, tool_name: str, blob_id: int, config: CompactionConfig) -> str:
    """The stub that stands for a persisted tool result (never over the preview limit)."""
    limit = config.tool_result_preview_chars
    lines = content.splitlines()
    header = f"[Tool result persisted: {len(content)} chars, tool {tool_name}, blob {blob_id}]"
    head = lines[: config.preview_head_lines]
    tail: list[str] = []
    if len(lines) > config.preview_tail_after_lines and config.preview_tail_lines:
        tail = lines[-config.preview_tail_lines :]
    omitted = len(lines) - len(head) - len(tail)
    gap = f"... ({omitted} lines omitted) ..." if omitted > 0 else ""
    # Share what is left after the header between head and tail, head first.
    room = limit - len(header) - len(gap) - 3
    tail_text = _clip("\n".join(tail), room // 3) if tail else ""
    head_text = _clip("\n".join(head), room - len(tail_text))
    stub = "\n".join(part for part in (header, head_text, gap, tail_text) if part)
    return stub[:limit]


def new_blob(
    result: ToolResult, *, seq: int, tool_name: str, blob_id: int, config: CompactionConfig
) -> tuple[NewBlob, str]:
    """A result persisted whole, and the text that stands for it in the context: a preview
    of its text, or for a result with media a note naming the media and the blob (the blob
    holds the JSON of its blocks, so no base64 is ever shown as text)."""
    if result.has_media:
        blob = NewBlob(
            blob_id, seq, result.tool_use_id, tool_name, storage_json(result.blocks), media=True
        )
    else:
        blob = NewBlob(blob_id, seq, result.tool_use_id, tool_name, result.text)
    return blob, stub(blob, config, blocks=result.blocks)


def stub(blob: NewBlob, config: CompactionConfig, *, blocks: object = None) -> str:
    """The text that stands for a persisted blob in the context (its preview, or the media
    note); ``blocks`` spares parsing a media blob's JSON when the caller has them."""
    if not blob.media:
        return preview(blob.content, tool_name=blob.tool_name, blob_id=blob.id, config=config)
    if blob.tool_use_id == USER_MEDIA:
        return user_media_note(
            json.loads(blob.content) if blocks is None else blocks, blob_id=blob.id
        )
    return media_note(
        json.loads(blob.content) if blocks is None else blocks,
        tool_name=blob.tool_name,
        blob_id=blob.id,
        limit=config.tool_result_preview_chars,
    )


def _clip(text: str, room: int) -> str:
    if len(text) <= room:
        return text
    return text[: max(0, room - 1)] + "…" if room > 0 else ""


def persist_results(
    context: ActiveContext,
    inputs: EngineInputs,
    choose: Callable[[Sequence[ContextMessage]], Sequence[tuple[int, str | None]]],
) -> tuple[Sequence[ContextMessage], list[Edit], list[NewBlob]]:
    """Persist what ``choose`` picks, as (kept index, tool-use id) pairs: a tool result, or
    with id None the media of a user message.

    Returns the kept part with the previews in place (``context.kept`` itself, not a copy,
    when nothing was picked: the usual step costs no pass over the context).
    """
    chosen = choose(context.kept)
    if not chosen:
        return context.kept, [], []
    kept = list(context.kept)
    edits: list[Edit] = []
    blobs: list[NewBlob] = []
    next_id = inputs.next_blob_id
    by_index: dict[int, list[str | None]] = {}
    for index, tool_use_id in chosen:
        by_index.setdefault(index, []).append(tool_use_id)
    names = context.call_names([(i, t) for i, t in chosen if t is not None])
    for index in sorted(by_index):
        item = kept[index]
        assert item.seq is not None
        results = {result.tool_use_id: result for result in item.results}
        replacements: dict[str, str] = {}
        user_blob: NewBlob | None = None
        for tool_use_id in by_index[index]:
            if tool_use_id is None:
                user_blob = user_media_blob(item.message, seq=item.seq, blob_id=next_id)
                blobs.append(user_blob)
                next_id += 1
                continue
            blob, text = new_blob(
                results[tool_use_id],
                seq=item.seq,
                tool_name=names.get((index, tool_use_id), "unknown"),
                blob_id=next_id,
                config=context.config,
            )
            blobs.append(blob)
            replacements[tool_use_id] = text
            next_id += 1
        kept[index], edit = Edit.of_results(
            context, item, replacements, "persisted", user_media_blob=user_blob
        )
        edits.append(edit)
    return kept, edits, blobs


def user_media_blob(message: dict[str, Any], *, seq: int, blob_id: int) -> NewBlob:
    """The media of a user message persisted as a blob (the JSON of its media blocks, so a
    single image is written decoded by ``compactstore blob -o``)."""
    return NewBlob(blob_id, seq, USER_MEDIA, "", storage_json(user_media(message)), media=True)


def oversized(
    context: ActiveContext, min_chars: int, *, exempt: frozenset[str] = frozenset()
) -> Callable[[Sequence[ContextMessage]], list[tuple[int, str]]]:
    """A chooser of every unedited tool result longer than ``min_chars``, except the
    results of calls to the tools named in ``exempt`` and results carrying media."""

    def choose(kept: Sequence[ContextMessage]) -> list[tuple[int, str]]:
        if context.open_results.longest <= min_chars:
            return []  # the usual case, seen without a pass over every message
        chosen = [
            (index, result.tool_use_id)
            for index, _, result in open_results_in(kept)
            if not result.has_media and len(result.text) > min_chars
        ]
        if chosen and exempt:
            names = context.call_names(chosen)
            chosen = [pick for pick in chosen if names.get(pick) not in exempt]
        return chosen

    return choose


def media_over_cap(
    context: ActiveContext, max_media: int
) -> Callable[[Sequence[ContextMessage]], list[tuple[int, str | None]]]:
    """A chooser of the oldest tool results and user messages with media, until at most
    ``max_media`` media blocks are left in the context (each leaves whole, so fewer may be
    left; a pinned message's media count but never leave)."""

    def choose(kept: Sequence[ContextMessage]) -> list[tuple[int, str | None]]:
        excess = context.open_media_blocks - max_media
        chosen: list[tuple[int, str | None]] = []
        if excess <= 0:
            return chosen  # the usual case, seen without a pass over every message
        for found in open_media(kept):
            if excess <= 0:
                break
            if found.movable:
                chosen.append((found.at, found.tool_use_id))
                excess -= found.blocks
        return chosen

    return choose


def run(context: ActiveContext, inputs: EngineInputs) -> StageResult:
    """Persist every tool result over the budget, except recall's answers: they are
    already capped (recall_max_tokens), and persisting one would only send the agent back
    to recall it again. Then persist the oldest results with media over
    ``max_media_in_context``. Under the rewrite policy a placeholder of a result already
    sent falls under the cache-aware cost rule (compactstore._engines.cache_rule): while it
    costs more than it saves, only the results not sent yet are persisted, and the detail
    says what waits."""
    before = context.usage
    unsent = unsent_from(context) if inputs.edit_policy == "append_only" else 0
    after_context, edits, blobs = _persisted(context, inputs, unsent)
    deferred = None
    if edits:
        edited = {edit.seq for edit in edits}
        first = min(index for index, item in enumerate(context.kept) if item.seq in edited)
        deferred = cache_rule.deferral(
            context, after_context, inputs, first=first, what=_what(edits, blobs)
        )
        if deferred is not None:
            start = max(unsent, cache_rule.first_unsent(context, inputs))
            after_context, edits, blobs = _persisted(context, inputs, start)
    return StageResult(
        strategy=CompactStrategy.TOOL_BUDGET,
        trigger=CompactTrigger.AUTO,
        applied=bool(edits),
        context=after_context,
        tokens_before=before,
        tokens_after=after_context.usage,
        edits=tuple(edits),
        blobs=tuple(blobs),
        detail="; ".join(part for part in (_detail(blobs), deferred) if part),
        attempted=bool(edits) or deferred is not None,
    )


def _persisted(
    context: ActiveContext, inputs: EngineInputs, start: int
) -> tuple[ActiveContext, list[Edit], list[NewBlob]]:
    """The context with the results over the budget, then the media over the cap,
    persisted from kept index ``start`` on; its edits and new blobs."""
    config = context.config
    chooser = oversized(context, config.tool_result_max_chars, exempt=frozenset({RECALL_TOOL_NAME}))
    kept, edits, blobs = persist_results(context, inputs, _from(start, chooser))
    after_context = context.with_kept(kept) if edits else context
    media_kept, media_edits, media_blobs = persist_results(
        after_context,
        replace(inputs, next_blob_id=inputs.next_blob_id + len(blobs)),
        _from(start, media_over_cap(after_context, config.max_media_in_context)),
    )
    if media_edits:
        after_context = after_context.with_kept(media_kept)
        edits, blobs = _merged_edits(edits, media_edits), blobs + media_blobs
    return after_context, edits, blobs


def _what(edits: Sequence[Edit], blobs: Sequence[NewBlob]) -> str:
    return f"placeholders for {len(blobs)} tool results in {len(edits)} messages"


def unsent_from(context: ActiveContext) -> int:
    """Index in ``context.kept`` of the first message not sent yet, as far as the log
    tells: what follows the newest assistant message (every message before it was part of
    the request it answered). Under append_only the budget acts only from there on."""
    kept = context.kept
    for index in range(len(kept) - 1, -1, -1):
        if kept[index].kind == "assistant":
            return index + 1
    return 0


_Chooser = Callable[[Sequence[ContextMessage]], Sequence[tuple[int, str | None]]]


def _from(start: int, chooser: _Chooser) -> _Chooser:
    """``chooser`` keeping only its picks at kept index ``start`` or later."""
    if start == 0:
        return chooser
    return lambda kept: [pick for pick in chooser(kept) if pick[0] >= start]


def _detail(blobs: Sequence[NewBlob]) -> str:
    if not blobs:
        return ""
    media = sum(blob.media for blob in blobs)
    text = f"persisted {len(blobs) - media} tool results" if len(blobs) > media else ""
    if media:
        user = sum(blob.media and blob.tool_use_id == USER_MEDIA for blob in blobs)
        what = (
            f"{media - user} results"
            if not user
            else f"{media - user} results and {user} user messages"
        )
        text += f"{', ' if text else 'persisted '}{what} with media over the cap"
    return text


def _merged_edits(first: list[Edit], second: list[Edit]) -> list[Edit]:
    """Edits of two passes, one per seq: a message edited by both keeps the second edit,
    which was made on top of the first, with the tool-use ids of both."""
    by_seq = {edit.seq: edit for edit in first}
    for edit in second:
        earlier = by_seq.get(edit.seq)
        ids = edit.tool_use_ids if earlier is None else earlier.tool_use_ids + edit.tool_use_ids
        by_seq[edit.seq] = replace(edit, tool_use_ids=ids)
    return sorted(by_seq.values(), key=lambda edit: edit.seq)
