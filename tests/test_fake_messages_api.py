"""The strict fake of the Messages API (tests/fake_messages_api.py): one test per rule of
its RULES list, each showing a request that breaks the rule refused as the API refuses it
(400, the provider's error shape, through the official SDK), and the valid form accepted."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.fake_messages_api import (
    BINDING_BETA,
    COMPACTION_BETA,
    CONTEXT_MANAGEMENT_BETA,
    RULES,
    THRESHOLD_COMPACTION_BETA,
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


# -- compaction ----------------------------------------------------------------------------


def _compact(client: Any, messages: list[dict[str, Any]], **kwargs: Any) -> Any:
    options: dict[str, Any] = {
        "model": NEW,
        "max_tokens": 1_024,
        "system": SYSTEM,
        "tools": TOOLS,
        "compaction": {"type": "summarize"},
        "betas": [COMPACTION_BETA],
    }
    options.update(kwargs)
    return client.beta.messages.create(messages=messages, **options)


def _beta(client: Any, messages: list[dict[str, Any]], **kwargs: Any) -> Any:
    options: dict[str, Any] = {
        "model": NEW,
        "max_tokens": 1_024,
        "system": SYSTEM,
        "tools": TOOLS,
        "betas": [COMPACTION_BETA],
    }
    options.update(kwargs)
    return client.beta.messages.create(messages=messages, **options)


def _typed_refusal(client: Any, call: Any, kind: str, rule: str, status: int = 400) -> str:
    api: FakeMessagesAPI = client._fake
    with pytest.raises(anthropic.APIStatusError) as caught:
        call()
    assert caught.value.status_code == status
    assert api.errors[-1]["rule"] == rule
    assert api.errors[-1]["type"] == kind
    message: str = api.errors[-1]["message"]
    return message


def _turn_start(messages: list[dict[str, Any]], n: int) -> int:
    """The index of the n-th user message that is a new instruction (not tool results)."""
    starts = [
        i
        for i, m in enumerate(messages)
        if m["role"] == "user"
        and not (isinstance(m["content"], list) and m["content"][0]["type"] == "tool_result")
    ]
    return starts[n]


def _history(client: Any, tasks: int) -> list[dict[str, Any]]:
    """A conversation of ``tasks`` finished tasks (each a tool loop), then a new instruction."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Fix the failing tests."}]
    while (
        sum(1 for m in messages if m["role"] == "user" and isinstance(m["content"], str)) <= tasks
    ):
        reply = _create(client, messages)
        content = [block.model_dump(exclude_none=True) for block in reply.content]
        messages.append({"role": "assistant", "content": content})
        calls = [b for b in content if b["type"] == "tool_use"]
        if calls:
            results = [
                {"type": "tool_result", "tool_use_id": c["id"], "content": "y = 2\n" * 300}
                for c in calls
            ]
            messages.append({"role": "user", "content": results})
        else:
            messages.append({"role": "user", "content": f"Task {len(messages)}: next."})
    return messages


@pytest.mark.slow
def test_compaction_on_demand_then_the_block_first_in_place_of_what_it_summarised(
    client: Any,
) -> None:
    messages = _history(client, 2)
    cut = _turn_start(messages, 1)  # keep the second task's tool loop, thinking and all
    assert any(
        b["type"] == "thinking"
        for m in messages[cut:]
        for b in m["content"]
        if m["role"] == "assistant"
    )
    reply = _compact(client, messages[:cut])
    assert reply.stop_reason == "compaction"
    assert [b.type for b in reply.content] == ["compaction"]
    block = reply.content[0].model_dump(exclude_none=True)
    assert block["content"].startswith("<summary>") and block["signature"]
    assert reply.usage.iterations[0].type == "compaction"
    assert reply.usage.iterations[0].input_tokens > 0
    assert reply.usage.input_tokens == 0  # the compaction is billed in its iteration only
    # A block of another conversation in their place: the kept thinking is bound elsewhere.
    other, _ = _summarised(client)
    foreign = [{"role": "assistant", "content": [other]}, *messages[cut:]]
    with pytest.raises(anthropic.BadRequestError, match="different conversation"):
        _beta(client, foreign)
    swapped = [{"role": "assistant", "content": [block]}, *messages[cut:]]
    kept = len(swapped)
    for _ in range(4):  # the loop goes on after the block: it and every thinking block valid
        answer = _beta(client, swapped)
        content = [b.model_dump(exclude_none=True) for b in answer.content]
        swapped.append({"role": "assistant", "content": content})
        calls = [b for b in content if b["type"] == "tool_use"]
        follow: Any = [
            {"type": "tool_result", "tool_use_id": c["id"], "content": "ok"} for c in calls
        ]
        swapped.append({"role": "user", "content": follow or "Go on."})
    assert len(client._fake.errors) == 1
    assert kept < len(swapped)
    # A breakpoint on the block is no change to it.
    marked = copy.deepcopy(swapped)
    marked[0]["content"][0]["cache_control"] = {"type": "ephemeral"}
    _beta(client, marked)
    assert len(client._fake.errors) == 1
    # A second compaction summarises the block with what followed it.
    again = _compact(client, swapped[:-1] if swapped[-1]["content"] == "Go on." else swapped)
    assert again.content[0].type == "compaction"


def test_compaction_beta(client: Any) -> None:
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    text = _typed_refusal(
        client,
        lambda: _compact(client, messages, betas=[]),
        "invalid_request_error",
        "compaction_beta",
    )
    assert COMPACTION_BETA in text
    both = {"edits": [{"type": "clear_tool_uses_20250919"}]}
    text = _typed_refusal(
        client,
        lambda: _compact(
            client,
            messages,
            context_management=both,
            betas=[COMPACTION_BETA, CONTEXT_MANAGEMENT_BETA],
        ),
        "invalid_request_error",
        "compaction_beta",
    )
    assert "context_management" in text


def _summarised(client: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(an on-demand block, what it summarised)."""
    messages = [
        {"role": "user", "content": "Name the entities of a recipe app."},
        {"role": "assistant", "content": "Recipe, Ingredient and Step."},
    ]
    reply = _compact(client, messages)
    return reply.content[0].model_dump(exclude_none=True), messages


def test_compaction_placement(client: Any) -> None:
    block, _ = _summarised(client)
    new = {"role": "user", "content": "Add a Tag entity."}
    second: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": "Hi."}, block]}
    ]
    text = _typed_refusal(
        client, lambda: _beta(client, second), "compaction_block_misplaced", "compaction_placement"
    )
    assert "first block" in text
    later: list[dict[str, Any]] = [new, {"role": "assistant", "content": [block]}, new]
    _typed_refusal(
        client, lambda: _beta(client, later), "compaction_block_misplaced", "compaction_placement"
    )
    twice: list[dict[str, Any]] = [
        {"role": "assistant", "content": [block]},
        {"role": "user", "content": [block]},
    ]
    text = _typed_refusal(
        client, lambda: _beta(client, twice), "compaction_block_misplaced", "compaction_placement"
    )
    assert "at most one" in text
    _beta(client, [{"role": "assistant", "content": [block]}, new])
    _beta(client, [{"role": "user", "content": [block, {"type": "text", "text": "Add a Tag."}]}])
    assert client._fake.errors[-1]["rule"] == "compaction_placement"  # the three refusals only
    assert len(client._fake.errors) == 3


def test_compaction_signature(client: Any) -> None:
    block, _ = _summarised(client)
    new = {"role": "user", "content": "Add a Tag entity."}
    edited = {**block, "content": block["content"].replace("Summary", "Résumé")}
    text = _typed_refusal(
        client,
        lambda: _beta(client, [{"role": "assistant", "content": [edited]}, new]),
        "compaction_signature_invalid",
        "compaction_signature",
    )
    assert "exactly as it was returned" in text
    forged = {**block, "signature": block["signature"][:-4] + "abcd"}
    _typed_refusal(
        client,
        lambda: _beta(client, [{"role": "assistant", "content": [forged]}, new]),
        "compaction_signature_invalid",
        "compaction_signature",
    )
    text = _typed_refusal(
        client,
        lambda: _beta(client, [{"role": "assistant", "content": [block]}, new], model=OLD),
        "compaction_signature_invalid",
        "compaction_signature",
    )
    assert "cannot be read" in text


def test_compaction_content(client: Any) -> None:
    block, summarised = _summarised(client)
    again = [{"role": "assistant", "content": [block]}, *summarised]
    text = _typed_refusal(
        client,
        lambda: _beta(client, again),
        "compaction_content_mismatch",
        "compaction_content",
    )
    assert "in their place" in text


def test_compaction_request(client: Any) -> None:
    block, _ = _summarised(client)
    text = _typed_refusal(
        client,
        lambda: _compact(client, [{"role": "assistant", "content": [block]}]),
        "compaction_nothing_to_summarize",
        "compaction_request",
    )
    assert "nothing to summarise" in text
    messages = _loop(client, 2)[:-1]  # ends with an assistant turn whose calls are open
    assert any(b["type"] == "tool_use" for b in messages[-1]["content"])
    text = _typed_refusal(
        client, lambda: _compact(client, messages), "invalid_request_error", "compaction_request"
    )
    assert "no results" in text
    client._fake.unavailable = 1
    done = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    _typed_refusal(
        client,
        lambda: _compact(client, done),
        "compaction_unavailable",
        "compaction_request",
        status=529,
    )
    assert _compact(client, done).stop_reason == "compaction"  # up again
    # A documented failure: 200, no content, a stop reason other than "compaction".
    client._fake.compaction_failures.append("refusal")
    failed = _compact(client, done)
    assert failed.content == [] and failed.stop_reason == "refusal"


@pytest.mark.slow
def test_compaction_at_a_threshold_in_the_response(client: Any) -> None:
    messages = _loop(client, 5)
    edit = {"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 2_000}}
    with pytest.raises(anthropic.BadRequestError):
        _beta(client, messages, context_management={"edits": [edit]})
    assert "compact-2026-01-12" in client._fake.errors[-1]["message"]
    reply = _beta(
        client,
        messages,
        context_management={"edits": [edit]},
        betas=[THRESHOLD_COMPACTION_BETA],
    )
    content = [b.model_dump(exclude_none=True) for b in reply.content]
    assert [b["type"] for b in content[:2]] == ["compaction", "thinking"]
    assert [i.type for i in reply.usage.iterations] == ["compaction", "message"]
    before = reply.usage.iterations[0].input_tokens
    assert reply.usage.input_tokens < before  # sampled on the compacted context
    # Appended as usual: the API drops what came before the block, thinking stays valid.
    history = [*messages, {"role": "assistant", "content": content}]
    calls = [b for b in content if b["type"] == "tool_use"]
    history.append(
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": c["id"], "content": "z"} for c in calls
            ]
            or "Go on.",
        }
    )
    n = len(client._fake.errors)
    big = {"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 100_000}}
    after = _beta(
        client, history, context_management={"edits": [big]}, betas=[THRESHOLD_COMPACTION_BETA]
    )
    assert len(client._fake.errors) == n
    assert after.content[0].type == "thinking"
    assert after.usage.input_tokens < before
