"""Built-in LLM summarizers: the official clients over a mocked HTTP transport.

What the request body holds is the subject: the handoff sections asked for, the output cap,
the input cap (oldest messages dropped first, the previous summary always kept), and no
media, base64 or thinking. And a compaction through a store uses the model's text.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import importlib
import subprocess
import sys
from typing import Any

import pytest

from compactstore import (
    CompactionConfig,
    CompactStore,
    InvalidInputError,
    MissingExtraError,
    SummaryResult,
)
from compactstore._context.tokens import estimate_tokens
from compactstore._recall import RECALL_LINE
from compactstore.summarizers import AnthropicSummarizer, OpenAISummarizer, resolve
from compactstore.summarizers.prompt import build_prompt, transcript
from tests.mock_http import anthropic_message, chat_completion, sdk_client

anthropic = pytest.importorskip("anthropic", reason="the 'anthropic' extra is not installed")
openai = pytest.importorskip("openai", reason="the 'openai' extra is not installed")

# A PNG's worth of base64 (4,000 characters) and a signed thinking block: never sent.
IMAGE_B64 = base64.b64encode(
    b"\x89PNG\r\n\x1a\n" + b"".join(hashlib.sha256(bytes([i])).digest() for i in range(93))
).decode()
SIGNATURE = "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxvO9bBfdL7Ebfj2xki" + "Q" * 120
SECRET_THOUGHT = "I privately wonder whether the flaky test is the clock"

SUMMARY_TEXT = (
    "## Original request\nFix the flaky test in tests/test_clock.py\n\n"
    "## Current work\nPatched the clock.\nNext step: run the suite."
)


def anthropic_log() -> list[dict[str, Any]]:
    """An anthropic-format conversation with thinking, a tool call, an image result and an
    error, as a session stores it."""
    return [
        {"role": "user", "content": "Fix the flaky test in tests/test_clock.py"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": SECRET_THOUGHT, "signature": SIGNATURE},
                {"type": "text", "text": "Let me look at the screenshot of the failure."},
                {
                    "type": "tool_use",
                    "id": "toolu_01",
                    "name": "screenshot",
                    "input": {"path": "ci/failure.png"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_01",
                    "content": [
                        {"type": "text", "text": "captured"},
                        {
                            "type": "image",
                            "source": {
                                "type": "base64",
                                "media_type": "image/png",
                                "data": IMAGE_B64,
                            },
                        },
                    ],
                }
            ],
        },
        {"role": "user", "content": "Use freezegun, not time.sleep"},
        {
            "role": "assistant",
            "content": [
                {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4aDFu"},
                {
                    "type": "tool_use",
                    "id": "toolu_02",
                    "name": "bash",
                    "input": {"command": "pytest tests/test_clock.py"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_02",
                    "content": "Error: AssertionError: 3 != 4",
                    "is_error": True,
                }
            ],
        },
        {"role": "assistant", "content": "The clock drifts. Next I will patch it with freezegun."},
    ]


def openai_log() -> list[dict[str, Any]]:
    data_url = f"data:image/png;base64,{IMAGE_B64}"
    return [
        {"role": "system", "content": "You are a careful engineer."},
        {"role": "user", "content": "Fix the flaky test in tests/test_clock.py"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {
                        "name": "read_file",
                        "arguments": '{"path": "tests/test_clock.py"}',
                    },
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "def test_clock(): ..."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Here is the failure, use freezegun"},
                {"type": "image_url", "image_url": {"url": data_url}},
            ],
        },
        {"role": "assistant", "content": "Next step: patch the clock."},
    ]


def assert_nothing_private(raw: str) -> None:
    assert IMAGE_B64 not in raw
    assert IMAGE_B64[:200] not in raw
    assert "base64," not in raw
    assert SIGNATURE not in raw
    assert SECRET_THOUGHT not in raw
    assert "EmwKAhgBEgy3va3pzix" not in raw


SECTIONS = (
    "## Original request",
    "## Later instructions from the user (oldest first)",
    "## Pending tasks",
    "## Current work",
    "Next step:",
    "## Files (newest first)",
    "## Errors",
)


def test_anthropic_request_asks_for_the_handoff_within_the_caps() -> None:
    client, seen = sdk_client(
        anthropic,
        lambda body: anthropic_message(
            [{"type": "text", "text": SUMMARY_TEXT}], input_tokens=1_000, cache_read=200
        ),
    )
    summarizer = AnthropicSummarizer(client, model="claude-haiku-4-5")

    result = summarizer(anthropic_log(), "## Original request\nearlier summary", "keep paths")

    assert result == SummaryResult(
        text=SUMMARY_TEXT,
        input_tokens=1_200,  # input + cache creation + cache read, as the API counts a prompt
        output_tokens=300,
        model="claude-haiku-4-5-20251001",
    )
    assert seen.paths == ["/v1/messages"]
    body = seen.bodies[0]
    assert body["model"] == "claude-haiku-4-5"
    assert body["max_tokens"] == CompactionConfig().summary_max_tokens == 6_000
    for heading in SECTIONS:
        assert heading in body["system"]
    assert RECALL_LINE not in body["system"]  # recall not enabled
    [message] = body["messages"]
    assert message["role"] == "user"
    prompt = message["content"]
    assert "earlier summary" in prompt and "keep paths" in prompt
    assert "Use freezegun, not time.sleep" in prompt
    assert "[call bash id=toolu_02]" in prompt and "AssertionError: 3 != 4" in prompt
    assert "[image left out]" in prompt and "[thinking left out]" in prompt
    assert_nothing_private(seen.raw[0])


def test_openai_request_asks_for_the_handoff_within_the_caps() -> None:
    client, seen = sdk_client(openai, lambda body: chat_completion(SUMMARY_TEXT))
    summarizer = OpenAISummarizer(client, model="gpt-4.1-mini", max_tokens=800, recall=True)

    result = summarizer(openai_log(), None, None)

    assert result == SummaryResult(
        text=SUMMARY_TEXT, input_tokens=900, output_tokens=250, model="gpt-4.1-mini-2025-04-14"
    )
    assert seen.paths == ["/v1/chat/completions"]
    body = seen.bodies[0]
    assert body["max_completion_tokens"] == 800
    system, user = body["messages"]
    assert system["role"] == "system" and user["role"] == "user"
    for heading in SECTIONS:
        assert heading in system["content"]
    assert "at most 800 tokens" in system["content"]
    assert RECALL_LINE in system["content"]
    assert "Here is the failure, use freezegun" in user["content"]
    assert "[call read_file id=call_1]" in user["content"]
    assert "<previous_summary>" not in user["content"]
    assert_nothing_private(seen.raw[0])


def test_input_cap_drops_the_oldest_messages_and_keeps_the_previous_summary() -> None:
    client, seen = sdk_client(
        anthropic, lambda body: anthropic_message([{"type": "text", "text": "s"}])
    )
    summarizer = AnthropicSummarizer(client, model="m", max_input_tokens=3_000)
    messages = [
        {
            "role": "user" if i % 2 == 0 else "assistant",
            "content": f"marker-{i:03d} " + "word " * 80,
        }
        for i in range(200)
    ]
    previous = "PREVIOUS SUMMARY " + "kept " * 400

    summarizer(messages, previous, None)

    body = seen.bodies[0]
    sent = body["system"] + body["messages"][0]["content"]
    assert estimate_tokens(sent) <= 3_000
    assert previous in sent
    assert "marker-199" in sent and "marker-000" not in sent
    kept = [i for i in range(200) if f"marker-{i:03d}" in sent]
    assert kept == list(range(kept[0], 200)), "only the oldest are dropped, newest kept in order"
    assert f"[{kept[0]} older messages left out to fit the summarizer's input cap]" in sent


def test_a_newest_message_over_the_cap_is_cut_to_its_end() -> None:
    prompt = build_prompt(
        [{"role": "user", "content": "start " + "z" * 40_000 + " THE END"}],
        None,
        None,
        max_input_tokens=2_000,
        max_output_tokens=500,
    )
    assert prompt.input_tokens <= 2_000
    assert "THE END" in prompt.user and prompt.sent == 1 and prompt.dropped == 0


def test_long_tool_results_are_sent_as_head_and_tail() -> None:
    text = transcript(
        [{"role": "tool", "tool_call_id": "c", "content": "HEAD" + "a" * 9_000 + "TAIL"}]
    )
    assert "HEAD" in text and "TAIL" in text and "characters left out" in text
    assert len(text) < 4_200


def test_responses_items_thinking_and_media_are_left_out() -> None:
    items: list[dict[str, Any]] = [
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAAAB" * 50},
        {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": '{"cmd":"ls"}'},
        {
            "type": "function_call_output",
            "call_id": "c1",
            "output": [{"type": "input_image", "image_url": f"data:image/png;base64,{IMAGE_B64}"}],
        },
        {"role": "user", "content": [{"type": "input_text", "text": "now the docs"}]},
        {"type": "compaction", "id": "cmp_1", "encrypted_content": "gAAAAB" * 50},
    ]
    text = transcript(items)
    assert "[call shell id=c1]" in text and "now the docs" in text
    assert "[thinking left out]" in text and "[image left out]" in text
    assert "gAAAAB" not in text and IMAGE_B64 not in text


@pytest.mark.slow_on_postgres
def test_a_compaction_through_a_store_uses_the_models_text(db_url: str) -> None:
    client, seen = sdk_client(
        anthropic, lambda body: anthropic_message([{"type": "text", "text": SUMMARY_TEXT}])
    )
    summarizer = AnthropicSummarizer(client, model="claude-haiku-4-5", max_tokens=1_000)
    with CompactStore.open(db_url, summarizer=summarizer) as store:
        sess = store.session("llm", context_window=20_000, format="anthropic")
        sess.extend(anthropic_log())
        for i in range(30):
            sess.append({"role": "user", "content": f"step {i}: " + "words " * 300})
            sess.append({"role": "assistant", "content": f"done {i}"})

        result = sess.process_request()

    assert result.success and result.summary_text == SUMMARY_TEXT
    assert len(seen.bodies) == 1
    assert seen.bodies[0]["max_tokens"] == 1_000
    assert_nothing_private(seen.raw[0])
    summary = result.messages[1]  # after the pinned first request
    assert summary == {"role": "user", "content": [{"type": "text", "text": SUMMARY_TEXT}]}


def test_bad_arguments_are_clear_errors() -> None:
    client, _ = sdk_client(anthropic, lambda body: {})
    with pytest.raises(InvalidInputError, match="model"):
        AnthropicSummarizer(client, model="")
    with pytest.raises(InvalidInputError, match="needs an anthropic client"):
        AnthropicSummarizer(None, model="m")
    with pytest.raises(InvalidInputError, match="max_tokens"):
        AnthropicSummarizer(client, model="m", max_tokens=0)


def test_a_missing_sdk_names_its_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "anthropic", None)  # as if not installed
    with pytest.raises(MissingExtraError, match=r"compactstore\[anthropic\]"):
        AnthropicSummarizer(object(), model="m")
    with pytest.raises(MissingExtraError, match=r"compactstore\[anthropic\]"):
        resolve("anthropic", "m")


@pytest.mark.slow
def test_import_compactstore_imports_no_sdk() -> None:
    code = (
        "import sys, compactstore, compactstore.summarizers, compactstore.integrations\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('anthropic', 'openai', 'langchain', 'langchain_core', 'langgraph')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# -- resolve: what `compactstore worker` and `replay --summarizer` take ----------------------


class EchoSummarizer:
    """A summarizer class a user names as module:Class."""

    def __init__(self, model: str | None = None) -> None:
        self.model = model

    def __call__(self, messages: Any, previous: Any, instructions: Any) -> str:
        return f"{self.model}: {len(messages)} messages"


def echo(messages: Any, previous: Any, instructions: Any) -> str:
    return "echo"


def test_resolve_builtins_from_the_sdk_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")

    built = resolve("anthropic", "claude-haiku-4-5", max_tokens=2_000)
    assert isinstance(built, AnthropicSummarizer)
    assert (built.model, built.max_tokens, built.name) == ("claude-haiku-4-5", 2_000, "anthropic")
    assert built.client.api_key == "sk-ant-test"

    chat = resolve("openai", "gpt-4.1-mini")
    assert isinstance(chat, OpenAISummarizer) and chat.name == "openai"
    assert str(chat.client.base_url) == "http://127.0.0.1:9/v1/"


def test_resolve_module_callable_and_class() -> None:
    assert resolve("tests.test_summarizers:echo") is echo
    built = resolve("tests.test_summarizers:EchoSummarizer", "m1")
    assert isinstance(built, EchoSummarizer) and built.model == "m1"
    assert built([{}], None, None) == "m1: 1 messages"


@pytest.mark.parametrize(
    ("spec", "model", "problem"),
    [
        ("", None, "anthropic"),
        ("gemini", None, "unknown summarizer 'gemini'"),
        ("anthropic", None, "needs a model"),
        ("no_such_module_xyz:f", None, "cannot import"),
        ("tests.test_summarizers:missing", None, "has no 'missing'"),
        ("compactstore:__version__", None, "not callable"),
        ("tests.test_summarizers:echo", "m", "takes no model"),
    ],
)
def test_resolve_refuses_what_it_cannot_build(spec: str, model: str | None, problem: str) -> None:
    with pytest.raises(InvalidInputError, match=problem):
        resolve(spec, model)


def test_the_langchain_integration_without_its_extra_names_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("langchain", "langchain.agents", "langchain.agents.middleware"):
        monkeypatch.setitem(sys.modules, name, None)  # as if not installed
    monkeypatch.delitem(sys.modules, "compactstore.integrations.langchain", raising=False)
    with pytest.raises(MissingExtraError, match=r"compactstore\[langchain\]"):
        importlib.import_module("compactstore.integrations.langchain")


@pytest.mark.slow
@pytest.mark.parametrize("sdk_name", ["anthropic", "openai"])
def test_async_clients_summarize_on_the_async_store(tmp_path: Any, sdk_name: str) -> None:
    """``AnthropicSummarizer(AsyncAnthropic())`` / ``OpenAISummarizer(AsyncOpenAI())`` are
    awaited by AsyncCompactStore: the model's text is the summary, no rule fallback."""
    pytest.importorskip("aiosqlite", reason="the 'async' extra is not installed")
    from compactstore import AsyncCompactStore

    sdk = anthropic if sdk_name == "anthropic" else openai
    if sdk_name == "anthropic":
        client, seen = sdk_client(
            sdk,
            lambda body: anthropic_message([{"type": "text", "text": SUMMARY_TEXT}]),
            asynchronous=True,
        )
        summarizer: Any = AnthropicSummarizer(client, model="claude-haiku-4-5")
        assert isinstance(summarizer, AnthropicSummarizer)
    else:
        client, seen = sdk_client(
            sdk, lambda body: chat_completion(SUMMARY_TEXT), asynchronous=True
        )
        summarizer = OpenAISummarizer(client, model="gpt-5-mini")
        assert isinstance(summarizer, OpenAISummarizer)

    async def main() -> Any:
        store = await AsyncCompactStore.open(str(tmp_path / "a.db"), summarizer=summarizer)
        try:
            sess = await store.session("llm", context_window=20_000, format="anthropic")
            for i in range(30):
                await sess.append({"role": "user", "content": f"step {i}: " + "words " * 300})
                await sess.append({"role": "assistant", "content": f"done {i}"})
            return await sess.process_request()
        finally:
            await store.close()

    result = asyncio.run(main())
    assert result.success and result.summary_text == SUMMARY_TEXT
    assert len(seen.bodies) == 1


@pytest.mark.parametrize("sdk_name", ["anthropic", "openai"])
def test_an_async_client_on_a_sync_store_is_refused_at_open(tmp_path: Any, sdk_name: str) -> None:
    sdk = anthropic if sdk_name == "anthropic" else openai
    client, seen = sdk_client(sdk, lambda body: {}, asynchronous=True)
    built = AnthropicSummarizer if sdk_name == "anthropic" else OpenAISummarizer
    summarizer = built(client, model="m")
    with pytest.raises(InvalidInputError, match="AsyncCompactStore") as raised:
        CompactStore.open(str(tmp_path / "s.db"), summarizer=summarizer)
    assert "async SDK client" in str(raised.value)
    with CompactStore.open(str(tmp_path / "s.db")) as store:
        with pytest.raises(InvalidInputError, match="AsyncCompactStore"):
            store.session("s", context_window=20_000, summarizer=summarizer)
        assert store.sessions() == []
    assert seen.bodies == []
