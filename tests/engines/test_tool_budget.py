"""Stage 2, the tool-result budget: results over 4,000 characters are stored
whole as blobs and replaced in the active context by a preview stub of at most 500 chars.
"""

from __future__ import annotations

import re

import pytest

from compactstore import CompactStore, CompactStrategy, NotFoundError
from tests.helpers import FORMATS, T0, new_session, result_map, results, words

LIMIT = 4_000


def numbered_lines(count: int, width: int = 30) -> str:
    """Lines that each name their number, padded with non-ASCII text to ``width`` chars."""
    return "\n".join(f"L{i:03d} café ✓ 漢字 — données ".ljust(width, "·") for i in range(count))


def test_a_result_of_4000_chars_stays_and_one_of_4001_is_persisted_once(
    store: CompactStore,
) -> None:
    for fmt in FORMATS:
        check_the_4000_char_budget(store, fmt)


def check_the_4000_char_budget(store: CompactStore, fmt: str) -> None:
    chat = new_session(store, fmt, sid=fmt)
    chat.request("Please read both files")
    _, stays_seq, stays_id = chat.tool(words(LIMIT, "a"))
    _, big_seq, big_id = chat.tool(words(LIMIT + 1, "b"))

    result = chat.sess.process_request(now=T0 + 60)

    assert result.success and result.effective
    assert result.strategy == CompactStrategy.TOOL_BUDGET
    assert [step.strategy for step in result.steps] == [CompactStrategy.TOOL_BUDGET]
    states = {item.seq: item.state for item in chat.sess.context().items}
    assert states[stays_seq] == "original" and states[big_seq] == "persisted"
    shown = result_map(fmt, chat.sess.active_context())
    assert shown[stays_id] == words(LIMIT, "a")
    assert len(shown[big_id]) <= 500
    (recorded,) = chat.sess.compactions()
    assert recorded.blob_ids == result.blob_ids and len(result.blob_ids) == 1
    assert recorded.cleared_tool_use_ids == [big_id]
    assert recorded.removed_seqs == [] and recorded.boundary is None
    assert chat.sess.get_blob(result.blob_ids[0]) == words(LIMIT + 1, "b")
    assert recorded.tokens_after == chat.sess.token_usage() < recorded.tokens_before
    assert results(fmt, chat.sess.messages()[big_seq]) == {big_id: words(LIMIT + 1, "b")}

    # A second call finds nothing new to persist and records nothing.
    context = chat.sess.active_context()
    again = chat.sess.process_request(now=T0 + 61)
    assert not again.success and again.strategy is None and again.tokens_freed == 0
    assert again.id is None and again.blob_ids == []
    assert len(chat.sess.compactions()) == 1
    assert chat.sess.active_context() == context
    with pytest.raises(NotFoundError):
        chat.sess.get_blob(2)


def test_the_preview_has_the_header_the_first_8_and_last_3_lines_and_the_omitted_count(
    store: CompactStore,
) -> None:
    for fmt in FORMATS:
        check_the_preview(store, fmt)
    # With at most 12 lines there is no tail.
    chat = new_session(store, "anthropic", sid="short")
    chat.request("Read it")
    content = "\n".join(f"T{i:02d} " + words(400, f"t{i}") for i in range(12))
    _, _, tool_use_id = chat.tool(content)
    chat.sess.process_request(now=T0 + 10)
    stub = result_map("anthropic", chat.sess.active_context())[tool_use_id]
    assert len(stub) <= 500
    assert "T00 " in stub
    assert not {"T09 ", "T10 ", "T11 "} & {line[:4] for line in stub.splitlines()}


def check_the_preview(store: CompactStore, fmt: str) -> None:
    chat = new_session(store, fmt, sid=fmt)
    chat.request("Read the logs")
    # Two persisted results first, so the blob id under test is not a trivial 1.
    chat.tool(words(5_000, "x"))
    chat.tool(words(5_000, "y"))
    chat.sess.process_request(now=T0 + 10)
    content = numbered_lines(200)
    assert len(content) > LIMIT
    _, _, tool_use_id = chat.tool(content, name="grep_logs")

    result = chat.sess.process_request(now=T0 + 20)

    (blob_id,) = result.blob_ids
    assert blob_id == 3
    stub = result_map(fmt, chat.sess.active_context())[tool_use_id]
    assert len(stub) <= 500
    header = stub.splitlines()[0]
    assert str(len(content)) in header
    assert "grep_logs" in header
    assert re.search(rf"\b{blob_id}\b", header)
    lines = content.splitlines()
    for line in lines[:8] + lines[-3:]:
        assert line in stub
    for line in lines[8:-3]:
        assert line not in stub
    assert re.search(rf"\b{len(lines) - 11}\b", stub), "the omitted line count is shown"
    assert chat.sess.get_blob(blob_id) == content


def test_get_blob_is_byte_exact_and_scoped_to_its_session(store: CompactStore) -> None:
    first = new_session(store, "minicode", sid="first")
    first.request("Fetch the page")
    content = (
        "naïve café — 漢字かなハングル 한국어 🙂 \U0001f680\r\n"
        "\ttabs\tand trailing spaces   \n"
        "backslash \\ quote \" apostrophe ' <tag> &amp;\n"
        * 120
        + "\u200b zero width, \u00a0 nbsp, combining e\u0301\n\n"
    )
    assert len(content) > LIMIT
    first.tool(content)
    first.tool(words(5_000, "q"))
    second = new_session(store, "anthropic", sid="second")
    second.request("Another agent")
    second.tool(words(6_000, "r"))

    ids_first = first.sess.process_request(now=T0 + 5).blob_ids
    ids_second = second.sess.process_request(now=T0 + 5).blob_ids

    assert ids_first == [1, 2] and ids_second == [1]
    fetched = first.sess.get_blob(1)
    assert fetched == content and fetched.encode("utf-8") == content.encode("utf-8")
    assert second.sess.get_blob(1) == words(6_000, "r")
    with pytest.raises(NotFoundError):
        second.sess.get_blob(2)  # blob 2 exists, but in the other session
    with pytest.raises(NotFoundError):
        first.sess.get_blob(3)


def test_only_the_oversized_block_of_a_message_with_two_results_is_replaced(
    store: CompactStore,
) -> None:
    chat = new_session(store, "anthropic")
    chat.request("Read two files at once")
    _, (small, big) = chat.calls([("read_file", {"path": "a"}), ("read_file", {"path": "b"})])
    message = {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": small, "content": "short"},
            {"type": "tool_result", "tool_use_id": big, "content": words(4_500, "big")},
        ],
    }
    chat.add(message)

    result = chat.sess.process_request(now=T0 + 5)

    assert result.cleared_tool_use_ids == [big]
    shown = result_map("anthropic", chat.sess.active_context())
    assert shown[small] == "short"
    assert len(shown[big]) <= 500 and shown[big] != words(4_500, "big")
    assert chat.sess.get_blob(result.blob_ids[0]) == words(4_500, "big")
    assert chat.sess.messages()[-1] == message, "the log keeps the original"
