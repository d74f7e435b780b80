"""Recall: the tool's definition in each format, and ``recall(arguments)``
giving back exactly what left the context — removed by a cut, cleared by microcompact,
persisted as a blob — by seq range, search or blob id, capped with a cursor, a pure read
of its own session only."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from pydantic import TypeAdapter

from compactstore import (
    CompactionConfig,
    CompactStore,
    CompactStrategy,
    InvalidInputError,
    NotFoundError,
)
from compactstore._simulate import simulate
from compactstore._summary_audit import whole_recall
from tests.conftest import Snapshot, corpus_transcripts
from tests.helpers import (
    CLEARED,
    FORMATS,
    HOUR,
    T0,
    Chat,
    calls_message,
    new_session,
    plain,
    result_map,
    results,
    text_of,
    words,
)

MORE = re.compile(r'call recall with (\{"cursor": ".*"\}) for the rest\]\Z')


def recalled(chat: Chat, arguments: dict[str, Any]) -> str:
    """The whole answer, every page followed."""
    whole, _ = whole_recall(chat.sess.recall, arguments)
    return whole


def compacted_chat(store: CompactStore, fmt: str, *, sid: str = "s", **config: Any) -> Chat:
    """A session whose first messages a cut removed, with one result persisted (a blob) and
    older small results cleared by microcompact, all still in the log."""
    chat = new_session(store, fmt, sid=sid, config=plain(**config))
    chat.request("Port the billing module to the new API")
    chat.user("Also keep the CSV export working")
    chat.say("Looking at the BILLING code first. Next I'll read invoice.py.")
    for i in range(8):
        chat.tool(f"small result {i}: " + words(300, f"r{i}"), args={"path": f"src/m{i}.py"})
    chat.tool("HUGE OUTPUT\n" + words(6_000, "big"), name="bash", args={"command": "pytest"})
    chat.chatter(6, chars=400)
    chat.sess.process_request(now=T0 + HOUR + 10)  # persists the huge one, clears old results
    chat.sess.compact(up_to_seq=4, now=T0 + HOUR + 11)
    return chat


def out_of_context(chat: Chat) -> dict[int, str]:
    """Seq -> why, for every logged message not in the context in full (read from the
    context's own detail)."""
    items = {item.seq: item.state for item in chat.sess.context().items if item.seq is not None}
    last = chat.sess.message_count()
    return {
        seq: items.get(seq, "removed")
        for seq in range(last)
        if items.get(seq, "removed") in ("removed", "cleared", "persisted")
    }


def pieces(fmt: str, message: dict[str, Any]) -> list[str]:
    """What a message says, read without compactstore's adapters: its prose and each tool
    result's full text."""
    found = [text_of(message)] if text_of(message) else []
    found.extend(results(fmt, message).values())
    return found


# -- the tool definition --------------------------------------------------------------------


def test_the_tool_is_declared_in_each_formats_own_shape(store: CompactStore) -> None:
    import anthropic.types
    import openai.types.chat
    import openai.types.responses

    for fmt in FORMATS:
        tool = store.session(fmt, format=fmt).recall_tool()
        if fmt == "openai":
            assert tool["type"] == "function" and tool["function"]["name"] == "recall"
            schema = tool["function"]["parameters"]
            TypeAdapter(openai.types.chat.ChatCompletionToolParam).validate_python(tool)
            # The Responses API takes the same function, flattened.
            flat = {"type": "function", **tool["function"], "strict": False}
            TypeAdapter(openai.types.responses.FunctionToolParam).validate_python(flat)
        else:  # minicode declares tools as anthropic does
            assert set(tool) == {"name", "description", "input_schema"}
            assert tool["name"] == "recall" and "verbatim" in tool["description"]
            schema = tool["input_schema"]
            TypeAdapter(anthropic.types.ToolParam).validate_python(tool)
        assert schema["type"] == "object" and schema["additionalProperties"] is False
        assert set(schema["properties"]) == {"from_seq", "to_seq", "query", "blob_id", "cursor"}
    tool = store.session("responses", format="responses").recall_tool()
    assert tool["type"] == "function" and tool["name"] == "recall" and tool["strict"] is False
    TypeAdapter(openai.types.responses.FunctionToolParam).validate_python(tool)


def test_asking_for_the_tool_turns_on_the_summarys_recall_line(
    store: CompactStore, db_url: str
) -> None:
    chat = new_session(store, "anthropic")
    chat.request("Refactor the parser")
    chat.chatter(12, chars=400)
    before = chat.sess.compact(up_to_seq=4, now=T0 + 1).summary_text
    assert "## Recall" not in before and "use recall" not in before

    chat.sess.recall_tool()
    assert chat.sess.config.recall_enabled
    chat.chatter(4, chars=400)
    after = chat.sess.compact(up_to_seq=10, now=T0 + 2).summary_text
    assert "## Recall" in after and "`recall` tool" in after
    # Stored with the session: another process's handle writes the line too.
    with CompactStore.open(db_url) as again:
        assert again.session("s").config.recall_enabled
    # Or from the config, without asking for the tool.
    other = new_session(store, "openai", sid="o", config=plain(recall_enabled=True))
    other.request("Refactor the lexer")
    other.chatter(8, chars=400)
    assert "`recall` tool" in other.sess.compact(up_to_seq=4, now=T0 + 1).summary_text


# -- what comes back ------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_seq_range_gives_back_exactly_what_left_the_context(
    store: CompactStore, fmt: str
) -> None:
    chat = compacted_chat(store, fmt)
    out = out_of_context(chat)
    assert {"removed", "cleared", "persisted"} <= set(out.values())
    log = chat.sess.messages()
    last = len(log) - 1
    whole = recalled(chat, {"from_seq": 0, "to_seq": last})
    for seq, why in out.items():
        header = f"[seq {seq} · "
        assert header in whole, f"seq {seq} ({why}) not recalled"
        for piece in pieces(fmt, log[seq]):
            assert piece in whole, f"seq {seq} ({why}) not given back exactly"
    # Messages in the context in full are not repeated.
    in_full = [i.seq for i in chat.sess.context().items if i.seq is not None and i.seq not in out]
    assert in_full and not [seq for seq in in_full if f"[seq {seq} · " in whole]
    # The persisted result names its blob; a cleared one says so.
    blob_id = chat.sess.compactions()[0].blob_ids[0]
    assert f"persisted as blob {blob_id}" in whole
    assert "cleared from the context by microcompact" in whole
    assert "removed from the context by a compaction" in whole


def test_a_range_inside_the_context_has_nothing_to_give_back(store: CompactStore) -> None:
    chat = compacted_chat(store, "anthropic")
    newest = chat.sess.message_count() - 1
    answer = chat.sess.recall({"from_seq": newest})
    assert answer == (
        f"Nothing to recall in seq {newest}: those messages are in the context in full."
    )
    with pytest.raises(InvalidInputError, match=f"past the end of the log .*{newest}"):
        chat.sess.recall({"from_seq": newest + 1, "to_seq": newest + 5})


def test_a_blob_id_gives_back_the_persisted_result_byte_for_byte(store: CompactStore) -> None:
    chat = compacted_chat(store, "openai", recall_max_tokens=500)
    (blob_id,) = chat.sess.compactions()[0].blob_ids
    whole, pages = whole_recall(chat.sess.recall, {"blob_id": blob_id})
    original = chat.sess.get_blob(blob_id)
    header = f"[blob {blob_id} · tool result of seq "
    assert whole.startswith(header) and whole.endswith(original)
    assert whole.split("\n", 1)[1] == original
    assert len(pages) > 2 and all(chat.sess.store.token_counter(p) <= 500 for p in pages)


def test_a_blob_of_another_session_is_not_found(store: CompactStore) -> None:
    chat = compacted_chat(store, "anthropic", sid="a")
    other = new_session(store, "anthropic", sid="b")
    other.request("Something else")
    (blob_id,) = chat.sess.compactions()[0].blob_ids
    assert chat.sess.recall({"blob_id": blob_id})
    with pytest.raises(NotFoundError, match=f"no blob {blob_id} in session 'b'"):
        other.sess.recall({"blob_id": blob_id})


def test_search_finds_what_left_the_context_case_insensitively_newest_first(
    store: CompactStore,
) -> None:
    chat = compacted_chat(store, "minicode")
    answer = chat.sess.recall({"query": "billing"})
    # The request is pinned (in the context in full): only the removed assistant text hits.
    hits = [line for line in answer.splitlines() if line.startswith("- seq ")]
    assert len(hits) == 1 and hits[0].startswith("- seq 2 (removed): ") and "BILLING" in hits[0]
    answer = chat.sess.recall({"query": "small RESULT"})
    seqs = [int(s) for s in re.findall(r"^- seq (\d+) ", answer, re.M)]
    log = chat.sess.messages()
    holding = [s for s in out_of_context(chat) if "small result" in json.dumps(log[s]).lower()]
    assert seqs == sorted(holding, reverse=True) and len(seqs) >= 3
    nothing = chat.sess.recall({"query": "HUGE output nowhere"})
    assert nothing.startswith('No match for "HUGE output nowhere"')
    # The persisted result is searched in full, beyond its preview.
    tail = words(6_000, "big")[-40:]
    assert "(persisted)" in chat.sess.recall({"query": tail})


def test_search_gives_at_most_20_hits_with_200_character_snippets(store: CompactStore) -> None:
    chat = new_session(store, "anthropic", config=plain(recall_max_tokens=100_000))
    chat.request("Tune the cache")
    chat.extend(
        [
            {"role": "assistant", "content": f"{i}: {words(600, 'n')} NEEDLE {words(600, 'm')}"}
            if i % 2 == 0
            else {"role": "user", "content": f"ok {i}"}
            for i in range(60)
        ]
    )
    chat.sess.compact(up_to_seq=55, now=T0 + 5)
    answer = chat.sess.recall({"query": "needle"})
    hits = [line for line in answer.splitlines() if line.startswith("- seq ")]
    assert len(hits) == 20 and "the first 20 hits" in answer
    seqs = [int(hit.split()[2]) for hit in hits]
    assert seqs == sorted(seqs, reverse=True) and seqs[0] == 55
    for hit in hits:
        snippet = hit.split("): ", 1)[1].strip("…")
        assert "NEEDLE" in snippet and len(snippet) <= 200


@pytest.mark.slow_on_postgres
def test_a_long_answer_is_cut_at_the_cap_and_the_cursor_continues_it_exactly(
    store: CompactStore,
) -> None:
    cap = 300
    small = compacted_chat(store, "anthropic", sid="small", recall_max_tokens=cap)
    large = compacted_chat(store, "anthropic", sid="large", recall_max_tokens=1_000_000)
    last = small.sess.message_count() - 1
    whole, pages = whole_recall(small.sess.recall, {"from_seq": 0, "to_seq": last})
    assert len(pages) > 3
    count = store.token_counter
    assert all(count(page) <= cap for page in pages)
    assert all(MORE.search(page) for page in pages[:-1]) and not MORE.search(pages[-1])
    # The pages, joined, are the one uncapped answer.
    assert whole == large.sess.recall({"from_seq": 0, "to_seq": last})


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        ([1, 2], "must be an object"),
        ("{not json", "not valid JSON"),
        ({}, "exactly one of"),
        ({"from_seq": 1, "query": "x"}, "exactly one of"),
        ({"to_seq": 3}, "to_seq needs from_seq"),
        ({"from_seq": 5, "to_seq": 2}, "to_seq 2 is before from_seq 5"),
        ({"from_seq": -1}, "between 0 and"),
        ({"from_seq": "3"}, "from_seq must be a whole number"),
        ({"from_seq": True}, "from_seq must be a whole number"),
        ({"blob_id": 0}, "blob_id must be 1 or more"),
        ({"query": "  "}, "query must not be empty"),
        ({"query": 7}, "query must be a string"),
        ({"query": "a\x00b"}, "NUL"),
        ({"seq": 3}, "unknown recall argument 'seq'"),
        ({"cursor": "seq:9"}, "is not one this tool gave"),
    ],
)
def test_bad_arguments_name_the_problem(
    store: CompactStore, db_snapshot: Snapshot, arguments: Any, problem: str
) -> None:
    chat = new_session(store, "anthropic")
    chat.request("Hello")
    before = db_snapshot(store)
    with pytest.raises(InvalidInputError, match=re.escape(problem)):
        chat.sess.recall(arguments)
    assert db_snapshot(store) == before


def test_recall_is_a_pure_read_and_takes_openai_json_arguments(
    store: CompactStore, db_snapshot: Snapshot
) -> None:
    chat = compacted_chat(store, "openai")
    before = db_snapshot(store)
    by_dict = chat.sess.recall({"from_seq": 0, "to_seq": 6})
    by_text = chat.sess.recall(json.dumps({"from_seq": 0, "to_seq": 6}))
    chat.sess.recall({"query": "small result"})
    assert by_dict == by_text and "[seq 2 · assistant · removed" in by_dict
    assert db_snapshot(store) == before


# -- recall answers and the tool-result budget -----------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_recall_answer_is_exempt_from_the_tool_result_budget(
    store: CompactStore, fmt: str
) -> None:
    chat = compacted_chat(store, fmt, recall_max_tokens=4_000)
    chat.sess.recall_tool()
    (blob_id,) = chat.sess.compactions()[0].blob_ids
    call_id = chat.new_id()
    chat.add(calls_message(fmt, [(call_id, "recall", {"blob_id": blob_id})]))
    answer = chat.sess.recall({"blob_id": blob_id})
    assert len(answer) > CompactionConfig().tool_result_max_chars
    seq = chat.sess.append_tool_result(call_id, answer, tool_name="recall", timestamp=chat.tick())
    # An ordinary result of the same size is persisted beside it; the answer is not.
    _, other_seq, other_id = chat.tool(answer, name="bash")
    result = chat.sess.process_request(now=chat.tick(), enable_microcompact=False)
    assert result.strategy == CompactStrategy.TOOL_BUDGET
    assert result.cleared_tool_use_ids == [other_id]
    states = {item.seq: item.state for item in chat.sess.context().items}
    assert states[seq] == "original" and states[other_seq] == "persisted"
    assert result_map(fmt, chat.sess.active_context())[call_id] == answer
    # So the answer stays readable: no recall -> blob -> recall loop.
    again = chat.sess.process_request(now=chat.tick(), enable_microcompact=False)
    assert again.id is None


def test_a_cleared_result_comes_back_by_its_seq(store: CompactStore) -> None:
    chat = compacted_chat(store, "anthropic")
    cleared = [s for s, why in out_of_context(chat).items() if why == "cleared"]
    assert cleared
    log = chat.sess.messages()
    context = {item.seq: item for item in chat.sess.context().items}
    seq = cleared[0]
    assert CLEARED in json.dumps(context[seq].message)
    answer = chat.sess.recall({"from_seq": seq})
    header = f"[seq {seq} · tool result · cleared from the context by microcompact]"
    assert answer.startswith(header)
    (original,) = results("anthropic", log[seq]).values()
    assert answer.endswith(original)


# -- over every cut of the real transcripts ------------------------------------------------


@pytest.mark.slow
@pytest.mark.corpus
def test_every_message_a_compaction_of_a_real_transcript_took_out_is_recalled_exactly() -> None:
    """Every dev transcript replayed at a 32k window, after every compaction: each message
    it removed, cleared or persisted comes back exactly (prose, call inputs, whole results, in
    its own seq's part of the answer, every page followed), and each blob byte for byte."""
    checked = 0
    for transcript in corpus_transcripts():
        report = simulate(transcript, window=32_000, use_usage=False)
        assert report.recall_share in (None, 1.0), (transcript.name, report.recall_examples)
        checked += report.recall_due + report.recall_blobs_due
    assert checked > 500


def test_a_responses_session_recalls_its_items(store: CompactStore) -> None:
    chat = new_session(store, "responses", sid="r")
    sess = chat.sess
    sess.append({"role": "user", "content": "Find the slow query"})
    for i in range(6):
        sess.append({"type": "reasoning", "id": f"rs_{i}", "summary": [], "encrypted_content": "x"})
        sess.append(
            {
                "type": "function_call",
                "call_id": f"c{i}",
                "name": "sql",
                "arguments": f'{{"q": {i}}}',
            }
        )
        sess.append({"type": "function_call_output", "call_id": f"c{i}", "output": f"plan {i}"})
        sess.append(
            {"role": "assistant", "content": [{"type": "output_text", "text": f"Step {i}"}]}
        )
    sess.compact(up_to_seq=12, now=T0 + 5)
    answer = recalled(chat, {"from_seq": 1, "to_seq": 12})
    assert "[seq 1 · assistant · removed" in answer and "(1 thinking block left out)" in answer
    assert (
        '→ tool call sql (id c0): {"q": 0}' in answer
        and "← tool result for c0 (the call at seq 2):\nplan 0" in answer
    )
    assert answer.count("Step 0") == 1  # the text once, not again as its block's JSON
