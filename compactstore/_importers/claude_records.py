"""The records of Claude Code subagents in a transcript, and the calls that started them.

A subagent's records are sidechain records (``isSidechain``, with its ``agentId``) or
``agent_progress`` progress records (``data.agentId``, ``data.message`` the record) in the
parent's file; see :mod:`compactstore._importers.claude_code`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from compactstore._importers.files import Progress, TranscriptFile

__all__ = ["Subagents", "agent_progress", "agent_records", "subagents"]


@dataclass
class Subagents:
    """The subagents a transcript holds records of, and the tool calls that started them."""

    # The agentIds whose records the file holds (sidechain or agent_progress), in order.
    inline: list[str] = field(default_factory=list)
    # agentId -> the id of the tool call that started it (from the call's result, or from
    # the progress records' parentToolUseID), for every subagent the file names.
    calls: dict[str, str] = field(default_factory=dict)


def subagents(file: TranscriptFile) -> Subagents:
    """The subagents of a main transcript (none for a subagent's own transcript)."""
    found = Subagents()
    main = False
    for _, record in file.records():
        kind = record.get("type")
        agent = record.get("agentId")
        if kind in ("user", "assistant") and not record.get("isSidechain"):
            main = True
            spawned = _spawned(record)
            if spawned is not None:
                found.calls.setdefault(*spawned)
        elif kind in ("user", "assistant") and isinstance(agent, str) and agent:
            if agent not in found.inline:
                found.inline.append(agent)
        elif kind == "progress":
            data = agent_progress(record)
            if data is not None:
                agent = data["agentId"]
                if agent not in found.inline:
                    found.inline.append(agent)
                parent = record.get("parentToolUseID")
                if isinstance(parent, str) and parent:
                    found.calls.setdefault(agent, parent)
    return found if main else Subagents()


def agent_progress(record: dict[str, Any]) -> dict[str, Any] | None:
    """An ``agent_progress`` record's data, when it carries a user or assistant record."""
    data = record.get("data")
    if not isinstance(data, dict) or data.get("type") != "agent_progress":
        return None
    agent, message = data.get("agentId"), data.get("message")
    if not (isinstance(agent, str) and agent and isinstance(message, dict)):
        return None
    return data if message.get("type") in ("user", "assistant") else None


def agent_records(
    file: TranscriptFile, progress: Progress | None, agent: str | None
) -> Iterator[tuple[int, dict[str, Any]]]:
    """The file's records; for one subagent (``agent``), only its own, its progress
    records unwrapped into the records they carry."""
    for number, record in file.records(progress):
        if agent is None:
            yield number, record
        elif record.get("type") == "progress":
            data = agent_progress(record)
            if data is not None and data["agentId"] == agent:
                inner = dict(data["message"])
                inner.setdefault("cwd", record.get("cwd"))
                yield number, {**inner, "isSidechain": True, "agentId": agent}
        elif record.get("isSidechain") and record.get("agentId") == agent:
            yield number, record


def _spawned(record: dict[str, Any]) -> tuple[str, str] | None:
    """(agentId, tool call id) when a main-conversation record is the result of the call
    that started a subagent (its ``toolUseResult`` names the agent)."""
    result = record.get("toolUseResult")
    named = result.get("agentId") if isinstance(result, dict) else None
    message = record.get("message")
    content = message.get("content") if isinstance(message, dict) else None
    if not (isinstance(named, str) and named and isinstance(content, list)):
        return None
    for block in content:
        call = block.get("tool_use_id") if isinstance(block, dict) else None
        if block.get("type") == "tool_result" and isinstance(call, str):
            return named, call
    return None
