"""The one small interface every message format implements.

Engines and the store never look inside a message themselves: they ask the session's
format for its role, tool calls, tool results and text, and ask it to build the messages
compaction adds (summaries, tool-result stubs, synthetic error results). Messages are plain
dicts stored verbatim; adapters never mutate them and always return new dicts.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Literal

from compactstore.errors import InvalidMessageError

__all__ = ["Kind", "MessageFormat", "ToolCall", "ToolResult", "json_text", "storage_json"]

# What a message is, whatever the format spells it as.
Kind = Literal["system", "user", "assistant", "tool"]


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool call made by an assistant message."""

    id: str
    name: str
    input: Any


@dataclass(frozen=True, slots=True)
class ToolResult:
    """A tool result carried by a message, with its content flattened to text."""

    tool_use_id: str
    text: str
    is_error: bool


def storage_json(value: Any) -> str:
    """JSON as messages are stored: key order kept, non-ASCII kept, NaN refused."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def json_text(value: Any) -> str:
    """Compact, deterministic JSON used when a structured value must count as text."""
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


class MessageFormat(ABC):
    """How one API spells messages, tool calls and tool results."""

    name: str

    @abstractmethod
    def validate(self, message: Any) -> None:
        """Check the message's shape; raise InvalidMessageError naming the problem.

        Pairing (does a result's call exist?) is checked by the store, not here.
        """

    @abstractmethod
    def kind(self, message: dict[str, Any]) -> Kind:
        """system, user, assistant, or tool (a message that carries only tool results)."""

    @abstractmethod
    def tool_calls(self, message: dict[str, Any]) -> list[ToolCall]:
        """Tool calls made by this message, in order (empty for non-assistant messages)."""

    @abstractmethod
    def tool_results(self, message: dict[str, Any]) -> list[ToolResult]:
        """Tool results carried by this message, in order."""

    @abstractmethod
    def text(self, message: dict[str, Any]) -> str:
        """The prose of the message (text blocks only; no tool calls or results)."""

    @abstractmethod
    def replace_tool_results(
        self, message: dict[str, Any], replacements: dict[str, str]
    ) -> dict[str, Any]:
        """A copy of the message whose results for the given tool-use ids have new text."""

    @abstractmethod
    def tool_result_message(
        self, tool_use_id: str, content: str, *, tool_name: str, is_error: bool
    ) -> dict[str, Any]:
        """A message carrying one tool result."""

    @abstractmethod
    def summary_message(self, text: str) -> dict[str, Any]:
        """The message that stands for the summarised part of the conversation."""

    @abstractmethod
    def synthetic_results(self, calls: list[ToolCall], text: str) -> list[dict[str, Any]]:
        """Messages that answer calls that never got a result with an error ``text``."""

    def token_text(self, message: dict[str, Any]) -> str:
        """Everything in the message that costs tokens: prose, calls and results."""
        parts = [self.text(message)]
        for call in self.tool_calls(message):
            parts.append(call.name)
            parts.append(call.input if isinstance(call.input, str) else json_text(call.input))
        parts.extend(result.text for result in self.tool_results(message))
        return "\n".join(p for p in parts if p)

    def is_request(self, message: dict[str, Any]) -> bool:
        """True for a user message written by a person (prose, no tool results)."""
        return (
            self.kind(message) == "user"
            and not self.tool_results(message)
            and bool(self.text(message).strip())
        )

    @staticmethod
    def fail(problem: str) -> InvalidMessageError:
        """The error adapters raise: ``raise self.fail("...")``."""
        return InvalidMessageError(problem)
