"""The strict fake of the Responses API (tests/fake_responses_api.py) refuses what the
documentation says the API refuses: one test per rule of its RULES list, each through the
official SDK, plus the answers it gives a valid request."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from tests.fake_responses_api import RULES, FakeResponsesAPI, fake_client

openai = pytest.importorskip("openai")

MODEL = "gpt-5"
TOOLS = [{"type": "function", "name": "read_file", "parameters": {"type": "object"}}]
INCLUDE = ["reasoning.encrypted_content"]


def _turn(client: Any, items: list[dict[str, Any]], **extra: Any) -> list[dict[str, Any]]:
    """One call; its output items appended to ``items``, each function call answered."""
    response = client.responses.create(
        model=MODEL, input=items, tools=TOOLS, include=INCLUDE, store=False, **extra
    )
    output = [item.model_dump(mode="json", exclude_none=True) for item in response.output]
    items = [*items, *output]
    for item in output:
        if item["type"] == "function_call":
            items.append(
                {"type": "function_call_output", "call_id": item["call_id"], "output": "ok\n" * 50}
            )
    return items


@pytest.fixture
def fake() -> tuple[Any, FakeResponsesAPI, list[dict[str, Any]]]:
    client, api = fake_client(openai, window=20_000)
    items = _turn(client, [{"role": "user", "content": "Fix the failing tests."}])
    items = _turn(client, items)
    assert api.errors == []
    return client, api, items


def _first(items: list[dict[str, Any]], kind: str) -> int:
    return next(i for i, item in enumerate(items) if item.get("type") == kind)


def _compacted(client: Any, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The new window ``responses.compact`` returns, as sent (JSON)."""
    raw = client.responses.with_raw_response.compact(model=MODEL, input=items)
    output: list[dict[str, Any]] = json.loads(raw.http_response.text)["output"]
    return output


# Each rule: a violation of it, made from a valid conversation (client, api, items) -> the
# request's keyword arguments.
def _unknown_field(client: Any, api: FakeResponsesAPI, items: list[dict[str, Any]]) -> Any:
    window = _compacted(client, items)
    window[-1]["summary"] = "readable"
    return {"input": window}


def _reasoning_alone(client: Any, api: FakeResponsesAPI, items: list[dict[str, Any]]) -> Any:
    i = _first(items, "reasoning")
    return {"input": [*items[: i + 1], {"role": "user", "content": "go on"}]}


def _orphan_output(client: Any, api: FakeResponsesAPI, items: list[dict[str, Any]]) -> Any:
    i = _first(items, "function_call")
    return {"input": [item for j, item in enumerate(items) if j not in (i - 1, i)]}


def _edited_content(client: Any, api: FakeResponsesAPI, items: list[dict[str, Any]]) -> Any:
    i = _first(items, "reasoning")
    item = dict(items[i])
    item["encrypted_content"] = item["encrypted_content"][:-3] + "abc"
    return {"input": [*items[:i], item, *items[i + 1 :]]}


def _bad_threshold(client: Any, api: FakeResponsesAPI, items: list[dict[str, Any]]) -> Any:
    return {"input": items, "context_management": [{"type": "compaction", "compact_threshold": 5}]}


def _too_long(client: Any, api: FakeResponsesAPI, items: list[dict[str, Any]]) -> Any:
    return {"input": [*items, {"role": "user", "content": "word " * 90_000}]}


def _nothing_to_compact(client: Any, api: FakeResponsesAPI, items: list[dict[str, Any]]) -> Any:
    return {"compact": True, "input": _compacted(client, items)[-1:]}


def _two_breakpoints(client: Any, api: FakeResponsesAPI, items: list[dict[str, Any]]) -> Any:
    return {"input": items}  # no violation possible: checked by the cache figures below


VIOLATIONS: dict[str, tuple[Callable[..., Any], str | None]] = {
    "input_items": (_unknown_field, "unknown_parameter"),
    "reasoning_order": (_reasoning_alone, "invalid_value"),
    "call_pairing": (_orphan_output, "invalid_value"),
    "encrypted_content": (_edited_content, "invalid_encrypted_content"),
    "context_management": (_bad_threshold, "invalid_value"),
    "context_window": (_too_long, "context_length_exceeded"),
    "compact_request": (_nothing_to_compact, "invalid_value"),
}


def test_every_rule_has_a_test() -> None:
    assert set(VIOLATIONS) | {"prompt_cache"} == {rule.name for rule in RULES}
    assert all(rule.doc for rule in RULES)


@pytest.mark.parametrize("rule", sorted(VIOLATIONS))
def test_the_fake_refuses_a_violation(rule: str, fake: Any) -> None:
    client, api, items = fake
    make, code = VIOLATIONS[rule]
    kwargs = make(client, api, items)
    api.errors.clear()
    with pytest.raises(openai.BadRequestError) as raised:
        if kwargs.pop("compact", False):
            client.responses.compact(model=MODEL, **kwargs)
        else:
            client.responses.create(model=MODEL, tools=TOOLS, store=False, **kwargs)
    assert raised.value.status_code == 400
    assert [error["rule"] for error in api.errors] == [rule]
    assert api.errors[0]["code"] == code and api.errors[0]["type"] == "invalid_request_error"


def test_a_function_call_without_its_output_is_refused(fake: Any) -> None:
    client, api, items = fake
    i = _first(items, "function_call_output")
    with pytest.raises(openai.BadRequestError, match="No tool output found"):
        client.responses.create(model=MODEL, input=items[:i] + items[i + 1 :])
    assert api.errors[-1]["rule"] == "call_pairing"


def test_a_rotated_key_or_another_model_cannot_read_the_content(fake: Any) -> None:
    client, api, items = fake
    with pytest.raises(openai.BadRequestError, match="could not be verified"):
        client.responses.create(model="o3", input=items)
    window = _compacted(client, items)
    client.responses.create(model=MODEL, input=window)  # reads as issued
    api.revoke(window[-1]["id"])
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model=MODEL, input=window)
    api.rotate_key()
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model=MODEL, input=items)
    assert {error["code"] for error in api.errors} == {"invalid_encrypted_content"}


def test_compact_is_retried_while_overloaded(fake: Any) -> None:
    client, api, items = fake
    api.unavailable = 1
    with pytest.raises(openai.InternalServerError) as raised:
        client.responses.compact(model=MODEL, input=items)
    assert raised.value.status_code == 503 and api.errors[-1]["rule"] == "compact_request"
    window = _compacted(client, items)
    assert [item["type"] for item in window] == ["message", "compaction"]
    assert window[0]["content"] == [{"type": "input_text", "text": "Fix the failing tests."}]


def test_server_side_compaction_puts_the_item_first_and_the_model_goes_on(fake: Any) -> None:
    client, api, items = fake
    items = [*items, {"role": "user", "content": "context " * 1_000}]
    managed = [{"type": "compaction", "compact_threshold": 1_000}]
    response = client.responses.create(
        model=MODEL, input=items, include=INCLUDE, store=False, context_management=managed
    )
    kinds = [item.type for item in response.output]
    assert kinds[0] == "compaction" and kinds[1] == "reasoning" and len(kinds) == 3
    # The next request may drop what came before the item: the model sees the item on.
    output = [item.model_dump(mode="json", exclude_none=True) for item in response.output]
    later = [*output]
    if output[-1]["type"] == "function_call":
        later.append(
            {"type": "function_call_output", "call_id": output[-1]["call_id"], "output": "ok"}
        )
    nxt = client.responses.create(model=MODEL, input=later, include=INCLUDE, store=False)
    # The 2,000 tokens of context the item summarised are not read again.
    assert nxt.usage is not None and nxt.usage.input_tokens < 1_000
    assert api.errors == [] and len(api.compactions) == 1


def test_the_prompt_cache_reads_the_prefix_sent_before(fake: Any) -> None:
    client, api, items = fake
    big = [*items, {"role": "user", "content": "context " * 2_000}]
    first = client.responses.create(model=MODEL, input=big)
    second = client.responses.create(model=MODEL, input=[*big, {"role": "user", "content": "more"}])
    assert first.usage.input_tokens_details.cached_tokens == 0
    assert second.usage.input_tokens_details.cached_tokens >= 2_000
    api.advance(3_600)  # the cache expired
    third = client.responses.create(model=MODEL, input=big)
    assert third.usage.input_tokens_details.cached_tokens == 0
