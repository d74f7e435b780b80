"""A Google ADK agent whose model requests compactstore compacts, offline.

    python examples/google_adk_agent.py [DB]

The model is a scripted ``BaseLlm`` that reads one file per user turn over 40 turns (every
tenth turn with a screenshot), so the example runs without a network or a key; use a real
model (``model="gemini-2.5-flash"``) for a real agent. The glue is the three lines marked
``# glue``. It prints one JSON line: how many compactions ran, how many messages the store
holds, how many events ADK's own session holds, and the largest request the model got (in
tokens, as the store counts them: images by their pixels).
"""

from __future__ import annotations

import asyncio
import json
import struct
import sys
import tempfile
import zlib
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

from google.adk.agents import LlmAgent
from google.adk.apps import App
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import InMemoryRunner
from google.genai import types

from compactstore import estimate_tokens
from compactstore.formats import get_format
from compactstore.integrations.google_adk import CompactPlugin, to_anthropic  # glue

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


class ScriptedModel(BaseLlm):
    """Reads a file after each user prompt, then answers; remembers the largest request."""

    model: str = "scripted"
    largest: int = 0
    calls: int = 0

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        fmt = get_format("anthropic")
        size = sum(
            fmt.message_tokens(to_anthropic(content, str(i)), estimate_tokens)
            for i, content in enumerate(llm_request.contents)
        )
        self.largest = max(self.largest, size)
        self.calls += 1
        last = llm_request.contents[-1].parts or []
        if last and last[0].function_response is None:
            path = f"app/module_{self.calls}.py"
            parts = [
                types.Part(text=f"Reading {path} to see how it handles errors."),
                types.Part(function_call=types.FunctionCall(name="read_file", args={"path": path})),
            ]
        else:
            parts = [types.Part(text="It re-raises every error it cannot handle. " * 8)]
        yield LlmResponse(content=types.Content(role="model", parts=parts))


def read_file(path: str) -> str:
    """Read a file of the project."""
    return "\n".join(
        f"{path}:{n}: def handler_{n}(request): return respond(request)" for n in range(60)
    )


async def main(db: str) -> dict[str, Any]:
    model = ScriptedModel()
    agent = LlmAgent(
        name="reviewer", model=model, instruction="You review error handling.", tools=[read_file]
    )
    plugin = CompactPlugin(db, context_window=CONTEXT_WINDOW)  # glue
    runner = InMemoryRunner(app=App(name="review", root_agent=agent, plugins=[plugin]))  # glue
    adk = await runner.session_service.create_session(app_name="review", user_id="me")
    image = screenshot()
    for turn in range(TURNS):
        parts = [types.Part(text=f"Turn {turn}: check the next module")]
        if turn % 10 == 0:
            parts.append(types.Part(inline_data=types.Blob(data=image, mime_type="image/png")))
        message = types.Content(role="user", parts=parts)
        async for _ in runner.run_async(user_id="me", session_id=adk.id, new_message=message):
            pass
    after = await runner.session_service.get_session(
        app_name="review", user_id="me", session_id=adk.id
    )
    assert after is not None
    session = plugin.session_for(adk.id)
    return {
        "compactions": sum(1 for c in session.compactions() if c.boundary is not None),
        "stored_messages": session.message_count(),
        "adk_events": len(after.events),
        "max_request_tokens": model.largest,
        "context_window": CONTEXT_WINDOW,
    }


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        target = sys.argv[1] if len(sys.argv) > 1 else str(Path(tmp) / "google_adk_agent.db")
        print(json.dumps(asyncio.run(main(target))))
