"""An OpenAI Agents SDK agent whose session compactstore keeps and compacts, offline.

The model is a fake implementing the SDK's own ``Model`` interface (no network): it calls a
tool twice per turn, then answers. Run: ``python examples/openai_agents_session.py``.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from agents import Agent, function_tool, set_tracing_disabled
from agents.items import ModelResponse, TResponseStreamEvent
from agents.models.interface import Model
from agents.usage import Usage
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage
from openai.types.responses.response_output_text import ResponseOutputText

from compactstore import CompactStore
from compactstore.integrations.openai_agents import CompactSession


class OfflineModel(Model):
    """Two tool calls per user turn, then a text answer."""

    def __init__(self) -> None:
        self.n = 0

    async def get_response(self, system_instructions: Any, input: Any, *a: Any, **k: Any) -> Any:
        self.n += 1
        since_user = 0
        for item in reversed(input):
            if item.get("role") == "user":
                break
            since_user += item.get("type") == "function_call"
        usage = Usage(requests=1, input_tokens=len(json.dumps(input)) // 4, output_tokens=5)
        if since_user < 2:
            out: Any = ResponseFunctionToolCall(
                type="function_call",
                call_id=f"call_{self.n}",
                name="grep",
                arguments=json.dumps({"pattern": f"TODO {self.n}"}),
                id=f"fc_{self.n}",
            )
        else:
            text = ResponseOutputText(type="output_text", text=f"answer {self.n}", annotations=[])
            out = ResponseOutputMessage(
                type="message",
                id=f"msg_{self.n}",
                role="assistant",
                status="completed",
                content=[text],
            )
        return ModelResponse(output=[out], usage=usage, response_id=None)

    def stream_response(self, *a: Any, **k: Any) -> AsyncIterator[TResponseStreamEvent]:
        raise NotImplementedError


@function_tool
def grep(pattern: str) -> str:
    """Search the code."""
    return f"{pattern}: " + "match in src/app.py line 12\n" * 200


async def main() -> None:
    set_tracing_disabled(True)
    store = CompactStore.open(str(Path(tempfile.mkdtemp()) / "agents.db"))
    agent = Agent(name="coder", instructions="Fix the TODOs.", model=OfflineModel(), tools=[grep])
    # The glue: the import and the session. ``Runner.run(agent, text, session=session)``
    # alone compacts before each run; ``session.run`` (Runner.run with this session) also
    # compacts between the tool rounds of one run and recovers from "prompt too long".
    session = CompactSession("task-42", store, context_window=8_000)
    for turn in range(6):
        result = await session.run(agent, f"fix TODO number {turn}")
    print(result.final_output, "| compactions:", len(session.session.compactions()))
    assert session.session.token_usage() <= 8_000
    print("ok")


if __name__ == "__main__":
    asyncio.run(main())
