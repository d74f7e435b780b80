"""SDK objects in append/extend, append_response, request_params and the anthropic wire
view, with real SDK objects built from recorded-shape JSON and the official client over
a mocked HTTP transport."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from anthropic.types import Message
from openai.types.chat import ChatCompletion
from openai.types.responses import Response
from sqlalchemy import text

from compactstore import CompactionConfig, CompactStore, InvalidInputError, Session
from compactstore.formats.sdk_types import request_params_problems, sdk_problems
from tests.helpers import T0, per_seq, words
from tests.mock_http import anthropic_message, chat_completion, sdk_client

REPO = Path(__file__).resolve().parent.parent

TOOL_TURN = anthropic_message(
    [
        {"type": "text", "text": "Reading both files."},
        {"type": "tool_use", "id": "toolu_a", "name": "read_file", "input": {"path": "a.py"}},
        {"type": "tool_use", "id": "toolu_b", "name": "read_file", "input": {"path": "b.py"}},
    ],
    input_tokens=5,
    cache_read=2_000,
    stop_reason="tool_use",
)
TOOL_TURN["usage"]["cache_creation_input_tokens"] = 300

RESPONSE = {
    "id": "resp_1",
    "object": "response",
    "created_at": 1_741_569_952,
    "model": "gpt-5",
    "status": "completed",
    "parallel_tool_calls": True,
    "tool_choice": "auto",
    "tools": [],
    "output": [
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [],
            "encrypted_content": "gAAA",
            "status": None,
        },
        {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "call_1",
            "name": "read_file",
            "arguments": '{"path": "a.py"}',
            "status": "completed",
        },
        {
            "type": "custom_tool_call",
            "id": "ctc_1",
            "call_id": "call_2",
            "name": "apply_patch",
            "input": "*** Begin Patch",
            "status": "completed",
            "created_by": "agent",
        },
        {
            "type": "code_interpreter_call",
            "id": "ci_1",
            "code": None,
            "container_id": "cntr_1",
            "outputs": None,
            "status": "completed",
        },
    ],
    "usage": {
        "input_tokens": 1_500,
        "input_tokens_details": {"cached_tokens": 1_000, "cache_write_tokens": 0},
        "output_tokens": 80,
        "output_tokens_details": {"reasoning_tokens": 40},
        "total_tokens": 1_580,
    },
}


def _session(store: CompactStore, fmt: str, name: str = "s") -> Session:
    return store.session(name, format=fmt, context_window=100_000, now=T0)


def _real_tokens(store: CompactStore, session_id: str) -> list[int | None]:
    with store.engine.connect() as connection:
        rows = connection.execute(
            text("SELECT real_tokens FROM model_calls WHERE session_id = :s ORDER BY id"),
            {"s": session_id},
        )
        return [row[0] for row in rows]


def test_an_anthropic_message_object_is_stored_as_its_request_param(store: CompactStore) -> None:
    sess = _session(store, "anthropic")
    sess.append({"role": "user", "content": "read a.py and b.py"})
    reply = Message.model_validate(TOOL_TURN)
    sess.append(reply)
    stored = sess.messages()[-1]
    assert stored == {"role": "assistant", "content": TOOL_TURN["content"]}
    assert "id" not in stored and "usage" not in stored  # output-only keys are dropped
    # A dict holding the SDK's blocks (the README loop's old spelling) works too.
    sess.append_tool_result("toolu_a", "A", tool_name="read_file")
    sess.append_tool_result("toolu_b", "B", tool_name="read_file")
    sess.append({"role": "assistant", "content": reply.content[:1]})
    assert sess.messages()[-1] == {"role": "assistant", "content": [TOOL_TURN["content"][0]]}
    assert sdk_problems("anthropic", sess.active_context()) == []


def test_responses_items_keep_only_declared_keys(store: CompactStore) -> None:
    sess = _session(store, "responses")
    sess.append({"role": "user", "content": "go"})
    sess.extend(Response.model_validate(RESPONSE).output)
    stored = sess.messages()[1:]
    assert "status" not in stored[0]  # an output's null the request type refuses: left out
    assert stored[1]["status"] == "completed"  # declared by the Param type: kept
    assert "created_by" not in stored[2]  # output-only
    assert stored[3]["outputs"] is None and stored[3]["code"] is None  # required-but-null
    assert sdk_problems("responses", stored) == []


def test_append_response_stores_the_turn_and_records_usage(store: CompactStore) -> None:
    sess = _session(store, "anthropic", "a")
    sess.append({"role": "user", "content": "read a.py and b.py"})
    seqs = sess.append_response(Message.model_validate(TOOL_TURN), now=T0 + 5)
    assert seqs == [1]
    assert sess.messages()[1]["content"] == TOOL_TURN["content"]
    # input + cache creation + cache read, as record_usage would have been told
    assert _real_tokens(store, "a") == [5 + 300 + 2_000]
    assert sess.token_usage() > 2_305  # the real count plus the reply appended since

    chat = _session(store, "openai", "o")
    chat.append({"role": "user", "content": "hi"})
    completion = ChatCompletion.model_validate(chat_completion("Hello!", prompt=900))
    assert chat.append_response(completion) == [1]
    assert chat.messages()[1] == {"role": "assistant", "content": "Hello!", "refusal": None}
    assert _real_tokens(store, "o") == [900]

    items = _session(store, "responses", "r")
    items.append({"role": "user", "content": "go"})
    assert items.append_response(Response.model_validate(RESPONSE)) == [1, 2, 3, 4]
    assert _real_tokens(store, "r") == [1_500]

    with pytest.raises(InvalidInputError, match=r"an Anthropic Message\), got ChatCompletion"):
        sess.append_response(completion)
    assert len(sess.messages()) == 2


def test_parallel_tool_results_are_one_user_message_on_the_wire(store: CompactStore) -> None:
    sess = _session(store, "anthropic")
    sess.append({"role": "system", "content": "You are terse."})
    sess.append({"role": "user", "content": "read a.py and b.py"})
    sess.append(Message.model_validate(TOOL_TURN))
    sess.append_tool_result("toolu_b", "B", tool_name="read_file")  # answered out of order
    sess.append_tool_result("toolu_a", "A", tool_name="read_file")
    assert len(per_seq(sess)) == 5  # the log and context().items: one item per seq
    wire = sess.active_context()
    assert len(wire) == 4
    assert [b["tool_use_id"] for b in wire[-1]["content"]] == ["toolu_a", "toolu_b"]
    assert list(sess.context_view()) == wire

    params = sess.request_params()
    assert params["system"] == "You are terse."
    assert params["messages"] == wire[1:]
    assert request_params_problems("anthropic", params) == []


def test_a_message_after_the_last_result_stays_its_own_on_the_wire(store: CompactStore) -> None:
    sess = _session(store, "anthropic")
    sess.append({"role": "user", "content": "read a.py and b.py"})
    sess.append(Message.model_validate(TOOL_TURN))
    sess.append_tool_result("toolu_b", "B", tool_name="read_file")
    sess.append_tool_result("toolu_a", "A", tool_name="read_file")
    pin = {"role": "user", "content": "Never touch the migrations."}
    sess.append(pin, pinned=True)

    wire = sess.active_context()

    assert len(wire) == 4 and wire[-1] == pin, "what follows the last result is not merged"
    assert [b["tool_use_id"] for b in wire[2]["content"]] == ["toolu_a", "toolu_b"]
    assert request_params_problems("anthropic", sess.request_params()) == []


def test_cache_breakpoints_where_they_pay(store: CompactStore) -> None:
    sess = store.session(
        "c",
        format="anthropic",
        context_window=100_000,
        config=CompactionConfig(),
        now=T0,
        model="claude-opus-5",  # caches prefixes from 512 tokens
    )
    system = words(2_400, "sys")  # 600 tokens
    sess.append({"role": "system", "content": system})
    sess.append({"role": "user", "content": "Refactor payments/"})
    for n in range(12):
        sess.append({"role": "assistant", "content": words(400, f"a{n}")})
        sess.append({"role": "user", "content": words(400, f"u{n}")})
    sess.compact(now=T0 + 10)
    params = sess.request_params(cache_control=True)
    assert params["system"] == [
        {"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}
    ]
    # Four at most, best first: the system prompt, the newest message, the last message
    # of the previous request (before the newest assistant message), the summary; the
    # pinned first message (a shorter prefix) is left out.
    messages = params["messages"]
    marked = [n for n, m in enumerate(messages) if "cache_control" in str(m)]
    assert marked == [1, len(messages) - 3, len(messages) - 1]
    assert messages[1]["content"][-1]["text"].startswith("[Context compacted")
    assert messages[-1]["content"][-1]["cache_control"] == {"type": "ephemeral"}
    assert request_params_problems("anthropic", params) == []
    assert sess.request_params()["system"] == system  # without: untouched

    # A model that caches from 4,096 tokens: the system prompt alone is too short.
    short = store.session("d", format="anthropic", context_window=100_000, model="my-model")
    short.append({"role": "system", "content": system})
    short.append({"role": "user", "content": "hi"})
    assert short.request_params(cache_control=True) == {
        "system": system,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
    }

    other = _session(store, "responses", "r")
    other.append({"role": "user", "content": "go"})
    assert other.request_params(cache_control=True) == {
        "input": [{"role": "user", "content": "go"}]
    }
    with pytest.raises(InvalidInputError, match="minicode"):
        _session(store, "minicode", "m").request_params()


def test_the_official_client_loop_over_a_mocked_transport(store: CompactStore) -> None:
    turns: list[dict[str, Any]] = [
        TOOL_TURN,
        anthropic_message([{"type": "text", "text": "Both read."}], input_tokens=2_600),
    ]

    def respond(body: dict[str, Any]) -> dict[str, Any]:
        reply: dict[str, Any] = turns[sum(m["role"] == "assistant" for m in body["messages"])]
        return reply

    client, recorder = sdk_client(anthropic, respond)
    sess = _session(store, "anthropic", "loop")
    sess.append({"role": "user", "content": "read a.py and b.py"})
    while True:
        sess.process_request(now=T0 + 1)
        reply = client.messages.create(
            model="claude-sonnet-4-5", max_tokens=1024, **sess.request_params(cache_control=True)
        )
        sess.append_response(reply, now=T0 + 2)
        calls = [block for block in reply.content if block.type == "tool_use"]
        for call in calls:
            sess.append_tool_result(
                call.id, f"contents of {call.input['path']}", tool_name=call.name
            )
        if not calls:
            break
    assert len(recorder.bodies) == 2
    second = recorder.bodies[1]["messages"]
    assert [b["tool_use_id"] for b in second[-1]["content"]] == ["toolu_a", "toolu_b"]
    for body in recorder.bodies:
        params = {k: v for k, v in body.items() if k in ("system", "messages")}
        assert request_params_problems("anthropic", params) == []
    assert _real_tokens(store, "loop") == [2_305, 2_600]
    assert sess.messages()[-1] == {
        "role": "assistant",
        "content": [{"type": "text", "text": "Both read."}],
    }
    assert openai  # the other SDK is importable too (the test extra has both)


@pytest.mark.slow  # a second process; test_docs runs the same code in-process
def test_the_docs_loop_is_the_example_verbatim_and_runs(tmp_path: Path) -> None:
    example = (REPO / "examples" / "anthropic_loop.py").read_text(encoding="utf-8")
    page = (REPO / "docs" / "getting-started.md").read_text(encoding="utf-8")
    assert "## Use it in an agent loop" in page
    assert f"```python\n{example}```" in page
    loop = example[example.index("store = CompactStore.open") : example.index("print(")]
    assert len(loop.strip().splitlines()) <= 16  # the glue: 15 lines and its comment
    done = subprocess.run(
        [sys.executable, str(REPO / "examples" / "anthropic_loop.py")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert done.stdout.startswith("Done: errors are typed now.")
    with CompactStore.open(tmp_path / "agent.db") as store:
        sess = store.session("task-42")
        assert len(sess.messages()) == 8  # request, 3 x (call, result), answer
        assert sdk_problems("anthropic", sess.active_context()) == []
