"""The shared SDK validation helper: the official types, strictly."""

from __future__ import annotations

import sys
from typing import Any

import pytest
from pydantic import TypeAdapter

from compactstore.errors import InvalidInputError, InvalidMessageError, MissingExtraError
from compactstore.formats.sdk_types import (
    SDK_FORMATS,
    check_sdk_types,
    request_params_problems,
    request_type,
    sdk_problems,
)

# (format, a request the plain TypeAdapter accepts, what the strict helper says about it)
SLIPS_THROUGH: list[tuple[str, list[dict[str, Any]], str]] = [
    ("anthropic", [{"role": "user", "content": "hi", "name": "me"}], "undeclared key 'name'"),
    (
        "anthropic",
        [{"role": "user", "content": [{"type": "tool_result", "content": "x"}]}],
        "missing required key 'tool_use_id'",
    ),
    (
        "anthropic",
        [
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t", "content": "x", "is_error": None}
                ],
            }
        ],
        "is_error: null is not allowed",
    ),
    (
        "openai",
        [{"role": "tool", "tool_call_id": "c", "content": "x", "name": "bash"}],
        "undeclared key 'name'",
    ),
    (
        "responses",
        [{"type": "function_call_output", "call_id": "c", "output": "x", "created_by": "u"}],
        "undeclared key 'created_by'",
    ),
    (
        "responses",
        [{"type": "reasoning", "id": "r", "summary": [{"type": "summary_text"}]}],
        "missing required key 'text'",
    ),
    (
        "responses",
        [
            {
                "type": "message",
                "role": "assistant",
                "id": "m",
                "status": "completed",
                "content": [{"type": "output_text", "text": "x", "annotations": None}],
            }
        ],
        "annotations: null is not allowed",
    ),
]


def plain_list_of(item_type: Any) -> TypeAdapter[list[Any]]:
    """Pydantic's own validation of a list of the SDK's items, with no further check."""
    return TypeAdapter(list[item_type])


@pytest.mark.parametrize(("fmt", "request_items", "problem"), SLIPS_THROUGH)
def test_the_helper_refuses_what_plain_validation_lets_through(
    fmt: str, request_items: list[dict[str, Any]], problem: str
) -> None:
    # Plain pydantic validation of the SDK's TypedDicts takes it...
    plain_list_of(request_type(fmt)).validate_python(request_items)
    # ...the helper does not, and says where and why.
    problems = sdk_problems(fmt, request_items)
    assert any(problem in p for p in problems), problems
    with pytest.raises(InvalidMessageError, match=f"the {fmt} SDK types refuse"):
        check_sdk_types(fmt, request_items)


FUNCTION = {"name": "f", "arguments": "{}"}


@pytest.mark.parametrize(
    ("fmt", "request_items"),
    [
        (
            "anthropic",
            [
                {"role": "user", "content": "hi"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "hm", "signature": "sig"},
                        {"type": "tool_use", "id": "t1", "name": "bash", "input": {"cmd": "ls"}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "t1", "content": "a"},
                        {"type": "text", "text": "go on", "cache_control": {"type": "ephemeral"}},
                    ],
                },
            ],
        ),
        (
            "openai",
            [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "hi"}]},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"id": "c", "type": "function", "function": FUNCTION}],
                },
                {"role": "tool", "tool_call_id": "c", "content": "out"},
            ],
        ),
        (
            "responses",
            [
                {"role": "user", "content": "hi"},
                {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "e"},
                {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c", "output": "out"},
                # Required but nullable keys: null is what the type allows.
                {
                    "type": "code_interpreter_call",
                    "id": "ci",
                    "code": None,
                    "container_id": "k",
                    "outputs": None,
                    "status": "completed",
                },
            ],
        ),
    ],
)
def test_valid_requests_pass(fmt: str, request_items: list[dict[str, Any]]) -> None:
    assert sdk_problems(fmt, request_items) == []
    check_sdk_types(fmt, request_items)


def test_an_unknown_block_type_is_named_with_the_allowed_ones() -> None:
    problems = sdk_problems("anthropic", [{"role": "user", "content": [{"type": "banana"}]}])
    assert len(problems) == 1
    assert "unknown type 'banana'" in problems[0]
    assert "tool_result" in problems[0]


def test_a_wrong_leaf_type_and_a_bad_literal_are_refused() -> None:
    assert sdk_problems(
        "responses", [{"type": "function_call", "call_id": "c", "name": "f", "arguments": {}}]
    ) == ["[0].arguments: expected str, got dict"]
    problems = sdk_problems("openai", [{"role": "robot", "content": "x"}])
    assert problems and "unknown role 'robot'" in problems[0]
    assert sdk_problems("openai", {"role": "user"}) == [  # type: ignore[arg-type]
        "the request must be a list of items, got dict"
    ]


def test_request_params_are_checked_as_keyword_arguments() -> None:
    good = {"system": "be brief", "messages": [{"role": "user", "content": "hi"}]}
    assert request_params_problems("anthropic", good) == []
    bad_system = {"system": [{"type": "text", "text": "x", "x": 1}], "messages": []}
    assert request_params_problems("anthropic", bad_system) == [
        "system: system[0]: undeclared key 'x' (TextBlockParam declares: text, type, "
        "cache_control, citations)"
    ]
    assert request_params_problems("responses", {"messages": []}) == [
        "undeclared parameter 'messages'",
        "missing parameter 'input'",
    ]


def test_minicode_has_no_sdk_type() -> None:
    assert "minicode" not in SDK_FORMATS
    with pytest.raises(InvalidInputError, match="no official SDK type"):
        sdk_problems("minicode", [])


@pytest.mark.parametrize(("fmt", "module"), [("anthropic", "anthropic"), ("responses", "openai")])
def test_without_the_sdk_the_error_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, fmt: str, module: str
) -> None:
    for name in list(sys.modules):
        if name == module or name.startswith(f"{module}."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(MissingExtraError, match=rf"compactstore\[{module}\]"):
        check_sdk_types(fmt, [])
