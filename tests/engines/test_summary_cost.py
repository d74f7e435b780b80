"""The rule summary's cost is linear in what it summarises, and its text is the one the
step-by-step rules give.

:func:`summary.render` shortens an over-budget summary one step at a time (cut the oldest
instruction, fold the oldest, drop the oldest error...), stopping at the first step that
fits. It used to render and count the whole text after every step, so a session with n
instructions cost n renders of an O(n) text: 50,000 messages took minutes. It now finds the
same step with a few counts. :func:`reference_render` below is the step-by-step rule,
written out as the docstring states it; the property test holds render to it.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compactstore import CompactStore
from compactstore._context.tokens import estimate_tokens
from compactstore._engines import summary, summary_render
from compactstore.models import (
    CompactionConfig,
    CurrentWork,
    EarlierInstructions,
    ErrorEntry,
    FileEntry,
    Instruction,
    Plan,
    PlanItem,
    SummaryState,
)
from tests.engines.builder import ContextBuilder
from tests.helpers import T0, assistant, new_session, user, words

Counter = Callable[[str], int]


def reference_render(
    state: SummaryState, config: CompactionConfig, count: Counter, budget: int | None = None
) -> tuple[str, SummaryState]:
    """The summary within ``budget``, one step at a time, testing the text after each."""
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
        return "\n\n".join(summary_render.sections(current(), config, files_shown, quote))

    def over() -> bool:
        return count(text()) > budget

    def instruction_cost() -> int:
        lines = [summary_render.instruction_line(e) for e in instructions]
        if earlier:
            lines.append(summary_render.earlier_line(earlier, config.recall_enabled))
        return count("\n".join(lines)) if lines else 0

    if over():
        chars = config.summary_instruction_chars
        for index, entry in enumerate(instructions):
            if len(entry.text) > chars:
                instructions[index] = entry.model_copy(
                    update={"text": summary_render.one_line(entry.text, chars)}
                )
                if not over():
                    break
        while instructions and instruction_cost() > budget // 2:
            earlier = summary_render.folded(earlier, instructions.pop(0))
        while over() and files_shown > 0:
            files_shown = max(0, files_shown - max(1, files_shown // 4))
        while over() and instructions:
            earlier = summary_render.folded(earlier, instructions.pop(0))
        for shorter in (600, 200, 60):
            if over():
                quote = shorter
        while over() and errors:
            errors.pop(0)
    written = text()
    while count(written) > budget and len(written) > 1:
        written = written[: int(len(written) * 0.9)].rstrip()
    return written, current()


# Words that move the counts: CJK (heavier in the estimate), escapes _one_line unescapes,
# the dashes and ellipsis the summary itself writes, a path.
_WORDS = st.sampled_from(
    ["fix", "the", "ledger", "总计", "テスト", "a\\nb", "x" * 30, "é", "…", "–", "\\t", "src/a.py"]
)
_TEXTS = st.lists(_WORDS, min_size=1, max_size=40).map(" ".join)
_SEQS = st.one_of(st.none(), st.integers(1, 10**6))
_INSTRUCTIONS = st.builds(Instruction, seq=_SEQS, text=_TEXTS)
_STATES = st.builds(
    SummaryState,
    original_request=st.one_of(st.none(), _TEXTS),
    instructions=st.lists(_INSTRUCTIONS, max_size=80).map(tuple),
    earlier_instructions=st.one_of(
        st.none(), st.builds(EarlierInstructions, count=st.integers(1, 50), first=_SEQS, last=_SEQS)
    ),
    plan=st.one_of(
        st.none(),
        st.builds(
            Plan,
            seq=st.just(3),
            tool=st.just("TodoWrite"),
            items=st.lists(st.builds(PlanItem, text=_TEXTS), max_size=8).map(tuple),
        ),
    ),
    current_work=st.one_of(st.none(), st.builds(CurrentWork, seq=st.just(9), text=_TEXTS)),
    files=st.integers(0, 80).map(
        lambda n: tuple(FileEntry(path=f"src/m{i}.py", actions=("read",), seq=i) for i in range(n))
    ),
    errors=st.lists(
        st.builds(ErrorEntry, tool=st.just("Bash"), text=_TEXTS, seq=_SEQS, resolved=st.booleans()),
        max_size=10,
    ).map(tuple),
    compactions=st.just(2),
    messages_removed=st.just(50),
)
_CONFIGS = st.builds(
    CompactionConfig,
    summary_max_tokens=st.sampled_from([100, 150, 300, 600, 6_000]),
    summary_instruction_chars=st.sampled_from([10, 30, 60]),
    summary_max_files=st.sampled_from([0, 5, 60]),
    summary_max_errors=st.just(20),
    recall_enabled=st.booleans(),
)
_COUNTERS: dict[str, Counter] = {
    "estimate": estimate_tokens,
    "characters": len,
    "words": lambda text: len(text.split()),
}


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(
    state=_STATES,
    config=_CONFIGS,
    budget=st.sampled_from([None, None, 1, 50, 400]),
    counter=st.sampled_from(sorted(_COUNTERS)),
)
def test_render_writes_what_the_step_by_step_rules_write(
    state: SummaryState, config: CompactionConfig, budget: int | None, counter: str
) -> None:
    count = _COUNTERS[counter]

    assert summary.render(state, config, count, budget) == reference_render(
        state, config, count, budget
    )


class Tally:
    """A token counter (the estimate) that adds up the characters it was given."""

    def __init__(self) -> None:
        self.characters = 0

    def __call__(self, text: str) -> int:
        self.characters += len(text)
        return estimate_tokens(text)


@pytest.mark.slow
def test_render_counts_a_few_times_the_text_however_many_instructions() -> None:
    state = SummaryState(
        original_request="Keep the ledger consistent",
        instructions=tuple(
            Instruction(seq=2 * i, text=f"instruction {i}: " + words(120, f"i{i}"))
            for i in range(1_000)
        ),
    )
    config = CompactionConfig()
    whole = len("\n\n".join(summary_render.sections(state, config, 0, None)))
    tally = Tally()

    text, written = summary.render(state, config, tally)

    assert estimate_tokens(text) <= config.summary_max_tokens
    assert written.earlier_instructions is not None
    assert written.earlier_instructions.count + len(written.instructions) == 1_000
    # The step-by-step rules counted the whole text once per instruction: ~1,000 times.
    assert tally.characters <= 6 * whole


def test_a_success_resolves_every_earlier_failure_of_the_same_call_and_no_other() -> None:
    builder = ContextBuilder(config=CompactionConfig(token_factor=1.0, summary_max_errors=50))
    builder.request("Make the build green")
    steps = [
        ("t0", "Error: t0 first"),
        ("t0", "Error: t0 again"),
        ("t1", "Error: t1"),
        ("t0", "ok"),
        ("t2", "Error: t2"),
        # -- the second fold starts here: it resolves what the first one recorded --
        ("t1", "ok"),
        ("t0", "Error: t0 later"),
        ("t3", "Error: t3"),
    ]
    for target, output in steps:
        builder.tool("Bash", {"command": f"make {target}"}, output)
    builder.chatter(2)
    context = builder.build()
    first, second = context.kept[1:11], context.kept[11:17]

    state = summary.fold(SummaryState(), first, context)
    assert [(e.text, e.resolved) for e in state.errors] == [
        ("Error: t0 first", True),
        ("Error: t0 again", True),
        ("Error: t1", False),
        ("Error: t2", False),
    ]
    state = summary.fold(state, second, context)
    assert [(e.text, e.resolved) for e in state.errors] == [
        ("Error: t0 first", True),
        ("Error: t0 again", True),
        ("Error: t1", True),
        ("Error: t2", False),
        ("Error: t0 later", False),
        ("Error: t3", False),
    ]


@pytest.mark.slow
def test_the_first_compaction_of_a_long_session_counts_each_text_a_few_times(
    tmp_path: object,
) -> None:
    tally = Tally()
    with CompactStore.open(f"{tmp_path}/long.db", token_counter=tally) as store:
        chat = new_session(store, "anthropic", sid="long", context_window=10_000_000)
        messages = []
        for i in range(1_000):
            messages += [
                user(f"Please change entry {i} of the ledger: " + words(100, f"u{i}")),
                assistant(f"Done with entry {i}. " + words(60, f"a{i}")),
            ]
        chat.sess.extend(messages, timestamps=[T0 + i for i in range(len(messages))])
        tally.characters = 0

        result = chat.sess.compact(now=T0 + 10_000)

    assert result.effective
    assert estimate_tokens(result.summary_text) <= CompactionConfig().summary_max_tokens
    # Rendering and counting after every step counted ~1,000 texts of all the instructions.
    written = sum(len(str(m["content"])) for m in messages)
    assert tally.characters <= 4 * written
