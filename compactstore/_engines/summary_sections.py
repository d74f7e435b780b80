"""The summary's sections, spelled once: the rule-based summary
(:mod:`compactstore._engines.summary`) writes them under these headings, and the built-in
summarizers' prompt (:mod:`compactstore.summarizers.prompt`) asks a model for the same
headings, in the same order, with what each holds."""

from __future__ import annotations

from dataclasses import dataclass

from compactstore._recall import RECALL_LINE

__all__ = [
    "CURRENT_WORK",
    "ERRORS",
    "FILES",
    "LATER_INSTRUCTIONS",
    "ORIGINAL_REQUEST",
    "PENDING_TASKS",
    "RECALL",
    "SECTIONS",
    "Section",
]


@dataclass(frozen=True, slots=True)
class Section:
    """One section of a summary: its heading and what a model is asked to write in it."""

    heading: str
    ask: str

    def title(self, note: str | None = None) -> str:
        """The heading line; ``note`` is added in parentheses (the rule summary's seqs)."""
        return f"## {self.heading}" + ("" if note is None else f" ({note})")

    def prompt(self) -> str:
        """The section as the prompt describes it: heading, then what it holds."""
        return f"{self.title()}\n{self.ask}"


ORIGINAL_REQUEST = Section(
    "Original request",
    "What the user first asked for, quoted verbatim (only the request itself, no environment "
    "or\ninstruction blocks). If it is neither in the previous summary nor in the "
    'conversation below,\nwrite: "(kept verbatim in the conversation)".',
)
LATER_INSTRUCTIONS = Section(
    "Later instructions from the user (oldest first)",
    "Every later instruction, correction or preference the user gave, in order, verbatim "
    'while\nshort, each on its own line starting with "- ". Keep the ones the previous '
    "summary lists.",
)
PENDING_TASKS = Section(
    "Pending tasks",
    'The tasks still open, from the latest plan or todo list if there is one ("- [status] task").',
)
CURRENT_WORK = Section(
    "Current work",
    "What was being worked on right before this point, and on a line of its own\n"
    '"Next step: ..." with the next step that was stated or is clearly implied.',
)
FILES = Section(
    "Files (newest first)",
    'One line per file: "- path — created/modified/read/deleted" with what was done to it.\n'
    "One path per file, relative to the working directory when it is known.",
)
ERRORS = Section(
    "Errors",
    "Each error the tools reported, short and unescaped, one per line with the tool's name; "
    'add\n" — resolved" when a later identical call succeeded.',
)
# The last section, written only when recall is enabled.
RECALL = Section("Recall", "End with exactly this line:\n" + RECALL_LINE)

# In the order both write them.
SECTIONS = (ORIGINAL_REQUEST, LATER_INSTRUCTIONS, PENDING_TASKS, CURRENT_WORK, FILES, ERRORS)
