"""One sections table (compactstore._engines.summary_sections): the rule-based summary and
the summarizers' prompt write the same headings, in the same order, from it."""

from __future__ import annotations

import re

from compactstore._context.tokens import estimate_tokens
from compactstore._engines import summary
from compactstore._engines.summary_sections import RECALL, SECTIONS
from compactstore.models import (
    CompactionConfig,
    CurrentWork,
    ErrorEntry,
    FileEntry,
    Instruction,
    Plan,
    PlanItem,
    SummaryState,
)
from compactstore.summarizers.prompt import system_prompt

FULL = SummaryState(
    original_request="Port the parser to Rust.",
    instructions=(Instruction(seq=4, text="Keep the public API."),),
    plan=Plan(seq=6, tool="TodoWrite", items=(PlanItem(text="lexer", status="in_progress"),)),
    current_work=CurrentWork(seq=9, text="Writing the lexer.", next_step="Run the tests."),
    files=(FileEntry(path="src/lexer.rs", actions=("created",), seq=8),),
    errors=(ErrorEntry(tool="bash", text="cargo: not found", seq=7),),
    messages_removed=10,
    compactions=1,
)


def headings(text: str) -> list[str]:
    return re.findall(r"^## ([^\n(]+?)(?: \([^\n]*\))?$", text, re.MULTILINE)


def test_the_rule_summary_and_the_prompt_write_the_tables_headings_in_its_order() -> None:
    table = [section.heading.split(" (")[0] for section in (*SECTIONS, RECALL)]
    text, _ = summary.render(FULL, CompactionConfig(recall_enabled=True), estimate_tokens)
    assert headings(text) == table
    assert headings(system_prompt(2_000, recall=True)) == table
    assert headings(system_prompt(2_000, recall=False)) == table[:-1]
    # The rule summary adds where its entries came from, in parentheses.
    assert "## Pending tasks (latest TodoWrite, seq 6)" in text
    assert "## Current work (seq 9)" in text
