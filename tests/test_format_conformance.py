"""The format conformance suite: what every registered message format promises.

Parametrised over ``FORMAT_NAMES``, so a new format runs it as soon as it is registered in
``compactstore.formats``: it is the checklist for adding one. Each format's ``examples()``
(a conversation carrying every block type its roles may carry, with tool calls and their
results) goes through the public API and the CLI on a real database, and the adapter is
checked against it: block lists, reading and building messages, pairing, tokens, the SDK
types, the request shape, the recall tool, thinking, tool-result content and responses.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner

from compactstore import CompactStore, InvalidInputError, InvalidMessageError, Session
from compactstore._cli import cli
from compactstore._context.media import MEDIA_BLOCK_TYPES
from compactstore._context.tokens import estimate_tokens, message_tokens
from compactstore._recall import render
from compactstore.formats import (
    FORMAT_NAMES,
    PROVIDER_FORMATS,
    MessageFormat,
    ToolCall,
    get_format,
)
from compactstore.formats.base import THINKING_NOTE
from compactstore.formats.block_types import check_block_types, note_unlisted
from compactstore.formats.sdk_types import (
    SDK_FORMATS,
    check_sdk_types,
    request_params_problems,
    request_type,
    to_request,
)
from tests.conftest import module_database

Message = dict[str, Any]
KINDS = {"system", "user", "assistant", "tool"}

database = module_database("conformance")
each_format = pytest.mark.parametrize("name", FORMAT_NAMES)


@pytest.fixture
def store(database: str) -> Iterator[CompactStore]:
    with CompactStore.open(database) as opened:
        yield opened


def _session(store: CompactStore, sid: str, name: str) -> Session:
    return store.session(f"{sid}-{name}"[-200:], format=name, now=0.0)


def _calls(fmt: MessageFormat, messages: list[Message]) -> list[tuple[int, ToolCall]]:
    return [(i, call) for i, m in enumerate(messages) for call in fmt.tool_calls(m)]


def _results(fmt: MessageFormat, messages: list[Message]) -> dict[str, int]:
    return {r.tool_use_id: i for i, m in enumerate(messages) for r in fmt.tool_results(m)}


def _covered(fmt: MessageFormat, messages: list[Message]) -> dict[str, set[str]]:
    covered: dict[str, set[str]] = {}
    for message in messages:
        for role, _, blocks in fmt.block_lists(message):
            types = {b["type"] for b in blocks if isinstance(b, dict) and "type" in b}
            covered.setdefault(role, set()).update(types)
    return covered


# -- registration and examples --------------------------------------------------------------


@each_format
def test_the_format_is_registered_by_its_name(name: str) -> None:
    fmt = get_format(name)
    assert isinstance(fmt, MessageFormat) and fmt.name == name
    assert get_format(name) is fmt  # one stateless adapter serves every session
    assert (name in PROVIDER_FORMATS) == (fmt.request_key is not None)
    assert (name in SDK_FORMATS) == (fmt.sdk_extra is not None)


@each_format
def test_the_examples_carry_every_listed_block_type_and_answer_every_call(name: str) -> None:
    fmt = get_format(name)
    examples = fmt.examples()
    assert examples, "a format gives examples(): a conversation in its own spelling"
    assert fmt.examples() is not examples and fmt.examples() == examples  # fresh copies
    for message in examples:
        fmt.validate(message)
        check_block_types(name, message)
        assert fmt.kind(message) in KINDS
    covered = _covered(fmt, examples)
    for role, types in fmt.block_types.items():
        assert types <= covered.get(role, set()), (role, types - covered.get(role, set()))
    calls, results = _calls(fmt, examples), _results(fmt, examples)
    assert calls, "the examples make at least one tool call"
    for index, call in calls:
        assert results.get(call.id, -1) > index, f"call {call.id} has no result after it"
    assert set(results) <= {call.id for _, call in calls}


# -- storing and reading ---------------------------------------------------------------------


@each_format
def test_the_examples_round_trip_verbatim_through_the_store_and_the_cli(
    store: CompactStore, database: str, sid: str, name: str
) -> None:
    fmt = get_format(name)
    examples = fmt.examples()
    session = _session(store, sid, name)
    seqs = session.extend(examples)
    assert len(seqs) == len(examples)
    stored = session.messages()
    assert json.dumps(stored) == json.dumps(examples)  # values and key order
    assert session.context().messages() == examples
    exported = CliRunner().invoke(cli, ["export", session.id, "--db", database])
    assert exported.exit_code == 0, exported.output
    lines = [json.loads(line) for line in exported.stdout.splitlines() if line.strip()]
    assert examples == [line.get("message", line) for line in lines]


@each_format
def test_each_message_reads_as_text_calls_results_and_tokens(name: str) -> None:
    fmt = get_format(name)
    for message in fmt.examples():
        original = json.dumps(message)
        text = fmt.token_text(message)
        assert fmt.text(message) in text
        for call in fmt.tool_calls(message):
            assert call.id and call.name and call.name in text
        for result in fmt.tool_results(message):
            assert result.tool_use_id and result.text in text
        assert message_tokens(fmt, message, estimate_tokens) >= estimate_tokens(text)
        assert fmt.sent(message, None) or fmt.leaves_messages_out
        assert json.dumps(message) == original  # reading never changes a message


@each_format
def test_a_block_its_role_may_not_carry_is_refused_and_the_note_is_allowed(
    store: CompactStore, sid: str, name: str
) -> None:
    fmt = get_format(name)
    session = _session(store, sid, name)
    for message in fmt.examples():
        for role, where, blocks in list(fmt.block_lists(message)):
            if role not in fmt.block_types:
                continue
            blocks.append({"type": "banana"})
            with pytest.raises(InvalidMessageError, match=r"'banana'.*allowed"):
                session.append(message)
            noted, replaced = note_unlisted(name, message)
            assert replaced == ["banana"], where
            check_block_types(name, noted)  # the note is a block the role may carry
            fmt.validate(noted)
            blocks.pop()
    assert session.message_count() == 0


@each_format
def test_bad_messages_are_refused_naming_the_problem(
    store: CompactStore, sid: str, name: str
) -> None:
    session = _session(store, sid, name)
    bad: Any
    for bad, problem in (
        ("not a dict", "dict"),
        ({"role": "wizard", "content": "hi"}, "wizard"),
        ({}, "role"),
    ):
        with pytest.raises(InvalidMessageError, match=problem):
            session.append(bad)
    assert session.message_count() == 0


# -- building messages -----------------------------------------------------------------------


@each_format
def test_built_messages_are_valid_and_read_back_what_they_were_built_from(name: str) -> None:
    fmt = get_format(name)
    summary = fmt.summary_message("The story so far.")
    fmt.validate(summary)
    check_block_types(name, summary)
    assert fmt.text(summary) == "The story so far." and fmt.kind(summary) in ("user", "system")
    call = ToolCall("call_x", "read_file", {"path": "a.py"})
    built = fmt.tool_result_message(call.id, "contents", tool_name=call.name, is_error=False)
    fmt.validate(built)
    check_block_types(name, built)
    assert fmt.kind(built) == "tool"
    [result] = fmt.tool_results(built)
    assert (result.tool_use_id, result.text, result.is_error) == (call.id, "contents", False)
    failed = fmt.tool_result_message(call.id, "boom", tool_name=call.name, is_error=True)
    [error] = fmt.tool_results(failed)
    assert error.is_error or error.text == "Error: boom"
    stand_ins = fmt.synthetic_results([call, ToolCall("call_y", "ls", {})], "lost")
    for message in stand_ins:
        fmt.validate(message)
    answered = [r for m in stand_ins for r in fmt.tool_results(m)]
    assert [r.tool_use_id for r in answered] == ["call_x", "call_y"]
    assert all(r.text == "lost" for r in answered)


@each_format
def test_tool_results_are_replaced_in_a_copy(name: str) -> None:
    fmt = get_format(name)
    for message in fmt.examples():
        results = [r for r in fmt.tool_results(message) if r.replaceable]
        if not results:
            continue
        original = json.dumps(message)
        replaced = fmt.replace_tool_results(message, {r.tool_use_id: "[cleared]" for r in results})
        assert json.dumps(message) == original
        fmt.validate(replaced)
        assert {r.tool_use_id: r.text for r in fmt.tool_results(replaced)} == {
            r.tool_use_id: "[cleared]" for r in results
        }


@each_format
def test_thinking_is_left_out_and_noted(name: str) -> None:
    fmt = get_format(name)
    thinking = [m for m in fmt.examples() if fmt.thinking_text(m) is not None]
    assert bool(thinking) == bool(fmt.thinking_block_types & set().union(*fmt.block_types.values()))
    for message in thinking:
        stripped = fmt.without_thinking(message)
        assert fmt.thinking_text(stripped) is None
        noted = fmt.thinking_noted(message)
        assert fmt.thinking_text(noted) is None and THINKING_NOTE in json.dumps(noted)
        fmt.validate(noted)


# -- pairing through the store ---------------------------------------------------------------


@each_format
def test_results_pair_with_calls_through_the_store(
    store: CompactStore, sid: str, name: str
) -> None:
    fmt = get_format(name)
    examples = fmt.examples()
    (index, call), *_ = _calls(fmt, examples)
    session = _session(store, sid, name)
    session.extend(examples[: index + 1])
    with pytest.raises(InvalidMessageError):
        session.append(fmt.tool_result_message("call_unknown", "x", tool_name="t", is_error=False))
    count = session.message_count()
    seq = session.append_tool_result(call.id, "ok", tool_name=call.name)
    assert session.message_count() == count + 1
    assert session.messages()[-1] == fmt.tool_result_message(
        call.id, "ok", tool_name=call.name, is_error=False
    )
    assert seq == count
    with pytest.raises(InvalidMessageError):  # a second result for the same call
        session.append_tool_result(call.id, "again", tool_name=call.name)
    for other in fmt.tool_calls(examples[index])[1:]:
        session.append_tool_result(other.id, "ok", tool_name=other.name)
    context = session.context().messages()
    assert {c.id for _, c in _calls(fmt, context)} <= set(_results(fmt, context))


@each_format
def test_tool_result_content_lists_follow_the_format(
    store: CompactStore, sid: str, name: str
) -> None:
    fmt = get_format(name)
    examples = fmt.examples()
    (index, call), *_ = _calls(fmt, examples)
    session = _session(store, sid, name)
    session.extend(examples[: index + 1])
    before = session.message_count()
    if fmt.result_block_types is None:
        with pytest.raises(InvalidInputError, match="string"):
            session.append_tool_result(call.id, [{"type": "text", "text": "x"}], tool_name="t")
    else:
        with pytest.raises(InvalidInputError, match="banana"):
            session.append_tool_result(call.id, [{"type": "banana"}], tool_name="t")
        assert session.message_count() == before
        text_type = fmt.result_block_types[0]
        session.append_tool_result(call.id, [{"type": text_type, "text": "ok"}], tool_name="t")
        [result] = fmt.tool_results(session.messages()[-1])
        assert result.text == "ok"
    assert session.message_count() in (before, before + 1)


# -- the provider API ------------------------------------------------------------------------


@each_format
def test_the_request_has_the_format_shape_and_passes_the_sdk_types(
    store: CompactStore, sid: str, name: str
) -> None:
    fmt = get_format(name)
    session = _session(store, sid, name)
    session.extend(fmt.examples())
    if fmt.request_key is None:
        with pytest.raises(InvalidInputError, match="no provider API"):
            session.request_params()
        with pytest.raises(InvalidInputError, match="no official SDK type"):
            request_type(name)
        assert to_request(name, fmt.examples()) == fmt.examples()
        return
    params = session.request_params()
    assert fmt.request_key in params
    assert set(params) <= {fmt.request_key, "system"}
    assert ("system" in params) == (
        fmt.system_parameter and any(m.get("role") == "system" for m in fmt.examples())
    )
    if fmt.sdk_extra is not None:
        assert request_params_problems(name, params) == []
        check_sdk_types(name, params[fmt.request_key])


@each_format
def test_append_response_names_the_response_object_the_format_takes(
    store: CompactStore, sid: str, name: str
) -> None:
    fmt = get_format(name)
    session = _session(store, sid, name)
    expected = fmt.response_name or "none for this format"
    with pytest.raises(InvalidInputError, match=expected):
        session.append_response({"role": "assistant", "content": "not an SDK object"})
    assert not fmt.is_response({"role": "assistant"})
    assert session.message_count() == 0


# -- recall --------------------------------------------------------------------------------


@each_format
def test_recall_renders_every_block_of_a_message_and_leaves_thinking_out(name: str) -> None:
    fmt = get_format(name)
    for seq, message in enumerate(fmt.examples()):
        body = render(fmt, seq, message, "removed").body
        assert fmt.text(message) in body
        for call in fmt.tool_calls(message):
            assert f"tool call {call.name} (id {call.id})" in body
        for result in fmt.tool_results(message):
            assert f"tool result for {result.tool_use_id}" in body and result.text in body
        thinking = fmt.thinking_text(message)
        if thinking:
            assert thinking not in body and "left out" in body
        media = 0
        for _, _, blocks in fmt.block_lists(message):
            for block in blocks:
                kind = block["type"]
                media += kind in MEDIA_BLOCK_TYPES
                read = kind in fmt.read_block_types | fmt.thinking_block_types | MEDIA_BLOCK_TYPES
                assert read or f'"type":"{kind}"' in body, (kind, body)  # its JSON
        assert body.count("not shown as text") == media  # a marker per image or document


@each_format
def test_the_recall_tool_is_declared_in_the_format_and_answers_from_the_log(
    store: CompactStore, sid: str, name: str
) -> None:
    fmt = get_format(name)
    session = _session(store, sid, name)
    definition = session.recall_tool()
    assert json.loads(json.dumps(definition)) == definition
    declared = json.dumps(definition)
    assert '"recall"' in declared and '"from_seq"' in declared and '"blob_id"' in declared
    # Long tool results, so that a summary is smaller than what it replaces.
    long = " ".join(f"line {n}: undefined symbol sqrt in libm" for n in range(200))
    examples = [
        fmt.replace_tool_results(m, {r.tool_use_id: long for r in fmt.tool_results(m)})
        for m in fmt.examples()
    ]
    session.extend(examples)
    session.append(fmt.summary_message("Now fix the linker flags."))
    result = session.compact(now=10.0)
    assert result.success
    context = session.context().messages()
    for message in context:
        fmt.validate(message)
    calls = {c.id for _, c in _calls(fmt, context)}
    assert calls <= set(_results(fmt, context)) | {c.id for c in fmt.tool_calls(context[-1])}
    answer = session.recall({"from_seq": 0, "to_seq": len(examples) - 1})
    assert "removed from the context" in answer and "line 199: undefined symbol" in answer
    assert any(f"tool call {c.name}" in answer for _, c in _calls(fmt, examples))
