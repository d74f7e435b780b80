"""LangChain v1 agents with CompactStoreMiddleware, offline.

Real ``create_agent`` graphs: a scripted fake chat model (langchain_core's
GenericFakeChatModel, which records what it was sent) over many turns with a small window,
and ChatAnthropic over the official client on a mocked HTTP transport for the round trip of a
message with a signed thinking block.
"""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langchain.agents", reason="the 'langchain' extra is not installed")

from langchain.agents import create_agent
from langchain_core.exceptions import ContextOverflowError
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    convert_to_openai_messages,
)
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from pydantic import Field

from compactstore import CompactionConfig, CompactStore, InvalidInputError
from compactstore._context.media import media_tokens
from compactstore._context.tokens import estimate_tokens
from compactstore.formats.sdk_types import sdk_problems
from compactstore.integrations.langchain import (
    CompactStoreMiddleware,
    format_for_model,
)
from tests.mock_http import anthropic_message, http_module, sdk_client
from tests.test_media import png

REPO = Path(__file__).resolve().parents[1]
TURNS = 40
WINDOW = 12_000


class ScriptedModel(GenericFakeChatModel):
    """A fake chat model that answers from a script and keeps every request it got."""

    seen: list[list[BaseMessage]] = Field(default_factory=list)

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> Any:
        self.seen.append(list(messages))
        return super()._generate(messages, *args, **kwargs)


@tool
def read_file(path: str) -> str:
    """Read a file of the repository."""
    return f"# {path}\n" + "\n".join(f"line {i} of {path}: some code here" for i in range(60))


def script(turns: int, tag: str = "") -> list[AIMessage]:
    """``turns`` tool calls with some talk, then a final answer."""
    steps = [
        AIMessage(
            content=f"Step {i}{tag}: reading the next module. " + "I will check it. " * 20,
            tool_calls=[
                {"name": "read_file", "args": {"path": f"src/m{i}.py"}, "id": f"c{tag}{i}"}
            ],
        )
        for i in range(turns)
    ]
    return [*steps, AIMessage(content=f"All {turns} modules read{tag}.")]


def check_pairs(messages: list[BaseMessage]) -> None:
    """Every tool call is answered right after its assistant message, every result has its
    call, and the summary is a human message (no system message inside the conversation)."""
    calls: set[str] = set()
    answered: set[str] = set()
    if messages and isinstance(messages[0], SystemMessage):
        assert messages[0].text == "You refactor."  # the agent's own system prompt, first
        messages = messages[1:]
    for message in messages:
        assert not isinstance(message, SystemMessage)
        if isinstance(message, AIMessage):
            assert calls == answered, "a call was not answered before the next model turn"
            calls |= {call["id"] for call in message.tool_calls if call["id"]}
        elif isinstance(message, ToolMessage):
            assert message.tool_call_id in calls and message.tool_call_id not in answered
            answered.add(message.tool_call_id)
    assert calls == answered


def run_agent(db: Path, turns: int = TURNS) -> tuple[dict[str, Any], ScriptedModel, CompactStore]:
    store = CompactStore.open(db)
    model = ScriptedModel(messages=iter(script(turns)))
    middleware = CompactStoreMiddleware(store, "lc", context_window=WINDOW)
    agent = create_agent(model, [read_file], system_prompt="You refactor.", middleware=[middleware])
    result = agent.invoke(
        {"messages": [HumanMessage("Refactor every module under src/")]},
        {"recursion_limit": 10 * turns},
    )
    return result, model, store


@pytest.mark.slow
def test_a_long_agent_run_compacts_and_keeps_state_and_requests_bounded(tmp_path: Path) -> None:
    result, model, store = run_agent(tmp_path / "lc.db")
    with store:
        sess = store.get_session("lc")
        assert sess.format == "openai"  # the fake model is no ChatAnthropic
        cuts = [c for c in sess.compactions() if c.boundary is not None and c.success]
        assert cuts, "the run compacted"
        # One stored message per LangChain message: the request, 40 calls, 40 results, answer.
        assert sess.message_count() == 2 + 2 * TURNS
        assert len(model.seen) == TURNS + 1
        for sent in model.seen:
            check_pairs(sent)
            assert sum(estimate_tokens(m.text) for m in sent) * 1.6 < WINDOW
        later = model.seen[-1][1:]  # after the system prompt
        assert later[0].text == "Refactor every module under src/"  # the pinned request
        summary = later[1]
        assert isinstance(summary, HumanMessage) and summary.id is not None
        assert summary.id.startswith("compactstore-summary")
        assert "Refactor every module under src/" in summary.text
        # The state the graph keeps is the compacted context, not the whole run.
        final = result["messages"]
        assert len(final) < 2 + 2 * TURNS
        assert final[-1].text == f"All {TURNS} modules read."
        assert len(final) <= len(later) + 1
        check_pairs(final)


@pytest.mark.slow
def test_a_resumed_thread_stores_each_message_once(tmp_path: Path) -> None:
    with CompactStore.open(tmp_path / "lc.db") as store:
        model = ScriptedModel(messages=iter([*script(3), *script(2, tag="b")]))
        middleware = CompactStoreMiddleware(store, "lc", context_window=WINDOW)
        agent = create_agent(
            model, [read_file], middleware=[middleware], checkpointer=InMemorySaver()
        )
        thread: RunnableConfig = {"configurable": {"thread_id": "t1"}}
        agent.invoke({"messages": [HumanMessage("Read three modules")]}, thread)
        sess = store.get_session("lc")
        assert sess.message_count() == 2 + 2 * 3
        result = agent.invoke({"messages": [HumanMessage("Now two more")]}, thread)
        assert sess.message_count() == 2 + 2 * 3 + 2 + 2 * 2
        # A second middleware on the same session (a new process) sees the same context.
        again = CompactStoreMiddleware(store, "lc")
        assert [m.id for m in again.messages()] == [m.id for m in result["messages"]]
        assert again.messages() == result["messages"]
        stored_texts = [m.get("content") for m in sess.messages()]
        assert stored_texts.count("Now two more") == 1


def test_a_persisted_tool_result_keeps_its_id_and_shows_the_preview(tmp_path: Path) -> None:
    @tool
    def dump(name: str) -> str:
        """Dump a big log."""
        return "\n".join(f"{name} line {i}: " + "x" * 60 for i in range(120))

    calls = [
        AIMessage(content="", tool_calls=[{"name": "dump", "args": {"name": "ci"}, "id": "d1"}]),
        AIMessage(content="That log is long."),
    ]
    with CompactStore.open(tmp_path / "lc.db") as store:
        model = ScriptedModel(messages=iter(calls))
        middleware = CompactStoreMiddleware(store, "big", context_window=200_000)
        agent = create_agent(model, [dump], middleware=[middleware])
        result = agent.invoke({"messages": [HumanMessage("Show the CI log")]})
        original = next(m for m in result["messages"] if isinstance(m, ToolMessage))
        [sent] = [m for m in model.seen[1] if isinstance(m, ToolMessage)]
        assert sent.id == original.id and sent.tool_call_id == "d1"
        assert sent.text.startswith("[Tool result persisted: ")
        assert len(sent.text) <= 500 < len(store.get_session("big").get_blob(1))
        assert store.get_session("big").get_blob(1) == dump.invoke({"name": "ci"})


@pytest.mark.slow
def test_the_async_hooks_run_the_same_way(tmp_path: Path) -> None:
    with CompactStore.open(tmp_path / "lc.db") as store:
        model = ScriptedModel(messages=iter(script(TURNS)))
        middleware = CompactStoreMiddleware(store, "async", context_window=WINDOW)
        agent = create_agent(model, [read_file], middleware=[middleware])
        result = asyncio.run(
            agent.ainvoke(
                {"messages": [HumanMessage("Refactor every module under src/")]},
                {"recursion_limit": 10 * TURNS},
            )
        )
        sess = store.get_session("async")
        assert sess.message_count() == 2 + 2 * TURNS
        assert any(c.boundary is not None for c in sess.compactions())
        assert len(result["messages"]) < 2 + 2 * TURNS
        for sent in model.seen:
            check_pairs(sent)


def test_only_formats_with_one_stored_message_per_langchain_message(tmp_path: Path) -> None:
    with CompactStore.open(tmp_path / "lc.db") as store:
        with pytest.raises(InvalidInputError, match="'anthropic' or 'openai'"):
            CompactStoreMiddleware(store, "r", format="responses")
        with pytest.raises(InvalidInputError, match="CompactStore or a database path"):
            CompactStoreMiddleware(42, "r")  # type: ignore[arg-type]


def test_format_follows_the_model() -> None:
    from langchain_anthropic import ChatAnthropic

    assert format_for_model(ChatAnthropic(model="claude-sonnet-4-5", api_key="x")) == "anthropic"
    assert format_for_model(ScriptedModel(messages=iter([]))) == "openai"


# -- ChatAnthropic over the official client on a mocked transport ----------------------------

SIGNATURE = "ErUBCkYIBxgCIkB2Zm9yY2VkIHNpZ25hdHVyZSBmb3IgdGVzdGluZyBvbmx5" + "A" * 80


@pytest.mark.slow
def test_chat_anthropic_thinking_survives_the_round_trip(tmp_path: Path) -> None:
    anthropic = pytest.importorskip("anthropic", reason="the 'anthropic' extra is not installed")
    langchain_anthropic = pytest.importorskip(
        "langchain_anthropic", reason="langchain-anthropic is not installed"
    )
    replies = iter(
        [
            anthropic_message(
                [
                    {"type": "thinking", "thinking": "Add them.", "signature": SIGNATURE},
                    {"type": "text", "text": "Adding."},
                    {
                        "type": "tool_use",
                        "id": "toolu_01",
                        "name": "add",
                        "input": {"a": 2, "b": 3},
                    },
                ],
                input_tokens=900,
                stop_reason="tool_use",
            ),
            anthropic_message([{"type": "text", "text": "2 + 3 = 5"}], input_tokens=950),
        ]
    )
    client, seen = sdk_client(anthropic, lambda body: next(replies))
    model = langchain_anthropic.ChatAnthropic(
        model="claude-sonnet-4-5", api_key="x", max_tokens=1_024
    )
    model.__dict__["_client"] = client  # the SDK client ChatAnthropic builds, over the mock

    @tool
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    db = tmp_path / "lc.db"
    with CompactStore.open(db) as store:
        middleware = CompactStoreMiddleware(store, "claude", context_window=20_000)
        agent = create_agent(model, [add], middleware=[middleware])
        result = agent.invoke({"messages": [HumanMessage("What is 2 + 3?")]})

        thinking = result["messages"][1]
        assert isinstance(thinking, AIMessage) and isinstance(thinking.content, list)
        first = thinking.content[0]
        assert isinstance(first, dict) and first["signature"] == SIGNATURE
        sess = store.get_session("claude")
        assert sess.format == "anthropic"
        assert sess.compactions() == [] or all(c.boundary is None for c in sess.compactions())
        # The second request carried the signed thinking block exactly as Claude sent it.
        second = seen.bodies[1]["messages"][1]
        assert second["content"][0] == {
            "type": "thinking",
            "thinking": "Add them.",
            "signature": SIGNATURE,
        }
        # The stored session-format message is valid anthropic and keeps the block too.
        stored = sess.messages()[1]
        assert stored["content"][0]["signature"] == SIGNATURE
        # Usage came from the reply: the real count (900) was recorded.
        assert sess.token_usage() > 0

    # A new process reads the LangChain message back equal, metadata and id included.
    with CompactStore.open(db) as store:
        back = CompactStoreMiddleware(store, "claude").messages()
        assert back[1] == thinking
        assert back == result["messages"]

    # Once its thinking is left out (here: not the newest turn, without preserved
    # thinking), the model gets it without, as the wire view sends it; the
    # stored original keeps the block.
    with CompactStore.open(db) as store:
        sess = store.session("claude", config=CompactionConfig(preserved_thinking=False))
        sess.append({"role": "user", "content": "And 3 + 4?"})
        sess.append({"role": "assistant", "content": [{"type": "text", "text": "7"}]})
        ai = next(
            m for m in CompactStoreMiddleware(store, "claude").messages() if m.id == thinking.id
        )
        assert isinstance(ai, AIMessage) and ai.content == thinking.content[1:]
        assert ai.tool_calls == thinking.tool_calls
        assert sess.messages()[1]["content"][0]["signature"] == SIGNATURE
        sent = sess.request_params()["messages"][1]["content"]
        assert [block["type"] for block in sent] == ["text", "tool_use"]


@pytest.mark.slow
def test_recall_tool_is_registered_when_recall_is_on(tmp_path: Path) -> None:
    with CompactStore.open(tmp_path / "lc.db") as store:
        plain = CompactStoreMiddleware(store, "a")
        assert plain.tools == []
        config = CompactionConfig(recall_enabled=True)
        recalling = CompactStoreMiddleware(store, "b", config=config)
        [recall] = recalling.tools
        assert recall.name == "recall" and "from_seq" in recall.args
        # The model calls recall; the agent's tool node runs it against the session.
        asks = AIMessage(
            content="Let me look back.",
            tool_calls=[{"name": "recall", "args": {"query": "module"}, "id": "r1"}],
        )
        model = ScriptedModel(messages=iter([*script(2)[:-1], asks, AIMessage(content="ok")]))
        agent = create_agent(model, [read_file], middleware=[recalling])
        result = agent.invoke({"messages": [HumanMessage("Read two modules")]})
        answer = next(m for m in result["messages"] if getattr(m, "tool_call_id", "") == "r1")
        assert answer.text.startswith("No match")  # nothing is out of the context yet
        sess = store.get_session("b")
        assert sess.config.recall_enabled
        sess.compact()
        assert "Step 0: reading the next module" in recall.invoke({"from_seq": 1, "to_seq": 1})
        summary = sess.context().summary
        assert summary is not None and "## Recall" in summary.message["content"]


@pytest.mark.slow
def test_the_example_runs_offline(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(REPO / "examples" / "langchain_agent.py"), str(tmp_path / "ex.db")],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
        timeout=120,
    )
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["compactions"] >= 1
    assert report["state_messages"] < report["stored_messages"]
    assert report["max_request_tokens"] < report["context_window"]


# -- standard content blocks, media, the window from the profile, recovery ----------------

SCREENSHOT_B64 = base64.b64encode(png(1000, 800)).decode()
PIXEL_TOKENS = -(-1000 * 800 // 750)  # how a 1000x800 image counts: 1,067 tokens


def screenshot_message(text: str) -> HumanMessage:
    """A user message with LangChain's v1 standard image block."""
    return HumanMessage(
        content=[
            {"type": "text", "text": text},
            {"type": "image", "base64": SCREENSHOT_B64, "mime_type": "image/png"},
        ]
    )


def chat_anthropic(replies: Any) -> tuple[Any, Any]:
    anthropic = pytest.importorskip("anthropic", reason="the 'anthropic' extra is not installed")
    langchain_anthropic = pytest.importorskip(
        "langchain_anthropic", reason="langchain-anthropic is not installed"
    )
    client, seen = sdk_client(anthropic, lambda body: next(replies))
    model = langchain_anthropic.ChatAnthropic(
        model="claude-sonnet-4-5", api_key="x", max_tokens=1_024
    )
    model.__dict__["_client"] = client  # the SDK client ChatAnthropic builds, over the mock
    return model, seen


def test_standard_image_blocks_work_with_chat_anthropic_and_count_by_pixels(
    tmp_path: Path,
) -> None:
    replies = iter([anthropic_message([{"type": "text", "text": "A login form."}])])
    model, seen = chat_anthropic(replies)
    with CompactStore.open(tmp_path / "lc.db") as store:
        middleware = CompactStoreMiddleware(store, "img")  # no window: the model's profile
        agent = create_agent(model, [], middleware=[middleware])
        result = agent.invoke({"messages": [screenshot_message("What is on this screenshot?")]})
        assert result["messages"][-1].text == "A login form."
        sess = store.get_session("img")
        assert sess.context_window == model.profile["max_input_tokens"] == 200_000
        stored = sess.messages()[0]
        assert stored["content"][1]["source"]["data"] == SCREENSHOT_B64
        assert media_tokens(stored) == PIXEL_TOKENS
        assert sess.context().usage >= PIXEL_TOKENS
    sent = seen.bodies[0]["messages"][0]["content"]
    assert sent[1]["type"] == "image" and sent[1]["source"]["data"] == SCREENSHOT_B64


def test_a_context_overflow_from_chat_anthropic_is_recovered_once(tmp_path: Path) -> None:
    """Anthropic's 400 "prompt is too long" (LangChain's ContextOverflowError) runs
    reactive_recover and the call again, recorded like any recovery."""
    too_long = {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "prompt is too long: 210011 tokens > 200000 maximum",
        },
    }
    answers = iter([False, True])

    def respond(body: dict[str, Any]) -> dict[str, Any]:
        if not next(answers):
            raise Overflow(too_long)
        size = estimate_tokens(json.dumps(body["messages"]))
        return anthropic_message([{"type": "text", "text": "Done."}], input_tokens=size)

    anthropic = pytest.importorskip("anthropic", reason="the 'anthropic' extra is not installed")
    langchain_anthropic = pytest.importorskip(
        "langchain_anthropic", reason="langchain-anthropic is not installed"
    )
    http = http_module(anthropic)

    def handler(request: Any) -> Any:
        body = json.loads(request.content.decode())
        bodies.append(body)
        try:
            return http.Response(200, json=respond(body))
        except Overflow as error:
            return http.Response(400, json=error.args[0])

    bodies: list[dict[str, Any]] = []
    client = anthropic.Anthropic(
        api_key="x", max_retries=0, http_client=http.Client(transport=http.MockTransport(handler))
    )
    model = langchain_anthropic.ChatAnthropic(
        model="claude-sonnet-4-5", api_key="x", max_tokens=1_024
    )
    model.__dict__["_client"] = client
    with CompactStore.open(tmp_path / "lc.db") as store:
        sess = store.session("over", context_window=20_000, format="anthropic")
        for i in range(12):
            sess.append({"role": "user", "content": f"step {i}: " + "words " * 400})
            sess.append({"role": "assistant", "content": f"done {i}"})
        middleware = CompactStoreMiddleware(store, "over")
        agent = create_agent(model, [], middleware=[middleware])
        result = agent.invoke({"messages": [HumanMessage("Finish.")]})
        assert result["messages"][-1].text == "Done."
        reactive = [c for c in sess.compactions() if c.trigger == "reactive"]
        assert len(reactive) == 1 and reactive[0].success
    assert len(bodies) == 2
    assert len(json.dumps(bodies[1])) < len(json.dumps(bodies[0]))


class Overflow(Exception):
    """The mocked API's 400 answer."""


class OverflowingModel(ScriptedModel):
    """A scripted model that answers call ``overflow_at`` (1-based) with LangChain's
    ContextOverflowError, and counts each request as compactstore does (images by pixels)."""

    overflow_at: int | None = None
    calls: int = 0
    sizes: list[tuple[int, int]] = Field(default_factory=list)

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        if self.calls == self.overflow_at:
            raise ContextOverflowError("This model's maximum context length is 10000 tokens")
        wire = convert_to_openai_messages(messages)
        text = json.dumps(wire)
        images = text.count(SCREENSHOT_B64)
        self.sizes.append(
            (estimate_tokens(text.replace(SCREENSHOT_B64, "")) + images * PIXEL_TOKENS, images)
        )
        return super()._generate(messages, *args, **kwargs)


@pytest.mark.slow
def test_fifty_turns_with_tools_images_and_one_overflow(tmp_path: Path) -> None:
    window = 10_000
    turns = 50
    steps: list[AIMessage] = []
    for turn in range(turns):
        steps += script(2, tag=f"t{turn}")
    model = OverflowingModel(messages=iter(steps), overflow_at=60)
    config = CompactionConfig(max_media_in_context=2)
    with CompactStore.open(tmp_path / "lc.db") as store:
        middleware = CompactStoreMiddleware(store, "fifty", context_window=window, config=config)
        agent = create_agent(
            model, [read_file], system_prompt="You refactor.", middleware=[middleware]
        )
        state: dict[str, Any] = {"messages": []}
        for turn in range(turns):
            text = f"turn {turn}: refactor the next two modules"
            message = screenshot_message(text) if turn % 5 == 0 else HumanMessage(text)
            state = agent.invoke({"messages": [*state["messages"], message]})
            assert state["messages"][-1].text.startswith("All 2 modules read")
        sess = store.get_session("fifty")
        reactive = [c for c in sess.compactions() if c.trigger == "reactive"]
        assert len(reactive) == 1 and reactive[0].success
        assert max(tokens for tokens, _ in model.sizes) <= window
        assert sum(images for _, images in model.sizes) >= 10  # images were sent...
        assert max(images for _, images in model.sizes) <= 2  # ...at most two at a time
        for sent in model.seen:
            check_pairs(sent)
        assert sdk_problems("openai", sess.request_params()["messages"]) == []
        assert sdk_problems("openai", sess.messages()) == []
    assert len(model.sizes) == turns * 3


@pytest.mark.slow
def test_the_async_hooks_recover_from_an_overflow_too(tmp_path: Path) -> None:
    model = OverflowingModel(messages=iter(script(2)), overflow_at=2)
    with CompactStore.open(tmp_path / "lc.db") as store:
        middleware = CompactStoreMiddleware(store, "async-over", context_window=WINDOW)
        agent = create_agent(model, [read_file], middleware=[middleware])
        result = asyncio.run(agent.ainvoke({"messages": [HumanMessage("Refactor src/")]}))
        assert result["messages"][-1].text == "All 2 modules read."
        sess = store.get_session("async-over")
        assert [str(c.trigger) for c in sess.compactions()].count("reactive") == 1
    assert model.calls == 4  # three answers and the one overflow


@pytest.mark.slow
def test_an_error_that_is_no_overflow_is_not_retried(tmp_path: Path) -> None:
    class Failing(ScriptedModel):
        calls: int = 0

        def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            raise ValueError("the context window is fine; this is another bug")

    model = Failing(messages=iter(script(1)))
    with CompactStore.open(tmp_path / "lc.db") as store:
        middleware = CompactStoreMiddleware(store, "other", context_window=WINDOW)
        agent = create_agent(model, [read_file], middleware=[middleware])
        with pytest.raises(ValueError, match="another bug"):
            agent.invoke({"messages": [HumanMessage("Refactor src/")]})
        assert store.get_session("other").compactions() == []
    assert model.calls == 1
