"""Public data models: triggers, strategies, the compaction config and recorded results.

:class:`CompactionConfig` is defined in :mod:`compactstore._config` and exported here."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    computed_field,
    model_validator,
)

from compactstore._config import CompactionConfig
from compactstore._context.frozen import FrozenDict, freeze, thaw
from compactstore._ledger import CallUsage

__all__ = [
    "MEMORY_KINDS",
    "BreakerState",
    "CompactBoundary",
    "CompactStrategy",
    "CompactTrigger",
    "CompactionConfig",
    "CompactionResult",
    "CompactionStep",
    "CurrentWork",
    "DroppedThinking",
    "EarlierInstructions",
    "EditState",
    "ErrorEntry",
    "FileAction",
    "FileEntry",
    "ImportedBoundary",
    "Instruction",
    "JobInfo",
    "MemoryEntry",
    "Plan",
    "PlanItem",
    "SessionInfo",
    "SummaryInfo",
    "SummaryState",
]


class CompactTrigger(StrEnum):
    """Why a compaction ran."""

    MANUAL = "manual"
    AUTO = "auto"
    REACTIVE = "reactive"
    MICROCOMPACT_TIME = "microcompact_time"
    MICROCOMPACT_CACHED = "microcompact_cached"
    # The provider did it: a server-side edit the response reports it applied.
    SERVER = "server"


class CompactStrategy(StrEnum):
    """What a compaction did."""

    TOOL_BUDGET = "tool_budget"
    READ_DEDUP = "read_dedup"
    MICROCOMPACT = "microcompact"
    SESSION_MEMORY = "session_memory"
    FULL = "full"
    REACTIVE = "reactive"
    PARTIAL = "partial"
    CLEAR = "clear"  # clear_session: a boundary that keeps nothing
    POP = "pop"  # pop_item: the newest item removed, a recorded edit
    PROVIDER = "provider"  # the provider summarised the range (a provider compactor)


class CompactBoundary(BaseModel):
    """A recorded cut of the active context: what was summarised and what was kept."""

    model_config = ConfigDict(frozen=True)

    id: int | None = None
    trigger: CompactTrigger
    strategy: CompactStrategy
    timestamp: float
    tokens_before: int
    tokens_after: int
    messages_removed: int
    preserved_segment: tuple[int, int] | None
    summary_text: str = ""
    parent_id: int | None = None
    rolled_back_at: float | None = None


class CompactionStep(BaseModel):
    """One stage's share of a compaction call."""

    model_config = ConfigDict(frozen=True)

    strategy: CompactStrategy
    trigger: CompactTrigger
    tokens_freed: int
    success: bool = True
    detail: str = ""
    # Tool results the stage took out of the context in full: cleared (a placeholder
    # stands for it) and persisted (a preview or media note names its blob). None in
    # steps recorded before compactstore counted them.
    results_cleared: int | None = None
    results_persisted: int | None = None


class SummaryInfo(BaseModel):
    """How a cut's summary was written, as recorded in its compactions row.

    ``source`` is ``"summarizer"`` (the summarizer wrote it), ``"rule"`` (the rule-based
    summary: none configured, or a fallback) or ``"recorded"`` (a replay reused the
    recorded text). ``fallback`` is True when a summarizer should have written it but
    failed, timed out, raised SummarizerError or was not configured in this process;
    ``reason`` says why (also when the hourly call limit made it rule-based).
    """

    model_config = ConfigDict(frozen=True)

    source: Literal["summarizer", "rule", "recorded", "provider"]
    summarizer: str | None = None
    model: str | None = None
    latency_ms: float | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    fallback: bool = False
    reason: str | None = None


def _frozen_message(message: Mapping[str, Any]) -> dict[str, Any]:
    if type(message) is FrozenDict:
        return message  # the context's own, read-only already
    if not isinstance(message, Mapping):
        raise TypeError(f"a message must be a JSON object, got {type(message).__name__}")
    frozen: dict[str, Any] = freeze(dict(message))
    return frozen


class CompactionResult(BaseModel):
    """The outcome of one call to process_request / reactive_recover / compact / replay.

    ``messages`` is the active context the call produced (one message per seq); it is empty
    when the call changed nothing (``active_context()`` gives the context) and in the
    recorded history.
    """

    model_config = ConfigDict(frozen=True)

    id: int | None = None
    success: bool
    strategy: CompactStrategy | None
    trigger: CompactTrigger | None
    boundary: CompactBoundary | None = None
    tokens_before: int = 0
    tokens_after: int = 0
    tokens_freed: int = 0
    summary_text: str = ""
    steps: list[CompactionStep] = Field(default_factory=list)
    created_at: float | None = None
    rolled_back_at: float | None = None
    removed_seqs: list[int] = Field(default_factory=list)
    # (tool-use id, call seq) of each tool result cleared or persisted (how many of each:
    # ``results_cleared``, ``results_persisted``): an id may be used again once its earlier
    # call is answered, so the id alone is not enough.
    cleared_tool_calls: list[tuple[str, int]] = Field(default_factory=list)
    blob_ids: list[int] = Field(default_factory=list)
    instructions: str | None = None
    error: str | None = None
    # How the summary of the cut was written; None when the call made no cut.
    summary: SummaryInfo | None = None
    # Background compaction: "started" when this call started one (the
    # compaction it records is committed later by a worker), "running" when one (or another
    # caller's summary) was in flight so this call ran the cheap stages only, "applied" when
    # one committed since this handle's last call; None otherwise.
    background: Literal["started", "running", "applied"] | None = None
    # A background compaction's row: the id of the call's row that started it.
    started_by: int | None = None
    # The edit policy it ran under: "rewrite" or "append_only" (None: recorded before the
    # policy existed, or a call that recorded nothing).
    edit_policy: str | None = None

    # The messages, read-only (compactstore._context.frozen): a compaction hands over the context's
    # own, so a call that compacts copies nothing unless the caller reads ``messages``.
    _messages: tuple[dict[str, Any], ...] = PrivateAttr(default=())

    def __init__(self, *, messages: Iterable[Mapping[str, Any]] = (), **data: Any) -> None:
        super().__init__(**data)
        self._messages = tuple(_frozen_message(message) for message in messages)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def messages(self) -> list[dict[str, Any]]:
        """The active context the call produced: fresh plain dicts the caller may change,
        copied on each read (``Session.context_view()`` is the shared read-only view)."""
        return [thaw(message) for message in self._messages]

    @property
    def effective(self) -> bool:
        """True when the call succeeded and actually freed tokens."""
        return self.success and self.tokens_freed > 0

    @computed_field  # type: ignore[prop-decorator]
    @property
    def cleared_tool_use_ids(self) -> list[str]:
        """The tool-use ids of ``cleared_tool_calls``, in order."""
        return [tool_use_id for tool_use_id, _ in self.cleared_tool_calls]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def results_cleared(self) -> int | None:
        """How many of ``cleared_tool_calls`` were cleared (a placeholder stands for each),
        over every step; None for a compaction recorded before they were counted."""
        counts = [step.results_cleared for step in self.steps]
        return None if None in counts else sum(c or 0 for c in counts)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def results_persisted(self) -> int | None:
        """How many tool results were persisted (a preview or note names each blob of
        ``blob_ids``), over every step; None for a compaction recorded before they were
        counted."""
        counts = [step.results_persisted for step in self.steps]
        return None if None in counts else sum(c or 0 for c in counts)


class JobInfo(BaseModel):
    """A background compaction job, as ``compaction_jobs`` records it.

    ``state``: ``pending``, ``running``, ``applied`` (its compaction cut), ``failed``
    (recorded but freed nothing, or an error) or ``superseded`` (another compaction made it
    moot). ``started_by`` is the starting call's compaction id, ``compaction_id`` the
    background compaction's own.
    """

    model_config = ConfigDict(frozen=True)

    id: int
    session_id: str
    state: Literal["pending", "running", "applied", "failed", "superseded"]
    started_by: int | None = None
    compaction_id: int | None = None
    created_at: float
    finished_at: float | None = None
    error: str | None = None


class BreakerState(BaseModel):
    """Circuit-breaker and reactive-recovery counters of a session."""

    model_config = ConfigDict(frozen=True)

    consecutive_failures: int = 0
    tripped: bool = False
    reactive_attempts: int = 0
    last_microcompact_at: float | None = None
    # Summaries in a row that fell back to the rule-based one.
    consecutive_fallbacks: int = 0


class SessionInfo(BaseModel):
    """A row of store.sessions()."""

    model_config = ConfigDict(frozen=True)

    id: str
    format: str
    context_window: int
    created_at: float
    message_count: int
    config: CompactionConfig


class DroppedThinking(BaseModel):
    """The thinking blocks the API dropped from one model call's input, as its response
    listed them (``input_transformations``)."""

    model_config = ConfigDict(frozen=True)

    call_seq: int  # the newest seq of the log when the call was made
    created_at: float
    count: int  # how many the response listed
    transformations: list[dict[str, Any]]  # as reported


class EditState(BaseModel):
    """How a session's requests are edited: its model, edit policy (as configured and as
    it resolves for that model), the thinking block binding and the blocks the API dropped
    (``Session.edit_state()``)."""

    model_config = ConfigDict(frozen=True)

    model: str | None
    edit_policy: str  # as configured: "auto", "rewrite" or "append_only"
    effective_policy: str  # "rewrite" or "append_only"
    prefix_checks: bool  # the model checks the prefix of every thinking block
    # "drop_block" once a cut inside a tool loop made every later request carry it.
    thinking_binding: str | None = None
    thinking_binding_at: float | None = None
    dropped: list[DroppedThinking] = Field(default_factory=list)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def dropped_total(self) -> int:
        """The thinking blocks the API dropped over all the session's calls."""
        return sum(d.count for d in self.dropped)


# What a memory entry is about (``Session.remember(kind, text)``).
MEMORY_KINDS = ("user_intent", "decision", "convention", "pattern", "fact")


class MemoryEntry(BaseModel):
    """A piece of memory used by session-memory compact."""

    model_config = ConfigDict(frozen=True)

    id: int | None = None
    kind: str
    text: str
    tokens: int
    created_at: float
    scope: str = "session"


@dataclass(frozen=True, slots=True)
class ImportedMessage:
    """A message of an imported transcript (a plain dataclass: transcripts are long)."""

    message: dict[str, Any]
    timestamp: float | None = None  # epoch seconds; None: the import time
    usage: int | None = None  # the prompt size the provider reported for the call producing it
    where: str | None = None  # its place in the file, for errors ("run.jsonl line 12")
    ledger: CallUsage | None = None  # what that call was billed for, when the transcript says


class ImportedBoundary(BaseModel):
    """A compaction found in an imported transcript (the agent did it itself)."""

    model_config = ConfigDict(frozen=True)

    first_kept_index: int  # index (in the imported messages) of the first message after it
    summary_text: str
    trigger: CompactTrigger = CompactTrigger.AUTO
    tokens_before: int | None = None  # the agent's own count, kept for reference
    timestamp: float | None = None
    # ``provider`` when the provider wrote what replaced the range (a Codex server-side
    # compaction); ``full`` for a summary the agent asked a model for itself.
    strategy: CompactStrategy = CompactStrategy.FULL


class _StateModel(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Instruction(_StateModel):
    """A user instruction after the original request (``seq`` unknown when upgraded)."""

    seq: int | None = None
    text: str


class EarlierInstructions(_StateModel):
    """The oldest instructions, folded into one line over budget."""

    count: int = Field(ge=1)
    first: int | None = None
    last: int | None = None


class PlanItem(_StateModel):
    text: str
    status: str = "pending"
    id: str | None = None  # a task of a TaskCreate/TaskUpdate list: its number


class Plan(_StateModel):
    """The latest plan/todo call's items (``CompactionConfig.plan_tool_names``)."""

    seq: int | None = None
    tool: str
    items: tuple[PlanItem, ...] = ()


class CurrentWork(_StateModel):
    """The last assistant text before the cut, and the next step it states."""

    seq: int | None = None
    text: str
    next_step: str | None = None


FileAction = Literal["created", "modified", "deleted", "read", "named"]


class FileEntry(_StateModel):
    """One file (one normalised path) and what was done to it."""

    path: str
    actions: tuple[FileAction, ...] = ()
    seq: int | None = None  # the newest message that touched it


class ErrorEntry(_StateModel):
    """A failed tool call; ``key`` is its tool and normalised input, so a later success of
    the same call marks it resolved."""

    tool: str = ""
    key: str = ""
    text: str
    seq: int | None = None
    resolved: bool = False


class _SummaryStateV1(_StateModel):
    """The first shape of :class:`SummaryState` (topics, a file list, error texts)."""

    version: Literal[1] = 1
    original_request: str | None = None
    topics: tuple[str, ...] = ()
    tools: tuple[str, ...] = ()
    files: tuple[str, ...] = ()  # newest last
    errors: tuple[str, ...] = ()
    compactions: int = Field(0, ge=0)
    messages_removed: int = Field(0, ge=0)


class SummaryState(_StateModel):
    """What a boundary's rule-based summary was written from, folded into the next one so
    the handoff survives any number of compactions.

    Stored as JSON with each boundary (``compact_boundaries.summary_state``) and parsed when
    read: a row that does not parse is a damaged database. ``version`` says which shape it
    has; a version-1 row (``"version": 1``, or no version and only version 1's fields, as rows
    written before it had one) is read as version 2: its topics
    become instructions without a seq, its files are "named" and its errors unresolved —
    what it did not record stays unknown.
    """

    version: Literal[2] = 2
    original_request: str | None = None
    cwd: str | None = None
    instructions: tuple[Instruction, ...] = ()  # oldest first
    earlier_instructions: EarlierInstructions | None = None
    plan: Plan | None = None
    current_work: CurrentWork | None = None
    files: tuple[FileEntry, ...] = ()  # oldest first
    errors: tuple[ErrorEntry, ...] = ()  # oldest first
    compactions: int = Field(0, ge=0)
    messages_removed: int = Field(0, ge=0)
    first_seq: int | None = None  # the seqs the summary stands for
    last_seq: int | None = None

    @model_validator(mode="before")
    @classmethod
    def _upgrade(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        if "version" in data and data["version"] != 1:
            return data
        if "version" not in data and data.keys() - _SummaryStateV1.model_fields.keys():
            return data  # made in code: version 2's own fields
        old = _SummaryStateV1.model_validate(data)  # a damaged row fails here, by name
        return {
            "original_request": old.original_request,
            "instructions": [{"text": topic} for topic in old.topics],
            "files": [{"path": path, "actions": ["named"]} for path in old.files],
            "errors": [{"text": text} for text in old.errors],
            "compactions": old.compactions,
            "messages_removed": old.messages_removed,
        }
