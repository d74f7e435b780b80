"""The three message formats: what they accept, what they reject, and what they build.

Messages built here for anthropic and openai are also checked against the official SDKs'
request types, so a message the adapters accept or create is one the real API takes.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from typing import Any

import pytest

from compactstore.errors import InvalidInputError, InvalidMessageError
from compactstore.formats import (
    FORMAT_NAMES,
    AnthropicFormat,
    MessageFormat,
    MiniCodeFormat,
    OpenAIFormat,
    ToolCall,
    ToolResult,
    get_format,
)
from compactstore.formats.block_types import check_block_types
from compactstore.formats.sdk_types import check_sdk_types

Message = dict[str, Any]

ANTHROPIC = get_format("anthropic")
OPENAI = get_format("openai")
MINICODE = get_format("minicode")


def _tool_use(call_id: str, name: str = "read_file", **input_: Any) -> Message:
    return {"type": "tool_use", "id": call_id, "name": name, "input": input_ or {"path": "a"}}


def _tool_result(call_id: str, content: Any = "ok", **extra: Any) -> Message:
    return {"type": "tool_result", "tool_use_id": call_id, "content": content, **extra}


def _oa_call(call_id: str, name: str = "read_file", arguments: Any = '{"path":"a"}') -> Message:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _mc_result(call_id: str = "t1", **overrides: Any) -> Message:
    message: Message = {
        "role": "tool_result",
        "content": "ok",
        "toolName": "read_file",
        "toolUseId": call_id,
        "isError": False,
    }
    message.update(overrides)
    return message


# --- what each format accepts -------------------------------------------------------------

VALID: list[tuple[MessageFormat, Any]] = [
    (ANTHROPIC, {"role": "user", "content": "hello"}),
    (ANTHROPIC, {"role": "user", "content": [{"type": "text", "text": "hello"}]}),
    (ANTHROPIC, {"role": "user", "content": []}),
    (
        ANTHROPIC,
        {
            "role": "user",
            "content": [
                {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}},
                {"type": "text", "text": "what is this?", "cache_control": {"type": "ephemeral"}},
            ],
        },
    ),
    (ANTHROPIC, {"role": "assistant", "content": ""}),
    (
        ANTHROPIC,
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "sig"},
                {"type": "text", "text": "Reading."},
                _tool_use("a"),
                _tool_use("b", "grep", pattern="x"),
            ],
        },
    ),
    (
        ANTHROPIC,
        {
            "role": "user",
            "content": [
                _tool_result("a", "text", is_error=False),
                _tool_result(
                    "b",
                    [
                        {"type": "text", "text": "x"},
                        {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}},
                    ],
                ),
                {"type": "tool_result", "tool_use_id": "c"},
                {"type": "text", "text": "and keep going"},
            ],
        },
    ),
    (ANTHROPIC, {"role": "user", "content": "x", "_compact_boundary": True}),
    (OPENAI, {"role": "system", "content": "be brief"}),
    (OPENAI, {"role": "developer", "content": [{"type": "text", "text": "be brief"}]}),
    (OPENAI, {"role": "user", "content": "hi", "name": "alice"}),
    (
        OPENAI,
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look"},
                {"type": "image_url", "image_url": {"url": "https://x/y.png"}},
            ],
        },
    ),
    (OPENAI, {"role": "assistant", "content": None, "tool_calls": [_oa_call("c1")]}),
    (OPENAI, {"role": "assistant", "tool_calls": [_oa_call("c1"), _oa_call("c2", "grep")]}),
    (
        OPENAI,
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "no"}, {"type": "refusal", "refusal": "can't"}],
            "refusal": None,
            "audio": None,
        },
    ),
    (
        OPENAI,
        {
            "role": "assistant",
            "content": "ok",
            "tool_calls": [
                {"id": "c9", "type": "custom", "custom": {"name": "patch", "input": "*** diff"}}
            ],
        },
    ),
    (OPENAI, {"role": "assistant", "content": "x", "some_future_key": {"kept": True}}),
    (OPENAI, {"role": "tool", "tool_call_id": "c1", "content": "result"}),
    (OPENAI, {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "r"}]}),
    (MINICODE, {"role": "system", "content": "you are minicode"}),
    (MINICODE, {"role": "user", "content": [{"type": "text", "text": "hi"}]}),
    (MINICODE, {"role": "assistant", "content": "sure"}),
    (MINICODE, {"role": "assistant", "content": [{"type": "text", "text": "x"}, _tool_use("t1")]}),
    (MINICODE, _mc_result()),
    (MINICODE, {"role": "tool_result", "content": "", "toolName": "ls", "toolUseId": "t2"}),
    (MINICODE, {"role": "system", "content": "summary", "_compact_boundary": True}),
]


@pytest.mark.parametrize(("fmt", "message"), VALID)
def test_valid_messages_pass_and_are_not_mutated(fmt: MessageFormat, message: Any) -> None:
    before = copy.deepcopy(message)
    fmt.validate(message)
    assert message == before


# --- what each format rejects, and how it says so -----------------------------------------

INVALID: list[tuple[MessageFormat, Any, str]] = [
    # anthropic
    (ANTHROPIC, "hello", "a message must be a dict, got str"),
    (ANTHROPIC, {"content": "x"}, "message has no 'role'"),
    (ANTHROPIC, {"role": 1, "content": "x"}, "message 'role' must be a string, got int"),
    (
        ANTHROPIC,
        {"role": "robot", "content": "x"},
        "unknown role 'robot' for format anthropic (expected one of: assistant, system, user)",
    ),
    (
        ANTHROPIC,
        {
            "role": "system",
            "content": [{"type": "tool_use", "id": "t", "name": "n", "input": {}}],
        },
        "tool_use blocks are only allowed in assistant messages",
    ),
    (ANTHROPIC, {"role": "user"}, "message has no 'content'"),
    (
        ANTHROPIC,
        {"role": "user", "content": 3},
        "message 'content' must be a string or a list of content blocks, got int",
    ),
    (
        ANTHROPIC,
        {"role": "user", "content": None},
        "message 'content' must be a string or a list of content blocks, got None",
    ),
    (ANTHROPIC, {"role": "user", "content": ["hi"]}, "content[0]: content block must be a dict"),
    (
        ANTHROPIC,
        {"role": "user", "content": [{"text": "hi"}]},
        "content[0]: content block needs a string 'type', got None",
    ),
    (
        ANTHROPIC,
        {"role": "user", "content": [{"type": "text", "text": 5}]},
        "content[0]: text block needs a string 'text', got int",
    ),
    (
        ANTHROPIC,
        {"role": "assistant", "content": [{"type": "tool_use", "name": "x", "input": {}}]},
        "content[0]: tool_use block needs a string 'id', got None",
    ),
    (
        ANTHROPIC,
        {"role": "assistant", "content": [{**_tool_use("a"), "id": ""}]},
        "tool_use block 'id' must not be empty",
    ),
    (
        ANTHROPIC,
        {"role": "assistant", "content": [{**_tool_use("a"), "name": 7}]},
        "tool_use block needs a string 'name', got int",
    ),
    (
        ANTHROPIC,
        {"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "x"}]},
        "tool_use block needs a dict 'input', got None",
    ),
    (
        ANTHROPIC,
        {"role": "assistant", "content": [{**_tool_use("a"), "input": '{"path": "a"}'}]},
        "tool_use block needs a dict 'input', got str",
    ),
    (
        ANTHROPIC,
        {"role": "user", "content": [_tool_use("a")]},
        "tool_use blocks are only allowed in assistant messages (this message's role is 'user')",
    ),
    (
        ANTHROPIC,
        {"role": "assistant", "content": [_tool_result("a")]},
        "tool_result blocks are only allowed in user messages (this message's role is 'assistant')",
    ),
    (
        ANTHROPIC,
        {"role": "user", "content": [{"type": "tool_result", "content": "x"}]},
        "tool_result block needs a string 'tool_use_id', got None",
    ),
    (
        ANTHROPIC,
        {"role": "user", "content": [_tool_result("")]},
        "tool_result block 'tool_use_id' must not be empty",
    ),
    (
        ANTHROPIC,
        {"role": "user", "content": [_tool_result("a", 42)]},
        "tool_result 'content' must be a string or a list of content blocks, got int",
    ),
    (
        ANTHROPIC,
        {"role": "user", "content": [_tool_result("a", [{"type": "text"}])]},
        "tool_result content[0]: text block needs a string 'text', got None",
    ),
    (
        ANTHROPIC,
        {"role": "user", "content": [_tool_result("a", [_tool_use("b")])]},
        "tool_result content may not contain tool_use blocks",
    ),
    (
        ANTHROPIC,
        {"role": "user", "content": [_tool_result("a", is_error="yes")]},
        "tool_result 'is_error' must be a bool, got str",
    ),
    (
        ANTHROPIC,
        {"role": "assistant", "content": [_tool_use("a"), _tool_use("a")]},
        "content[1]: duplicate tool_use id 'a' in one message",
    ),
    (
        ANTHROPIC,
        {"role": "user", "content": [_tool_result("a"), _tool_result("a")]},
        "duplicate tool_result for tool_use_id 'a' in one message",
    ),
    # openai
    (OPENAI, ["role", "user"], "a message must be a dict, got list"),
    (
        OPENAI,
        {"role": "robot", "content": "x"},
        "unknown role 'robot' for format openai "
        "(expected one of: assistant, developer, system, tool, user)",
    ),
    (
        OPENAI,
        {"role": "function", "name": "f", "content": "x"},
        "role 'function' (the deprecated function-calling API) is not supported",
    ),
    (OPENAI, {"role": "user"}, "user message needs 'content'"),
    (OPENAI, {"role": "assistant", "content": None}, "assistant message needs 'content'"),
    (
        OPENAI,
        {"role": "user", "content": 1.5},
        "message 'content' must be a string or a list of content parts, got float",
    ),
    (
        OPENAI,
        {"role": "user", "content": [{"type": "text", "text": None}]},
        "content[0]: text block needs a string 'text', got None",
    ),
    (
        OPENAI,
        {"role": "assistant", "content": [{"type": "refusal", "refusal": 1}]},
        "content[0]: refusal part needs a string 'refusal', got int",
    ),
    (OPENAI, {"role": "tool", "content": "r"}, "tool message needs a string 'tool_call_id'"),
    (
        OPENAI,
        {"role": "tool", "tool_call_id": "", "content": "r"},
        "tool message 'tool_call_id' must not be empty",
    ),
    (
        OPENAI,
        {"role": "tool", "tool_call_id": "c1", "content": {"text": "r"}},
        "message 'content' must be a string or a list of content parts, got dict",
    ),
    (
        OPENAI,
        {"role": "user", "tool_call_id": "c1", "content": "r"},
        "'tool_call_id' is only allowed on tool messages (this message's role is 'user')",
    ),
    (
        OPENAI,
        {"role": "user", "content": "x", "tool_calls": [_oa_call("c1")]},
        "'tool_calls' is only allowed on assistant messages (this message's role is 'user')",
    ),
    (
        OPENAI,
        {"role": "assistant", "tool_calls": {"id": "c1"}},
        "'tool_calls' must be a list, got dict",
    ),
    (
        OPENAI,
        {"role": "assistant", "content": "x", "tool_calls": []},
        "'tool_calls' must not be an empty list",
    ),
    (
        OPENAI,
        {"role": "assistant", "tool_calls": ["c1"]},
        "tool_calls[0]: tool call must be a dict, got str",
    ),
    (
        OPENAI,
        {"role": "assistant", "tool_calls": [{**_oa_call("c1"), "id": ""}]},
        "tool_calls[0]: tool call 'id' must not be empty",
    ),
    (
        OPENAI,
        {"role": "assistant", "tool_calls": [{**_oa_call("c1"), "type": "tool"}]},
        "tool_calls[0]: tool call 'type' must be 'function' or 'custom', got 'tool'",
    ),
    (
        OPENAI,
        {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function"}]},
        "tool_calls[0]: function tool call needs a dict 'function', got None",
    ),
    (
        OPENAI,
        {"role": "assistant", "tool_calls": [_oa_call("c1", name="")]},
        "tool_calls[0]: function tool call 'name' must not be empty",
    ),
    (
        OPENAI,
        {"role": "assistant", "tool_calls": [_oa_call("c1", arguments={"path": "a"})]},
        "tool_calls[0]: function tool call needs a string 'arguments' (JSON text), got dict",
    ),
    (
        OPENAI,
        {"role": "assistant", "tool_calls": [_oa_call("c1"), _oa_call("c1")]},
        "tool_calls[1]: duplicate tool call id 'c1' in one message",
    ),
    (OPENAI, {"role": "user", "content": "x", "name": 3}, "message 'name' must be a string"),
    (
        OPENAI,
        {"role": "assistant", "content": "x", "refusal": 0},
        "message 'refusal' must be a string or null, got int",
    ),
    (
        OPENAI,
        {"role": "assistant", "content": "x", "audio": {"data": "..."}},
        "message 'audio' must be null or a dict with a string 'id'",
    ),
    # minicode
    (MINICODE, None, "a message must be a dict, got None"),
    (
        MINICODE,
        {"role": "robot", "content": "x"},
        "unknown role 'robot' for format minicode "
        "(expected one of: assistant, system, tool_result, user)",
    ),
    (MINICODE, {"role": "tool", "content": "x"}, "unknown role 'tool' for format minicode"),
    (MINICODE, {"role": "assistant"}, "message has no 'content'"),
    (
        MINICODE,
        {"role": "user", "content": {"text": "x"}},
        "message 'content' must be a string or a list of content blocks, got dict",
    ),
    (
        MINICODE,
        {"role": "user", "content": [_tool_use("t1")]},
        "tool_use blocks are only allowed in assistant messages (this message's role is 'user')",
    ),
    (
        MINICODE,
        {"role": "user", "content": [_tool_result("t1")]},
        "tool_result blocks are not used by this format; send the result as a message with "
        "role 'tool_result'",
    ),
    (
        MINICODE,
        {"role": "assistant", "content": [{**_tool_use("t1"), "input": ["a"]}]},
        "content[0]: tool_use block needs a dict 'input', got list",
    ),
    (
        MINICODE,
        {"role": "assistant", "content": [_tool_use("t1"), _tool_use("t1")]},
        "duplicate tool_use id 't1' in one message",
    ),
    (
        MINICODE,
        _mc_result(content=[{"type": "text", "text": "x"}]),
        "tool_result message 'content' must be a string, got list",
    ),
    (
        MINICODE,
        {"role": "tool_result", "content": "x", "toolName": "ls"},
        "tool_result message needs a string 'toolUseId', got None",
    ),
    (MINICODE, _mc_result(""), "tool_result message 'toolUseId' must not be empty"),
    (
        MINICODE,
        {"role": "tool_result", "content": "x", "toolUseId": "t1"},
        "tool_result message needs a string 'toolName', got None",
    ),
    (
        MINICODE,
        _mc_result(isError="false"),
        "tool_result message 'isError' must be a bool, got str",
    ),
]


@pytest.mark.parametrize(("fmt", "message", "problem"), INVALID)
def test_invalid_messages_are_rejected_naming_the_problem(
    fmt: MessageFormat, message: Any, problem: str
) -> None:
    with pytest.raises(InvalidMessageError, match=re.escape(problem)):
        fmt.validate(message)


@pytest.mark.parametrize("fmt", [ANTHROPIC, OPENAI, MINICODE], ids=lambda f: f.name)
def test_every_format_has_at_least_eight_rejection_cases(fmt: MessageFormat) -> None:
    assert sum(1 for f, _, _ in INVALID if f is fmt) >= 8


def test_invalid_message_error_is_an_invalid_input_error() -> None:
    with pytest.raises(InvalidInputError):
        ANTHROPIC.validate(42)


# --- reading messages ---------------------------------------------------------------------


def test_anthropic_extraction() -> None:
    call = {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Let me look."},
            _tool_use("a", path="x.py"),
            {"type": "text", "text": "And search."},
            _tool_use("b", "grep", pattern="TODO"),
        ],
    }
    assert ANTHROPIC.kind(call) == "assistant"
    assert ANTHROPIC.text(call) == "Let me look.\nAnd search."
    assert ANTHROPIC.tool_calls(call) == [
        ToolCall("a", "read_file", {"path": "x.py"}),
        ToolCall("b", "grep", {"pattern": "TODO"}),
    ]
    assert ANTHROPIC.tool_results(call) == []

    results = {
        "role": "user",
        "content": [
            _tool_result("a", "print(1)"),
            _tool_result(
                "b",
                [{"type": "text", "text": "x.py:1"}, {"type": "image", "source": {"k": 1}}],
                is_error=True,
            ),
            {"type": "tool_result", "tool_use_id": "c"},
        ],
    }
    assert ANTHROPIC.kind(results) == "tool"
    assert ANTHROPIC.text(results) == ""
    assert ANTHROPIC.tool_calls(results) == []
    assert ANTHROPIC.tool_results(results) == [
        ToolResult("a", "print(1)", False),
        # Media is not text: its blocks ride along, counted by size (tests/test_media.py).
        ToolResult(
            "b",
            "x.py:1",
            True,
            blocks=[{"type": "text", "text": "x.py:1"}, {"type": "image", "source": {"k": 1}}],
        ),
        ToolResult("c", "", False),
    ]
    assert not ANTHROPIC.is_request(results)


def test_anthropic_kind_of_user_messages() -> None:
    assert ANTHROPIC.kind({"role": "user", "content": "hi"}) == "user"
    assert ANTHROPIC.kind({"role": "user", "content": []}) == "user"
    mixed = {"role": "user", "content": [_tool_result("a"), {"type": "text", "text": "go on"}]}
    assert ANTHROPIC.kind(mixed) == "user"
    assert ANTHROPIC.text(mixed) == "go on"
    assert [r.tool_use_id for r in ANTHROPIC.tool_results(mixed)] == ["a"]
    assert ANTHROPIC.is_request({"role": "user", "content": "fix the bug"})
    assert not ANTHROPIC.is_request({"role": "user", "content": "   "})


def test_openai_extraction() -> None:
    call = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            _oa_call("c1", arguments='{"path": "x.py"}'),
            {"id": "c2", "type": "custom", "custom": {"name": "patch", "input": "*** diff"}},
        ],
    }
    assert OPENAI.kind(call) == "assistant"
    assert OPENAI.text(call) == ""
    assert OPENAI.tool_calls(call) == [
        ToolCall("c1", "read_file", '{"path": "x.py"}'),
        ToolCall("c2", "patch", "*** diff"),
    ]
    assert OPENAI.token_text(call) == 'read_file\n{"path": "x.py"}\npatch\n*** diff'

    tool = {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "a"}] * 2}
    assert OPENAI.kind(tool) == "tool"
    assert OPENAI.text(tool) == ""
    assert OPENAI.tool_results(tool) == [ToolResult("c1", "a\na", False)]
    assert OPENAI.tool_calls(tool) == []

    assert OPENAI.kind({"role": "system", "content": "s"}) == "system"
    assert OPENAI.kind({"role": "developer", "content": "s"}) == "system"
    user = {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image_url"}]}
    assert OPENAI.kind(user) == "user"
    assert OPENAI.text(user) == "hi"
    assert OPENAI.is_request(user)
    assert OPENAI.tool_results(user) == []


def test_minicode_extraction() -> None:
    call = {"role": "assistant", "content": [{"type": "text", "text": "x"}, _tool_use("t1")]}
    assert MINICODE.kind(call) == "assistant"
    assert MINICODE.text(call) == "x"
    assert MINICODE.tool_calls(call) == [ToolCall("t1", "read_file", {"path": "a"})]

    result = _mc_result("t1", content="data", isError=True)
    assert MINICODE.kind(result) == "tool"
    assert MINICODE.text(result) == ""
    assert MINICODE.tool_results(result) == [ToolResult("t1", "data", True)]
    no_flag = {"role": "tool_result", "content": "d", "toolName": "ls", "toolUseId": "t2"}
    assert MINICODE.tool_results(no_flag) == [ToolResult("t2", "d", False)]

    assert MINICODE.kind({"role": "system", "content": "s"}) == "system"
    assert MINICODE.kind({"role": "user", "content": "u"}) == "user"
    assert MINICODE.tool_calls({"role": "user", "content": "u"}) == []


# --- replacing tool results ---------------------------------------------------------------


def test_anthropic_replace_changes_only_the_targeted_result() -> None:
    message: Message = {
        "role": "user",
        "content": [
            _tool_result("a", [{"type": "text", "text": "big"}], is_error=True),
            _tool_result("b", "keep me", cache_control={"type": "ephemeral"}),
            {"type": "text", "text": "note"},
        ],
        "_extra": {"nested": [1]},
    }
    before = copy.deepcopy(message)
    new = ANTHROPIC.replace_tool_results(message, {"a": "[cleared]", "zzz": "unused"})
    assert message == before
    assert new["content"][0] == {
        "type": "tool_result",
        "tool_use_id": "a",
        "content": "[cleared]",
        "is_error": True,
    }
    assert new["content"][1:] == message["content"][1:]
    assert new["_extra"] == message["_extra"]
    # The copy shares nothing mutable with the input.
    new["content"][1]["content"] = "changed"
    new["_extra"]["nested"].append(2)
    assert message == before


def test_replace_leaves_other_messages_equal_but_copied() -> None:
    cases: list[tuple[MessageFormat, Message]] = [
        (ANTHROPIC, {"role": "assistant", "content": [_tool_use("a")]}),
        (OPENAI, {"role": "tool", "tool_call_id": "other", "content": "x"}),
        (MINICODE, _mc_result("other")),
    ]
    for fmt, message in cases:
        new = fmt.replace_tool_results(message, {"a": "gone"})
        assert new == message
        assert new is not message


@pytest.mark.parametrize(
    ("fmt", "message", "read"),
    [
        (
            OPENAI,
            {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "x"}]},
            lambda m: (m["content"], m["tool_call_id"]),
        ),
        (
            MINICODE,
            _mc_result("c1", isError=True, _persisted_path="/tmp/x"),
            lambda m: (m["content"], m["isError"], m["_persisted_path"]),
        ),
    ],
    ids=["openai", "minicode"],
)
def test_replace_tool_result_messages(
    fmt: MessageFormat, message: Message, read: Callable[[Message], tuple[Any, ...]]
) -> None:
    before = copy.deepcopy(message)
    new = fmt.replace_tool_results(message, {"c1": "stub"})
    assert message == before
    assert read(new)[0] == "stub"
    assert read(new)[1:] == read(message)[1:]
    fmt.validate(new)


# --- building messages --------------------------------------------------------------------


def test_builders_anthropic() -> None:
    calls = [ToolCall("a", "read_file", {}), ToolCall("b", "grep", {})]
    assert ANTHROPIC.tool_result_message("a", "out", tool_name="read_file", is_error=False) == {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "a", "content": "out", "is_error": False}
        ],
    }
    assert ANTHROPIC.summary_message("S") == {
        "role": "user",
        "content": [{"type": "text", "text": "S"}],
    }
    [synthetic] = ANTHROPIC.synthetic_results(calls, "interrupted")
    assert ANTHROPIC.tool_results(synthetic) == [
        ToolResult("a", "interrupted", True),
        ToolResult("b", "interrupted", True),
    ]
    assert ANTHROPIC.synthetic_results([], "interrupted") == []


def test_builders_openai() -> None:
    calls = [ToolCall("c1", "read_file", "{}"), ToolCall("c2", "grep", "{}")]
    assert OPENAI.tool_result_message("c1", "out", tool_name="read_file", is_error=False) == {
        "role": "tool",
        "tool_call_id": "c1",
        "content": "out",
    }
    error = OPENAI.tool_result_message("c1", "boom", tool_name="read_file", is_error=True)
    assert error["content"] == "Error: boom"
    assert OPENAI.tool_results(error) == [ToolResult("c1", "Error: boom", False)]
    assert OPENAI.summary_message("S") == {"role": "system", "content": "S"}
    assert OPENAI.synthetic_results(calls, "lost") == [
        {"role": "tool", "tool_call_id": "c1", "content": "lost"},
        {"role": "tool", "tool_call_id": "c2", "content": "lost"},
    ]


def test_builders_minicode() -> None:
    calls = [ToolCall("t1", "read_file", {}), ToolCall("t2", "bash", {})]
    assert MINICODE.tool_result_message("t1", "out", tool_name="read_file", is_error=True) == {
        "role": "tool_result",
        "content": "out",
        "toolName": "read_file",
        "toolUseId": "t1",
        "isError": True,
    }
    assert MINICODE.summary_message("S") == {"role": "system", "content": "S"}
    synthetic = MINICODE.synthetic_results(calls, "lost")
    assert [(m["toolUseId"], m["toolName"], m["isError"]) for m in synthetic] == [
        ("t1", "read_file", True),
        ("t2", "bash", True),
    ]


@pytest.mark.parametrize("fmt", [ANTHROPIC, OPENAI, MINICODE], ids=lambda f: f.name)
def test_built_messages_validate_and_are_deterministic(fmt: MessageFormat) -> None:
    calls = [ToolCall("x1", "read_file", {}), ToolCall("x2", "grep", {})]
    built = [
        fmt.summary_message("summary"),
        *fmt.synthetic_results(calls, "interrupted"),
        fmt.tool_result_message("x1", "out", tool_name="read_file", is_error=True),
        fmt.tool_result_message("x2", "out", tool_name="grep", is_error=False),
    ]
    for message in built:
        fmt.validate(message)
    assert built == [
        fmt.summary_message("summary"),
        *fmt.synthetic_results(calls, "interrupted"),
        fmt.tool_result_message("x1", "out", tool_name="read_file", is_error=True),
        fmt.tool_result_message("x2", "out", tool_name="grep", is_error=False),
    ]
    assert fmt.kind(fmt.summary_message("summary")) in ("system", "user")
    assert fmt.text(fmt.summary_message("summary")) == "summary"


# --- long conversations and the official SDKs ---------------------------------------------

TOOLS = ("read_file", "grep", "bash")


def _turn_calls(turn: int) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (f"call_{turn}_{k}", TOOLS[(turn + k) % 3], {"path": f"src/m{turn}_{k}.py"})
        for k in range(1 + turn % 3)
    ]


def _anthropic_conversation(turns: int) -> list[Message]:
    messages: list[Message] = [{"role": "user", "content": "Refactor the error handling."}]
    for turn in range(turns):
        calls = _turn_calls(turn)
        messages.append(
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": f"Step {turn}."},
                    *({"type": "tool_use", "id": i, "name": n, "input": a} for i, n, a in calls),
                ],
            }
        )
        blocks = [
            {
                "type": "tool_result",
                "tool_use_id": call_id,
                "content": f"contents of {args['path']}"
                if turn % 2
                else [{"type": "text", "text": f"contents of {args['path']}"}],
                "is_error": turn % 5 == 0,
            }
            for call_id, _, args in calls
        ]
        messages.append({"role": "user", "content": blocks})
        messages.append({"role": "assistant", "content": f"Finished step {turn}."})
        messages.append({"role": "user", "content": [{"type": "text", "text": "Continue."}]})
    return messages


def _openai_conversation(turns: int) -> list[Message]:
    messages: list[Message] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Refactor the error handling."},
    ]
    for turn in range(turns):
        calls = _turn_calls(turn)
        messages.append(
            {
                "role": "assistant",
                "content": None if turn % 2 else f"Step {turn}.",
                "tool_calls": [
                    {"id": i, "type": "function", "function": {"name": n, "arguments": repr(a)}}
                    for i, n, a in calls
                ],
            }
        )
        for call_id, name, args in calls:
            messages.append(
                OPENAI.tool_result_message(
                    call_id, f"contents of {args['path']}", tool_name=name, is_error=turn % 5 == 0
                )
            )
        messages.append({"role": "assistant", "content": f"Finished step {turn}."})
        messages.append({"role": "user", "content": [{"type": "text", "text": "Continue."}]})
    return messages


def _minicode_conversation(turns: int) -> list[Message]:
    messages: list[Message] = [
        {"role": "system", "content": "You are MiniCode."},
        {"role": "user", "content": "Refactor the error handling."},
    ]
    for turn in range(turns):
        calls = _turn_calls(turn)
        messages.append(
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": i, "name": n, "input": a} for i, n, a in calls
                ],
            }
        )
        for call_id, name, args in calls:
            messages.append(
                MINICODE.tool_result_message(
                    call_id, f"contents of {args['path']}", tool_name=name, is_error=turn % 5 == 0
                )
            )
        messages.append({"role": "assistant", "content": f"Finished step {turn}."})
        messages.append({"role": "user", "content": "Continue."})
    return messages


CONVERSATIONS: list[tuple[MessageFormat, Callable[[int], list[Message]]]] = [
    (ANTHROPIC, _anthropic_conversation),
    (OPENAI, _openai_conversation),
    (MINICODE, _minicode_conversation),
]


@pytest.mark.parametrize(("fmt", "build"), CONVERSATIONS, ids=lambda x: getattr(x, "name", ""))
def test_fifty_turn_conversation_validates_and_pairs(
    fmt: MessageFormat, build: Callable[[int], list[Message]]
) -> None:
    messages = build(50)
    before = copy.deepcopy(messages)
    call_ids: list[str] = []
    result_ids: list[str] = []
    for message in messages:
        fmt.validate(message)
        call_ids.extend(call.id for call in fmt.tool_calls(message))
        result_ids.extend(result.tool_use_id for result in fmt.tool_results(message))
        fmt.token_text(message)
    assert len(call_ids) == sum(len(_turn_calls(t)) for t in range(50))
    assert result_ids == call_ids
    assert messages == before
    kinds = [fmt.kind(m) for m in messages]
    assert kinds.count("tool") > 0
    assert kinds.count("assistant") == 100


@pytest.fixture(scope="module")
def anthropic_sdk() -> Callable[[list[Message]], None]:
    return lambda messages: check_sdk_types("anthropic", messages)


@pytest.fixture(scope="module")
def openai_sdk() -> Callable[[list[Message]], None]:
    return lambda messages: check_sdk_types("openai", messages)


def _with_built_messages(fmt: MessageFormat, messages: list[Message]) -> list[Message]:
    pending = [ToolCall("pending_1", "bash", {}), ToolCall("pending_2", "grep", {})]
    return [
        *messages,
        fmt.summary_message("## Summary\nEverything so far."),
        *fmt.synthetic_results(pending, "[tool call interrupted]"),
        fmt.tool_result_message("late", "output", tool_name="bash", is_error=True),
        fmt.replace_tool_results(messages[2], {"call_0_0": "[cleared]"}),
    ]


def test_anthropic_conversation_matches_the_sdk(
    anthropic_sdk: Callable[[list[Message]], None],
) -> None:
    anthropic_sdk(_with_built_messages(ANTHROPIC, _anthropic_conversation(50)))


def test_openai_conversation_matches_the_sdk(openai_sdk: Callable[[list[Message]], None]) -> None:
    openai_sdk(_with_built_messages(OPENAI, _openai_conversation(50)))


@pytest.mark.parametrize(
    "bad",
    [
        {"role": "robot", "content": "x"},
        {"role": "user", "content": [{"type": "text"}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "n"}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "content": 1}]},
    ],
)
def test_the_anthropic_sdk_check_is_real(
    anthropic_sdk: Callable[[list[Message]], None], bad: Message
) -> None:
    with pytest.raises(InvalidMessageError):
        anthropic_sdk([{"role": "user", "content": "hi"}, bad])
    with pytest.raises(InvalidMessageError):
        ANTHROPIC.validate(bad)


@pytest.mark.parametrize(
    "bad",
    [
        {"role": "robot", "content": "x"},
        {"role": "tool", "content": "x"},
        {"role": "assistant", "tool_calls": [_oa_call("c1", arguments={"k": 1})]},
        {"role": "system", "content": [{"type": "image_url", "image_url": {"url": "u"}}]},
    ],
)
def test_the_openai_sdk_check_is_real(
    openai_sdk: Callable[[list[Message]], None], bad: Message
) -> None:
    with pytest.raises(InvalidMessageError):
        openai_sdk([{"role": "user", "content": "hi"}, bad])
    with pytest.raises(InvalidMessageError):  # the shape, then the role's part types
        OPENAI.validate(bad)
        check_block_types("openai", bad)


# --- the registry -------------------------------------------------------------------------


def test_get_format_returns_each_adapter() -> None:
    assert FORMAT_NAMES == ("anthropic", "minicode", "openai", "responses")
    assert isinstance(get_format("anthropic"), AnthropicFormat)
    assert isinstance(get_format("openai"), OpenAIFormat)
    assert isinstance(get_format("minicode"), MiniCodeFormat)
    for name in FORMAT_NAMES:
        assert get_format(name).name == name
        assert get_format(name) is get_format(name)


@pytest.mark.parametrize("name", ["gemini", "Anthropic", "", "open ai"])
def test_get_format_rejects_unknown_names(name: str) -> None:
    with pytest.raises(
        InvalidInputError,
        match=re.escape(
            f"unknown message format {name!r} "
            "(expected one of: anthropic, minicode, openai, responses)"
        ),
    ):
        get_format(name)


def test_get_format_rejects_non_strings() -> None:
    with pytest.raises(InvalidInputError, match="unknown message format None"):
        get_format(None)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="unknown message format"):
        get_format(["anthropic"])  # type: ignore[arg-type]
