"""pydantic-ai messages and the ``anthropic`` session format, both ways (for
:mod:`compactstore.integrations.pydantic_ai`; imported once pydantic-ai is)."""

from __future__ import annotations

import base64
import dataclasses
import json
from typing import Any

from pydantic_ai.messages import (
    BinaryContent,
    DocumentUrl,
    ImageUrl,
    ModelMessage,
    ModelRequest,
    ModelRequestPart,
    ModelResponse,
    ModelResponsePart,
    RetryPromptPart,
    SystemPromptPart,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)

from compactstore._store.session import Session

__all__ = ["answers", "from_format", "pieces", "to_anthropic", "with_results", "without_thinking"]


def answers(part: ModelRequestPart) -> bool:
    """A part that answers a tool call (it goes into a tool_result block)."""
    if isinstance(part, ToolReturnPart):
        return True
    return isinstance(part, RetryPromptPart) and part.tool_name is not None


def pieces(message: ModelMessage) -> list[ModelMessage]:
    """``message`` as the messages it is stored as: a request holding system prompts and
    other parts (but no tool returns, which must follow their calls) is split in two."""
    if not isinstance(message, ModelRequest) or any(answers(p) for p in message.parts):
        return [message]
    groups: list[list[ModelRequestPart]] = []
    for part in message.parts:
        system = isinstance(part, SystemPromptPart)
        if groups and isinstance(groups[-1][0], SystemPromptPart) == system:
            groups[-1].append(part)
        else:
            groups.append([part])
    if len(groups) <= 1:
        return [message]
    return [dataclasses.replace(message, parts=group) for group in groups]


def _media(item: Any) -> dict[str, Any]:
    """A piece of user content as an anthropic content block."""
    if isinstance(item, str):
        return {"type": "text", "text": item}
    if isinstance(item, BinaryContent):
        data = base64.b64encode(item.data).decode()
        source = {"type": "base64", "media_type": item.media_type, "data": data}
        if item.is_image:
            return {"type": "image", "source": source}
        if item.media_type == "application/pdf":
            return {"type": "document", "source": source}
    elif isinstance(item, ImageUrl):
        return {"type": "image", "source": {"type": "url", "url": item.url}}
    elif isinstance(item, DocumentUrl) and item.media_type == "application/pdf":
        return {"type": "document", "source": {"type": "url", "url": item.url}}
    kind = getattr(item, "kind", type(item).__name__)
    url = getattr(item, "url", None)
    return {"type": "text", "text": f"[{kind}{': ' + url if isinstance(url, str) else ''}]"}


def _request_blocks(part: ModelRequestPart) -> list[dict[str, Any]]:
    if isinstance(part, ToolReturnPart):
        result: dict[str, Any] = {
            "type": "tool_result",
            "tool_use_id": part.tool_call_id,
            "content": part.model_response_str(),
        }
        if part.outcome in ("failed", "denied"):
            result["is_error"] = True
        return [result]
    if isinstance(part, RetryPromptPart):
        if part.tool_name is not None:
            return [
                {
                    "type": "tool_result",
                    "tool_use_id": part.tool_call_id,
                    "content": part.model_response(),
                    "is_error": True,
                }
            ]
        return [{"type": "text", "text": part.model_response()}]
    if isinstance(part, UserPromptPart):
        content = part.content
        return [_media(item) for item in ([content] if isinstance(content, str) else content)]
    text = getattr(part, "content", None)
    if isinstance(text, str):
        return [{"type": "text", "text": text}]
    return [{"type": "text", "text": f"[{getattr(part, 'part_kind', type(part).__name__)}]"}]


def _response_block(part: ModelResponsePart) -> dict[str, Any] | None:
    if isinstance(part, TextPart):
        return {"type": "text", "text": part.content} if part.content else None
    if isinstance(part, ThinkingPart):
        return {"type": "thinking", "thinking": part.content, "signature": part.signature or ""}
    if isinstance(part, ToolCallPart) and part.part_kind == "tool-call":
        return {
            "type": "tool_use",
            "id": part.tool_call_id,
            "name": part.tool_name,
            "input": part.args_as_dict(),
        }
    return {"type": "text", "text": f"[{part.part_kind}]"}


def to_anthropic(message: ModelMessage) -> list[dict[str, Any]]:
    """A pydantic-ai message in the ``anthropic`` session format: one message per stored
    piece (a request with system prompts and a user prompt is two)."""
    out: list[dict[str, Any]] = []
    for piece in pieces(message):
        if isinstance(piece, ModelResponse):
            blocks = [b for b in map(_response_block, piece.parts) if b is not None]
            out.append({"role": "assistant", "content": blocks or ""})
        elif all(isinstance(p, SystemPromptPart) for p in piece.parts) and piece.parts:
            text = "\n\n".join(p.content for p in piece.parts if isinstance(p, SystemPromptPart))
            out.append({"role": "system", "content": text})
        else:
            blocks = [b for part in piece.parts for b in _request_blocks(part)]
            out.append({"role": "user", "content": blocks or ""})
    return out


def with_results(message: ModelMessage, texts: dict[str, str]) -> ModelMessage:
    """``message`` with the content of its tool returns replaced (a compaction edit)."""
    if not isinstance(message, ModelRequest):
        return message
    parts: list[ModelRequestPart] = [
        ToolReturnPart(
            tool_name=p.tool_name,
            content=texts[p.tool_call_id],
            tool_call_id=p.tool_call_id,
            timestamp=p.timestamp,
            outcome=p.outcome,
        )
        if isinstance(p, ToolReturnPart) and p.tool_call_id in texts
        else p
        for p in message.parts
    ]
    return dataclasses.replace(message, parts=parts)


def without_thinking(message: ModelMessage) -> ModelMessage:
    if not isinstance(message, ModelResponse):
        return message
    return dataclasses.replace(
        message, parts=[p for p in message.parts if not isinstance(p, ThinkingPart)]
    )


def from_format(session: Session, message: dict[str, Any], names: dict[str, str]) -> ModelMessage:
    """A pydantic-ai message for a stored message that has no pydantic-ai form."""
    adapter = session.adapter
    kind = adapter.kind(message)
    if kind == "assistant":
        parts: list[ModelResponsePart] = []
        text = adapter.text(message)
        if text:
            parts.append(TextPart(text))
        for call in adapter.tool_calls(message):
            args = json.loads(call.input) if isinstance(call.input, str) else call.input
            parts.append(ToolCallPart(call.name, args, tool_call_id=call.id))
        return ModelResponse(parts=parts)
    if kind == "system":
        return ModelRequest(parts=[SystemPromptPart(adapter.text(message))])
    results = adapter.tool_results(message)
    if results:
        return ModelRequest(
            parts=[
                ToolReturnPart(
                    tool_name=names.get(r.tool_use_id, "unknown"),
                    content=r.text,
                    tool_call_id=r.tool_use_id,
                    outcome="failed" if r.is_error else "success",
                )
                for r in results
            ]
        )
    return ModelRequest(parts=[UserPromptPart(adapter.text(message))])
