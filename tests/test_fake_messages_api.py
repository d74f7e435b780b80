"""The strict fake of the Messages API (tests/fake_messages_api.py): one test per rule of
its RULES list, each showing a request that breaks the rule refused as the API refuses it
(400, the provider's error shape, through the official SDK), and the valid form accepted."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.fake_messages_api import (
    BINDING_BETA,
    CONTEXT_MANAGEMENT_BETA,
    RULES,
    FakeMessagesAPI,
    fake_client,
)

anthropic = pytest.importorskip("anthropic")

NEW = "claude-opus-5-5"
OLD = "claude-sonnet-4-5"
TOOLS = [
    {"name": "read_file", "description": "Read a file", "input_schema": {"type": "object"}},
]
SYSTEM = "You are a careful coding agent."


def _create(client: Any, messages: list[dict[str, Any]], **kwargs: Any) -> Any:
    options: dict[str, Any] = {"model": NEW, "max_tokens": 1_024, "system": SYSTEM, "tools": TOOLS}
    options.update(kwargs)
    return client.messages.create(messages=messages, **options)


def _loop(client: Any, steps: int, **kwargs: Any) -> list[dict[str, Any]]:
    """A valid conversation of ``steps`` replies, sent back exactly as returned."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Fix the failing tests."}]
    for _ in range(steps):
        reply = _create(client, messages, **kwargs)
        content = [block.model_dump(exclude_none=True) for block in reply.content]
        messages.append({"role": "assistant", "content": content})
        calls = [b for b in content if b["type"] == "tool_use"]
        if not calls:
            messages.append({"role": "user", "content": "Next: the docs."})
            continue
        messages.append(
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": c["id"], "content": "x = 1\n" * 400}
                    for c in calls
                ],
            }
        )
    return messages


def _refused(client: Any, messages: list[dict[str, Any]], rule: str, **kwargs: Any) -> str:
    api: FakeMessagesAPI = client._fake
    with pytest.raises(anthropic.BadRequestError) as caught:
        _create(client, messages, **kwargs)
    assert caught.value.status_code == 400
    body = caught.value.body
    assert (
        body["type"] == "invalid_request_error"
        or body.get("error", {}).get("type") == "invalid_request_error"
    )
    assert api.errors[-1]["rule"] == rule
    message: str = api.errors[-1]["message"]
    return message


@pytest.fixture
def client() -> Any:
    client, api = fake_client(anthropic)
    client._fake = api
    return client


def test_rules_are_one_named_list() -> None:
    names = [rule.name for rule in RULES]
    assert len(names) == len(set(names)) >= 9
    assert all(rule.doc for rule in RULES)


def test_valid_loop_passes_every_rule(client: Any) -> None:
    messages = _loop(client, 8)
    assert client._fake.errors == []
    assert any(
        b["type"] == "thinking" for m in messages if m["role"] == "assistant" for b in m["content"]
    )
    reply = _create(client, messages)
    assert reply.content[0].type == "thinking"


def test_roles(client: Any) -> None:
    assert "first message" in _refused(client, [{"role": "assistant", "content": "hi"}], "roles")


def test_beta_fields(client: Any) -> None:
    messages = [{"role": "user", "content": "hi"}]
    binding = {"type": "adaptive", "block_binding": {"prefix_mismatch_behavior": "drop_block"}}
    text = _refused(client, messages, "beta_fields", thinking=binding)
    assert BINDING_BETA in text
    edits = {"edits": [{"type": "clear_tool_uses_20250919"}]}
    text = _refused(client, messages, "beta_fields", extra_body={"context_management": edits})
    assert CONTEXT_MANAGEMENT_BETA in text


def test_tool_pairing(client: Any) -> None:
    messages = _loop(client, 2)
    broken = copy.deepcopy(messages)
    broken[2]["content"][0]["tool_use_id"] = "toolu_nobody"
    assert "tool_use` ids were found without" in _refused(client, broken, "tool_pairing")
    reordered = copy.deepcopy(messages)
    reordered[2]["content"].insert(0, {"type": "text", "text": "note"})
    assert "must come first" in _refused(client, reordered, "tool_pairing")


def test_signature(client: Any) -> None:
    messages = _loop(client, 2)
    edited = copy.deepcopy(messages)
    edited[1]["content"][0]["thinking"] += " (edited)"
    assert "Invalid `signature`" in _refused(client, edited, "signature")


def test_prefix_check_refuses_a_changed_prefix(client: Any) -> None:
    messages = _loop(client, 3)
    cleared = copy.deepcopy(messages)
    cleared[2]["content"][0]["content"] = "[cleared]"  # an earlier tool result shortened
    text = _refused(client, cleared, "prefix_check")
    assert "bound to a different conversation" in text
    assert text.startswith("messages.3.content.0")
    # The system prompt is part of every block's prefix too.
    _refused(client, messages, "prefix_check", system=SYSTEM + " Today is Friday.")


def test_prefix_check_ignores_cache_control_and_removal_from_the_ends(client: Any) -> None:
    messages = _loop(client, 4)
    marked = copy.deepcopy(messages)
    marked[2]["content"][0]["cache_control"] = {"type": "ephemeral"}
    _create(client, marked)
    no_first = copy.deepcopy(messages)  # the oldest thinking block left out
    no_first[1]["content"] = [b for b in no_first[1]["content"] if b["type"] != "thinking"]
    _create(client, no_first)
    assert client._fake.errors == []
    between = copy.deepcopy(messages)  # one between others left out
    between[3]["content"] = [b for b in between[3]["content"] if b["type"] != "thinking"]
    _refused(client, between, "prefix_check")


@pytest.mark.slow
def test_prefix_check_drop_block_drops_it_and_every_later_one(client: Any) -> None:
    messages = _loop(client, 4)
    cleared = copy.deepcopy(messages)
    cleared[4]["content"][0]["content"] = "[cleared]"
    binding = {"type": "adaptive", "block_binding": {"prefix_mismatch_behavior": "drop_block"}}
    reply = client.beta.messages.create(
        model=NEW,
        max_tokens=1_024,
        system=SYSTEM,
        tools=TOOLS,
        messages=cleared,
        thinking=binding,
        betas=[BINDING_BETA],
    )
    paths = [t.path for t in reply.input_transformations]
    assert paths == ["messages.5.content.0", "messages.7.content.0"]
    assert {t.reason for t in reply.input_transformations} == {"prefix_binding_mismatch"}
    assert client._fake.dropped == 2


def test_prefix_check_only_on_models_that_run_it(client: Any) -> None:
    messages = _loop(client, 3, model=OLD, thinking={"type": "enabled", "budget_tokens": 2_000})
    cleared = copy.deepcopy(messages)
    cleared[2]["content"][0]["content"] = "[cleared]"
    _create(client, cleared, model=OLD, thinking={"type": "enabled", "budget_tokens": 2_000})
    assert client._fake.errors == []


def test_thinking_continuation(client: Any) -> None:
    messages = _loop(client, 2)
    stripped = copy.deepcopy(messages)  # the turn in progress without its thinking
    stripped[3]["content"] = [b for b in stripped[3]["content"] if b["type"] != "thinking"]
    text = _refused(client, stripped, "thinking_continuation")
    assert "must start with a thinking block" in text


def test_context_management_clears_server_side(client: Any) -> None:
    messages = _loop(client, 6)
    edits = [
        {
            "type": "clear_tool_uses_20250919",
            "trigger": {"type": "input_tokens", "value": 1_000},
            "keep": {"type": "tool_uses", "value": 2},
        }
    ]
    reply = client.beta.messages.create(
        model=NEW,
        max_tokens=1_024,
        system=SYSTEM,
        tools=TOOLS,
        messages=messages,
        context_management={"edits": edits},
        betas=[CONTEXT_MANAGEMENT_BETA],
    )
    applied = reply.context_management.applied_edits
    assert applied[0].type == "clear_tool_uses_20250919"
    results = sum(
        b["type"] == "tool_result"
        for m in messages
        if m["role"] == "user" and isinstance(m["content"], list)
        for b in m["content"]
    )
    assert applied[0].cleared_tool_uses == results - 2
    assert applied[0].cleared_input_tokens > 0
    # Server-side edits are no change to the prefix: the same history goes on being valid.
    assert client._fake.errors == []
    wrong = [{"type": "clear_tool_uses_20250919"}, {"type": "clear_thinking_20251015"}]
    text = _refused(
        client,
        messages,
        "context_management",
        extra_body={"context_management": {"edits": wrong}},
        extra_headers={"anthropic-beta": CONTEXT_MANAGEMENT_BETA},
    )
    assert "must be the first edit" in text


def test_context_window() -> None:
    client, api = fake_client(anthropic, default_window=4_000)
    client._fake = api
    messages = [{"role": "user", "content": "word " * 20_000}]
    assert "prompt is too long" in _refused(client, messages, "context_window")


def test_prompt_cache_ttls_on_the_simulated_clock(client: Any) -> None:
    api: FakeMessagesAPI = client._fake
    long = "def f():\n    return 1\n" * 600
    system = [{"type": "text", "text": long, "cache_control": {"type": "ephemeral"}}]
    messages = [{"role": "user", "content": "hi"}]
    first = _create(client, messages, system=system)
    assert first.usage.cache_creation_input_tokens > 1_024
    assert first.usage.cache_creation.ephemeral_5m_input_tokens > 0
    api.advance(200)
    second = _create(client, messages, system=system)
    assert second.usage.cache_read_input_tokens == first.usage.cache_creation_input_tokens
    api.advance(299)  # a read refreshed the 5 minutes
    assert _create(client, messages, system=system).usage.cache_read_input_tokens > 0
    api.advance(301)
    assert _create(client, messages, system=system).usage.cache_read_input_tokens == 0
    hour = [
        {"type": "text", "text": long + "#", "cache_control": {"type": "ephemeral", "ttl": "1h"}}
    ]
    assert _create(client, messages, system=hour).usage.cache_creation.ephemeral_1h_input_tokens
    api.advance(3_000)
    assert _create(client, messages, system=hour).usage.cache_read_input_tokens > 0
    five_then_hour = [
        {"type": "text", "text": long, "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "more", "cache_control": {"type": "ephemeral", "ttl": "1h"}},
    ]
    assert "must not come after" in _refused(
        client, messages, "prompt_cache", system=five_then_hour
    )
    many = [
        {"type": "text", "text": str(n), "cache_control": {"type": "ephemeral"}} for n in range(5)
    ]
    assert "maximum of 4" in _refused(client, messages, "prompt_cache", system=many)
