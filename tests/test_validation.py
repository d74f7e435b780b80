"""Bad input: every refusal is a CompactStoreError with a message that says what
is wrong, and the database is exactly as it was before the call.

The table runs against one prepared store per backend: each case must leave it unchanged,
which is the point of the test, so sharing it costs nothing and keeps the table fast.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import inspect

from compactstore import (
    CompactionConfig,
    CompactStore,
    CompactStoreError,
    ConflictError,
    InvalidInputError,
    InvalidMessageError,
    NotFoundError,
    Session,
)
from tests.conftest import BACKENDS, Snapshot, fresh_database
from tests.helpers import TABLES

Message = dict[str, Any]
Action = Callable[[Session], object]


def call_message(fmt: str, *ids: str, **input_: Any) -> Message:
    """An assistant message making one tool call per id, spelled in the session's format."""
    if fmt == "openai":
        return {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": "read_file", "arguments": json.dumps(input_)},
                }
                for call_id in ids
            ],
        }
    return {
        "role": "assistant",
        "content": [
            {"type": "tool_use", "id": call_id, "name": "read_file", "input": input_}
            for call_id in ids
        ],
    }


def result_message(fmt: str, call_id: str, content: Any = "ok") -> Message:
    if fmt == "anthropic":
        return {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call_id, "content": content}],
        }
    if fmt == "openai":
        return {"role": "tool", "tool_call_id": call_id, "content": content}
    return {
        "role": "tool_result",
        "content": content,
        "toolName": "read_file",
        "toolUseId": call_id,
        "isError": False,
    }


def user(content: Any) -> Message:
    return {"role": "user", "content": content}


# -- one prepared store per backend ---------------------------------------------------------


@pytest.fixture(scope="module", params=BACKENDS)
def prepared(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Session]]:
    """Sessions of each format with an answered call 't1' and a pending call 't2'."""
    directory = tmp_path_factory.mktemp("validation")
    with fresh_database(request.param, directory, "validation") as url:
        yield from _prepare(url)


def _prepare(url: str) -> Iterator[dict[str, Session]]:
    store = CompactStore.open(url)
    try:
        sessions: dict[str, Session] = {}
        for fmt in ("anthropic", "openai", "minicode"):
            sess = store.session(f"v-{fmt}", format=fmt, now=0.0)
            if fmt != "anthropic":
                sess.append({"role": "system", "content": "system prompt"})
            sess.append(user("start"))
            sess.append(call_message(fmt, "t1", path="a.py"))
            sess.append(result_message(fmt, "t1"))
            sess.append(call_message(fmt, "t2", path="b.py"))
            sessions[fmt] = sess
        sessions["small"] = store.session(
            "v-small", config=CompactionConfig(max_message_bytes=2_048), now=0.0
        )
        yield sessions
    finally:
        store.close()


def _case(
    fmt: str,
    action: Action,
    error: type[CompactStoreError],
    match: str,
    id: str,
    marks: Any = (),
) -> Any:
    return pytest.param(fmt, action, error, match, id=id, marks=marks)


def wrong(value: object) -> Any:
    """A value of the wrong type, passed on purpose (the check under test refuses it)."""
    return value


def appending_at(stamp: Any) -> Action:
    return lambda s: s.append(user("x"), timestamp=stamp)


CASES = [
    # -- shape ---------------------------------------------------------------------------
    _case(
        "anthropic",
        lambda s: s.append(wrong("hello")),
        InvalidMessageError,
        r"a message must be a dict, got str",
        "not-a-dict",
    ),
    _case(
        "openai",
        lambda s: s.append(wrong([{"role": "user", "content": "x"}])),
        InvalidMessageError,
        r"a message must be a dict, got list",
        "a-list",
    ),
    _case(
        "minicode",
        lambda s: s.append({"content": "x"}),
        InvalidMessageError,
        r"message has no 'role'",
        "missing-role",
    ),
    _case(
        "anthropic",
        lambda s: s.append({"role": "robot", "content": "x"}),
        InvalidMessageError,
        r"unknown role 'robot' for format anthropic \(expected one of: assistant, system, user\)",
        "unknown-role",
    ),
    _case(
        "openai",
        lambda s: s.append({"role": "tool_result", "content": "x"}),
        InvalidMessageError,
        r"unknown role 'tool_result' for format openai",
        "unknown-role-openai",
    ),
    _case(
        "anthropic",
        lambda s: s.append({"role": "system", "content": [{"type": "text", "text": 3}]}),
        InvalidMessageError,
        r"text block needs a string 'text', got int",
        "system-text-not-a-string-in-anthropic",
    ),
    _case(
        "anthropic",
        lambda s: s.append(user(42)),
        InvalidMessageError,
        r"'content' must be a string or a list of content blocks, got int",
        "content-int",
    ),
    _case(
        "openai",
        lambda s: s.append(user(42)),
        InvalidMessageError,
        r"'content' must be a string or a list of content parts, got int",
        "content-int-openai",
    ),
    _case(
        "minicode",
        lambda s: s.append(result_message("minicode", "t2", content=42)),
        InvalidMessageError,
        r"tool_result message 'content' must be a string, got int",
        "content-int-minicode-result",
    ),
    _case(
        "anthropic",
        lambda s: s.append(user([{"text": "no type"}])),
        InvalidMessageError,
        r"content\[0\]: content block needs a string 'type', got None",
        "block-without-type",
    ),
    _case(
        "anthropic",
        lambda s: s.append(
            {"role": "assistant", "content": [{"type": "tool_use", "name": "f", "input": {}}]}
        ),
        InvalidMessageError,
        r"content\[0\]: tool_use block needs a string 'id', got None",
        "tool-use-without-id",
    ),
    _case(
        "openai",
        lambda s: s.append(
            {
                "role": "assistant",
                "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": ""}}],
            }
        ),
        InvalidMessageError,
        r"tool_calls\[0\]: tool call needs a string 'id', got None",
        "tool-call-without-id-openai",
    ),
    _case(
        "anthropic",
        lambda s: s.append(user([{"type": "tool_use", "id": "u1", "name": "f", "input": {}}])),
        InvalidMessageError,
        r"tool_use blocks are only allowed in assistant messages",
        "tool-use-in-user-message",
    ),
    _case(
        "openai",
        lambda s: s.append({"role": "tool", "content": "x"}),
        InvalidMessageError,
        r"tool message needs a string 'tool_call_id'",
        "tool-message-without-call-id",
    ),
    _case(
        "minicode",
        lambda s: s.append(
            user([{"type": "tool_result", "tool_use_id": "t2", "content": "anthropic style"}])
        ),
        InvalidMessageError,
        r"tool_result blocks are not used by this format",
        "anthropic-result-in-minicode",
    ),
    # -- pairing -------------------------------------------------------------------------
    *[
        _case(
            fmt,
            lambda s: s.append(result_message(s.format, "ghost")),
            InvalidMessageError,
            r"tool result for 'ghost', but no tool call with that id was made in session",
            f"result-of-unknown-call-{fmt}",
        )
        for fmt in ("anthropic", "openai", "minicode")
    ],
    *[
        _case(
            fmt,
            lambda s: s.append_tool_result("ghost", "content", tool_name="read_file"),
            InvalidMessageError,
            r"tool result for 'ghost', but no tool call with that id",
            f"append_tool_result-of-unknown-call-{fmt}",
        )
        for fmt in ("anthropic", "openai", "minicode")
    ],
    _case(
        "anthropic",
        lambda s: s.append(call_message("anthropic", "t1")),
        InvalidMessageError,
        r"duplicate tool call id 't1' in session 'v-anthropic'",
        "duplicate-call-id-across-messages",
    ),
    _case(
        "openai",
        lambda s: s.append(call_message("openai", "t2")),
        InvalidMessageError,
        r"duplicate tool call id 't2' in session 'v-openai'",
        "duplicate-pending-call-id-openai",
    ),
    _case(
        "anthropic",
        lambda s: s.append(call_message("anthropic", "t9", "t9")),
        InvalidMessageError,
        r"content\[1\]: duplicate tool_use id 't9' in one message",
        "duplicate-call-id-in-one-message",
    ),
    _case(
        "openai",
        lambda s: s.append(call_message("openai", "t9", "t9")),
        InvalidMessageError,
        r"tool_calls\[1\]: duplicate tool call id 't9' in one message",
        "duplicate-call-id-in-one-message-openai",
    ),
    _case(
        "minicode",
        lambda s: s.extend([call_message("minicode", "t8"), call_message("minicode", "t8")]),
        InvalidMessageError,
        r"message 1: duplicate tool call id 't8'",
        "duplicate-call-id-in-one-batch",
    ),
    _case(
        "anthropic",
        lambda s: s.append(result_message("anthropic", "t1")),
        InvalidMessageError,
        r"tool call 't1' already has a result",
        "second-result",
    ),
    _case(
        "openai",
        lambda s: s.append_tool_result("t1", "again", tool_name="read_file"),
        InvalidMessageError,
        r"tool call 't1' already has a result",
        "second-result-append_tool_result",
    ),
    _case(
        "minicode",
        lambda s: s.extend([result_message("minicode", "t2"), result_message("minicode", "t2")]),
        InvalidMessageError,
        r"message 1: tool call 't2' already has a result",
        "second-result-in-one-batch",
    ),
    _case(
        "anthropic",
        lambda s: s.append(
            user(
                [
                    {"type": "tool_result", "tool_use_id": "t2", "content": "a"},
                    {"type": "tool_result", "tool_use_id": "t2", "content": "b"},
                ]
            )
        ),
        InvalidMessageError,
        r"duplicate tool_result for tool_use_id 't2' in one message",
        "two-results-in-one-message",
    ),
    _case(
        "anthropic",
        lambda s: s.append(
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t2"}]},
            pinned=True,
        ),
        InvalidMessageError,
        r"a message with tool calls or results cannot be pinned",
        "pinned-tool-result",
    ),
    _case(
        "openai",
        lambda s: s.append(call_message("openai", "t7"), pinned=True),
        InvalidMessageError,
        r"cannot be pinned",
        "pinned-tool-call",
    ),
    _case(
        "anthropic",
        lambda s: s.append(user("x"), pinned=wrong("yes")),
        InvalidInputError,
        r"pinned must be True or False",
        "pinned-not-a-bool",
    ),
    # -- values JSON cannot hold ---------------------------------------------------------
    _case(
        "anthropic",
        lambda s: s.append(call_message("anthropic", "t5", paths={"a.py", "b.py"})),
        InvalidMessageError,
        r"message is not JSON-serialisable: Object of type set",
        "set-in-input",
    ),
    _case(
        "minicode",
        lambda s: s.append(call_message("minicode", "t5", handle=object())),
        InvalidMessageError,
        r"message is not JSON-serialisable: Object of type object",
        "object-in-input",
    ),
    _case(
        "anthropic",
        lambda s: s.append(call_message("anthropic", "t5", limit=math.nan)),
        InvalidMessageError,
        r"message is not JSON-serialisable: Out of range float values",
        "nan-in-input",
    ),
    _case(
        "minicode",
        lambda s: s.append(call_message("minicode", "t5", limit=math.inf)),
        InvalidMessageError,
        r"not JSON-serialisable",
        "infinity-in-input",
    ),
    _case(
        "openai",
        lambda s: s.append(user("broken \ud800 text")),
        InvalidMessageError,
        r"message text is not valid Unicode \(a lone surrogate",
        "lone-surrogate",
    ),
    _case(
        "anthropic",
        lambda s: s.append_tool_result("t2", "bad \udfff", tool_name="read_file"),
        InvalidInputError,
        r"tool result content is not valid Unicode text \(a lone surrogate",
        "lone-surrogate-tool-result",
    ),
    _case(
        "small",
        lambda s: s.append(user("x" * 3_000)),
        InvalidMessageError,
        r"message is \d+ bytes, over the limit of 2048 \(CompactionConfig.max_message_bytes\)",
        "over-max-message-bytes",
    ),
    _case(
        "small",
        lambda s: s.extend([user("fine"), user("é" * 1_100)]),
        InvalidMessageError,
        r"message 1: message is \d+ bytes, over the limit of 2048",
        "over-max-message-bytes-utf8-in-batch",
    ),
    # -- timestamps ----------------------------------------------------------------------
    *[
        _case(
            "anthropic",
            appending_at(stamp),
            InvalidInputError,
            match,
            f"timestamp-{label}",
        )
        for stamp, label, match in [
            ("yesterday", "text", r"timestamp must be a number of epoch seconds, got 'yesterday'"),
            (math.nan, "nan", r"timestamp must be a finite, non-negative number, got nan"),
            (
                -1,
                "negative",
                r"timestamp must be epoch seconds between 0 and 253402300799 .*got -1",
            ),
            (True, "bool", r"timestamp must be a number of epoch seconds, got True"),
        ]
    ],
    _case(
        "openai",
        lambda s: s.extend([user("a"), user("b")], timestamps=[1.0]),
        InvalidInputError,
        r"timestamps must be a list as long as messages",
        "extend-timestamps-wrong-length",
    ),
    _case(
        "openai",
        lambda s: s.extend([user("a"), user("b")], timestamps=[1.0, wrong("later")]),
        InvalidInputError,
        r"timestamp must be a number of epoch seconds, got 'later'",
        "extend-bad-timestamp",
    ),
    _case(
        "openai",
        lambda s: s.extend(wrong(user("a"))),
        InvalidInputError,
        r"extend\(\) takes a list of messages",
        "extend-a-dict",
    ),
    # -- append_tool_result arguments ------------------------------------------------------
    _case(
        "minicode",
        lambda s: s.append_tool_result("t2", wrong({"lines": 3}), tool_name="read_file"),
        InvalidInputError,
        r"tool result content must be a string or a list of content blocks, got dict",
        "tool-result-content-not-a-string",
    ),
    _case(
        "minicode",
        lambda s: s.append_tool_result("", "x", tool_name="read_file"),
        InvalidInputError,
        r"tool_use_id must be a non-empty string",
        "tool-result-empty-id",
    ),
    _case(
        "openai",
        lambda s: s.append_tool_result("t2", "x", tool_name="read_file", file_path=""),
        InvalidInputError,
        r"file_path must be a non-empty string",
        "tool-result-empty-file-path",
    ),
    _case(
        "anthropic",
        lambda s: s.append_tool_result("t2", "x", tool_name="r", is_error=wrong("no")),
        InvalidInputError,
        r"is_error must be True or False",
        "tool-result-is-error-not-a-bool",
    ),
    # -- text kept in its own column (not inside the JSON payload) ------------------------
    _case(
        "anthropic",
        lambda s: s.append(call_message("anthropic", "c" * 300)),
        InvalidMessageError,
        r"tool call id is longer than 255 characters",
        "tool-call-id-300-chars",
    ),
    _case(
        "openai",
        lambda s: s.append(result_message("openai", "r" * 300)),
        InvalidMessageError,
        r"tool result id is longer than 255 characters",
        "tool-result-id-300-chars",
    ),
    _case(
        "minicode",
        lambda s: s.append(
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "n1", "name": "read\x00file", "input": {}}],
            }
        ),
        InvalidMessageError,
        r"tool name contains a NUL character",
        "tool-name-nul",
    ),
    _case(
        "openai",
        lambda s: s.append_tool_result("t2", "x", tool_name="t" * 300),
        InvalidInputError,
        r"tool_name is longer than 255 characters",
        "append_tool_result-tool-name-300-chars",
    ),
    _case(
        "anthropic",
        lambda s: s.remember("gossip", "x"),
        InvalidInputError,
        r"unknown memory kind 'gossip'",
        "memory-unknown-kind",
    ),
    _case(
        "anthropic",
        lambda s: s.remember("fact", "x", scope="team\x00"),
        InvalidInputError,
        r"scope",
        "memory-scope-nul",
    ),
    _case(
        "anthropic",
        lambda s: s.remember("fact", "x", scope="team\ud800"),
        InvalidInputError,
        r"scope",
        "memory-scope-lone-surrogate",
    ),
    # -- sessions ------------------------------------------------------------------------
    _case(
        "anthropic",
        lambda s: s.store.session("new", format="gemini"),
        InvalidInputError,
        r"unknown message format 'gemini' "
        r"\(expected one of: anthropic, minicode, openai, responses\)",
        "unknown-session-format",
    ),
    _case(
        "anthropic",
        lambda s: s.store.session("new", context_window=0),
        InvalidInputError,
        r"context_window \(tokens\) must be between 1000 and \d+, got 0",
        "context-window-zero",
    ),
    _case(
        "anthropic",
        lambda s: s.store.session("new", context_window=wrong("big")),
        InvalidInputError,
        r"context_window \(tokens\) must be a whole number, got 'big'",
        "context-window-text",
    ),
    _case(
        "anthropic",
        lambda s: s.store.session("new", config=wrong({"max_message_bytes": 2048})),
        InvalidInputError,
        r"config must be a CompactionConfig",
        "config-not-a-model",
    ),
    _case(
        "openai",
        lambda s: s.store.session("v-openai", format="anthropic"),
        ConflictError,
        r"session 'v-openai' exists with format 'openai'; it cannot be reopened as 'anthropic'",
        "existing-session-other-format",
    ),
    _case(
        "anthropic",
        lambda s: s.store.session(""),
        InvalidInputError,
        r"session id must be a non-empty string, got ''",
        "session-id-empty",
    ),
    _case(
        "anthropic",
        lambda s: s.store.session("a\x00b"),
        InvalidInputError,
        r"contains control characters",
        "session-id-nul",
    ),
    _case(
        "anthropic",
        lambda s: s.store.session("s" * 300),
        InvalidInputError,
        r"session id is longer than 255 characters",
        "session-id-300-chars",
    ),
    _case(
        "anthropic",
        lambda s: s.store.session(wrong(42)),
        InvalidInputError,
        r"session id must be a non-empty string, got 42",
        "session-id-not-a-string",
    ),
    _case(
        "anthropic",
        lambda s: s.get_blob(wrong("1")),
        InvalidInputError,
        r"blob id must be a whole number, got '1'",
        "blob-id-text",
    ),
    _case(
        "anthropic",
        lambda s: s.get_blob(10**20),
        NotFoundError,
        r"no blob",
        "blob-id-beyond-any-integer-column",
    ),
    _case(
        "anthropic",
        lambda s: s.store.session("huge-window", context_window=3_000_000_000),
        InvalidInputError,
        r"context_window",
        "context-window-beyond-any-integer-column",
    ),
    _case(
        "anthropic",
        lambda s: s.invalidate(""),
        InvalidInputError,
        r"file_path must be a non-empty string",
        "invalidate-empty-path",
    ),
]


@pytest.mark.parametrize(("fmt", "action", "error", "match"), CASES)
def test_bad_input_raises_a_clear_error_and_stores_nothing(
    prepared: dict[str, Session],
    db_snapshot: Snapshot,
    fmt: str,
    action: Action,
    error: type[CompactStoreError],
    match: str,
) -> None:
    sess = prepared[fmt]
    before = db_snapshot(sess.store)

    with pytest.raises(error, match=match) as caught:
        action(sess)

    assert type(caught.value) is error
    assert isinstance(caught.value, CompactStoreError)
    assert db_snapshot(sess.store) == before


def test_the_table_covers_every_format_and_enough_cases() -> None:
    formats = {param.values[0] for param in CASES}
    assert {"anthropic", "openai", "minicode"} <= formats
    assert len(CASES) >= 24


# -- ids are data, never SQL or paths -------------------------------------------------------


@pytest.mark.parametrize(
    "session_id",
    [
        pytest.param("x'; DROP TABLE messages; --", id="sql"),
        pytest.param('"); DELETE FROM sessions; --', id="sql-double-quote"),
        pytest.param("../../etc/passwd", id="path"),
        pytest.param("C:\\Windows\\system32 %s %(x)s {0}", id="backslash-and-format"),
    ],
)
def test_a_session_id_with_sql_or_path_characters_is_just_an_id(
    store: CompactStore, tmp_path: Path, session_id: str
) -> None:
    files_before = sorted(p.name for p in tmp_path.iterdir())
    sess = store.session(session_id, format="openai", now=0.0)
    sess.append(user("hi"))
    sess.append({"role": "assistant", "content": "hello"})
    sess.invalidate("../../etc/passwd")

    assert store.session(session_id).messages() == [
        user("hi"),
        {"role": "assistant", "content": "hello"},
    ]
    assert [info.id for info in store.sessions()] == [session_id]
    assert [info.message_count for info in store.sessions()] == [2]
    assert set(inspect(store.engine).get_table_names()) >= TABLES
    # Nothing was written next to the database because of the id (the writers' turn file,
    # <database>-writer, is made by the first write of any session).
    files_after = sorted(p.name for p in tmp_path.iterdir())
    assert [name for name in files_after if name not in files_before] in ([], ["store.db-writer"])
    assert set(files_before) <= set(files_after)
