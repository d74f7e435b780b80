"""The OpenAI Agents SDK with CompactSession, offline.

``Runner.run`` of the real SDK with a fake model implementing the SDK's own ``Model`` interface:
it answers from a script (tool calls, then a final text), keeps every input it was given and
reports an input-token count computed from that input.
"""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import sys
import tomllib
import warnings
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

pytest.importorskip("agents", reason="the 'openai-agents' extra is not installed")

from agents import Agent, RunHooks, Runner, function_tool, set_tracing_disabled
from agents.items import ModelResponse, TResponseInputItem, TResponseStreamEvent
from agents.models.interface import Model
from agents.usage import Usage
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage
from openai.types.responses.response_output_text import ResponseOutputText

from compactstore import CompactionConfig, CompactStore, CompactStoreWarning, InvalidInputError
from compactstore._context.media import media_tokens
from compactstore._context.tokens import estimate_tokens
from compactstore.formats.responses import CALLS, OUTPUTS, item_type
from compactstore.formats.sdk_types import sdk_problems
from compactstore.integrations.openai_agents import (
    CompactSession,
    is_context_overflow,
    wire_item,
)
from tests.test_media import png

REPO = Path(__file__).resolve().parents[1]
TURNS, CALLS_PER_TURN = 8, 5
WINDOW = 8_000
BIG = "lorem ipsum dolor sit amet " * 160  # ~1k tokens of tool output


class FakeModel(Model):
    """Answers each user turn with ``calls`` tool calls, then a text; records its inputs."""

    def __init__(self, calls: int = 3, overflow_at: int | None = None) -> None:
        self.calls = calls
        self.inputs: list[list[dict[str, Any]]] = []
        self.counter = 0
        # The model call (1-based) answered with the provider's "over the window" error.
        self.overflow_at = overflow_at
        self.overflowed = 0

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        *args: Any,
        **kwargs: Any,
    ) -> ModelResponse:
        items = [{"role": "user", "content": input}] if isinstance(input, str) else input
        if self.overflow_at is not None and self.counter + 1 == self.overflow_at:
            self.overflow_at = None
            self.overflowed += 1
            raise overflow_error()
        self.inputs.append([dict(item) for item in items])
        self.counter += 1
        n = self.counter
        since_user = 0
        for item in reversed(items):
            if isinstance(item, dict) and item.get("role") == "user":
                break
            if isinstance(item, dict) and item.get("type") == "function_call":
                since_user += 1
        tokens = estimate_tokens(json.dumps(items))
        usage = Usage(requests=1, input_tokens=tokens, output_tokens=10, total_tokens=tokens + 10)
        output: list[Any]
        if since_user < self.calls:
            output = [
                ResponseFunctionToolCall(
                    type="function_call",
                    id=f"fc_{n}",
                    call_id=f"call_{n}",
                    name="read_file",
                    arguments=json.dumps({"path": f"src/file_{n}.py"}),
                    status="completed",
                )
            ]
        else:
            output = [
                ResponseOutputMessage(
                    type="message",
                    id=f"msg_{n}",
                    role="assistant",
                    status="completed",
                    content=[
                        ResponseOutputText(
                            type="output_text", text=f"done with turn {n}", annotations=[]
                        )
                    ],
                )
            ]
        return ModelResponse(output=output, usage=usage, response_id=f"resp_{n}")

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[TResponseStreamEvent]:
        raise NotImplementedError("the tests do not stream")


set_tracing_disabled(True)


def answer(status: int, request: httpx.Request) -> Any:
    """An HTTP response, as the SDKs' errors carry one."""
    return httpx.Response(status, request=request)


def overflow_error() -> openai.BadRequestError:
    """What the Responses API answers to a prompt over the model's window."""
    request = httpx.Request("POST", "https://api.openai.com/v1/responses")
    body = {
        "message": "Your input exceeds the context window of this model.",
        "type": "invalid_request_error",
        "code": "context_length_exceeded",
    }
    return openai.BadRequestError(
        "Error code: 400 - " + json.dumps({"error": body}),
        response=answer(400, request),
        body=body,
    )


@function_tool
def read_file(path: str) -> str:
    """Read a file."""
    return f"contents of {path}\n{BIG}"


def make_agent(model: FakeModel, session: CompactSession | None = None) -> Agent[Any]:
    tools: list[Any] = [read_file]
    if session is not None:
        tools.append(session.recall_tool())
    return Agent(name="coder", instructions="You write code.", model=model, tools=tools)


async def run_turns(
    session: CompactSession, model: FakeModel, turns: int, start: int = 0
) -> list[Any]:
    agent = make_agent(model)
    results = []
    for turn in range(start, start + turns):
        result = await Runner.run(
            agent,
            f"task step {turn}: change file {turn}",
            session=session,
            run_config=session.run_config(),
            hooks=session.hooks(),
        )
        results.append(result)
    return results


def paired(items: list[dict[str, Any]]) -> bool:
    calls = {item[CALLS[item_type(item)][0]] for item in items if item_type(item) in CALLS}
    outputs = {item[OUTPUTS[item_type(item)][0]] for item in items if item_type(item) in OUTPUTS}
    return calls == outputs


@pytest.fixture
def store(tmp_path: Path) -> CompactStore:
    return CompactStore.open(str(tmp_path / "agents.db"))


@pytest.mark.slow
def test_compaction_inside_runs_keeps_input_in_window(store: CompactStore) -> None:
    session = CompactSession("agents-1", store, context_window=WINDOW)
    model = FakeModel(calls=CALLS_PER_TURN)
    results = asyncio.run(run_turns(session, model, TURNS))
    assert results[-1].final_output == f"done with turn {model.counter}"
    cuts = [c for c in session.session.compactions() if c.success and c.boundary is not None]
    assert cuts, "no cut happened"
    # The cut happened inside a run: a model call whose input ends with a tool output (mid-run)
    # got the summary, while the call before it in the same run did not.
    with_summary = [
        i for i, sent in enumerate(model.inputs) if "summary" in json.dumps(sent[:3]).lower()
    ]
    assert with_summary
    first = with_summary[0]
    assert model.inputs[first][-1]["type"] == "function_call_output"
    assert model.counter == TURNS * (CALLS_PER_TURN + 1)
    for sent in model.inputs:
        assert estimate_tokens(json.dumps(sent)) <= WINDOW
        assert paired(sent), sent
        assert sdk_problems("responses", sent) == []
    # Every item is stored once: the user messages, the calls and outputs, the answers.
    log = session.session.messages()
    assert len(log) == TURNS * (1 + 2 * CALLS_PER_TURN + 1)
    assert len({json.dumps(m, sort_keys=True) for m in log}) == len(log)
    assert session.session.context().usage <= WINDOW


def test_sdk_keys_are_stored_not_sent(store: CompactStore) -> None:
    session = CompactSession("agents-keys", store, context_window=WINDOW)
    item = {
        "type": "function_call",
        "call_id": "c1",
        "name": "read_file",
        "arguments": "{}",
        "provider_data": {"model": "x"},
    }
    shell_call = {
        "type": "local_shell_call",
        "id": "ls1",
        "call_id": "sh1",
        "status": "completed",
        "action": {"type": "exec", "command": ["ls"], "env": {}},
    }
    shell_out = {"type": "local_shell_call_output", "id": "sh1", "call_id": "sh1", "output": "a"}
    output = {"type": "function_call_output", "call_id": "c1", "output": "ok"}
    asyncio.run(session.add_items([item, output, shell_call, shell_out]))  # type: ignore[list-item]
    assert session.session.messages() == [item, output, shell_call, shell_out]
    sent = [wire_item(m) for m in session.session.active_context()]
    assert sdk_problems("responses", sent) == []
    assert "provider_data" not in sent[0]


@pytest.mark.slow
def test_restart_continues(tmp_path: Path) -> None:
    path = str(tmp_path / "restart.db")
    first = CompactStore.open(path)
    session = CompactSession("agents-r", first, context_window=WINDOW)
    asyncio.run(run_turns(session, FakeModel(calls=1), 2))
    before = session.session.messages()
    first.close()
    second = CompactStore.open(path)
    again = CompactSession("agents-r", second, context_window=WINDOW)
    model = FakeModel(calls=1)
    model.counter = 100
    asyncio.run(run_turns(again, model, 1, start=2))
    log = again.session.messages()
    assert log[: len(before)] == before
    assert len(log) == len(before) + 4
    # The new run's first model call got the stored history, then the new user message.
    assert model.inputs[0][-1] == {"role": "user", "content": "task step 2: change file 2"}
    assert model.inputs[0][0] == {"role": "user", "content": "task step 0: change file 0"}
    second.close()


@pytest.mark.slow
def test_clear_pop_and_rollback(store: CompactStore) -> None:
    session = CompactSession("agents-edit", store, context_window=WINDOW)
    asyncio.run(run_turns(session, FakeModel(calls=1), 2))
    items = asyncio.run(session.get_items())
    assert len(items) == 8
    log_before = session.session.messages()
    # pop: exactly the newest item, as stored (verbatim, not the preview the context held).
    popped = asyncio.run(session.pop_item())
    assert popped == items[-1] == log_before[-1]
    assert asyncio.run(session.get_items()) == items[:-1]
    again = asyncio.run(session.pop_item())
    assert again == log_before[-2]
    pops = [c for c in session.session.compactions() if c.strategy == "pop"]
    assert [c.trigger for c in pops] == ["manual", "manual"]
    # clear keeps nothing: no pinned first message, no summary.
    asyncio.run(session.clear_session())
    assert asyncio.run(session.get_items()) == []
    clear = session.session.compactions()[-1]
    assert (clear.strategy, clear.trigger) == ("clear", "manual")
    assert session.session.messages() == log_before  # the log keeps everything
    # The next run starts from nothing but its own input.
    model = FakeModel(calls=0)
    model.counter = 50
    asyncio.run(run_turns(session, model, 1, start=7))
    assert model.inputs[0] == [{"role": "user", "content": "task step 7: change file 7"}]
    # Rolling back the second pop undoes it and the clear after it.
    session.rollback(pops[1].id)
    restored = asyncio.run(session.get_items())
    assert restored[:7] == items[:-1]
    assert restored[7]["content"] == "task step 7: change file 7"
    session.rollback(pops[0].id)
    assert asyncio.run(session.get_items())[:8] == items
    assert (
        asyncio.run(CompactSession("agents-empty", store, context_window=WINDOW).pop_item()) is None
    )


@pytest.mark.slow
def test_clear_survives_a_later_compaction(store: CompactStore) -> None:
    session = CompactSession("agents-clear", store, context_window=WINDOW)
    asyncio.run(run_turns(session, FakeModel(calls=1), 1))
    asyncio.run(session.clear_session())
    model = FakeModel(calls=CALLS_PER_TURN)
    model.counter = 100  # call ids of its own
    asyncio.run(run_turns(session, model, TURNS, start=10))
    assert any(c.strategy == "full" for c in session.session.compactions())
    first = json.dumps(asyncio.run(session.get_items()))
    assert "task step 0" not in first  # the pinned first message before the clear stays gone


def test_recall_tool_is_a_function_tool(store: CompactStore) -> None:
    session = CompactSession("agents-recall", store, context_window=WINDOW)
    tool = session.recall_tool()
    assert tool.name == "recall"
    assert session.session.config.recall_enabled


def test_wrong_store_is_refused() -> None:
    with pytest.raises(InvalidInputError, match="CompactStore"):
        CompactSession("x", object(), context_window=WINDOW)  # type: ignore[arg-type]


def test_config_is_passed_on(store: CompactStore) -> None:
    config = CompactionConfig(auto_compact_threshold=0.5)
    session = CompactSession("agents-cfg", store, context_window=WINDOW, config=config)
    assert session.session.format == "responses"
    assert session.session.config.auto_compact_threshold == 0.5


@pytest.mark.slow
def test_over_an_async_store(tmp_path: Path) -> None:
    """The same runs over an AsyncCompactStore: its session
    is opened on first use and every call is awaited on the loop."""
    pytest.importorskip("aiosqlite", reason="the 'async' extra is not installed")
    from compactstore import AsyncCompactStore

    async def main() -> None:
        store = await AsyncCompactStore.open(str(tmp_path / "async-agents.db"))
        try:
            session = CompactSession("agents-async", store, context_window=WINDOW)
            with pytest.raises(InvalidInputError, match="async_session"):
                session.session.messages()
            model = FakeModel(calls=CALLS_PER_TURN)
            agent = make_agent(model, session)  # with the recall tool
            for turn in range(TURNS):
                await Runner.run(
                    agent,
                    f"task step {turn}: change file {turn}",
                    session=session,
                    run_config=session.run_config(),
                    hooks=session.hooks(),
                )
            inner = await session.async_session()
            assert inner.config.recall_enabled
            compactions = await inner.compactions()
            assert any(c.success and c.boundary is not None for c in compactions)
            for sent in model.inputs:
                assert estimate_tokens(json.dumps(sent)) <= WINDOW
                assert paired(sent), sent
                assert sdk_problems("responses", sent) == []
            log = await inner.messages()
            assert len(log) == TURNS * (1 + 2 * CALLS_PER_TURN + 1)
            # pop, clear and their rollback, awaited.
            items = await session.get_items()
            popped = await session.pop_item()
            assert popped == log[-1]
            await session.clear_session()
            assert await session.get_items() == []
            pop = next(c.id for c in await inner.compactions() if c.strategy == "pop")
            assert pop is not None
            with pytest.raises(InvalidInputError, match="rollback_async"):
                session.rollback(pop)
            await session.rollback_async(pop)  # the pop and the clear after it
            assert await session.get_items() == items
        finally:
            await store.close()

    asyncio.run(main())
    # The same session over the sync store: what the async one stored.
    with CompactStore.open(str(tmp_path / "async-agents.db")) as sync_store:
        again = CompactSession("agents-async", sync_store, context_window=WINDOW)
        assert len(again.session.messages()) == TURNS * (1 + 2 * CALLS_PER_TURN + 1)
        with pytest.raises(InvalidInputError, match="over a CompactStore"):
            asyncio.run(again.async_session())


@pytest.mark.slow  # a second process
@pytest.mark.parametrize("name", ["openai_agents_session.py", "responses_loop.py"])
def test_example_runs(name: str) -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "examples" / name)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    assert "ok" in done.stdout


# -- session= alone, chaining, recovery, images ---------------------------------------------

SCREENSHOT = "data:image/png;base64," + base64.b64encode(png(1000, 800)).decode()
PIXEL_TOKENS = -(-1000 * 800 // 750)  # how the responses format counts a 1000x800 image


def request_tokens(items: list[dict[str, Any]]) -> tuple[int, int]:
    """(the tokens of a request by compactstore's rules, the images it holds): the text by
    its JSON, each image by its pixels (not by its base64)."""
    images = 0
    text = json.dumps(items)
    if "input_image" in text:
        images = text.count(SCREENSHOT)
        text = text.replace(SCREENSHOT, "")
    return estimate_tokens(text) + images * PIXEL_TOKENS, images


def turn_input(turn: int) -> str | list[Any]:
    if turn % 5:
        return f"task step {turn}: change file {turn}"
    return [
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": f"task step {turn}: match this screenshot"},
                {"type": "input_image", "image_url": SCREENSHOT, "detail": "auto"},
            ],
        }
    ]


@pytest.mark.slow
def test_session_alone_compacts(store: CompactStore) -> None:
    """``Runner.run(agent, x, session=CompactSession(...))`` and nothing else: get_items
    compacts before each run, so every request stays in the window."""

    async def main() -> FakeModel:
        model = FakeModel(calls=1)
        agent = make_agent(model)
        session = CompactSession("alone", store, context_window=10_000)
        for turn in range(30):
            await Runner.run(agent, turn_input(turn), session=session)
        return model

    # A tool round can take a run past the auto-compact threshold before the next read:
    # the session says so, once.
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", CompactStoreWarning)
        model = asyncio.run(main())
    assert len(seen) <= 1
    session = store.get_session("alone")
    assert [c for c in session.compactions() if c.success and c.boundary is not None]
    sizes = [request_tokens(sent) for sent in model.inputs]
    assert max(tokens for tokens, _ in sizes) <= 10_000
    assert sum(images for _, images in sizes) > 0
    for sent in model.inputs:
        assert paired(sent), sent
        assert sdk_problems("responses", sent) == []


@pytest.mark.slow
def test_session_alone_warns_when_a_run_outgrows_the_window(store: CompactStore) -> None:
    """Tool rounds inside one run are sent without asking the session: past the threshold
    mid-run, the session says so (once) instead of staying silent."""
    model = FakeModel(calls=8)
    session = CompactSession("warned", store, context_window=4_000)

    async def main() -> None:
        await Runner.run(make_agent(model), "read everything", session=session)
        await Runner.run(make_agent(model), "and again", session=session)

    with pytest.warns(CompactStoreWarning, match=r"run_config=session\.run_config\(\)") as seen:
        asyncio.run(main())
    assert len([w for w in seen if issubclass(w.category, CompactStoreWarning)]) == 1


@pytest.mark.slow
def test_users_filter_and_hooks_are_chained(store: CompactStore) -> None:
    """``run_config(call_model_input_filter=mine)`` runs mine on the compacted view;
    ``hooks(mine)`` keeps every one of the user's hooks."""
    seen: list[int] = []
    events: list[str] = []

    def mine(data: Any) -> Any:
        seen.append(len(data.model_data.input))
        data.model_data.instructions = "Be brief."
        return data.model_data

    class Mine(RunHooks[Any]):
        async def on_llm_end(self, context: Any, agent: Any, response: Any) -> None:
            events.append("llm_end")

        async def on_tool_start(self, context: Any, agent: Any, tool: Any) -> None:
            events.append("tool_start")

    class Recording(FakeModel):
        async def get_response(self, system_instructions: Any, *a: Any, **k: Any) -> Any:
            assert system_instructions == "Be brief."
            return await super().get_response(system_instructions, *a, **k)

    session = CompactSession("chained", store, context_window=WINDOW)
    model = Recording(calls=1)
    recorded: list[int] = []
    record = session.session.record_usage

    def spy(tokens: int, **kwargs: Any) -> Any:
        recorded.append(tokens)
        return record(tokens, **kwargs)

    session.session.record_usage = spy  # type: ignore[method-assign,assignment]

    async def main() -> None:
        await Runner.run(
            make_agent(model),
            "go",
            session=session,
            run_config=session.run_config(call_model_input_filter=mine),
            hooks=session.hooks(Mine()),
        )

    asyncio.run(main())
    assert seen == [len(sent) for sent in model.inputs] and len(seen) == 2
    assert events == ["llm_end", "tool_start", "llm_end"]
    assert len(recorded) == 2  # the session's own on_llm_end ran too
    with pytest.raises(InvalidInputError, match="callable"):
        session.run_config(call_model_input_filter="no")


def test_overflow_errors_are_recognised() -> None:
    assert is_context_overflow(overflow_error())
    request = httpx.Request("POST", "https://api.anthropic.com/v1/messages")
    too_long = anthropic.BadRequestError(
        "prompt is too long: 210000 tokens > 200000 maximum",
        response=answer(400, request),
        body=None,
    )
    assert is_context_overflow(too_long)
    assert not is_context_overflow(
        openai.BadRequestError(
            "Invalid value for 'tool_choice'",
            response=answer(400, request),
            body=None,
        )
    )
    assert not is_context_overflow(ValueError("the context window is fine"))


@pytest.mark.slow
def test_fifty_turns_with_tools_images_and_one_overflow(store: CompactStore) -> None:
    """``session.run``: compaction before every model call, usage recorded, and the forced
    "exceeds the context window" error recovered (recorded as a reactive compaction)."""
    window = 10_000
    model = FakeModel(calls=2, overflow_at=70)
    session = CompactSession("fifty", store, context_window=window)

    async def main() -> None:
        agent = make_agent(model)
        for turn in range(50):
            result = await session.run(agent, turn_input(turn))
            assert result.final_output.startswith("done with turn")

    asyncio.run(main())
    assert model.overflowed == 1
    inner = session.session
    reactive = [c for c in inner.compactions() if c.trigger == "reactive"]
    assert len(reactive) == 1 and reactive[0].success
    sizes = [request_tokens(sent) for sent in model.inputs]
    assert max(tokens for tokens, _ in sizes) <= window
    assert sum(images for _, images in sizes) >= 10
    for sent in model.inputs:
        assert paired(sent), sent
        assert sdk_problems("responses", sent) == []
    # Images are counted by their pixels in the stored context.
    first = inner.messages()[0]
    assert inner.adapter.kind(first) == "user"
    assert media_tokens(first) == PIXEL_TOKENS
    assert model.counter == 50 * 3


def test_extras_are_ranges_the_installed_versions_satisfy() -> None:
    """No extra pins one exact version (it would break installs beside any other)."""
    from importlib.metadata import version

    from packaging.requirements import Requirement

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    for extra, requirements in project["optional-dependencies"].items():
        for line in requirements:
            requirement = Requirement(line)
            assert not any(s.operator in ("==", "===") for s in requirement.specifier), (
                extra,
                line,
            )
            if requirement.name in ("openai-agents", "langchain-core", "langchain", "langgraph"):
                assert requirement.specifier.contains(version(requirement.name)), line
