"""The records of a Codex rollout: each record's kind and payload, line-numbered."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from compactstore._importers.builder import TranscriptBuilder, parse_timestamp
from compactstore._importers.files import Progress, TranscriptFile

__all__ = ["CALL_TYPES", "OUTPUT_TYPES", "payloads", "unwrap"]

CALL_TYPES = frozenset(
    {"function_call", "custom_tool_call", "local_shell_call", "tool_search_call"}
)
OUTPUT_TYPES = frozenset(
    {
        "function_call_output",
        "custom_tool_call_output",
        "local_shell_call_output",
        "tool_search_output",
    }
)


def payloads(
    file: TranscriptFile, out: TranscriptBuilder, progress: Progress | None = None
) -> Iterator[tuple[str, str, dict[str, Any], float | None]]:
    """(where, kind, payload, timestamp) of each record of a rollout that has a payload.

    Raises:
        InvalidInputError: a record whose payload is not an object (line-numbered).
    """
    for number, record in file.records(progress):
        where = f"line {number}"
        kind, payload = unwrap(record)
        if payload is None:
            continue
        if not isinstance(payload, dict):
            raise out.error(where, f"{kind} record: 'payload' must be an object")
        yield (
            where,
            kind,
            payload,
            parse_timestamp(record.get("timestamp") or payload.get("timestamp")),
        )


def unwrap(record: dict[str, Any]) -> tuple[str, Any]:
    """The record's kind and payload; old rollouts have no wrapper (None: nothing to use)."""
    kind = record.get("type") if isinstance(record.get("type"), str) else None
    if "payload" in record and kind is not None:
        return kind, record["payload"]
    if kind in CALL_TYPES | OUTPUT_TYPES | {"message", "reasoning"}:
        return "response_item", record
    if kind is None and "instructions" in record and "id" in record:
        return "session_meta", record
    return str(kind), None
