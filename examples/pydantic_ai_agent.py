"""A pydantic-ai agent whose conversation lives in compactstore, offline.

    python examples/pydantic_ai_agent.py [DB]

The model is pydantic-ai's FunctionModel, scripted to read one file per user turn over 40
turns (every tenth turn with a screenshot), so the example runs without a network or a key;
swap in any model (``"anthropic:claude-sonnet-4-5"``, ``"openai:gpt-5"``) for a real agent.
The glue is the three lines marked ``# glue``. It prints one JSON line: how many compactions
ran, how many messages the store holds, how many the run's history kept, and the largest
request the model got (in tokens, as the store counts them: images by their pixels).
"""

from __future__ import annotations

import json
import struct
import sys
import tempfile
import zlib
from pathlib import Path
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import (
    BinaryContent,
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from compactstore.integrations.pydantic_ai import CompactHistory, to_anthropic  # glue

CONTEXT_WINDOW = 10_000
TURNS = 40


def screenshot(width: int = 1000, height: int = 800) -> bytes:
    """A blank PNG of this size."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    rows = b"".join(b"\x00" + bytes(width * 3) for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


class Script:
    """Reads a file after each user prompt, then answers; remembers the largest request."""

    def __init__(self) -> None:
        self.largest = 0
        self.calls = 0

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        from compactstore import estimate_tokens
        from compactstore.formats import get_format

        fmt = get_format("anthropic")
        size = sum(
            fmt.message_tokens(m, estimate_tokens) for msg in messages for m in to_anthropic(msg)
        )
        self.largest = max(self.largest, size)
        self.calls += 1
        last = messages[-1]
        if isinstance(last, ModelRequest) and isinstance(last.parts[-1], UserPromptPart):
            path = f"app/module_{self.calls}.py"
            return ModelResponse(
                parts=[
                    TextPart(f"Reading {path} to see how it handles errors."),
                    ToolCallPart("read_file", {"path": path}),
                ]
            )
        return ModelResponse(parts=[TextPart("It re-raises every error it cannot handle. " * 8)])


def main(db: str) -> dict[str, Any]:
    script = Script()
    history = CompactHistory(db, "review-1", context_window=CONTEXT_WINDOW)  # glue
    agent = Agent(
        FunctionModel(script),
        system_prompt="You review error handling.",
        capabilities=[history],  # glue
    )

    @agent.tool_plain
    def read_file(path: str) -> str:
        """Read a file of the project."""
        return "\n".join(
            f"{path}:{n}: def handler_{n}(request): return respond(request)" for n in range(60)
        )

    image = screenshot()
    result = None
    for turn in range(TURNS):
        prompt: Any = f"Turn {turn}: check the next module"
        if turn % 10 == 0:
            prompt = [
                f"Turn {turn}: does this error page look right?",
                BinaryContent(image, media_type="image/png"),
            ]
        # The stored conversation carries on from run to run: no message_history needed.
        result = agent.run_sync(prompt)
    assert result is not None
    session = history.session
    assert session is not None
    return {
        "compactions": sum(1 for c in session.compactions() if c.boundary is not None),
        "stored_messages": session.message_count(),
        "history_messages": len(result.all_messages()),
        "max_request_tokens": script.largest,
        "context_window": CONTEXT_WINDOW,
        "answer": result.output[:60],
    }


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        target = sys.argv[1] if len(sys.argv) > 1 else str(Path(tmp) / "pydantic_ai_agent.db")
        print(json.dumps(main(target)))
