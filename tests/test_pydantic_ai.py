"""pydantic-ai agents with CompactHistory, offline.

Real ``Agent`` runs over pydantic-ai's own fake model (``FunctionModel``, which hands the
function every request it would send), with tools and images, on a small window.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pydantic_ai", reason="the 'pydantic-ai' extra is not installed")

from pydantic_ai import Agent, ModelMessagesTypeAdapter
from pydantic_ai.exceptions import ModelContextWindowExceededError
from pydantic_ai.messages import (
    BinaryContent,
    ImageUrl,
    ModelMessage,
    ModelRequest,
    ModelResponse,
    RetryPromptPart,
    SystemPromptPart,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from compactstore import CompactionConfig, CompactStore, ConflictError, InvalidInputError
from compactstore._context.tokens import estimate_tokens, message_tokens
from compactstore.formats import get_format
from compactstore.integrations.pydantic_ai import CompactHistory, to_anthropic
from tests.test_media import PIXEL_TOKENS, png

# Each test runs real agents (pydantic-ai's run setup alone takes about 0.2 s).
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
WINDOW = 10_000
IMAGE = png(1000, 800, noise=2000)
ANTHROPIC = get_format("anthropic")


def request_tokens(messages: list[ModelMessage]) -> int:
    """A request's size as the session format counts it (images by their pixels)."""
    return sum(
        message_tokens(ANTHROPIC, m, estimate_tokens) for msg in messages for m in to_anthropic(msg)
    )


def check_pairs(messages: list[ModelMessage]) -> None:
    """Every tool call is answered in the request right after its response, and every tool
    return answers a call of the response right before it."""
    open_calls: set[str] = set()
    for message in messages:
        if isinstance(message, ModelResponse):
            assert not open_calls, f"calls {open_calls} were not answered"
            open_calls = {p.tool_call_id for p in message.parts if isinstance(p, ToolCallPart)}
        else:
            answered = {
                p.tool_call_id
                for p in message.parts
                if isinstance(p, ToolReturnPart | RetryPromptPart) and p.tool_name
            }
            assert answered <= open_calls, f"returns {answered - open_calls} have no call"
            assert answered == open_calls, f"calls {open_calls - answered} lost their returns"
            open_calls = set()


class Reviewer:
    """A FunctionModel script: a tool call after each user prompt, then an answer; keeps
    every request it got."""

    def __init__(self) -> None:
        self.requests: list[list[ModelMessage]] = []

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.requests.append(list(messages))
        last = messages[-1]
        assert isinstance(last, ModelRequest)
        if isinstance(last.parts[-1], UserPromptPart):
            n = len(self.requests)
            return ModelResponse(
                parts=[
                    ThinkingPart("Which file next? " * 5, signature=f"sig-{n}"),
                    TextPart("Reading the next file. " * 12),
                    ToolCallPart("read", {"path": f"src/f{n}.py"}),
                ]
            )
        return ModelResponse(parts=[TextPart("Reviewed: " + "no issue found here. " * 20)])


def make_agent(history: CompactHistory, model: Reviewer) -> Agent[None, str]:
    agent = Agent(FunctionModel(model), system_prompt="You review code.", capabilities=[history])

    @agent.tool_plain
    def read(path: str) -> str:
        """Read a file."""
        return "\n".join(f"{path}:{i}: value = compute(value, {i})" for i in range(80))

    return agent


def prompt(turn: int) -> Any:
    if turn % 5 == 0:
        return [f"Turn {turn}: is this screen right?", BinaryContent(IMAGE, media_type="image/png")]
    return f"Turn {turn}: review the next file"


def test_fifty_turns_with_tools_and_images_stay_in_the_window(tmp_path: Path) -> None:
    store = CompactStore.open(tmp_path / "pai.db")
    history = CompactHistory(store, "pai", context_window=WINDOW)
    model = Reviewer()
    agent = make_agent(history, model)
    messages: list[ModelMessage] | None = None
    for turn in range(50):
        result = agent.run_sync(prompt(turn), message_history=messages)
        messages = result.all_messages()
    assert messages is not None and len(model.requests) == 100
    sizes = [request_tokens(sent) for sent in model.requests]
    assert max(sizes) <= WINDOW
    for sent in model.requests:
        check_pairs(sent)
    # Images are sent as pydantic-ai's own BinaryContent and counted by their pixels.
    first_sent = model.requests[0]
    image = first_sent[-1].parts[-1]
    assert isinstance(image, UserPromptPart) and isinstance(image.content[1], BinaryContent)
    assert image.content[1].data == IMAGE
    assert sizes[0] >= PIXEL_TOKENS
    later = model.requests[90]  # turn 45 asks about an image
    assert any(
        isinstance(p, UserPromptPart) and any(isinstance(c, BinaryContent) for c in p.content)
        for m in later
        for p in m.parts
    )
    session = history.session
    assert session is not None
    cuts = [c for c in session.compactions() if c.boundary is not None and c.success]
    assert len(cuts) >= 3
    # Everything stored once: the system prompt, and per turn the prompt, the call, its
    # return and the answer; the run's history stays as bounded as the context.
    log = session.messages()
    assert Counter(m["role"] for m in log) == {"system": 1, "user": 100, "assistant": 100}
    assert len(messages) < 30
    # The summary reaches the model as a user prompt, never as a system prompt.
    summary = session.context().summary
    assert summary is not None
    text = session.adapter.text(summary.message)
    sent_parts = [p for m in model.requests[-1] for p in m.parts]
    assert any(isinstance(p, UserPromptPart) and p.content == text for p in sent_parts)
    assert sum(isinstance(p, SystemPromptPart) for p in sent_parts) == 1


def test_messages_come_back_as_pydantic_ai_objects(tmp_path: Path) -> None:
    store = CompactStore.open(tmp_path / "rt.db")
    history = CompactHistory(store, "rt", context_window=WINDOW)
    model = Reviewer()
    agent = make_agent(history, model)
    result = agent.run_sync(
        [
            "Check both screens",
            BinaryContent(IMAGE, media_type="image/png"),
            ImageUrl("https://example.com/b.png"),
        ]
    )
    parts = [p for m in history.messages() for p in m.parts]
    sent = [p for m in result.all_messages() for p in m.parts]

    def part_dumps(messages: list[ModelMessage]) -> list[Any]:
        dumped = ModelMessagesTypeAdapter.dump_python(messages, mode="json")
        return [part for message in dumped for part in message["parts"]]

    # What pydantic-ai got back is exactly what it gave (its history merges the system
    # prompt's request with the next one; the parts are the same).
    assert part_dumps(history.messages()) == part_dumps(result.all_messages())
    assert len(parts) == len(sent)
    kinds = [type(p) for p in parts]
    assert kinds == [
        SystemPromptPart,
        UserPromptPart,
        ThinkingPart,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
        TextPart,
    ]
    thinking = parts[2]
    assert isinstance(thinking, ThinkingPart) and thinking.signature == "sig-1"
    user = parts[1]
    assert isinstance(user, UserPromptPart)
    assert isinstance(user.content[1], BinaryContent) and user.content[1].data == IMAGE
    assert isinstance(user.content[2], ImageUrl)
    # Stored in the anthropic format beside the originals: image blocks, tool_use/result.
    session = history.session
    assert session is not None and session.format == "anthropic"
    stored = session.messages()
    assert [m["role"] for m in stored] == ["system", "user", "assistant", "user", "assistant"]
    assert stored[1]["content"][1]["type"] == "image"
    assert stored[1]["content"][2] == {
        "type": "image",
        "source": {"type": "url", "url": "https://example.com/b.png"},
    }
    assert [b["type"] for b in stored[2]["content"]] == ["thinking", "text", "tool_use"]
    assert stored[3]["content"][0]["type"] == "tool_result"


def test_a_new_process_continues_the_stored_conversation(tmp_path: Path) -> None:
    db = tmp_path / "cont.db"
    with CompactStore.open(db) as store:
        first = make_agent(CompactHistory(store, "c", context_window=WINDOW), Reviewer())
        given = first.run_sync("Turn 0: review src/").all_messages()
    with CompactStore.open(db) as store:
        history = CompactHistory(store, "c", context_window=WINDOW)
        model = Reviewer()
        agent = make_agent(history, model)
        # Without message_history the run continues the stored conversation...
        agent.run_sync("Turn 1: and the tests")
        seen = [p for m in model.requests[0] for p in m.parts]
        assert [type(p) for p in seen][:2] == [SystemPromptPart, UserPromptPart]
        assert sum(isinstance(p, SystemPromptPart) for p in seen) == 1
        assert isinstance(seen[1], UserPromptPart) and "Turn 0: review src/" in str(seen[1].content)
        session = history.session
        assert session is not None
        count = session.message_count()
        assert count == 9  # system + 2 turns of prompt, call, return, answer
        # ...and a history given back (the first run's, or this one's) stores nothing twice.
        agent.run_sync("Turn 2: and the docs", message_history=given)
        assert session.message_count() == count + 4
        check_pairs(model.requests[-1])


def test_a_context_overflow_is_recovered_once_and_retried(tmp_path: Path) -> None:
    store = CompactStore.open(tmp_path / "ovf.db")
    history = CompactHistory(store, "ovf", context_window=WINDOW)
    script = Reviewer()
    failed: list[int] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if len(script.requests) == 7 and not failed:
            failed.append(len(messages))
            raise ModelContextWindowExceededError("fake", "prompt is too long: 210000 tokens")
        return script(messages, info)

    agent = Agent(FunctionModel(model), system_prompt="You review code.", capabilities=[history])

    @agent.tool_plain
    def read(path: str) -> str:
        """Read a file."""
        return f"{path}: " + "line of code " * 200

    messages: list[ModelMessage] | None = None
    for turn in range(5):
        messages = agent.run_sync(f"Turn {turn}", message_history=messages).all_messages()
    assert failed
    session = history.session
    assert session is not None
    recoveries = [c for c in session.compactions() if c.trigger == "reactive"]
    assert len(recoveries) == 1 and recoveries[0].success
    retried = script.requests[7]
    assert len(retried) < failed[0]  # the retry sent the recovered, smaller context
    check_pairs(retried)


def test_a_second_overflow_propagates(tmp_path: Path) -> None:
    history = CompactHistory(CompactStore.open(tmp_path / "o2.db"), "o2", context_window=WINDOW)

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        raise ModelContextWindowExceededError("fake", "prompt is too long")

    agent = Agent(FunctionModel(model), capabilities=[history])
    with pytest.raises(ModelContextWindowExceededError):
        agent.run_sync("hello")


def test_recall_tool_answers_from_the_log(tmp_path: Path) -> None:
    store = CompactStore.open(tmp_path / "recall.db")
    history = CompactHistory(store, "r", context_window=WINDOW, recall=True)
    tools: list[str] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        tools.extend(t.name for t in info.function_tools)
        last = messages[-1]
        if isinstance(last.parts[-1], UserPromptPart) and "recall" in str(last.parts[-1].content):
            return ModelResponse(parts=[ToolCallPart("recall", {"query": "aubergine"})])
        return ModelResponse(parts=[TextPart("Noted.")])

    agent = Agent(FunctionModel(model), system_prompt="sys", capabilities=[history])
    first = agent.run_sync("The secret word is aubergine.")
    session = history.session
    assert session is not None and session.config.recall_enabled
    session.compact()  # the secret leaves the context for the summary
    result = agent.run_sync("Please recall the secret word", message_history=first.all_messages())
    assert "recall" in tools
    returns = [p for m in result.all_messages() for p in m.parts if isinstance(p, ToolReturnPart)]
    assert "aubergine" in str(returns[0].content)


def test_the_window_comes_from_the_model_when_not_given(tmp_path: Path) -> None:
    store = CompactStore.open(tmp_path / "win.db")
    history = CompactHistory(store, "w", config=CompactionConfig())
    model = FunctionModel(Reviewer(), profile={"context_window": 32_000})
    Agent(model, capabilities=[history]).run_sync("hi")
    session = history.session
    assert session is not None and session.context_window == 32_000


def test_bad_arguments_are_refused_clearly(tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="CompactStore or a database path"):
        CompactHistory(object(), "s")  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="session id"):
        CompactHistory(tmp_path / "x.db", "")
    with CompactStore.open(tmp_path / "fmt.db") as store:
        store.session("openai-one", format="openai", context_window=WINDOW)
        history = CompactHistory(store, "openai-one")
        with pytest.raises(ConflictError, match="format 'openai'"):
            Agent(FunctionModel(Reviewer()), capabilities=[history]).run_sync("hi")


def test_the_example_runs_offline(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(REPO / "examples" / "pydantic_ai_agent.py"), str(tmp_path / "ex.db")],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
        timeout=120,
    )
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["compactions"] >= 1
    assert report["max_request_tokens"] <= report["context_window"]
    assert report["stored_messages"] > report["history_messages"]
