"""Which agent wrote a transcript, told from the file's content."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from compactstore._importers.files import TranscriptFile, open_transcript
from compactstore._importers.mini_swe_agent import is_trajectory
from compactstore.errors import InvalidInputError

__all__ = ["detect", "detect_file", "transcripts"]

# How many records detection looks at before giving up on a file.
_DETECT_RECORDS = 50

_CODEX_RECORD_TYPES = frozenset(
    {"session_meta", "response_item", "event_msg", "turn_context", "compacted"}
)
# Older Codex rollouts wrote response items as top-level records, without a payload wrapper.
_CODEX_ITEM_TYPES = frozenset(
    {
        "message",
        "function_call",
        "function_call_output",
        "custom_tool_call",
        "custom_tool_call_output",
        "local_shell_call",
        "local_shell_call_output",
        "reasoning",
        "web_search_call",
    }
)
_CLAUDE_RECORD_TYPES = frozenset(
    {
        "user",
        "assistant",
        "system",
        "summary",
        "progress",
        "file-history-snapshot",
        "queue-operation",
        "attachment",
    }
)
# OpenHands agent-sdk event classes, and Copilot CLI event namespaces (see their modules).
_OPENHANDS_KINDS = frozenset(
    {
        "SystemPromptEvent",
        "MessageEvent",
        "ActionEvent",
        "ObservationEvent",
        "UserRejectObservation",
        "AgentErrorEvent",
        "Condensation",
        "CondensationRequest",
        "CondensationSummaryEvent",
        "ConversationStateUpdateEvent",
        "PauseEvent",
    }
)
_COPILOT_PREFIXES = ("session.", "user.", "assistant.", "tool.", "system.", "hook.", "subagent.")
_CLAUDE_MARKERS = ("uuid", "parentUuid", "sessionId", "leafUuid", "messageId", "isSidechain")


def _classify(record: dict[str, Any]) -> str | None:
    """The source a JSONL record belongs to, or None when it does not tell."""
    kind = record.get("type") if isinstance(record.get("type"), str) else None
    if kind in _CODEX_RECORD_TYPES and "payload" in record:
        return "codex"
    if "record_type" in record or (kind in _CODEX_ITEM_TYPES and "payload" not in record):
        return "codex"
    if kind in _CLAUDE_RECORD_TYPES and any(key in record for key in _CLAUDE_MARKERS):
        return "claude-code"
    if record.get("kind") in _OPENHANDS_KINDS and "source" in record:
        return "openhands"
    if (
        kind is not None
        and kind.startswith(_COPILOT_PREFIXES)
        and isinstance(record.get("data"), dict)
        and "parentId" in record
    ):
        return "copilot-cli"
    if "role" in record:
        return "jsonl"
    if kind is None and {"id", "timestamp", "instructions"} <= record.keys():
        return "codex"  # the session header of an old rollout
    return None


def _is_trajectory(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("history"), list)


def _trajectory_source(value: Any) -> str | None:
    """The source of a whole-document trajectory, or None."""
    if is_trajectory(value):
        return "mini-swe-agent"
    return "swe-agent" if _is_trajectory(value) else None


def detect_file(file: TranscriptFile, *, plain: bool = False) -> str:
    """The file's source; ``plain``: the caller named a message format, so a file that is
    no other source is plain JSONL (its lines then say what is wrong with them)."""
    if file.suffix == ".traj":
        return "swe-agent"
    first = next((text for _, text, _ in file.lines() if text.strip()), "")
    try:
        head = json.loads(first)
    except RecursionError:
        raise InvalidInputError(f"{file.name}: JSON nested too deeply") from None
    except json.JSONDecodeError:
        head = None
        # Not JSONL: a pretty-printed JSON document may still be a trajectory.
        if first.lstrip().startswith("{"):
            try:
                whole = json.loads(file.text())
            except RecursionError:
                raise InvalidInputError(f"{file.name}: JSON nested too deeply") from None
            except ValueError:  # not JSON, or a number too long to read
                whole = None
            found = _trajectory_source(whole)
            if found is not None:
                return found
    except ValueError:
        head = None  # a number too long to read: reading the records names its line
    found = _trajectory_source(head)
    if found is not None:
        return found
    for number, record in file.records():
        if number > _DETECT_RECORDS * 4:
            break
        source = _classify(record)
        if source is not None:
            return source
    if plain:
        return "jsonl"
    raise InvalidInputError(
        f"cannot tell what kind of transcript {file.name} is: its records are none of Claude "
        f"Code, Codex rollout, SWE-agent, OpenHands, mini-swe-agent, Copilot CLI or plain "
        f"messages (with a 'role'); give the format"
    )


def detect(path: str | os.PathLike[str]) -> str:
    """The source of a transcript file, from its content: one of
    ``compactstore._importers.SOURCES``.

    Raises:
        InvalidInputError: unreadable, not UTF-8, empty, or not a known kind of transcript.
    """
    with open_transcript(path) as file:
        return detect_file(file)


def transcripts(paths: Iterable[Path]) -> list[Path]:
    """The files among ``paths``, in their order, that :func:`detect` reads as a transcript
    (companion files and kinds without an importer are left out)."""
    found = []
    for path in paths:
        try:
            detect(path)
        except InvalidInputError:
            continue
        found.append(path)
    return found
