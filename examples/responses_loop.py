"""A tool loop on the OpenAI Responses API with a ``responses`` session, offline.

The official ``openai`` client talks to a mocked HTTP transport (``MockTransport`` of httpx or
httpx2, the library the client is built on), so its real request and response code runs
without a network. Each step: the wire view goes to ``client.responses.create``, the
response's output items and usage are stored, each ``function_call`` gets its
``function_call_output``, and ``process_request()`` compacts before the next call. Every
request body is checked strictly against the SDK's input-item types.
Run: ``python examples/responses_loop.py``.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import openai

try:  # the HTTP library the openai client is built on: httpx2 in newer releases, else httpx
    import httpx2 as httpx
except ImportError:  # pragma: no cover - older openai releases
    import httpx  # type: ignore[no-redef]

from compactstore import CompactStore
from compactstore.formats.sdk_types import check_sdk_types

WINDOW = 8_000
calls = 0


def respond(request: httpx.Request) -> httpx.Response:
    """The fake Responses endpoint: a function call on 4 of 5 requests, else a text answer."""
    global calls
    calls += 1
    body = json.loads(request.content)
    check_sdk_types("responses", body["input"])  # what was sent passes the strict check
    if calls % 5:
        args = json.dumps({"path": f"src/m{calls}.py"})
        output: dict[str, Any] = {
            "type": "function_call",
            "id": f"fc_{calls}",
            "call_id": f"call_{calls}",
            "name": "read_file",
            "arguments": args,
            "status": "completed",
        }
    else:
        output = {
            "type": "message",
            "id": f"msg_{calls}",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "done", "annotations": []}],
        }
    tokens = len(request.content) // 4
    return httpx.Response(
        200,
        json={
            "id": f"resp_{calls}",
            "object": "response",
            "created_at": 0,
            "model": "gpt-test",
            "status": "completed",
            "output": [output],
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "usage": {
                "input_tokens": tokens,
                "output_tokens": 5,
                "total_tokens": tokens + 5,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens_details": {"reasoning_tokens": 0},
            },
        },
    )


def main() -> None:
    client = openai.OpenAI(
        api_key="offline",
        base_url="http://mock/v1",
        http_client=httpx.Client(transport=httpx.MockTransport(respond)),
    )
    store = CompactStore.open(str(Path(tempfile.mkdtemp()) / "loop.db"))
    sess = store.session("loop", context_window=WINDOW, format="responses")
    tool: Any = {
        "type": "function",
        "name": "read_file",
        "description": "Read a file.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
    }
    for task in range(16):
        sess.append({"role": "user", "content": f"refactor module {task}"})
        while True:
            sess.process_request()
            context: Any = sess.active_context()  # Responses input items (the wire view)
            response = client.responses.create(model="gpt-test", input=context, tools=[tool])
            sess.extend(
                [item.model_dump(mode="json", exclude_none=True) for item in response.output]
            )
            assert response.usage is not None
            sess.record_usage(response.usage.input_tokens)
            pending = [item for item in response.output if item.type == "function_call"]
            for call in pending:
                content = f"# {call.arguments}\n" + "def f(): pass\n" * 300
                sess.append(
                    {"type": "function_call_output", "call_id": call.call_id, "output": content}
                )
            if not pending:
                break
    cuts = [c for c in sess.compactions() if c.boundary is not None]
    print(
        f"{calls} model calls, {len(sess.messages())} items stored, {len(cuts)} cuts, "
        f"usage {sess.token_usage()} of {WINDOW}"
    )
    assert sess.token_usage() <= WINDOW
    print("ok")


if __name__ == "__main__":
    main()
