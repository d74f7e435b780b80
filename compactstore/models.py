"""Public data models: triggers, strategies, the compaction config and recorded results."""

from __future__ import annotations

import re
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
    field_validator,
    model_validator,
)

from compactstore.boilerplate import DEFAULT_BOILERPLATE_PATTERNS, compile_patterns
from compactstore.frozen import FrozenDict, freeze, thaw
from compactstore.ledger import CallUsage

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


# Fields of earlier versions that no longer mean anything (the topics list of the first summary).
_RETIRED_FIELDS = frozenset(
    {"summary_max_topics", "summary_topic_chars", "summary_max_earlier_files"}
)


class CompactionConfig(BaseModel):
    """Every threshold of the pipeline.

    Defaults are the MiniCode article's numbers, except where the article names none or a
    comment here says why not: ``token_factor`` (1.6, measured on real transcripts; 1.0 is
    the article's plain estimate), ``full_compact_max_tail_messages``,
    ``full_compact_target_share`` and the summary's fields. Each field's description is
    the configuration reference of the documentation.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    # Stage 2: tool-result budget.
    tool_result_max_chars: int = Field(
        4_000,
        ge=1,
        description="A tool result longer than this many characters is stored whole as a blob "
        "and replaced in the context by a preview (tool-result budget stage).",
    )
    tool_result_preview_chars: int = Field(
        500,
        ge=100,
        description="The longest preview (or media note) that stands for a persisted tool "
        "result, in characters.",
    )
    preview_head_lines: int = Field(
        8, ge=0, description="Lines from the start of a persisted result the preview shows."
    )
    preview_tail_lines: int = Field(
        3,
        ge=0,
        description="Lines from the end of a persisted result the preview shows, when the "
        "result has more than preview_tail_after_lines lines.",
    )
    preview_tail_after_lines: int = Field(
        12,
        ge=0,
        description="A preview shows the result's last lines only when it has more lines "
        "than this.",
    )
    max_media_in_context: int = Field(
        20,
        ge=0,
        description="Tool results with images or documents are exempt from the character "
        "budget; once the context holds more media blocks than this (tool results and user "
        "messages together), the oldest are persisted as blobs behind a text note.",
    )

    # Stage 3: read dedup (at tool-execution time).
    read_dedup_enabled: bool = Field(
        True,
        description="An unchanged re-read of a file (a tool result appended with file_path=) "
        "becomes a stub pointing at the earlier read.",
    )

    # Format responses.
    responses_store: bool = Field(
        False,
        description="Format responses: whether the provider keeps responses (store=True), so "
        "item_reference items are accepted and reasoning items without encrypted_content are "
        "sent. With False both are left out of what is sent (the log keeps them).",
    )

    # Thinking.
    preserved_thinking: bool = Field(
        True,
        description="Signed thinking blocks of earlier turns are sent while nothing before "
        "them changed; with False only the newest assistant turn's thinking is sent and "
        "counted.",
    )

    edit_policy: Literal["auto", "rewrite", "append_only"] = Field(
        "auto",
        description='"rewrite" edits sent messages in place (placeholders, previews, cuts); '
        '"append_only" never changes a message\'s wire bytes once it was sent (the cheap '
        "stages act before the first send, microcompact is the provider's server-side edit); "
        '"auto" is append_only for a model whose API checks thinking blocks\' prefixes '
        "(compactstore.capabilities), rewrite otherwise.",
    )

    # Stage 4: microcompact.
    microcompact_interval_seconds: float = Field(
        3_600.0,
        gt=0,
        description="Microcompact clears old tool results every this many seconds (from the "
        "session's creation).",
    )
    microcompact_keep_recent: int = Field(
        5, ge=0, description="The newest tool results microcompact leaves in the context."
    )
    cache_ttl_seconds: float | None = Field(
        None,
        gt=0,
        description="When set, microcompact also runs once the provider's prompt cache "
        "expired: this many seconds after the last model call.",
    )
    cache_aware: bool = Field(
        True,
        description="Cache-aware in-place edits (rewrite policy): a clear of content already "
        "sent waits while the cache writes it causes cost more than it saves within "
        "cache_ttl_seconds (the 5-minute cache when that is None), unless usage is at "
        "auto_compact_threshold (compactstore.caching.edit_cost).",
    )

    # Stage 5: auto-compact check and circuit breaker.
    auto_compact_threshold: float = Field(
        0.85,
        gt=0,
        le=1,
        description="Share of the context window at which auto-compact cuts the context.",
    )
    auto_compact_wait_limit: float = Field(
        0.93,
        gt=0,
        le=1,
        description="On models whose API checks thinking blocks' prefixes, a cut inside a tool "
        "loop would make the loop's own thinking invalid: auto-compact waits for the loop to "
        "end (a user message) until usage reaches this share of the window.",
    )
    breaker_max_failures: int = Field(
        3,
        ge=1,
        description="Consecutive failed auto-compactions that trip the circuit breaker "
        "(Session.reset_breaker() re-arms it).",
    )

    # Stage 6a: session-memory compact.
    session_memory_max_tokens: int = Field(
        6_000,
        ge=0,
        description="The most tokens of session memory (Session.remember entries) a "
        "session-memory compact puts in its summary.",
    )
    session_memory_min_tail_messages: int = Field(
        5, ge=1, description="Session-memory compact keeps at least this many newest messages."
    )
    session_memory_min_tail_tokens: int = Field(
        10_000, ge=0, description="Session-memory compact keeps at least this many tokens."
    )
    session_memory_max_tail_tokens: int = Field(
        40_000, ge=0, description="Session-memory compact keeps at most this many tokens."
    )
    session_memory_max_after_ratio: float = Field(
        0.95,
        gt=0,
        le=1,
        description="A session-memory compact fails unless it gets usage below this share "
        "of the usage before it; a full compact runs instead.",
    )

    # Stage 6b: full compact (rule-based summary).
    full_compact_keep_fraction: float = Field(
        1 / 3,
        gt=0,
        lt=1,
        description="Share of the newest messages a full compact keeps after its summary.",
    )
    full_compact_max_tail_messages: int = Field(
        40,
        ge=1,
        description="The most messages a full compact keeps after its summary (the article "
        "names the bound but not its value).",
    )
    full_compact_target_share: float = Field(
        0.5,
        gt=0,
        le=1,
        description="The kept tail is cut further so usage right after a full compact is at "
        "most this share of the window (fixed overhead, pins and summary included), so one "
        "compaction leaves room to work instead of triggering again on the next turn.",
    )
    summary_max_tokens: int = Field(
        6_000,
        ge=100,
        description="The budget of a summary; the built-in summarizers also send it as their "
        "output cap.",
    )
    summary_max_window_share: float = Field(
        0.2,
        gt=0,
        le=1,
        description=(
            "The most of the context window a summary may fill: its budget is the smaller of "
            "summary_max_tokens and this share of context_window (in the token counter's "
            "tokens: divided by the session's token factor), so a small window still has "
            "room for the messages a compaction keeps."
        ),
    )
    summary_request_chars: int = Field(
        2_000,
        ge=1,
        description="The summary quotes the original request up to this many characters.",
    )
    summary_instruction_chars: int = Field(
        60,
        ge=10,
        description="Over budget, the oldest later instructions are cut to this many "
        "characters first.",
    )
    summary_max_files: int = Field(
        60, ge=0, description="The most files the summary lists, newest first."
    )
    summary_max_errors: int = Field(
        5, ge=0, description="The most errors the summary lists (the newest)."
    )
    summary_error_chars: int = Field(
        160, ge=20, description="Each error in the summary is one line of at most this length."
    )
    plan_tool_names: tuple[str, ...] = Field(
        ("update_plan", "TodoWrite", "write_todos"),
        description="Calls whose input is the agent's plan or todo list: the latest one's "
        "items are the summary's pending tasks.",
    )

    # Recall.
    recall_enabled: bool = Field(
        False,
        description="Summaries end with a recall line naming the recall tool "
        "(Session.recall_tool() turns it on).",
    )
    recall_max_tokens: int = Field(
        4_000,
        ge=100,
        description="Recall answers are cut at this many tokens, with a cursor to continue.",
    )

    # Summarizers.
    summarizer_timeout_seconds: float = Field(
        120.0,
        gt=0,
        le=86_400,
        description="A summarizer call that takes longer falls back to the rule-based "
        "summary; also the compaction lease's length (plus 30 s).",
    )
    summarizer_max_calls_per_hour: int = Field(
        30,
        ge=0,
        description="At most this many summarizer calls per session per hour (by the calls' "
        "now); then summaries are rule-based until the hour has passed.",
    )
    background_threshold: float = Field(
        0.70,
        gt=0,
        le=1,
        description="process_request(background=True) starts a background compaction once "
        "usage passes this share of the window (a summarizer must be configured); one that "
        "leaves usage at or above it counts as a breaker failure.",
    )

    # Stage 7: reactive recovery.
    reactive_blocking_ratio: float = Field(
        0.97,
        gt=0,
        le=1,
        description="At or above this share of the window the agent is blocked: a call "
        "waits for a running summary and then compacts, background or not.",
    )
    reactive_target_ratio: float = Field(
        0.9,
        gt=0,
        le=1,
        description="Reactive recovery aims below reactive_blocking_ratio times this share "
        "of the window.",
    )
    reactive_keep_fractions: tuple[float, ...] = Field(
        (0.4, 0.3, 0.2),
        description="Shares of the newest messages reactive recovery's truncation attempts "
        "keep, one attempt each after the forced full compact.",
    )
    reactive_min_keep_messages: int = Field(
        3, ge=1, description="Reactive truncation keeps at least this many messages."
    )
    reactive_min_keep_fraction: float = Field(
        0.15,
        ge=0,
        le=1,
        description="Reactive truncation keeps at least this share of the messages.",
    )

    # Token accounting.
    fixed_overhead_tokens: int = Field(
        0,
        ge=0,
        description="Tokens of system prompt and tool definitions the API counts but the "
        "messages do not show; counted from the start.",
    )
    token_factor: float = Field(
        1.6,
        gt=0,
        le=10,
        description="Real tokens per estimated token before any real count is known (then "
        "it is learnt from record_usage). On the Claude Code dev transcripts real growth over "
        "estimated growth is 1.43-1.52 in aggregate, so 1.6 does not undercount code-heavy "
        "sessions; 1.0 gives the article's plain estimate (use it with an exact counter).",
    )

    boilerplate_patterns: tuple[str, ...] = Field(
        DEFAULT_BOILERPLATE_PATTERNS,
        description="Regular expressions of client boilerplate (environment blocks, command "
        "tags, reminders, skill banners): removed from the request, instructions and errors; "
        "a user message with nothing else is never the request. Defaults in "
        "compactstore.boilerplate.",
    )

    # Input limits.
    max_message_bytes: int = Field(
        32 * 1024 * 1024,
        ge=1_024,
        description="The largest message (its JSON, in bytes) append and import accept.",
    )

    @model_validator(mode="before")
    @classmethod
    def _drop_retired(cls, data: Any) -> Any:
        # Stored configs of sessions made before the summary had sections keep loading.
        if isinstance(data, dict) and _RETIRED_FIELDS & data.keys():
            return {k: v for k, v in data.items() if k not in _RETIRED_FIELDS}
        return data

    @field_validator("boilerplate_patterns")
    @classmethod
    def _check_patterns(cls, patterns: tuple[str, ...]) -> tuple[str, ...]:
        try:
            compile_patterns(patterns)
        except re.error as exc:
            raise ValueError(str(exc)) from None
        return patterns

    @model_validator(mode="after")
    def _check_ranges(self) -> CompactionConfig:
        if self.session_memory_max_tail_tokens < self.session_memory_min_tail_tokens:
            raise ValueError(
                "session_memory_max_tail_tokens must be >= session_memory_min_tail_tokens"
            )
        if not self.reactive_keep_fractions or any(
            not 0 < f < 1 for f in self.reactive_keep_fractions
        ):
            raise ValueError("reactive_keep_fractions must be fractions between 0 and 1")
        return self

    @property
    def reactive_limit_ratio(self) -> float:
        """Share of the window reactive recovery must get under (97% x 0.9 = 87.3%)."""
        return self.reactive_blocking_ratio * self.reactive_target_ratio


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

    # The messages, read-only (compactstore.frozen): a compaction hands over the context's
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
