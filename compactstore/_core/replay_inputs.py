"""What a compaction records for replay: the engines' inputs, typed.

The ``compactions.inputs`` column holds one of these as JSON. It is parsed when read
(:func:`parse`), so a damaged row is a :class:`DatabaseError` naming the database, never a
``KeyError``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    TypeAdapter,
    model_serializer,
)

from compactstore._context.active import ActiveContext
from compactstore._engines.base import EngineInputs, SummaryService
from compactstore._engines.stages import PROCESS_STAGES
from compactstore.capabilities import EditPolicy
from compactstore.models import SummaryState

__all__ = [
    "DedupRun",
    "EditRun",
    "EngineRun",
    "ImportedRun",
    "Recorded",
    "ReplayInputs",
    "ServerRun",
    "UsageCheck",
    "parse",
]

# Rows written before the field had its name spell ``call`` as "kind".
_CALL_ALIASES = AliasChoices("call", "kind")


class _Recorded(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    now: float  # the time the engines were given
    last_seq: int  # the last message of the context they saw
    replay_of: int | None = None  # set on a replay recorded in place of compaction N


class EngineRun(_Recorded):
    """A call that ran the engines: process_request, reactive_recover or compact."""

    call: Literal["process", "reactive", "manual", "background"] = Field(
        validation_alias=_CALL_ALIASES
    )
    next_blob_id: int
    memory_text: str
    memory_count: int
    last_microcompact_at: float
    consecutive_failures: int
    tripped: bool
    reactive_attempts: int
    usage_offset: int
    token_factor: float | None
    # process_request()'s stage switches: the built-in stages' by name, a registered
    # stage's (compactstore._engines.stages) in stage_switches.
    enable_tool_budget: bool = True
    enable_microcompact: bool = True
    enable_auto_compact: bool = True
    stage_switches: dict[str, bool] = Field(default_factory=dict)
    # compact(up_to_seq=).
    up_to_seq: int | None = None
    # The edit policy the engines ran under and whether the model checks thinking prefixes
    # (rows from before the policy existed ran under rewrite).
    edit_policy: EditPolicy = "rewrite"
    prefix_checks: bool = False
    # The prompt cache the cost rule of in-place edits saw (rows from before it: none).
    last_call_at: float | None = None
    sent_seq: int | None = None
    call_gap: float | None = None
    cache_read: float = 0.1

    @classmethod
    def of(
        cls, call: str, inputs: EngineInputs, context: ActiveContext, options: dict[str, Any]
    ) -> EngineRun:
        """What to record of a run: the engines' inputs and the context's calibration."""
        return cls(
            call=call,
            now=inputs.now,
            last_seq=context.last_seq,
            next_blob_id=inputs.next_blob_id,
            memory_text=inputs.memory_text,
            memory_count=inputs.memory_count,
            last_microcompact_at=inputs.last_microcompact_at,
            consecutive_failures=inputs.consecutive_failures,
            tripped=inputs.tripped,
            reactive_attempts=inputs.reactive_attempts,
            usage_offset=context.usage_offset,
            token_factor=context.token_factor,
            edit_policy=inputs.edit_policy,
            prefix_checks=inputs.prefix_checks,
            last_call_at=inputs.last_call_at,
            sent_seq=inputs.sent_seq,
            call_gap=inputs.call_gap,
            cache_read=inputs.cache_read,
            **{key: value for key, value in options.items() if key in cls.model_fields},
            stage_switches={
                key: bool(value) for key, value in options.items() if key not in cls.model_fields
            },
        )

    @model_serializer(mode="wrap")
    def _without_empty_switches(self, handler: SerializerFunctionWrapHandler) -> Any:
        """Rows record ``stage_switches`` only when a registered stage has one, so the
        inputs of the built-in pipeline are stored as before."""
        data = handler(self)
        if not self.stage_switches and isinstance(data, dict):
            data.pop("stage_switches", None)
        return data

    def switches(self) -> dict[str, bool]:
        """process_request()'s stage switches as recorded (a stage recorded with no switch
        of its own ran)."""
        switches: dict[str, bool] = {}
        for stage in PROCESS_STAGES:
            own = getattr(self, stage.switch, None)  # a built-in stage's field
            switches[stage.switch] = (
                self.stage_switches.get(stage.switch, True) if own is None else bool(own)
            )
        return switches

    def engine_inputs(
        self, context: ActiveContext, summarizer: SummaryService | None, instructions: str | None
    ) -> EngineInputs:
        """The inputs the engines were given, for ``context`` rebuilt as it stood."""
        boundary = context.boundary
        return EngineInputs(
            now=self.now,
            next_blob_id=self.next_blob_id,
            memory_text=self.memory_text,
            memory_count=self.memory_count,
            last_microcompact_at=self.last_microcompact_at,
            consecutive_failures=self.consecutive_failures,
            tripped=self.tripped,
            reactive_attempts=self.reactive_attempts,
            summary_state=boundary.summary_state if boundary is not None else SummaryState(),
            summarizer=summarizer,
            instructions=instructions,
            edit_policy=self.edit_policy,
            prefix_checks=self.prefix_checks,
            last_call_at=self.last_call_at,
            sent_seq=self.sent_seq,
            call_gap=self.call_gap,
            cache_read=self.cache_read,
        )


class ImportedRun(_Recorded):
    """A compaction the agent did itself, found in an imported transcript: nothing of
    compactstore's ran, so there is nothing to run again."""

    call: Literal["import"] = Field(validation_alias=_CALL_ALIASES)
    pre_tokens: int | None = None  # the agent's own count before it


class UsageCheck(_Recorded):
    """A real count whose overhead fills the window (``record_usage``): nothing ran."""

    call: Literal["usage"] = Field(validation_alias=_CALL_ALIASES)
    real_tokens: int


class EditRun(_Recorded):
    """A recorded edit of the context (``clear_session`` / ``pop_item``): no engine ran, so
    there is nothing to run again; rollback undoes it."""

    call: Literal["clear", "pop"] = Field(validation_alias=_CALL_ALIASES)


class DedupRun(_Recorded):
    """A re-read stored as a stub pointing at an earlier read (read dedup, at append time):
    no engine ran and the stub is the logged message, so there is nothing to run again or
    undo. ``last_seq`` is the stub's seq."""

    call: Literal["read_dedup"] = Field(validation_alias=_CALL_ALIASES)
    file_path: str
    dedup_of_seq: int  # the earlier read it points at


class ServerRun(_Recorded):
    """Server-side edits a provider response reports it applied (``append_response``):
    the provider did them, on its copy of the request; nothing to run again."""

    call: Literal["server"] = Field(validation_alias=_CALL_ALIASES)
    applied_edits: list[dict[str, Any]]


Recorded = EngineRun | ImportedRun | UsageCheck | EditRun | DedupRun | ServerRun
ReplayInputs = Annotated[Recorded, Field(union_mode="left_to_right")]

_ADAPTER: TypeAdapter[Recorded] = TypeAdapter(ReplayInputs)


def parse(text: str) -> Recorded:
    """The recorded inputs of a compactions row (pydantic's ValidationError when damaged,
    which the store reports as a damaged database)."""
    return _ADAPTER.validate_json(text)
