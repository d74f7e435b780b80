"""``request_params()`` kept up to date step by step: after any sequence of appends,
compactions, rollbacks and config changes it equals the request built from the rows, and
what it hands out is the caller's to pass to an SDK (which copies it and changes nothing)."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import anthropic
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compactstore import CompactStore, Session
from compactstore._context.caching import min_cacheable_tokens
from compactstore._context.request_view import RequestView
from compactstore.formats.request import build_request_params
from tests.helpers import Chat, new_session, plain, scratch_store, words
from tests.mock_http import anthropic_message, chat_completion, sdk_client

OPS = st.sampled_from(
    [
        *("user", "tool", "big_tool", "calls", "result", "thinking", "process", "compact"),
        *("rollback", "config", "flip", "system"),
    ]
)


def reference(store: CompactStore, sess: Session, cache_control: bool) -> dict[str, Any]:
    """The request built the long way, from the rows (a store that never saw the session)."""
    other = CompactStore.open(store.location)
    try:
        fresh = other.get_session(sess.id)
        context = fresh.context()
        return build_request_params(
            fresh.adapter,
            fresh.config,
            context.items,
            context.messages(),
            cache_control=cache_control,
            min_tokens=min_cacheable_tokens(fresh.model),
        )
    finally:
        other.close()


def thinking_turn(chat: Chat, n: int) -> None:
    call = chat.new_id()
    chat.add(
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": f"plan {n}", "signature": f"sig{n}"},
                {"type": "tool_use", "id": call, "name": "bash", "input": {"n": n}},
            ],
        }
    )
    chat.result(call, f"done {n}", name="bash")


def apply(chat: Chat, store: CompactStore, op: str, n: int) -> None:
    sess = chat.sess
    if op == "user":
        chat.user(f"step {n}: " + words(80, f"u{n}"))
    elif op == "tool":
        chat.tool(words(120, f"t{n}"))
    elif op == "big_tool":
        chat.tool(words(6_000, f"b{n}"))
    elif op == "calls":  # two calls, one answered: the next result merges with it
        _, ids = chat.calls([("bash", {"n": n}), ("grep", {"q": n})])
        chat.result(ids[0], f"first {n}")
    elif op == "result":
        open_ids = list(sess.context().unanswered)
        if open_ids:
            chat.result(open_ids[-1], f"result {n}")
    elif op == "thinking":
        thinking_turn(chat, n)
    elif op == "process":
        sess.process_request(now=chat.tick(3_600))
    elif op == "compact":
        if len(sess.context().kept) > 4:
            sess.compact(now=chat.tick())
    elif op == "rollback":
        if sess.boundaries():
            sess.rollback(now=chat.tick())
    elif op == "config":
        keep = 1 + n % 3
        chat.sess = store.session(
            sess.id, config=plain(microcompact_keep_recent=keep, preserved_thinking=n % 2 == 0)
        )
    elif op == "system":
        chat.add({"role": "system", "content": f"rule {n}"})


KNOBS = st.tuples(
    st.sampled_from(["5m", "1h"]),  # ttl
    st.sampled_from([0, 50, 2_000]),  # min_tokens
    st.sampled_from([None, 1, 2]),  # server_clear
    st.sampled_from([None, {"type": "adaptive"}]),  # thinking=
    st.sampled_from([None, {"anthropic-beta": "b1"}]),  # extra_headers=
)


@pytest.mark.slow
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(OPS, KNOBS), min_size=1, max_size=25), st.booleans())
def test_after_any_steps_the_request_equals_the_one_built_from_the_rows(
    steps: list[tuple[str, tuple[Any, ...]]], cache_control: bool
) -> None:
    probe = RequestView()  # the same context, the breakpoint knobs the session never turns
    with scratch_store() as store:
        chat = new_session(store, "anthropic", context_window=12_000)
        chat.system("You are terse.")
        chat.request("Fix the bug")
        for n, (op, (ttl, min_tokens, server_clear, thinking, headers)) in enumerate(steps):
            if op == "flip":
                cache_control = not cache_control
            else:
                apply(chat, store, op, n)
            params = chat.sess.request_params(
                cache_control, thinking=thinking, extra_headers=headers, now=chat.clock
            )
            expected = reference(store, chat.sess, cache_control)
            assert params["messages"] == expected["messages"], (n, op)
            assert params.get("system") == expected.get("system"), (n, op)
            other = CompactStore.open(store.location)
            try:
                fresh = other.get_session(chat.sess.id).request_params(
                    cache_control, thinking=thinking, extra_headers=headers, now=chat.clock
                )
            finally:
                other.close()
            assert params == fresh, (n, op)
            context = chat.sess.context()
            knobs = {"ttl": ttl, "min_tokens": min_tokens, "server_clear": server_clear}
            built = build_request_params(
                context.fmt,
                chat.sess.config,
                context.items,
                context.messages(),
                cache_control=cache_control,
                **knobs,
            )
            probed = probe.params(context, chat.sess.config, cache_control=cache_control, **knobs)
            assert probed == built, (n, op, knobs)


def responses_turn(chat: Chat, n: int, size: int) -> None:
    call = f"fc_{n}"
    chat.extend(
        [
            {"type": "reasoning", "id": f"rs_{n}", "summary": []},
            {"type": "function_call", "call_id": call, "name": "bash", "arguments": "{}"},
            {"type": "function_call_output", "call_id": call, "output": words(size, f"o{n}")},
        ]
    )


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["openai", "responses"])
def test_other_formats_equal_the_request_built_from_the_rows(fmt: str) -> None:
    with scratch_store() as store:
        chat = new_session(store, fmt, context_window=12_000)
        chat.system("You are terse.")
        chat.request("Fix the bug")
        for n, op in enumerate(["tool", "big_tool", "user", "process", "tool", "compact", "tool"]):
            if fmt == "responses" and op.endswith("tool"):
                responses_turn(chat, n, 6_000 if op == "big_tool" else 100)
            else:
                apply(chat, store, op, n)
            params = chat.sess.request_params(True)
            assert params == reference(store, chat.sess, True), (n, op)


def test_an_append_changes_only_the_tail_and_the_moved_breakpoints() -> None:
    with scratch_store() as store:
        chat = new_session(store, "anthropic", config=plain())
        chat.system("You are terse.")
        chat.request("Fix the bug")
        for i in range(6):
            chat.tool(words(300, f"r{i}"))
        before = chat.sess.request_params(cache_control=True)["messages"]
        chat.tool(words(300, "new"))
        after = chat.sess.request_params(cache_control=True)["messages"]
        assert after == reference(store, chat.sess, True)["messages"]
        assert len(after) == len(before) + 2

        def marked(message: Any) -> bool:
            return "cache_control" in json.dumps(message)

        # Every message but those a breakpoint left or reached is the one sent before.
        unmarked = [i for i in range(len(before)) if not marked(before[i]) and not marked(after[i])]
        assert len(unmarked) >= len(before) - 4
        assert all(after[i] is before[i] for i in unmarked)


@pytest.mark.slow
def test_the_caller_may_change_the_dict_and_list_not_the_shared_messages() -> None:
    with scratch_store() as store:
        chat = new_session(store, "anthropic")
        chat.request("Fix the bug")
        chat.tool("ok")
        params = chat.sess.request_params(cache_control=True)
        params["messages"].append({"role": "user", "content": "extra"})
        params["tools"] = []
        with pytest.raises(TypeError):
            params["messages"][0]["content"] = "changed"
        again = chat.sess.request_params(cache_control=True)
        assert len(again["messages"]) == len(params["messages"]) - 1
        assert again == chat.sess.request_params(cache_control=True)


@pytest.mark.slow
def test_the_sdks_send_the_read_only_messages_as_they_are() -> None:
    with scratch_store() as store:
        chat = new_session(store, "anthropic")
        chat.system("You are terse.")
        chat.request("Fix the bug")
        thinking_turn(chat, 1)
        chat.tool(words(200, "r"))
        params = chat.sess.request_params(cache_control=True, thinking={"type": "adaptive"})
        snapshot = json.dumps(params, sort_keys=True)
        reply = anthropic_message([{"type": "text", "text": "ok"}])
        client, seen = sdk_client(anthropic, lambda _: reply)
        client.messages.create(model="claude-sonnet-4-5", max_tokens=10, **params)
        client.beta.messages.create(model="claude-sonnet-4-5", max_tokens=10, **params)
        assert json.dumps(params, sort_keys=True) == snapshot
        assert seen.bodies[0]["messages"] == json.loads(json.dumps(params["messages"]))

        chat = new_session(store, "openai", sid="o")
        chat.request("Fix the bug")
        chat.tool("ok")
        params = chat.sess.request_params()
        client, seen = sdk_client(openai, lambda _: chat_completion("ok"))
        client.chat.completions.create(model="gpt-5", **params)
        assert seen.bodies[0]["messages"] == json.loads(json.dumps(params["messages"]))

        chat = new_session(store, "responses", sid="r")
        chat.request("Fix the bug")
        responses_turn(chat, 1, 100)
        params = chat.sess.request_params()
        client, seen = sdk_client(openai, lambda _: {"error": "not read"})
        with contextlib.suppress(Exception):  # the reply is not a response: sent is enough
            client.responses.create(model="gpt-5", **params)
        assert seen.bodies[0]["input"] == json.loads(json.dumps(params["input"]))
