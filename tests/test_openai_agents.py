"""The OpenAI Agents SDK with CompactSession (SPEC §9.5), offline.

``Runner.run`` of the real SDK with a fake model implementing the SDK's own ``Model`` interface:
it answers from a script (tool calls, then a final text), keeps every input it was given and
reports an input-token count computed from that input.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agents", reason="the 'openai-agents' extra is not installed")

from agents import Agent, Runner, function_tool, set_tracing_disabled
from agents.items import ModelResponse, TResponseInputItem, TResponseStreamEvent
from agents.models.interface import Model
from agents.usage import Usage
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage
from openai.types.responses.response_output_text import ResponseOutputText

from compactstore import CompactionConfig, CompactStore, InvalidInputError
from compactstore.formats.responses import CALLS, OUTPUTS, item_type
from compactstore.formats.sdk_types import sdk_problems
from compactstore.integrations.openai_agents import CompactSession, wire_item
from compactstore.tokens import estimate_tokens

REPO = Path(__file__).resolve().parents[1]
TURNS, CALLS_PER_TURN = 8, 5
WINDOW = 8_000
BIG = "lorem ipsum dolor sit amet " * 160  # ~1k tokens of tool output


class FakeModel(Model):
    """Answers each user turn with ``calls`` tool calls, then a text; records its inputs."""

    def __init__(self, calls: int = 3) -> None:
        self.calls = calls
        self.inputs: list[list[dict[str, Any]]] = []
        self.counter = 0

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        *args: Any,
        **kwargs: Any,
    ) -> ModelResponse:
        items = [{"role": "user", "content": input}] if isinstance(input, str) else input
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
    """The same runs over an AsyncCompactStore (SPEC §9.5 "over either store"): its session
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
