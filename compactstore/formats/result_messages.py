"""Formats whose tool result is a message of its own, with a role and an id key.

OpenAI Chat Completions (``{"role": "tool", "tool_call_id", "content"}``) and MiniCode
(``{"role": "tool_result", "toolUseId", "content", ...}``) read and rewrite such messages
the same way; :class:`ResultMessageFormat` does it once for both.
"""

from __future__ import annotations

import copy
from typing import Any, ClassVar

from compactstore.formats.base import MessageFormat, content_parts, content_text

__all__ = ["ResultMessageFormat"]


class ResultMessageFormat(MessageFormat):
    """A format whose results are ``{"role": result_role, result_id_key: id, "content"}``
    messages, and whose summary is a ``system`` message."""

    result_role: ClassVar[str]
    result_id_key: ClassVar[str]

    def text(self, message: dict[str, Any]) -> str:
        # A result message's content is its result, counted by tool_results().
        if message.get("role") == self.result_role:
            return ""
        return content_text(message.get("content"))

    def text_parts(self, message: dict[str, Any]) -> list[str]:
        if message.get("role") == self.result_role:
            return []
        return content_parts(message.get("content"))

    def replace_tool_results(
        self, message: dict[str, Any], replacements: dict[str, str]
    ) -> dict[str, Any]:
        new = copy.deepcopy(message)
        if new.get("role") == self.result_role and new.get(self.result_id_key) in replacements:
            new["content"] = replacements[new[self.result_id_key]]
        return new

    def summary_message(self, text: str) -> dict[str, Any]:
        return {"role": "system", "content": text}
