"""A LangChain v1 agent whose conversation lives in compactstore, offline.

    python examples/langchain_agent.py [DB]

The chat model is langchain_core's GenericFakeChatModel, scripted to read 60 files one tool
call at a time, so the example runs without a network or a key; swap in any chat model
(``ChatAnthropic(model=...)``, ``ChatOpenAI(model=...)``) for a real agent: without
``context_window=`` the window is then the model's profile (``profile["max_input_tokens"]``).
The glue is the two lines marked ``# glue``. It prints one JSON line: how many compactions
ran, how many messages the store holds, how many the graph state kept, and the largest
request the model got.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.tools import tool

from compactstore.integrations.langchain import CompactStoreMiddleware  # glue

CONTEXT_WINDOW = 16_000
FILES = 60


class FakeModel(GenericFakeChatModel):
    """Answers from a script; remembers the size of the largest request (in characters)."""

    largest: int = 0

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self  # the script already knows its one tool

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> Any:
        self.largest = max(self.largest, sum(len(m.text) for m in messages))
        return super()._generate(messages, *args, **kwargs)


@tool
def read_file(path: str) -> str:
    """Read a file of the project."""
    return "\n".join(
        f"{path}:{n}: def handler_{n}(request): return respond(request)" for n in range(40)
    )


def script() -> list[AIMessage]:
    reads = [
        AIMessage(
            content=f"Reading app/module_{i}.py to see how it handles errors.",
            tool_calls=[
                {"name": "read_file", "args": {"path": f"app/module_{i}.py"}, "id": f"call_{i}"}
            ],
        )
        for i in range(FILES)
    ]
    return [*reads, AIMessage(content=f"Read all {FILES} modules; none swallows errors.")]


def main(db: str) -> dict[str, Any]:
    model = FakeModel(messages=iter(script()))
    agent = create_agent(
        model,
        [read_file],
        system_prompt="You review error handling.",
        middleware=[CompactStoreMiddleware(db, "review-1", context_window=CONTEXT_WINDOW)],  # glue
    )
    result = agent.invoke(
        {"messages": [HumanMessage("Check how every module under app/ handles errors")]},
        {"recursion_limit": 10 * FILES},
    )
    from compactstore import CompactStore

    with CompactStore.open(db) as store:
        session = store.get_session("review-1")
        return {
            "compactions": sum(1 for c in session.compactions() if c.boundary is not None),
            "stored_messages": session.message_count(),
            "state_messages": len(result["messages"]),
            "max_request_tokens": model.largest // 4,
            "context_window": CONTEXT_WINDOW,
            "answer": result["messages"][-1].text,
        }


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        target = sys.argv[1] if len(sys.argv) > 1 else str(Path(tmp) / "langchain_agent.db")
        print(json.dumps(main(target)))
