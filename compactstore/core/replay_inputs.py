"""What a compaction records for replay (SPEC §7): the engines' inputs, typed.

The ``compactions.inputs`` column holds one of these as JSON. It is parsed when read
(:func:`parse`), so a damaged row is a :class:`DatabaseError` naming the database, never a
``KeyError``.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, TypeAdapter

__all__ = ["EngineRun", "ImportedRun", "Recorded", "ReplayInputs", "UsageCheck", "parse"]

# Rows written before the field had its name spell ``call`` as "kind".
_CALL_ALIASES = AliasChoices("call", "kind")


class _Recorded(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    now: float  # the time the engines were given
    last_seq: int  # the last message of the context they saw
    replay_of: int | None = None  # set on a replay recorded in place of compaction N


class EngineRun(_Recorded):
    """A call that ran the engines: process_request, reactive_recover or compact."""

    call: Literal["process", "reactive", "manual"] = Field(validation_alias=_CALL_ALIASES)
    next_blob_id: int
    memory_text: str
    memory_count: int
    last_microcompact_at: float
    consecutive_failures: int
    tripped: bool
    reactive_attempts: int
    usage_offset: int
    token_factor: float | None
    # process_request()'s stage switches.
    enable_tool_budget: bool = True
    enable_microcompact: bool = True
    enable_auto_compact: bool = True
    # compact(up_to_seq=).
    up_to_seq: int | None = None


class ImportedRun(_Recorded):
    """A compaction the agent did itself, found in an imported transcript: nothing of
    compactstore's ran, so there is nothing to run again."""

    call: Literal["import"] = Field(validation_alias=_CALL_ALIASES)
    pre_tokens: int | None = None  # the agent's own count before it


class UsageCheck(_Recorded):
    """A real count whose overhead fills the window (``record_usage``): nothing ran."""

    call: Literal["usage"] = Field(validation_alias=_CALL_ALIASES)
    real_tokens: int


Recorded = EngineRun | ImportedRun | UsageCheck
ReplayInputs = Annotated[Recorded, Field(union_mode="left_to_right")]

_ADAPTER: TypeAdapter[Recorded] = TypeAdapter(ReplayInputs)


def parse(text: str) -> Recorded:
    """The recorded inputs of a compactions row (pydantic's ValidationError when damaged,
    which the store reports as a damaged database)."""
    return _ADAPTER.validate_json(text)
