"""The rule-based summary written out: a :class:`~compactstore.models.SummaryState` as its
sections (headings from :mod:`compactstore._engines.summary_sections`) within a token budget.
See :mod:`compactstore._engines.summary` for what each section holds and how an over-budget
summary is shortened; :func:`render` is a pure function of its inputs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from compactstore._context.active import ActiveContext
from compactstore._engines.summary_sections import (
    CURRENT_WORK,
    ERRORS,
    FILES,
    LATER_INSTRUCTIONS,
    ORIGINAL_REQUEST,
    PENDING_TASKS,
    RECALL,
)
from compactstore._engines.tasks import open_items, task_line
from compactstore._recall import RECALL_LINE
from compactstore.models import (
    CompactionConfig,
    EarlierInstructions,
    ErrorEntry,
    FileAction,
    FileEntry,
    Instruction,
    SummaryState,
)

__all__ = [
    "budget_for",
    "clip",
    "earlier_line",
    "folded",
    "instruction_line",
    "one_line",
    "render",
    "sections",
    "unescape",
]


# The order a file line lists what was done to the file.
_ACTION_ORDER: tuple[FileAction, ...] = ("created", "modified", "deleted", "read", "named")


def unescape(text: str) -> str:
    """Literal ``\\n``/``\\t``/``\\"`` escapes (JSON left inside a result) made plain."""
    return text.replace("\\r\\n", "\n").replace("\\n", "\n").replace("\\t", " ").replace('\\"', '"')


def one_line(text: str, limit: int | None = None) -> str:
    line = " ".join(unescape(text).split())
    return line if limit is None else clip(line, limit)


def clip(text: str, limit: int) -> str:
    """The first ``limit`` characters, and "…" when there were more."""
    return text if len(text) <= limit else text[:limit] + "…"


def instruction_line(entry: Instruction) -> str:
    where = f"(seq {entry.seq}) " if entry.seq is not None else ""
    return f"- {where}{entry.text}"


def earlier_line(earlier: EarlierInstructions, recall: bool) -> str:
    span = f"seqs {earlier.first}–{earlier.last}"
    tail = "use recall" if recall else "not shown"
    return f"- {earlier.count} earlier instructions ({span}): {tail}"


def file_line(entry: FileEntry) -> str:
    actions = sorted(entry.actions, key=_ACTION_ORDER.index)
    return f"- {entry.path} — {', '.join(actions) or 'named'}"


def error_line(entry: ErrorEntry) -> str:
    where = f"{entry.tool} (seq {entry.seq})" if entry.seq is not None else "earlier"
    status = " — resolved" if entry.resolved else ""
    return f"- {where}: {entry.text}{status}"


def sections(
    state: SummaryState, config: CompactionConfig, files_shown: int, quote: int | None
) -> list[str]:
    """The sections; ``quote`` shortens the quoted request and current work (None: in full)."""
    parts: list[str] = []
    span = ""
    if state.first_seq is not None:
        span = f" (seqs {state.first_seq}–{state.last_seq})"
    parts.append(
        f"This summary stands for {state.messages_removed} earlier messages{span}, "
        f"summarised over {state.compactions} compactions; the conversation continues below."
    )
    if state.original_request:
        parts.append(
            ORIGINAL_REQUEST.title()
            + "\n"
            + unescape(state.original_request)[: config.summary_request_chars]
        )
    lines = []
    if state.earlier_instructions:
        lines.append(earlier_line(state.earlier_instructions, config.recall_enabled))
    lines.extend(instruction_line(entry) for entry in state.instructions)
    if lines:
        parts.append(LATER_INSTRUCTIONS.title() + "\n" + "\n".join(lines))
    plan, pending = state.plan, open_items(state.plan)
    if plan and pending:
        parts.append(
            PENDING_TASKS.title(f"latest {plan.tool}, seq {plan.seq}")
            + "\n"
            + "\n".join(task_line(item) for item in pending)
        )
    work = state.current_work
    if work:
        said = unescape(work.text).strip()
        text = (
            CURRENT_WORK.title(f"seq {work.seq}")
            + "\n"
            + (said if quote is None else clip(said, quote))
        )
        if work.next_step:
            text += f"\nNext step: {one_line(work.next_step)}"
        parts.append(text)
    files = state.files
    if files and files_shown:
        newest = list(reversed(files))[:files_shown]
        more = len(files) - len(newest)
        text = FILES.title() + "\n" + "\n".join(file_line(e) for e in newest)
        if more:
            text += f"\n- … {more} older files"
        parts.append(text)
    if state.errors:
        parts.append(ERRORS.title() + "\n" + "\n".join(error_line(e) for e in state.errors))
    if config.recall_enabled:
        parts.append(RECALL.title() + "\n" + RECALL_LINE)
    return parts


def folded(earlier: EarlierInstructions | None, oldest: Instruction) -> EarlierInstructions:
    """``earlier`` with the ``oldest`` instruction folded in."""
    if earlier is None:
        return EarlierInstructions(count=1, first=oldest.seq, last=oldest.seq)
    return EarlierInstructions(
        count=earlier.count + 1,
        first=earlier.first if earlier.first is not None else oldest.seq,
        last=oldest.seq if oldest.seq is not None else earlier.last,
    )


class _Folds:
    """The "earlier instructions" entry once the oldest ``j`` of ``instructions`` are folded
    into ``earlier``, for any ``j`` at once: what ``j`` calls of :func:`folded` give."""

    def __init__(self, earlier: EarlierInstructions | None, instructions: Sequence[Instruction]):
        self.earlier = earlier
        self.count = earlier.count if earlier is not None else 0
        # The first fold sets ``first`` when it was unset; then it never changes.
        self.first = earlier.first if earlier is not None else None
        self.first_at = next((i for i, e in enumerate(instructions) if e.seq is not None), None)
        last: int | None = earlier.last if earlier is not None else None
        self.last = [last]
        for entry in instructions:
            if entry.seq is not None:
                last = entry.seq
            self.last.append(last)

    def after(self, j: int) -> EarlierInstructions | None:
        if j == 0:
            return self.earlier
        first = self.first
        if first is None and self.first_at is not None and self.first_at < j:
            first = self.last[self.first_at + 1]
        return EarlierInstructions(count=self.count + j, first=first, last=self.last[j])


def _first_fit(start: int, end: int, fits: Callable[[int], bool]) -> int:
    """The smallest ``j`` in ``[start, end]`` for which ``fits(j)`` or ``j == end``: the step
    where a loop that shrinks the summary one item at a time, testing after each, stops.

    ``fits`` is tested at ``start``, then only where it is monotone (false, then true from some
    ``j`` on, as each step removes or shortens a line): from ``end`` downwards, doubling the
    step, then by bisection. The probes near ``end`` are the cheap ones (little is left to
    render), so a loop of n steps costs about as much as rendering what it keeps, not n renders.
    """
    if start >= end or fits(start):
        return start
    low, high = start + 1, end
    step = 1
    while low < high:
        probe = max(low, high - step)
        if not fits(probe):
            low = probe + 1
            break
        high = probe
        step *= 2
    while low < high:
        middle = (low + high) // 2
        if fits(middle):
            high = middle
        else:
            low = middle + 1
    return low


def budget_for(context: ActiveContext) -> int:
    """The summary's budget in ``context``, in the token counter's tokens:
    ``summary_max_tokens``, and no more than ``summary_max_window_share`` of the window
    once the session's token factor is applied."""
    config = context.config
    share = config.summary_max_window_share * context.context_window / context.factor
    # Rounded first so float noise (0.2 * 1296 / 1.6 = 161.99999999999997) cannot lose a token.
    return max(1, min(config.summary_max_tokens, math.floor(round(share, 6))))


def render(
    state: SummaryState,
    config: CompactionConfig,
    count: Callable[[str], int],
    budget: int | None = None,
) -> tuple[str, SummaryState]:
    """The summary's sections within ``budget`` tokens (default ``summary_max_tokens``; the
    engines pass :func:`budget_for`, which the window bounds too), and
    the state as written (instructions cut or folded by the budget).

    Over budget: the oldest instructions are cut to ``summary_instruction_chars``; while they
    take more than half the budget the oldest are folded into one "earlier instructions" line;
    then fewer files are shown, more instructions folded, the quoted request and current work
    shortened, the oldest errors left out, and at last the text is cut.

    Each of these stops at the first step that fits, as if it tested after every step; it
    finds that step with a few tests (:func:`_first_fit`), so the cost is linear in the
    instructions, however many there are.
    """
    budget = max(1, config.summary_max_tokens if budget is None else budget)
    instructions = list(state.instructions)
    earlier = state.earlier_instructions
    errors = list(state.errors)
    files_shown = min(len(state.files), config.summary_max_files)
    quote: int | None = None

    def current() -> SummaryState:
        return state.model_copy(
            update={
                "instructions": tuple(instructions),
                "earlier_instructions": earlier,
                "errors": tuple(errors),
            }
        )

    def text() -> str:
        return "\n\n".join(sections(current(), config, files_shown, quote))

    def over() -> bool:
        return count(text()) > budget

    if over():
        chars = config.summary_instruction_chars
        original = list(instructions)
        long = [i for i, entry in enumerate(original) if len(entry.text) > chars]
        cut = [
            original[i].model_copy(update={"text": one_line(original[i].text, chars)}) for i in long
        ]

        def cut_first(k: int) -> list[Instruction]:
            shorter = list(original)
            for index, entry in zip(long[:k], cut[:k], strict=True):
                shorter[index] = entry
            return shorter

        def fits_cut(k: int) -> bool:
            nonlocal instructions
            instructions = cut_first(k)
            return not over()

        if long:
            instructions = cut_first(_first_fit(1, len(long), fits_cut))

        # Fold the oldest while the instructions take more than half the budget.
        lines = [instruction_line(entry) for entry in instructions]
        folds = _Folds(earlier, instructions)
        unfolded = list(instructions)

        def instruction_cost(j: int) -> int:
            shown = lines[j:]
            entry = folds.after(j)
            if entry:
                shown.append(earlier_line(entry, config.recall_enabled))
            return count("\n".join(shown)) if shown else 0

        def fold_to(j: int) -> None:
            nonlocal instructions, earlier
            instructions, earlier = unfolded[j:], folds.after(j)

        folded = _first_fit(0, len(unfolded), lambda j: instruction_cost(j) <= budget // 2)
        fold_to(folded)
        while over() and files_shown > 0:
            files_shown = max(0, files_shown - max(1, files_shown // 4))

        def fits_folded(j: int) -> bool:
            fold_to(j)
            return not over()

        fold_to(_first_fit(folded, len(unfolded), fits_folded))
        for shorter in (600, 200, 60):
            if over():
                quote = shorter
        every_error = list(errors)

        def fits_errors(j: int) -> bool:
            nonlocal errors
            errors = every_error[j:]
            return not over()

        errors = every_error[_first_fit(0, len(every_error), fits_errors) :]
    written = text()
    while count(written) > budget and len(written) > 1:
        written = written[: int(len(written) * 0.9)].rstrip()
    return written, current()
