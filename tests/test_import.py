"""Importing transcripts (issue: Import): Claude Code, Codex CLI rollouts, SWE-agent
trajectories and plain JSONL, on the real dev corpus and on both backends.

The corpus is read from ../shared/corpus/dev at test time; malformed inputs are small files
written to tmp_path.
"""

from __future__ import annotations

import gzip
import io
import json
import sqlite3
import tracemalloc
from collections import Counter
from collections.abc import Callable, Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from compactstore import (
    CompactStore,
    CompactStoreWarning,
    CompactTrigger,
    ConflictError,
    InvalidInputError,
    InvalidMessageError,
    NotFoundError,
)
from compactstore._cli import cli
from compactstore._importers import (
    SOURCES,
    Transcript,
    detect,
    import_file,
    read_transcript,
)
from compactstore._importers.codex import apply_patch_paths, shell_read_path
from compactstore.formats import get_format
from compactstore.formats.sdk_types import SDK_FORMATS, check_sdk_types
from compactstore.models import ImportedMessage
from tests.conftest import CORPUS_DEV, Snapshot, corpus_params
from tests.helpers import claude_code_record

Message = dict[str, Any]

SPOTTER = CORPUS_DEV / "claude-code" / "spotter-258c7280.jsonl"

# Tool calls of the first dev transcripts, as counted in SOURCES.md; the SWE-agent one has
# 11 calls, some reusing an id, which the importer makes unique. The sweeping tests below
# hold for any transcript of a known kind; these counts only check the files they name.
KNOWN_CALLS = {
    "agentcmd-full-session-four.jsonl": 27,
    "spotter-258c7280.jsonl": 186,
    "spotter-4d5611e5.compaction-agent-acompact-e1f845.jsonl": 0,
    "spotter-4d5611e5.jsonl": 150,
    "spotter-4d5611e5.subagent-a2898e3.jsonl": 33,
    "agentcmd-rollout-2025-09-24T19-22-20.jsonl": 123,
    "agentcmd-rollout-2025-09-25T08-02-05.jsonl": 57,
    "sweagent-marshmallow-1867-function_calling.traj": 11,
}
SOURCE_OF_DIR = {"claude-code": "claude-code", "codex": "codex", "swe-agent": "swe-agent"}
CORPUS_FILES = sorted(p for p in CORPUS_DEV.glob("*/*") if p.parent.name in SOURCE_OF_DIR)
_CODEX_CALLS = frozenset(
    {"function_call", "custom_tool_call", "local_shell_call", "tool_search_call", "web_search_call"}
)


def raw_calls(path: Path) -> int | None:
    """The tool calls a line-record transcript itself holds (distinct ids), read straight
    from its records: Claude Code's ``tool_use`` blocks of the main conversation (the
    sidechain when the whole file is one), Codex's call items. None for other kinds."""
    if path.parent.name not in ("claude-code", "codex"):
        return None
    records = raw_records(path)
    ids: set[str] = set()
    if path.parent.name == "codex":
        for record in records:
            item = record.get("payload", record)
            kind = item.get("type") if isinstance(item, dict) else None
            if kind in _CODEX_CALLS and record.get("type") in ("response_item", *_CODEX_CALLS):
                ids.add(item.get("call_id") or item["id"])
        return len(ids)
    main = [
        r for r in records if r.get("type") in ("user", "assistant") and not r.get("isSidechain")
    ]
    for record in main or records:
        if record.get("type") != "assistant" or record.get("isApiErrorMessage"):
            continue
        content = record["message"]["content"]
        for block in content if isinstance(content, list) else []:
            if block.get("type") == "tool_use":
                ids.add(block["id"])
    return len(ids)


def check_sdk(format_name: str, messages: list[Message]) -> None:
    """The official SDK's request type accepts these messages (minicode has no SDK)."""
    if format_name in SDK_FORMATS:
        check_sdk_types(format_name, messages)


def check_pairing(format_name: str, messages: list[Message]) -> None:
    """Every tool result answers the newest unanswered call of its id, made earlier; an id
    is used again only once its call was answered, and only where the format allows it
    (openai, responses: the documentation)."""
    fmt = get_format(format_name)
    called: set[str] = set()
    open_calls: set[str] = set()
    for index, message in enumerate(messages):
        for result in fmt.tool_results(message):
            assert result.tool_use_id in called, f"message {index}: result without its call"
            assert result.tool_use_id in open_calls, f"message {index}: second result"
            open_calls.discard(result.tool_use_id)
        for call in fmt.tool_calls(message):
            if format_name not in ("openai", "responses"):
                assert call.id not in called, f"message {index}: duplicate call id"
            assert call.id not in open_calls, f"message {index}: id of an unanswered call"
            called.add(call.id)
            open_calls.add(call.id)


def calls_in(transcript: Transcript) -> int:
    fmt = get_format(transcript.format)
    return sum(len(fmt.tool_calls(m)) for m in transcript.messages)


def raw_records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text("utf-8").splitlines() if line.strip()]


def blocks_of(content: Any) -> list[Message]:
    """Content as blocks, without the whitespace-only text blocks the API refuses."""
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
    return [b for b in blocks if not (b.get("type") == "text" and not b["text"].strip())]


def write_lines(path: Path, lines: Iterable[Any]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), "utf-8")
    return path


def epoch(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


# -- the real dev corpus ------------------------------------------------------------------


@pytest.mark.corpus
def test_the_dev_corpus_is_there() -> None:
    """At least one transcript of each kind (the sweeping tests take whatever is there)."""
    assert {p.parent.name for p in CORPUS_FILES} == set(SOURCE_OF_DIR)


@pytest.mark.corpus
@pytest.mark.parametrize(
    "path",
    corpus_params(CORPUS_FILES, CORPUS_DEV, f"{'/'.join(SOURCE_OF_DIR)} transcripts"),
    ids=lambda p: p.name,
)
def test_dev_transcript_reads_and_detects(path: Path) -> None:
    assert detect(path) == SOURCE_OF_DIR[path.parent.name]
    transcript = read_transcript(path)  # warnings are errors: none on a real transcript
    n = len(transcript.messages)
    assert n > 0
    lists = (
        transcript.timestamps,
        transcript.usage,
        transcript.read_paths,
        transcript.write_paths,
    )
    assert all(len(values) == n for values in lists)
    calls = calls_in(transcript)
    if path.name in KNOWN_CALLS:
        assert calls == KNOWN_CALLS[path.name]
    expected = raw_calls(path)
    if expected is not None:
        assert calls == expected, "every tool call of the file is imported"
    # Every call got its result, except those of a run cut off during its last call.
    fmt = get_format(transcript.format)
    results = sum(len(fmt.tool_results(m)) for m in transcript.messages)
    last = next((m for m in reversed(transcript.messages) if fmt.kind(m) == "assistant"), None)
    cut_off = len(fmt.tool_calls(last)) if last is not None else 0
    assert calls - cut_off <= results <= calls
    check_pairing(transcript.format, transcript.messages)
    check_sdk(transcript.format, transcript.messages)
    assert sum(u is not None for u in transcript.usage) <= sum(
        fmt.kind(m) == "assistant" for m in transcript.messages
    )


@pytest.mark.slow
@pytest.mark.corpus
def test_dev_corpus_imports_on_both_backends(
    store: CompactStore, reopen: Callable[[], CompactStore]
) -> None:
    """Every dev transcript imports; a new process sees a valid, paired active context."""
    transcripts = {path.stem: read_transcript(path) for path in CORPUS_FILES}
    for path in CORPUS_FILES:
        session = import_file(store, path)
        assert session.id == path.stem
        assert session.format == transcripts[path.stem].format
    fresh = reopen()
    # Subagents (Claude Code sidechains) are sessions of their own, linked to their parent.
    top = [i.id for i in fresh.sessions() if fresh.get_session(i.id).parent_session_id is None]
    assert sorted(top) == sorted(transcripts)
    for sid, transcript in transcripts.items():
        session = fresh.get_session(sid)
        assert session.messages() == transcript.messages
        assert len(session.boundaries()) == len(transcript.boundaries)
        active = session.active_context()
        check_pairing(session.format, active)
        check_sdk(session.format, active)
        if not transcript.boundaries:  # one message per seq, before the wire view
            assert session.context().messages() == transcript.messages


@pytest.mark.slow
@pytest.mark.corpus
def test_corpus_sources_produce_their_formats() -> None:
    formats = {p.parent.name: read_transcript(p).format for p in CORPUS_FILES}
    assert formats == {"claude-code": "anthropic", "codex": "openai", "swe-agent": "openai"}


# -- Claude Code --------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.corpus
def test_spotter_active_context_is_what_claude_code_continued_with(store: CompactStore) -> None:
    """After its auto compaction Claude Code continued with its summary, then the records
    after the boundary: the imported session's active context is exactly that (preceded only
    by the original request, which the store pins)."""
    records = raw_records(SPOTTER)
    at = next(i for i, r in enumerate(records) if r.get("subtype") == "compact_boundary")
    boundary_record = records[at]
    summary_record = next(r for r in records[at:] if r.get("isCompactSummary"))
    after = [
        r
        for r in records[at + 1 :]
        if r.get("type") in ("user", "assistant")
        and not r.get("isSidechain")
        and not r.get("isCompactSummary")
    ]
    assert after, "the transcript goes on after its compaction"

    session = import_file(store, SPOTTER)

    [boundary] = session.boundaries()
    meta = boundary_record["compactMetadata"]
    assert boundary.trigger == CompactTrigger(meta["trigger"]) == CompactTrigger.AUTO
    assert boundary.summary_text == summary_record["message"]["content"]
    assert boundary.timestamp == pytest.approx(epoch(boundary_record["timestamp"]))
    # Everything stays in the log; the summary record is a boundary, not a message.
    log = session.messages()
    assert not any(
        m["content"] == summary_record["message"]["content"] for m in log if m["role"] == "user"
    )

    context = session.context()
    states = [item.state for item in context.items]
    s = states.index("summary")
    assert context.items[s].message == {
        "role": "user",
        "content": [{"type": "text", "text": summary_record["message"]["content"]}],
    }
    assert set(states[:s]) == {"pinned"}
    assert [item.message for item in context.items[:s]] == [
        {"role": "user", "content": "Implement spotter-gqc"}
    ]
    kept = [item.message for item in context.items[s + 1 :]]
    first_kept = context.items[s + 1].seq
    assert first_kept is not None
    assert kept == log[first_kept:]
    # The kept messages carry exactly the blocks of the records after the boundary (the
    # importer regroups them into API messages, so compare as multisets).
    expected = Counter(
        json.dumps(block, sort_keys=True)
        for record in after
        for block in blocks_of(record["message"]["content"])
    )
    got = Counter(
        json.dumps(block, sort_keys=True) for m in kept for block in blocks_of(m["content"])
    )
    assert got == expected
    # The records before the boundary are kept in the log, before the cut.
    before = [
        r
        for r in records[:at]
        if r.get("type") in ("user", "assistant") and not r.get("isSidechain")
    ]
    before_ids = {b["id"] for r in before for b in blocks_of(r["message"]["content"]) if "id" in b}
    logged_ids = {b["id"] for m in log[:first_kept] for b in blocks_of(m["content"]) if b.get("id")}
    assert before_ids == logged_ids
    assert len(before_ids) > 100


@pytest.mark.corpus
def test_blocks_of_one_api_message_are_regrouped() -> None:
    """Records sharing message.id form one assistant message even when the results of its
    parallel tool calls were written between them; the results follow it."""
    records = raw_records(SPOTTER)
    by_message: dict[str, list[str]] = {}
    for record in records:
        if record.get("type") != "assistant" or record.get("isSidechain"):
            continue
        message = record["message"]
        for block in blocks_of(message["content"]):
            if block.get("type") == "tool_use":
                by_message.setdefault(message["id"], []).append(block["id"])
    interleaved = [ids for ids in by_message.values() if len(ids) > 1]
    assert len(interleaved) >= 5

    transcript = read_transcript(SPOTTER)
    fmt = get_format("anthropic")
    call_index = {c.id: i for i, m in enumerate(transcript.messages) for c in fmt.tool_calls(m)}
    result_index = {
        r.tool_use_id: i for i, m in enumerate(transcript.messages) for r in fmt.tool_results(m)
    }
    for ids in interleaved:
        [index] = {call_index[i] for i in ids}
        assert [c.id for c in fmt.tool_calls(transcript.messages[index])] == ids
        assert all(result_index[i] > index for i in ids)
    # One assistant message per API message.
    assert sum(m["role"] == "assistant" for m in transcript.messages) == len(
        {
            r["message"]["id"]
            for r in records
            if r.get("type") == "assistant" and not r.get("isSidechain")
        }
    )


@pytest.mark.corpus
def test_claude_code_timestamps_usage_and_paths() -> None:
    records = raw_records(SPOTTER)
    transcript = read_transcript(SPOTTER)
    first = next(r for r in records if r.get("type") == "user")
    assert transcript.timestamps[0] == pytest.approx(epoch(first["timestamp"]))
    assert all(t is not None for t in transcript.timestamps)

    first_assistant = next(r for r in records if r.get("type") == "assistant")
    usage = first_assistant["message"]["usage"]
    index = next(i for i, m in enumerate(transcript.messages) if m["role"] == "assistant")
    assert transcript.usage[index] == (
        usage["input_tokens"]
        + usage["cache_creation_input_tokens"]
        + usage["cache_read_input_tokens"]
    )
    assert all(
        (u is None) == (m["role"] != "assistant")
        for u, m in zip(transcript.usage, transcript.messages, strict=True)
    )

    reads = {
        b["id"]: b["input"]["file_path"]
        for r in records
        if r.get("type") == "assistant"
        for b in blocks_of(r["message"]["content"])
        if b.get("type") == "tool_use" and b["name"] == "Read"
    }
    fmt = get_format("anthropic")
    for message, path in zip(transcript.messages, transcript.read_paths, strict=True):
        results = fmt.tool_results(message)
        ok_reads = [r for r in results if r.tool_use_id in reads and not r.is_error]
        assert path == (reads[ok_reads[0].tool_use_id] if ok_reads else None)
    assert sum(p is not None for p in transcript.read_paths) > 10
    written = {p for paths in transcript.write_paths for p in paths}
    assert written and all(p.startswith("/home/USER/") for p in written)


def _use(call_id: str, name: str = "Bash", **input_: Any) -> Message:
    return {"type": "tool_use", "id": call_id, "name": name, "input": input_}


def _result(call_id: str, text: str = "ok") -> Message:
    return {"type": "tool_result", "tool_use_id": call_id, "content": text}


def test_claude_code_drops_what_the_store_would_refuse(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "cc.jsonl",
        [
            {"type": "file-history-snapshot", "messageId": "m0", "snapshot": {}},
            claude_code_record("user", "do it", uuid="u1"),
            claude_code_record(
                "assistant", [{"type": "text", "text": "\n\n"}], uuid="a1", message_id="m1"
            ),
            claude_code_record("assistant", [_use("t1")], uuid="a2", message_id="m1"),
            {"type": "progress", "uuid": "p1", "sessionId": "s", "data": {}},
            claude_code_record("user", [_result("t1")], uuid="u2"),
            claude_code_record("assistant", [_use("t2", name="Task")], uuid="a3", message_id="m1"),
            # The subagent's traffic: a sidechain, with its own call and result.
            claude_code_record(
                "assistant", [_use("side1")], uuid="s1", message_id="ms", isSidechain=True
            ),
            claude_code_record("user", [_result("side1")], uuid="s2", isSidechain=True),
            claude_code_record("user", [_result("t2"), _result("side1")], uuid="u3"),
            claude_code_record("user", [_result("t2", "again")], uuid="u4"),  # a second result
            claude_code_record("user", [_result("ghost")], uuid="u5"),  # its call was never made
            claude_code_record("user", [_result("t1")], uuid="u2"),  # a repeated record
            claude_code_record(
                "assistant",
                [
                    {"type": "thinking", "thinking": "hmm"},  # no signature: refused by the API
                    {"type": "thinking", "thinking": "ok", "signature": "sig"},
                    {"type": "text", "text": "done"},
                ],
                uuid="a4",
                message_id="m2",
            ),
            claude_code_record(
                "assistant",
                [{"type": "text", "text": "API Error"}],
                uuid="a5",
                message_id="m3",
                isApiErrorMessage=True,
            ),
            {"type": "system", "subtype": "turn_duration", "uuid": "x", "sessionId": "s"},
        ],
    )
    transcript = read_transcript(path)
    assert transcript.source == "claude-code"
    assert transcript.messages == [
        {"role": "user", "content": "do it"},
        {"role": "assistant", "content": [_use("t1"), _use("t2", name="Task")]},
        {"role": "user", "content": [_result("t1")]},
        {"role": "user", "content": [_result("t2")]},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "ok", "signature": "sig"},
                {"type": "text", "text": "done"},
            ],
        },
    ]
    check_sdk("anthropic", transcript.messages)


@pytest.mark.corpus
def test_a_subagent_transcript_is_its_own_conversation() -> None:
    """A file that is all sidechain (a subagent's transcript) keeps its records."""
    path = CORPUS_DEV / "claude-code" / "spotter-4d5611e5.subagent-a2898e3.jsonl"
    assert all(r.get("isSidechain") for r in raw_records(path) if "isSidechain" in r)
    assert calls_in(read_transcript(path)) == 33


def test_claude_code_boundary_without_summary_and_results_across_it(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "cc.jsonl",
        [
            claude_code_record("user", "first", uuid="u1"),
            claude_code_record("assistant", [_use("t1")], uuid="a1", message_id="m1"),
            {
                "type": "system",
                "subtype": "compact_boundary",
                "uuid": "b1",
                "sessionId": "s",
                "timestamp": "2026-01-01T01:00:00Z",
                "compactMetadata": {"trigger": "manual", "preTokens": 1234},
            },
            claude_code_record("user", [_result("t1")], uuid="u2"),  # its call is on the other side
            claude_code_record("user", "next", uuid="u3"),
        ],
    )
    transcript = read_transcript(path)
    assert transcript.messages == [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": [_use("t1")]},
        {"role": "user", "content": "next"},
    ]
    [boundary] = transcript.boundaries
    assert boundary.first_kept_index == 2
    assert boundary.trigger == CompactTrigger.MANUAL
    assert boundary.tokens_before == 1234
    assert boundary.timestamp == pytest.approx(epoch("2026-01-01T01:00:00+00:00"))
    assert "no summary" in boundary.summary_text


def _queue(operation: str, content: str | None = None, at: str = "00:00:30") -> Message:
    record: Message = {
        "type": "queue-operation",
        "operation": operation,
        "timestamp": f"2026-01-01T{at}.000Z",
        "sessionId": "s",
    }
    if content is not None:
        record["content"] = content
    return record


def test_claude_code_user_messages_queued_while_the_agent_worked(tmp_path: Path) -> None:
    """A message typed while the agent works is a queue-operation record; it reaches the
    model in the running turn, so it is imported as a user message before the next
    assistant message, never between a call and its result."""
    path = write_lines(
        tmp_path / "cc.jsonl",
        [
            claude_code_record("user", "port the parser", uuid="u1"),
            claude_code_record("assistant", [_use("t1"), _use("t2")], uuid="a1", message_id="m1"),
            _queue("enqueue", "also keep the old API working"),
            {"type": "progress", "uuid": "p1", "sessionId": "s", "data": {}},
            _queue("remove"),
            claude_code_record("user", [_result("t1")], uuid="u2"),
            _queue("enqueue", "   "),  # nothing typed: nothing to import
            claude_code_record("user", [_result("t2")], uuid="u3"),
            claude_code_record(
                "assistant", [{"type": "text", "text": "On it."}], uuid="a2", message_id="m2"
            ),
            # Queued, then delivered as an ordinary user record once the agent was idle.
            _queue("enqueue", "run the tests"),
            claude_code_record("user", "run the tests", uuid="u4"),
            _queue("enqueue", "and push", at="00:05:00"),  # the last word, at the end
        ],
    )
    transcript = read_transcript(path)
    assert transcript.messages == [
        {"role": "user", "content": "port the parser"},
        {"role": "assistant", "content": [_use("t1"), _use("t2")]},
        {"role": "user", "content": [_result("t1")]},
        {"role": "user", "content": [_result("t2")]},
        {"role": "user", "content": "also keep the old API working"},
        {"role": "assistant", "content": [{"type": "text", "text": "On it."}]},
        {"role": "user", "content": "run the tests"},
        {"role": "user", "content": "and push"},
    ]
    assert transcript.timestamps[4] == pytest.approx(epoch("2026-01-01T00:00:30+00:00"))
    assert transcript.timestamps[-1] == pytest.approx(epoch("2026-01-01T00:05:00+00:00"))
    check_sdk("anthropic", transcript.messages)


def test_claude_code_queued_command_attachments_typed_by_a_person(tmp_path: Path) -> None:
    """Newer Claude Code writes a queued message as a ``queued_command`` attachment; one
    typed by a person is a user message (once, even when a queue-operation repeats it), one
    the client queued itself is not."""

    def queued(prompt: str, kind: str, uuid: str) -> Message:
        attachment = {"type": "queued_command", "prompt": prompt, "origin": {"kind": kind}}
        return {"type": "attachment", "uuid": uuid, "sessionId": "s", "attachment": attachment}

    path = write_lines(
        tmp_path / "cc.jsonl",
        [
            claude_code_record("user", "port the parser", uuid="u1"),
            claude_code_record("assistant", [_use("t1")], uuid="a1", message_id="m1"),
            queued("keep the old API", "human", "q1"),
            queued("<task-notification>done</task-notification>", "task", "q2"),
            claude_code_record("user", [_result("t1")], uuid="u2"),
            claude_code_record(
                "assistant", [{"type": "text", "text": "On it."}], uuid="a2", message_id="m2"
            ),
            _queue("enqueue", "and push"),
            queued("and push", "human", "q3"),
        ],
    )
    said = [m["content"] for m in read_transcript(path).messages]
    assert said[3:] == ["keep the old API", [{"type": "text", "text": "On it."}], "and push"]


def test_claude_code_server_tool_the_api_does_not_take_back(tmp_path: Path) -> None:
    """The beta advisor tool's result is a block the Messages API does not take back: the
    call and its result become one text note, without a warning, whether they share a
    record or not; the rest of the API message is kept."""
    call = {"type": "server_tool_use", "id": "srvtoolu_1", "name": "advisor", "input": {}}
    result = {
        "type": "advisor_tool_result",
        "tool_use_id": "srvtoolu_1",
        "content": {"type": "advisor_redacted_result", "encrypted_content": "abc"},
    }
    text = {"type": "text", "text": "Asking first."}
    note = {
        "type": "text",
        "text": "[advisor consulted; its result (advisor_tool_result) is not kept]",
    }
    for records in (
        [
            claude_code_record("assistant", [text], uuid="a1", message_id="m1"),
            claude_code_record("assistant", [call], uuid="a2", message_id="m1"),
            claude_code_record("assistant", [result], uuid="a3", message_id="m1"),
        ],
        [claude_code_record("assistant", [text, call, result], uuid="a1", message_id="m1")],
    ):
        path = write_lines(
            tmp_path / "cc.jsonl", [claude_code_record("user", "plan it", uuid="u1"), *records]
        )
        transcript = read_transcript(path)
        assert transcript.messages[1] == {"role": "assistant", "content": [text, note]}
        check_sdk("anthropic", transcript.messages)


@pytest.mark.corpus
def test_queued_user_messages_of_a_real_transcript_are_imported() -> None:
    path = CORPUS_DEV / "claude-code" / "spotter-258c7280.jsonl"
    said = [m["content"] for m in read_transcript(path).messages if isinstance(m["content"], str)]
    assert "check again" in said and "new beads for the epic were added. tackle them" in said


# -- Codex --------------------------------------------------------------------------------


@pytest.mark.corpus
def test_codex_rollout_pairs_calls_and_outputs() -> None:
    path = CORPUS_DEV / "codex" / "agentcmd-rollout-2025-09-24T19-22-20.jsonl"
    records = raw_records(path)
    transcript = read_transcript(path)
    items = [r["payload"] for r in records if r["type"] == "response_item"]
    calls = {i["call_id"]: i for i in items if i["type"] == "function_call"}
    outputs = {i["call_id"]: i["output"] for i in items if i["type"] == "function_call_output"}
    tools = [m for m in transcript.messages if m["role"] == "tool"]
    assert {m["tool_call_id"]: m["content"] for m in tools} == outputs
    made = [c for m in transcript.messages for c in m.get("tool_calls", [])]
    assert [c["id"] for c in made] == list(calls)
    assert all(
        c["function"] == {"name": calls[c["id"]]["name"], "arguments": calls[c["id"]]["arguments"]}
        for c in made
    )
    roles = Counter(m["role"] for m in transcript.messages)
    user_items = sum(1 for i in items if i["type"] == "message" and i["role"] == "user")
    assert roles["user"] == user_items
    assert set(roles) == {"user", "assistant", "tool"}
    # Prompt sizes come from token_count events, one per model call.
    counts = [
        r["payload"]["info"]["last_token_usage"]["input_tokens"]
        for r in records
        if r["type"] == "event_msg" and r["payload"]["type"] == "token_count"
    ]
    assert [u for u in transcript.usage if u is not None] == counts[: roles["assistant"]]
    assert all(
        (u is not None) <= (m["role"] == "assistant")
        for u, m in zip(transcript.usage, transcript.messages, strict=True)
    )
    # Reads of one file by `sed -n`/`cat`, writes by apply_patch, resolved against the cwd.
    reads = [p for p in transcript.read_paths if p is not None]
    assert len(reads) >= 10
    assert all(p.startswith("/Users/jnarowski/Dev/spectora/") for p in reads)
    writes = {p for paths in transcript.write_paths for p in paths}
    assert any(p.endswith("settings/teams/components/TeamSheet.tsx") for p in writes)


def test_codex_read_and_patch_detection() -> None:
    cwd = "/repo"
    assert shell_read_path(["bash", "-lc", "sed -n '1,200p' src/a.ts"], None, cwd) == (
        "/repo/src/a.ts"
    )
    assert shell_read_path(["zsh", "-lc", "cat b.md"], "/repo/docs", cwd) == "/repo/docs/b.md"
    assert shell_read_path(["cat", "/etc/x"], None, None) == "/etc/x"
    assert shell_read_path("cat a | head", None, cwd) is None
    assert shell_read_path(["bash", "-lc", "cat a b"], None, cwd) is None
    assert shell_read_path(["bash", "-lc", "sed -i 's/a/b/' f"], None, cwd) is None
    assert shell_read_path(["bash", "-lc", "rg foo"], None, cwd) is None
    patch = "*** Begin Patch\n*** Add File: a.py\n+x\n*** Update File: b.py\n*** Move to: c.py\n"
    assert apply_patch_paths(patch + "*** Delete File: d.py\n*** End Patch") == [
        "a.py",
        "b.py",
        "c.py",
        "d.py",
    ]
    assert apply_patch_paths("*** Update File: x") == []


def _rollout(kind: str, payload: Message) -> Message:
    return {"timestamp": "2025-09-25T14:02:05.435Z", "type": kind, "payload": payload}


def test_codex_current_tools(tmp_path: Path) -> None:
    """Codex 0.14x: code-mode ``exec`` programs calling the tools (their reads and writes
    are the inner calls'), ``wait``, ``tool_search`` and provider-run web searches."""
    patch = "*** Begin Patch\n*** Update File: src/a.rs\n@@\n-a\n+b\n*** End Patch"
    program = (
        f"const patch = {json.dumps(patch)};\nawait tools.apply_patch(patch);\n"
        'const r = await tools.exec_command({cmd:"git diff", workdir:"/w"}); text(r.output);'
    )
    read = "const r = await tools.exec_command({cmd:\"sed -n '1,80p' src/b.rs\"}); text(r);"

    def call(kind: str, call_id: str, name: str, **extra: Any) -> Message:
        return _rollout("response_item", {"type": kind, "call_id": call_id, "name": name, **extra})

    def output(kind: str, call_id: str, **extra: Any) -> Message:
        return _rollout("response_item", {"type": kind, "call_id": call_id, **extra})

    path = write_lines(
        tmp_path / "rollout.jsonl",
        [
            _rollout("session_meta", {"id": "1", "cwd": "/w"}),
            _rollout(
                "response_item",
                {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "fix it"}],
                },
            ),
            call("custom_tool_call", "c1", "exec", input=program),
            output("custom_tool_call_output", "c1", output=[{"type": "input_text", "text": "ok"}]),
            call("custom_tool_call", "c2", "exec", input=read),
            output("custom_tool_call_output", "c2", output="fn b() {}"),
            call("function_call", "c3", "wait", arguments='{"cell_id":"7"}'),
            output("function_call_output", "c3", output="Script completed"),
            _rollout(
                "response_item",
                {"type": "tool_search_call", "call_id": "c4", "arguments": {"query": "github"}},
            ),
            output("tool_search_output", "c4", tools=[{"type": "namespace", "name": "github"}]),
            _rollout(
                "response_item",
                {
                    "type": "web_search_call",
                    "id": "ws_1",
                    "status": "completed",
                    "action": {"type": "search", "query": "rust 2027 edition"},
                },
            ),
        ],
    )
    transcript = read_transcript(path)
    calls = [c for m in transcript.messages for c in m.get("tool_calls", [])]
    names = [c.get("function", c.get("custom", {}))["name"] for c in calls]
    assert names == ["exec", "exec", "wait", "tool_search", "web_search"]
    assert transcript.write_paths[1] == ["/w/src/a.rs"]
    assert [p for p in transcript.read_paths if p] == ["/w/src/b.rs"]
    results = [m["content"] for m in transcript.messages if m["role"] == "tool"]
    assert results[3] == '[{"type": "namespace", "name": "github"}]'
    assert results[4].startswith("[web_search completed: run by the provider")
    assert json.loads(calls[4]["function"]["arguments"])["query"] == "rust 2027 edition"
    check_pairing("openai", transcript.messages)
    check_sdk("openai", transcript.messages)


def test_codex_variants_map_into_openai(tmp_path: Path) -> None:
    patch = "*** Begin Patch\n*** Update File: x.py\n@@\n-a\n+b\n*** End Patch"
    path = write_lines(
        tmp_path / "rollout.jsonl",
        [
            _rollout("session_meta", {"id": "1", "cwd": "/w", "instructions": "Be brief."}),
            _rollout(
                "response_item",
                {
                    "type": "message",
                    "role": "developer",
                    "content": [{"type": "input_text", "text": "sandboxed"}],
                },
            ),
            _rollout(
                "response_item",
                {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "go"}],
                },
            ),
            _rollout("response_item", {"type": "reasoning", "summary": [], "content": None}),
            _rollout(
                "response_item",
                {
                    "type": "custom_tool_call",
                    "call_id": "c1",
                    "name": "apply_patch",
                    "input": patch,
                },
            ),
            _rollout(
                "response_item",
                {
                    "type": "local_shell_call",
                    "call_id": "c2",
                    "status": "completed",
                    "action": {"type": "exec", "command": ["cat", "y.py"]},
                },
            ),
            _rollout(
                "event_msg",
                {"type": "token_count", "info": {"last_token_usage": {"input_tokens": 777}}},
            ),
            _rollout(
                "response_item",
                {"type": "custom_tool_call_output", "call_id": "c1", "output": "Done"},
            ),
            _rollout(
                "response_item", {"type": "function_call_output", "call_id": "c2", "output": "y"}
            ),
            _rollout(
                "response_item", {"type": "function_call_output", "call_id": "zz", "output": "?"}
            ),
            _rollout(
                "response_item",
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "ok"}],
                },
            ),
        ],
    )
    transcript = read_transcript(path)
    assert transcript.source == "codex"
    assert transcript.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "developer", "content": "sandboxed"},
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "custom", "custom": {"name": "apply_patch", "input": patch}},
                {
                    "id": "c2",
                    "type": "function",
                    "function": {
                        "name": "local_shell",
                        "arguments": json.dumps({"type": "exec", "command": ["cat", "y.py"]}),
                    },
                },
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "Done"},
        {"role": "tool", "tool_call_id": "c2", "content": "y"},
        {"role": "assistant", "content": "ok"},
    ]
    assert transcript.usage == [None, None, None, 777, None, None, None]
    assert transcript.write_paths[3] == ["/w/x.py"]
    assert transcript.read_paths == [None, None, None, None, None, "/w/y.py", None]
    check_sdk("openai", transcript.messages)


# -- SWE-agent ----------------------------------------------------------------------------


@pytest.mark.corpus
def test_swe_agent_history_becomes_openai_messages() -> None:
    path = CORPUS_DEV / "swe-agent" / "sweagent-marshmallow-1867-function_calling.traj"
    history = json.loads(path.read_text("utf-8"))["history"]
    transcript = read_transcript(path)
    assert [m["role"] for m in transcript.messages] == [m["role"] for m in history]
    assert [m.get("content") for m in transcript.messages] == [m["content"] for m in history]
    # Reused call ids become unique, and each observation answers the call just before it.
    for call_message, result in zip(
        transcript.messages[2::2], transcript.messages[3::2], strict=True
    ):
        assert [c["id"] for c in call_message["tool_calls"]] == [result["tool_call_id"]]
    assert all(
        set(m) <= {"role", "content", "tool_calls", "tool_call_id"} for m in transcript.messages
    )
    assert "src/marshmallow/fields.py" in transcript.read_paths
    assert ["src/marshmallow/fields.py"] in transcript.write_paths


# -- plain JSONL --------------------------------------------------------------------------

PLAIN = {
    "anthropic": [
        {"role": "user", "content": "read a.py"},
        {"role": "assistant", "content": [_use("t1", name="read_file", path="a.py")]},
        {"role": "user", "content": [_result("t1", "print(1)")]},
        {"role": "assistant", "content": "done"},
    ],
    "openai": [
        {"role": "user", "content": "read a.py"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "t1",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": '{"path":"a.py"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "t1", "content": "print(1)"},
        {"role": "assistant", "content": "done"},
    ],
    "minicode": [
        {"role": "user", "content": "read a.py"},
        {"role": "assistant", "content": [_use("t1", name="read_file", path="a.py")]},
        {
            "role": "tool_result",
            "content": "print(1)",
            "toolName": "read_file",
            "toolUseId": "t1",
            "isError": False,
        },
        {"role": "assistant", "content": "done"},
    ],
}


@pytest.mark.parametrize("format_name", list(PLAIN))
def test_plain_jsonl_format_is_detected(tmp_path: Path, format_name: str) -> None:
    path = write_lines(tmp_path / "plain.jsonl", PLAIN[format_name])
    assert detect(path) == "jsonl"
    transcript = read_transcript(path)
    assert (transcript.source, transcript.format) == ("jsonl", format_name)
    assert transcript.messages == PLAIN[format_name]
    assert read_transcript(path, format=format_name).messages == PLAIN[format_name]


@pytest.mark.parametrize(
    ("messages", "expected"),
    [
        ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}], "anthropic"),
        ([{"role": "system", "content": "be nice"}, {"role": "user", "content": "hi"}], "openai"),
        ([{"role": "developer", "content": "x"}, {"role": "user", "content": "hi"}], "openai"),
    ],
)
def test_plain_text_jsonl_detection(tmp_path: Path, messages: list[Message], expected: str) -> None:
    path = write_lines(tmp_path / "plain.jsonl", messages)
    assert read_transcript(path).format == expected


def test_plain_jsonl_in_the_wrong_format_names_the_line(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "plain.jsonl", PLAIN["openai"])
    with pytest.raises(InvalidInputError, match=r"plain\.jsonl line 2: not a valid anthropic"):
        read_transcript(path, format="anthropic")
    claude_code = write_lines(tmp_path / "cc.jsonl", [claude_code_record("user", "hi", uuid="u1")])
    with pytest.raises(InvalidInputError, match="imports as format 'anthropic', not 'openai'"):
        read_transcript(claude_code, format="openai")


def test_explicit_source_overrides_detection(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "plain.jsonl", PLAIN["anthropic"])
    # As a rollout it has no conversation, and the error says what it looks like.
    with pytest.raises(
        InvalidInputError,
        match=r"plain\.jsonl holds no codex messages to import: it looks like plain JSONL of "
        "messages; import it as format 'jsonl'",
    ):
        read_transcript(path, format="codex")
    with pytest.raises(InvalidInputError, match="unknown import format 'cursor'"):
        read_transcript(path, format="cursor")


def test_a_pretty_printed_trajectory_is_detected_by_content(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    history = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    path.write_text(json.dumps({"history": history}, indent=2), "utf-8")
    assert detect(path) == "swe-agent"
    assert read_transcript(path).messages == history


@pytest.mark.corpus
def test_progress_is_reported(tmp_path: Path) -> None:
    seen: list[tuple[int, int]] = []
    read_transcript(SPOTTER, progress=lambda done, total: seen.append((done, total)))
    total = len(SPOTTER.read_text("utf-8").splitlines())
    assert seen[-1] == (total, total)
    assert len(seen) > 10
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)

    traj = CORPUS_DEV / "swe-agent" / "sweagent-marshmallow-1867-function_calling.traj"
    steps: list[tuple[int, int]] = []
    read_transcript(traj, progress=lambda done, total: steps.append((done, total)))
    assert steps[-1] == (24, 24)


# -- errors leave the database unchanged --------------------------------------------------


def _malformed(tmp_path: Path) -> list[tuple[Path, str]]:
    good = json.dumps({"role": "user", "content": "hi"})
    cases: list[tuple[Path, str]] = []

    def case(name: str, data: bytes, expected: str) -> None:
        path = tmp_path / name
        path.write_bytes(data)
        cases.append((path, expected))

    case(
        "bad.jsonl",
        f'{good}\n{good}\n{{"role": "user" "content": 1}}\n'.encode(),
        (r"bad\.jsonl line 3: not valid JSON \(Expecting ',' delimiter at column 17\)"),
    )
    case(
        "latin1.jsonl",
        f'{good}\n{{"role":"user","content":"caf'.encode() + b'\xe9"}\n',
        (r"latin1\.jsonl is not UTF-8 text \(byte 0xe9 at offset 63\)"),
    )
    case("empty.jsonl", b"", r"empty\.jsonl is empty")
    case("blank.jsonl", b"\n  \n", r"blank\.jsonl is empty")
    case(
        "array.jsonl", f"{good}\n[1, 2]\n".encode(), r"array\.jsonl line 2: expected a JSON object"
    )
    case("number.jsonl", b"42\n", r"number\.jsonl line 1: expected a JSON object, got a number")
    case("odd.jsonl", b'{"kind": "x"}\n', r"cannot tell what kind of transcript odd\.jsonl is")
    case(
        "orphan.jsonl",
        (good + "\n" + json.dumps({"role": "tool", "tool_call_id": "x", "content": "r"})).encode(),
        r"orphan\.jsonl line 2: tool result for 'x', but no earlier tool call",
    )
    case(
        "cc.jsonl",
        json.dumps(claude_code_record("user", "hi", uuid="u1")).encode()
        + b"\n"
        + json.dumps({"type": "assistant", "uuid": "a", "sessionId": "s", "message": "x"}).encode(),
        r"cc\.jsonl line 2: a assistant record needs a 'message' object",
    )
    case(
        "noid.jsonl",
        json.dumps(claude_code_record("user", "hi", uuid="u1")).encode()
        + b"\n"
        + json.dumps(
            claude_code_record(
                "assistant", [{"type": "tool_use", "name": "Bash", "input": {}}], uuid="a"
            )
        ).encode(),
        r"noid\.jsonl line 2: assistant record: content\[0\]: tool_use block needs a string 'id'",
    )
    case(
        "nothing.jsonl",
        json.dumps({"type": "progress", "uuid": "p", "sessionId": "s"}).encode(),
        r"nothing\.jsonl holds no conversation messages",
    )
    case("bad.traj", b'{"history": [\n{"role": "user",\n"content": }]}', r"bad\.traj line 3")
    case(
        "role.traj",
        json.dumps({"history": [{"role": "robot", "content": "x"}]}).encode(),
        r"role\.traj history\[0\]: unknown role 'robot'",
    )
    return cases


@pytest.mark.slow
def test_malformed_files_fail_naming_the_place_and_store_nothing(
    store: CompactStore, db_snapshot: Snapshot, tmp_path: Path
) -> None:
    import_file(store, write_lines(tmp_path / "existing.jsonl", PLAIN["anthropic"]))
    before = db_snapshot(store)
    for path, expected in _malformed(tmp_path):
        with pytest.raises(InvalidInputError, match=expected):
            import_file(store, path)
        with pytest.raises(NotFoundError):
            store.get_session(path.stem)
    assert db_snapshot(store) == before


@pytest.mark.corpus
def test_a_real_transcript_damaged_mid_file_stores_nothing(
    store: CompactStore, db_snapshot: Snapshot, tmp_path: Path
) -> None:
    before = db_snapshot(store)
    # A real transcript whose write was cut short 1,500 lines in.
    lines = SPOTTER.read_text("utf-8").splitlines(keepends=True)
    lines[1499] = lines[1499][: len(lines[1499]) // 2] + "\n"
    broken = tmp_path / "spotter.jsonl"
    broken.write_text("".join(lines), "utf-8")
    with pytest.raises(InvalidInputError, match=r"^spotter\.jsonl line 1500: not valid JSON"):
        import_file(store, broken)
    assert db_snapshot(store) == before


@pytest.mark.slow
def test_import_options_and_an_existing_session(
    store: CompactStore, db_snapshot: Snapshot, tmp_path: Path
) -> None:
    assert {"claude-code", "codex", "swe-agent", "jsonl"} <= set(SOURCES)
    path = write_lines(tmp_path / "plain.jsonl", PLAIN["openai"])
    session = import_file(store, path, session_id="mine", context_window=50_000)
    assert (session.id, session.format, session.context_window) == ("mine", "openai", 50_000)
    # ``format`` takes a source or a message format.
    minicode = write_lines(tmp_path / "mc.jsonl", PLAIN["minicode"])
    assert import_file(store, minicode, session_id="a", format="jsonl").format == "minicode"
    assert import_file(store, minicode, session_id="b", format="minicode").format == "minicode"
    before = db_snapshot(store)
    with pytest.raises(InvalidInputError, match="unknown import format 'yaml'"):
        import_file(store, minicode, session_id="c", format="yaml")
    with pytest.raises(ConflictError, match="already exists"):
        import_file(store, path, session_id="mine")
    assert db_snapshot(store) == before


# -- files as they come: cut short, gzip, standard input -----------------------------------


def _claude_code_lines() -> list[Any]:
    return [
        claude_code_record("user", "list the files", uuid="u1"),
        claude_code_record("assistant", [_use("t1", command="ls")], uuid="a1", message_id="m1"),
        claude_code_record("user", [_result("t1", "a.py")], uuid="u2"),
        claude_code_record(
            "assistant", [{"type": "text", "text": "one file"}], uuid="a2", message_id="m2"
        ),
    ]


@pytest.mark.slow
def test_a_cut_last_line_is_left_out_with_a_warning(
    store: CompactStore, db_snapshot: Snapshot, tmp_path: Path
) -> None:
    lines = _claude_code_lines()
    path = write_lines(tmp_path / "live.jsonl", lines[:3])
    with path.open("a", encoding="utf-8") as out:
        out.write(json.dumps(lines[3])[:40])  # the agent is still writing line 4
    before = db_snapshot(store)
    with pytest.raises(InvalidInputError, match=r"^live\.jsonl line 4: the last line is cut short"):
        import_file(store, path, strict=True)
    assert db_snapshot(store) == before
    with pytest.warns(CompactStoreWarning, match=r"live\.jsonl line 4 is cut short"):
        session = import_file(store, path)
    assert [m["role"] for m in session.messages()] == ["user", "assistant", "user"]
    with pytest.warns(CompactStoreWarning, match="line 4 is cut short"):
        assert len(read_transcript(path).messages) == 3


def test_a_damaged_last_line_that_was_finished_is_still_an_error(tmp_path: Path) -> None:
    path = tmp_path / "done.jsonl"
    path.write_text(json.dumps(PLAIN["anthropic"][0]) + "\n" + '{"role": "user", "con\n')
    with pytest.raises(InvalidInputError, match=r"^done\.jsonl line 2: not valid JSON"):
        read_transcript(path)


@pytest.mark.slow
def test_gzip_files_and_streams_import_like_the_plain_file(
    store: CompactStore, tmp_path: Path
) -> None:
    data = "".join(json.dumps(line) + "\n" for line in _claude_code_lines()).encode()
    zipped = tmp_path / "run.jsonl.gz"
    zipped.write_bytes(gzip.compress(data))
    expected = read_transcript(write_lines(tmp_path / "plain.jsonl", _claude_code_lines()))
    assert detect(zipped) == "claude-code"
    session = import_file(store, zipped)
    assert session.id == "run" and session.messages() == expected.messages
    with pytest.raises(InvalidInputError, match="give the session id"):
        import_file(store, io.BytesIO(data))
    assert import_file(store, io.BytesIO(data), session_id="piped").messages() == expected.messages
    unzipped = import_file(store, io.BytesIO(gzip.compress(data)), session_id="piped-gz")
    assert unzipped.messages() == expected.messages
    # A trajectory keeps its suffix under .gz; a damaged gzip stream is one clear error.
    traj = tmp_path / "t.traj.gz"
    traj.write_bytes(gzip.compress(json.dumps({"history": PLAIN["openai"]}).encode()))
    assert read_transcript(traj).source == "swe-agent"
    broken = tmp_path / "broken.jsonl.gz"
    broken.write_bytes(gzip.compress(data)[:-30])
    with pytest.raises(InvalidInputError, match=r"cannot read broken\.jsonl\.gz as gzip"):
        import_file(store, broken)
    with pytest.raises(NotFoundError):
        store.get_session("broken")


def test_format_takes_a_source_name_when_reading_too(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "cc.jsonl", _claude_code_lines())
    assert read_transcript(path, format="claude-code").format == "anthropic"
    plain = write_lines(tmp_path / "plain.jsonl", PLAIN["minicode"])
    assert read_transcript(plain, format="jsonl").format == "minicode"


@pytest.mark.slow
def test_a_message_the_store_refuses_is_named_by_its_file_line(
    store: CompactStore, db_snapshot: Snapshot, tmp_path: Path
) -> None:
    path = tmp_path / "odd.jsonl"
    lines = [
        '{"role": "user", "content": "hi"}',
        '{"role": "assistant", "content": "ok"}',
        "",
        '{"role": "user", "content": "caf\\ud800"}',  # a lone surrogate, escaped
    ]
    path.write_text("\n".join(lines) + "\n", "utf-8")
    before = db_snapshot(store)
    with pytest.raises(InvalidMessageError, match=r"^odd\.jsonl line 4: message text is not valid"):
        import_file(store, path)
    assert db_snapshot(store) == before


@pytest.mark.slow
def test_tokens_are_counted_while_the_target_is_not_locked(tmp_path: Path) -> None:
    """The import is staged (and counted) in a temporary database; the target's
    write lock is taken only to copy the finished session in."""
    target = tmp_path / "target.db"
    probes: list[bool] = []

    def counter(text: str) -> int:
        probe = sqlite3.connect(target, timeout=0)
        try:
            probe.execute("BEGIN IMMEDIATE")  # fails while another writer holds the lock
            probes.append(True)
        except sqlite3.OperationalError:
            probes.append(False)
        finally:
            probe.close()
        return len(text) // 4

    with CompactStore.open(target, token_counter=counter) as store:
        session = import_file(store, write_lines(tmp_path / "run.jsonl", _claude_code_lines()))
        assert len(session.messages()) == 4
        assert probes and all(probes)
        # store.import_session stages the same way.
        probes.clear()
        items = [ImportedMessage({"role": "user", "content": "hi"}, 1_700_000_000.0)]
        assert store.import_session("direct", items).messages() == [items[0].message]
        with pytest.raises(ConflictError, match="already exists"):
            store.import_session("direct", items)
    assert probes and all(probes)


@pytest.mark.slow
def test_import_memory_does_not_grow_with_the_transcript(tmp_path: Path) -> None:
    """Memory held while importing stays bounded: a 4x longer transcript needs no more.

    (benchmarks/memory.py measures the process's peak RSS on a 200 MB transcript.)
    """
    from benchmarks.memory import generate

    peaks: list[int] = []
    for size in (1_000_000, 4_000_000):
        path = tmp_path / f"t{size}.jsonl"
        generate(path, size)
        with CompactStore.open(tmp_path / f"{size}.db") as store:
            tracemalloc.start()
            try:
                session = import_file(store, path)
                peaks.append(tracemalloc.get_traced_memory()[1])
            finally:
                tracemalloc.stop()
            assert session.boundaries()  # Claude Code's own compactions came along
    assert peaks[1] < peaks[0] + 1_500_000, [f"{p / 1e6:.1f} MB" for p in peaks]


# -- the command line -----------------------------------------------------------------------


@pytest.mark.slow
def test_the_cli_imports_from_stdin_and_reports_a_cut_line(tmp_path: Path) -> None:
    db = str(tmp_path / "cli.db")
    data = "".join(json.dumps(line) + "\n" for line in _claude_code_lines())
    runner = CliRunner()
    piped = runner.invoke(cli, ["import", "-", "--session", "piped", "--db", db], input=data)
    assert piped.exit_code == 0, piped.output
    assert "imported 4 messages into session piped" in piped.stdout
    nameless = runner.invoke(cli, ["import", "-", "--db", db], input=data)
    assert nameless.exit_code == 1 and "give the session id" in nameless.stderr
    cut = data[: data.rindex("{") + 30]  # the last record half written
    warned = runner.invoke(cli, ["import", "-", "--session", "live", "--db", db], input=cut)
    assert warned.exit_code == 0, warned.output
    assert "imported 3 messages into session live" in warned.stdout
    assert "\nWarning: stdin line 4 is cut short" in warned.stderr
    strict = runner.invoke(
        cli, ["import", "-", "--session", "strict", "--strict", "--db", db], input=cut
    )
    assert strict.exit_code == 1
    assert strict.stderr.startswith("Error: stdin line 4: the last line is cut short")
    listed = runner.invoke(cli, ["sessions", "--db", db, "--json"])
    assert sorted(s["id"] for s in json.loads(listed.stdout)) == ["live", "piped"]


@pytest.mark.slow
def test_the_cli_simulates_a_gzip_file_and_stdin(tmp_path: Path) -> None:
    plain = write_lines(tmp_path / "run.jsonl", _claude_code_lines())
    zipped = tmp_path / "run.jsonl.gz"
    zipped.write_bytes(gzip.compress(plain.read_bytes()))
    for args, data in (([str(zipped)], None), (["-"], plain.read_text())):
        out = CliRunner().invoke(cli, ["simulate", *args, "--json"], input=data)
        assert out.exit_code == 0, out.output
        assert json.loads(out.stdout)["calls"] == 2


@pytest.mark.slow
def test_the_agents_working_directory_becomes_the_sessions(
    store: CompactStore, tmp_path: Path
) -> None:
    """Paths in summaries are relative to the session's cwd: an import takes it from the
    transcript (Claude Code records, Codex session_meta), a Windows one included."""
    claude = write_lines(
        tmp_path / "cc.jsonl",
        [
            claude_code_record("user", "hi", uuid="u1", cwd="D:\\oh-my-posh"),
            claude_code_record("assistant", [{"type": "text", "text": "hello"}], uuid="a1"),
        ],
    )
    codex = write_lines(
        tmp_path / "rollout.jsonl",
        [
            {"type": "session_meta", "payload": {"id": "s", "cwd": "/w/app"}},
            {
                "type": "response_item",
                "payload": {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "hi"}],
                },
            },
        ],
    )
    assert read_transcript(claude).cwd == "D:\\oh-my-posh"
    assert import_file(store, claude).context().cwd == "D:\\oh-my-posh"
    assert import_file(store, codex).context().cwd == "/w/app"
