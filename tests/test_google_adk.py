"""Google ADK agents with CompactPlugin, offline.

Real ADK runners (``InMemoryRunner``: its runner, session service and function tools) over a
fake model, a ``BaseLlm`` subclass that answers from a script and keeps every request it got.
"""

from __future__ import annotations

import asyncio
import gc
import json
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncGenerator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("google.adk", reason="the 'google-adk' extra is not installed")

from google.adk.agents import LlmAgent
from google.adk.apps import App
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import InMemoryRunner, Runner
from google.genai import errors, types
from pydantic import Field

from compactstore import CompactStore, InvalidInputError
from compactstore._context.tokens import estimate_tokens, message_tokens
from compactstore.formats import get_format
from compactstore.integrations.google_adk import CompactPlugin, is_context_overflow, to_anthropic
from tests.test_media import PIXEL_TOKENS, png

# Each test runs real ADK runners (a runner's setup alone takes about 0.1 s).
pytestmark = [
    pytest.mark.slow,
    # ADK's runner leaves an event loop of its own (and its AF_UNIX socket pair) to the
    # garbage collector now and then, whose ResourceWarning fails whichever test is running
    # then. compactstore opens no event loop or socket in these tests (the store is a SQLite
    # file, the calls are asyncio.run's); the fixture below collects after each test, so the
    # warnings land here, where these filters take them.
    pytest.mark.filterwarnings("ignore:unclosed:ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]


@pytest.fixture(autouse=True)
def _collect_adk_leftovers() -> Iterator[None]:
    yield
    gc.collect()


REPO = Path(__file__).resolve().parents[1]
WINDOW = 10_000
IMAGE = png(1000, 800, noise=2000)
ANTHROPIC = get_format("anthropic")


def request_tokens(contents: list[types.Content]) -> int:
    """A request's size as the session format counts it (images by their pixels)."""
    return sum(
        message_tokens(ANTHROPIC, to_anthropic(c, str(i)), estimate_tokens)
        for i, c in enumerate(contents)
    )


def check_pairs(contents: list[types.Content]) -> None:
    """Each model Content's function calls are answered, by name, in the next Content, and
    every function response answers a call of the Content right before it."""
    open_calls: Counter[str] = Counter()
    for content in contents:
        parts = content.parts or []
        if content.role == "model":
            assert not open_calls, f"calls {open_calls} were not answered"
            open_calls = Counter(p.function_call.name or "" for p in parts if p.function_call)
        else:
            answered = Counter(p.function_response.name or "" for p in parts if p.function_response)
            assert answered == open_calls, (answered, open_calls)
            open_calls = Counter()


class Scripted(BaseLlm):
    """A fake model: a function call after each user prompt, then an answer."""

    model: str = "scripted"
    requests: list[list[types.Content]] = Field(default_factory=list)
    report_usage: bool = False  # report the request's size as its prompt tokens
    answer: Callable[[list[types.Content]], types.Content] | None = None

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        contents = [c.model_copy(deep=True) for c in llm_request.contents]
        self.requests.append(contents)
        size = request_tokens(contents) if self.report_usage else None
        usage = types.GenerateContentResponseUsageMetadata(prompt_token_count=size)
        if self.answer is not None:
            yield LlmResponse(content=self.answer(contents), usage_metadata=usage)
            return
        parts = contents[-1].parts or []
        if parts and parts[0].function_response is None:
            n = len(self.requests)
            reply = [
                types.Part(
                    text="Which file next? " * 5, thought=True, thought_signature=b"sig%d" % n
                ),
                types.Part(text="Reading the next file. " * 12),
                types.Part(
                    function_call=types.FunctionCall(name="read", args={"path": f"f{n}.py"})
                ),
            ]
        else:
            reply = [types.Part(text="Reviewed: " + "no issue found here. " * 20)]
        yield LlmResponse(content=types.Content(role="model", parts=reply), usage_metadata=usage)


def read(path: str) -> str:
    """Read a file."""
    return "\n".join(f"{path}:{i}: value = compute(value, {i})" for i in range(80))


def prompt(turn: int) -> types.Content:
    parts = [types.Part(text=f"Turn {turn}: review the next file")]
    if turn % 5 == 0:
        parts.append(types.Part(inline_data=types.Blob(data=IMAGE, mime_type="image/png")))
    return types.Content(role="user", parts=parts)


def run(
    plugin: CompactPlugin, model: Scripted, turns: int, tools: list[Any] | None = None
) -> tuple[InMemoryRunner, str]:
    agent = LlmAgent(
        name="reviewer", model=model, instruction="You review code.", tools=tools or [read]
    )
    runner = InMemoryRunner(app=App(name="app", root_agent=agent, plugins=[plugin]))

    async def go() -> str:
        session = await runner.session_service.create_session(app_name="app", user_id="u")
        for turn in range(turns):
            async for _ in runner.run_async(
                user_id="u", session_id=session.id, new_message=prompt(turn)
            ):
                pass
        return session.id

    return runner, asyncio.run(go())


def test_fifty_turns_with_tools_and_images_stay_in_the_window(tmp_path: Path) -> None:
    store = CompactStore.open(tmp_path / "adk.db")
    plugin = CompactPlugin(store, context_window=WINDOW)
    model = Scripted()
    runner, sid = run(plugin, model, 50)
    assert len(model.requests) == 100
    sizes = [request_tokens(sent) for sent in model.requests]
    assert max(sizes) <= WINDOW
    for sent in model.requests:
        check_pairs(sent)
    # Images reach the model as ADK's own inline data and are counted by their pixels.
    first = model.requests[0][-1].parts or []
    assert first[1].inline_data is not None and first[1].inline_data.data == IMAGE
    assert sizes[0] >= PIXEL_TOKENS
    assert any(p.inline_data for c in model.requests[90] for p in c.parts or [])
    session = plugin.session_for(sid)
    cuts = [c for c in session.compactions() if c.boundary is not None and c.success]
    assert len(cuts) >= 3
    # Stored once: per turn the prompt, the call, its response and the answer.
    assert Counter(m["role"] for m in session.messages()) == {"user": 100, "assistant": 100}
    # The summary is a user Content; ADK's own session keeps every event.
    summary = session.context().summary
    assert summary is not None
    text = session.adapter.text(summary.message)
    assert any(c.role == "user" and (c.parts or [])[0].text == text for c in model.requests[-1])

    async def events() -> int:
        adk = await runner.session_service.get_session(app_name="app", user_id="u", session_id=sid)
        assert adk is not None
        return len(adk.events)

    assert asyncio.run(events()) == 200


def test_contents_come_back_as_adk_objects(tmp_path: Path) -> None:
    store = CompactStore.open(tmp_path / "rt.db")
    plugin = CompactPlugin(store, context_window=WINDOW)
    model = Scripted()
    _, sid = run(plugin, model, 1)
    sent = model.requests[1]  # prompt, call, response
    back = plugin.messages(sid)
    dumps = [c.model_dump(exclude_none=True) for c in back]
    assert dumps[:3] == [c.model_dump(exclude_none=True) for c in sent]
    thought = (back[1].parts or [])[0]
    assert thought.thought and thought.thought_signature == b"sig1"
    session = plugin.session_for(sid)
    stored = session.messages()
    assert [m["role"] for m in stored] == ["user", "assistant", "user", "assistant"]
    assert stored[0]["content"][1]["type"] == "image"
    assert [b["type"] for b in stored[1]["content"]] == ["thinking", "text", "tool_use"]
    call_id = stored[1]["content"][2]["id"]
    assert stored[2]["content"][0] == {
        "type": "tool_result",
        "tool_use_id": call_id,
        "content": read("f1.py"),
    }


def test_usage_the_model_reports_is_recorded(tmp_path: Path) -> None:
    plugin = CompactPlugin(CompactStore.open(tmp_path / "u.db"), context_window=WINDOW)
    model = Scripted(report_usage=True)
    _, sid = run(plugin, model, 2)
    cost = plugin.session_for(sid).cost()
    assert cost.calls == 4
    assert cost.input_tokens == sum(request_tokens(sent) for sent in model.requests)


def test_a_second_plugin_on_the_same_store_stores_nothing_twice(tmp_path: Path) -> None:
    db = tmp_path / "twice.db"
    model = Scripted()
    runner, sid = run(CompactPlugin(db, context_window=WINDOW), model, 2)
    # Another process: a new plug-in over the same database, the same ADK session.
    again = CompactPlugin(db, context_window=WINDOW)
    agent = LlmAgent(name="reviewer", model=model, instruction="You review code.", tools=[read])
    second = Runner(
        app=App(name="app", root_agent=agent, plugins=[again]),
        session_service=runner.session_service,
    )

    async def more() -> None:
        async for _ in second.run_async(user_id="u", session_id=sid, new_message=prompt(7)):
            pass

    asyncio.run(more())
    session = again.session_for(sid)
    assert session.message_count() == 12  # 3 turns of prompt, call, response, answer
    check_pairs(model.requests[-1])


class Overflowing(Scripted):
    """Scripted, but the request numbered ``fail_at`` fails as Gemini says a prompt is too
    long (once, or every time from then on)."""

    fail_at: int = 7
    always: bool = False
    failed: list[int] = Field(default_factory=list)

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        if len(self.requests) >= self.fail_at and (self.always or not self.failed):
            self.failed.append(len(llm_request.contents))
            message = "The input token count (1200000) exceeds the maximum number of tokens"
            raise errors.ClientError(400, {"error": {"code": 400, "message": message}})
        async for response in super().generate_content_async(llm_request, stream):
            yield response


def test_a_context_overflow_is_recovered_and_the_call_made_again(tmp_path: Path) -> None:
    plugin = CompactPlugin(tmp_path / "ovf.db", context_window=WINDOW)
    model = Overflowing()
    _, sid = run(plugin, model, 6)
    assert len(model.failed) == 1
    session = plugin.session_for(sid)
    recoveries = [c for c in session.compactions() if c.trigger == "reactive"]
    assert len(recoveries) == 1 and recoveries[0].success
    retried = model.requests[7]
    assert len(retried) < model.failed[0]  # the recovered, smaller context
    check_pairs(retried)
    assert session.message_count() == 24  # 6 turns, nothing lost or doubled


def test_a_second_overflow_propagates(tmp_path: Path) -> None:
    plugin = CompactPlugin(tmp_path / "o2.db", context_window=WINDOW)
    with pytest.raises(errors.ClientError, match="exceeds the maximum number of tokens"):
        run(plugin, Overflowing(fail_at=1, always=True), 1)


def test_one_overflow_recogniser_knows_gemini_and_the_other_providers() -> None:
    gemini = "The input token count (1200000) exceeds the maximum number of tokens"
    assert is_context_overflow(errors.ClientError(400, {"error": {"code": 400, "message": gemini}}))
    # The phrases the OpenAI Agents and LangChain integrations knew count here too.
    openai_words = "This model's maximum context length is 128000 tokens"
    assert is_context_overflow(errors.ClientError(400, {"error": {"message": openai_words}}))
    # A server error that mentions tokens is not an overflow: retrying smaller won't help.
    assert not is_context_overflow(errors.ServerError(500, {"error": {"message": gemini}}))
    assert not is_context_overflow(ValueError("prompt is too long"))


def test_recall_tool_answers_from_the_log(tmp_path: Path) -> None:
    plugin = CompactPlugin(tmp_path / "recall.db", context_window=WINDOW)
    opened = plugin.session_for("opened-before")
    recall = plugin.recall_tool()
    assert opened.config.recall_enabled

    def answer(contents: list[types.Content]) -> types.Content:
        last = (contents[-1].parts or [])[0]
        if last.text and "recall" in last.text:
            call = types.FunctionCall(name="recall", args={"query": "aubergine"})
            return types.Content(role="model", parts=[types.Part(function_call=call)])
        return types.Content(role="model", parts=[types.Part(text="Noted.")])

    model = Scripted(answer=answer)
    agent = LlmAgent(name="r", model=model, instruction="Remember.", tools=[recall])
    runner = InMemoryRunner(app=App(name="app", root_agent=agent, plugins=[plugin]))

    async def go() -> str:
        adk = await runner.session_service.create_session(app_name="app", user_id="u")
        for text in ("The secret word is aubergine.", "Please recall the secret word"):
            if text.startswith("Please"):
                plugin.session_for(adk.id).compact()
            message = types.Content(role="user", parts=[types.Part(text=text)])
            async for _ in runner.run_async(user_id="u", session_id=adk.id, new_message=message):
                pass
        return adk.id

    sid = asyncio.run(go())
    assert plugin.session_for(sid).config.recall_enabled
    responses = [
        p.function_response for p in model.requests[-1][-1].parts or [] if p.function_response
    ]
    assert responses and "aubergine" in json.dumps(responses[0].response)


def test_bad_arguments_are_refused_clearly() -> None:
    with pytest.raises(InvalidInputError, match="CompactStore or a database path"):
        CompactPlugin(object())  # type: ignore[arg-type]


def test_the_example_runs_offline(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(REPO / "examples" / "google_adk_agent.py"), str(tmp_path / "ex.db")],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
        timeout=120,
    )
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["compactions"] >= 1
    assert report["max_request_tokens"] <= report["context_window"]
    assert report["stored_messages"] == report["adk_events"]
