"""An Anthropic tool loop on compactstore, runnable offline: the official client talks to a
scripted stand-in for the Messages API over a mocked HTTP transport. Use anthropic.Anthropic()
instead to talk to Claude; the loop itself does not change."""

import json

import anthropic

try:  # the HTTP library the SDK is built on: httpx, or httpx2 in newer releases
    import httpx2 as httpx
except ImportError:
    import httpx

from compactstore import CompactStore


def fake_messages_api(request):  # reads three files, one tool call per turn, then answers
    turn = sum(m["role"] == "assistant" for m in json.loads(request.content)["messages"])
    read = {
        "type": "tool_use",
        "id": f"toolu_{turn}",
        "name": "read_file",
        "input": {"path": f"payments/module_{turn}.py"},
    }
    content = [read] if turn < 3 else [{"type": "text", "text": "Done: errors are typed now."}]
    usage = {
        "input_tokens": 3,
        "output_tokens": 40,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": len(request.content) // 4,
    }
    return httpx.Response(
        200,
        json={
            "id": f"msg_{turn}",
            "type": "message",
            "role": "assistant",
            "model": "claude-sonnet-4-5",
            "content": content,
            "stop_reason": "tool_use" if turn < 3 else "end_turn",
            "stop_sequence": None,
            "usage": usage,
        },
    )


def run_tool(name, tool_input):
    return "\n".join(f"def handler_{i}(): ...  # {tool_input['path']}" for i in range(80))


client = anthropic.Anthropic(
    api_key="offline", http_client=httpx.Client(transport=httpx.MockTransport(fake_messages_api))
)

# The agent loop: everything below is the glue a real agent needs.
store = CompactStore.open("agent.db")  # creates or upgrades the schema
sess = store.session("task-42", context_window=200_000, format="anthropic")
sess.append({"role": "user", "content": "Refactor the error handling of payments/"})
while True:
    sess.process_request()  # budget, microcompact, auto-compact
    reply = client.messages.create(
        model="claude-sonnet-4-5", max_tokens=4096, **sess.request_params(cache_control=True)
    )
    sess.append_response(reply)  # stores the assistant turn, records the prompt's real size
    calls = [block for block in reply.content if block.type == "tool_use"]
    for call in calls:
        output = run_tool(call.name, call.input)
        sess.append_tool_result(call.id, output, tool_name=call.name, file_path=call.input["path"])
    if not calls:
        break
print(reply.content[0].text, f"({sess.token_usage():,} tokens in context)")
store.close()
