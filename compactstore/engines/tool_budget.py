"""Stage 2, tool-result budget (SPEC §5.2).

Every tool result longer than ``tool_result_max_chars`` is stored whole as a blob and
replaced in the active context by a preview stub of at most ``tool_result_preview_chars``:
a header with the original length, tool name and blob id, the first lines and, for long
results, the last lines with the count of lines left out. Answers of the ``recall`` tool
are exempt (SPEC §9.7).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from compactstore.context import ActiveContext, ContextMessage
from compactstore.engines.base import Edit, EngineInputs, NewBlob, StageResult
from compactstore.models import CompactionConfig, CompactStrategy, CompactTrigger
from compactstore.recall import RECALL_TOOL_NAME

__all__ = ["persist_results", "preview", "run"]


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


def _clip(text: str, room: int) -> str:
    if len(text) <= room:
        return text
    return text[: max(0, room - 1)] + "…" if room > 0 else ""


def persist_results(
    context: ActiveContext,
    inputs: EngineInputs,
    choose: Callable[[Sequence[ContextMessage]], list[tuple[int, str]]],
) -> tuple[Sequence[ContextMessage], list[Edit], list[NewBlob]]:
    """Persist the tool results ``choose`` picks, as (kept index, tool-use id) pairs.

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
    by_index: dict[int, list[str]] = {}
    for index, tool_use_id in chosen:
        by_index.setdefault(index, []).append(tool_use_id)
    names = context.tool_names({tool_use_id for _, tool_use_id in chosen})
    for index in sorted(by_index):
        item = kept[index]
        assert item.seq is not None
        texts = {result.tool_use_id: result.text for result in item.results}
        replacements: dict[str, str] = {}
        for tool_use_id in by_index[index]:
            name = names.get(tool_use_id, "unknown")
            content = texts[tool_use_id]
            blobs.append(NewBlob(next_id, item.seq, tool_use_id, name, content))
            replacements[tool_use_id] = preview(
                content, tool_name=name, blob_id=next_id, config=context.config
            )
            next_id += 1
        kept[index], edit = Edit.of_results(context, item, replacements, "persisted")
        edits.append(edit)
    return kept, edits, blobs


def oversized(
    context: ActiveContext, min_chars: int, *, exempt: frozenset[str] = frozenset()
) -> Callable[[Sequence[ContextMessage]], list[tuple[int, str]]]:
    """A chooser of every unedited tool result longer than ``min_chars``, except the
    results of calls to the tools named in ``exempt``."""

    def choose(kept: Sequence[ContextMessage]) -> list[tuple[int, str]]:
        if context.longest_open_result <= min_chars:
            return []  # the usual case, seen without a pass over every message
        chosen = [
            (index, result.tool_use_id)
            for index, item in enumerate(kept)
            if item.seq is not None and item.state != "pinned"
            for result in item.results
            if result.replaceable
            and result.tool_use_id not in item.edited_ids
            and len(result.text) > min_chars
        ]
        if chosen and exempt:
            names = context.tool_names({tool_use_id for _, tool_use_id in chosen})
            chosen = [pick for pick in chosen if names.get(pick[1]) not in exempt]
        return chosen

    return choose


def run(context: ActiveContext, inputs: EngineInputs) -> StageResult:
    """Persist every tool result over the budget, except recall's answers: they are
    already capped (recall_max_tokens), and persisting one would only send the agent back
    to recall it again."""
    before = context.usage
    chooser = oversized(
        context, context.config.tool_result_max_chars, exempt=frozenset({RECALL_TOOL_NAME})
    )
    kept, edits, blobs = persist_results(context, inputs, chooser)
    after_context = context.with_kept(kept) if edits else context
    return StageResult(
        strategy=CompactStrategy.TOOL_BUDGET,
        trigger=CompactTrigger.AUTO,
        applied=bool(edits),
        context=after_context,
        tokens_before=before,
        tokens_after=after_context.usage,
        edits=tuple(edits),
        blobs=tuple(blobs),
        detail=f"persisted {len(blobs)} tool results" if blobs else "",
        attempted=bool(edits),
    )
