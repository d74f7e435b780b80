"""The compaction config: every threshold of the pipeline, in one place. Exported by
:mod:`compactstore.models` (and :mod:`compactstore`)."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from compactstore._context.boilerplate import DEFAULT_BOILERPLATE_PATTERNS, compile_patterns

__all__ = ["CompactionConfig"]

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
        300.0,
        gt=0,
        description="Seconds a cached prefix stays warm (300: the 5-minute cache; an hour while "
        "the calls write 1-hour entries); microcompact also runs once that long passed since "
        "the newest model call (or assistant message). None: no such trigger.",
    )
    cache_aware: bool = Field(
        True,
        description="Rewrite policy: a microcompact clear or tool-result placeholder of content "
        "already sent waits while the cache writes it causes cost more than it saves within "
        "cache_ttl_seconds, unless usage is at auto_compact_threshold (caching.edit_cost).",
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
        ("update_plan", "TodoWrite", "write_todos", "task_tracker", "TaskCreate", "TaskUpdate"),
        description="Calls that keep the agent's plan or task list: a whole list per call "
        "(the latest one is the list) or TaskCreate/TaskUpdate, one task per call; the open "
        "tasks at a cut are the summary's pending tasks.",
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
        "compactstore._context.boilerplate.",
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
