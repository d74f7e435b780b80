"""Codex rollouts as Responses items (``--format responses``) and Codex's multi-part user
messages: the items the SDK types accept, reasoning and compaction items kept verbatim, the
default format unchanged, the real request the one the summary quotes."""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from compactstore import CompactStore, InvalidInputError
from compactstore._cli import cli
from compactstore._importers import import_file, read_transcript
from compactstore._simulate import simulate
from compactstore.formats.sdk_types import check_sdk_types
from tests.conftest import CORPUS_DEV, corpus_params

SECRET = "gAAAAABo1Ut" + "x" * 200  # an encrypted reasoning blob, as Codex stores it
AGENTS = "# AGENTS.md instructions for /w\n\n<INSTRUCTIONS>\nRun cargo fmt.\n</INSTRUCTIONS>"
ENVIRONMENT = "<environment_context>\n  <cwd>/w</cwd>\n  <shell>zsh</shell>\n</environment_context>"
REQUEST = "Make the parser keep trailing comments"


def write_lines(path: Path, lines: Iterable[Any]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


def _record(kind: str, payload: dict[str, Any], second: int = 0) -> dict[str, Any]:
    return {"timestamp": f"2026-07-15T21:00:{second:02d}.000Z", "type": kind, "payload": payload}


def _item(payload: dict[str, Any], second: int = 0) -> dict[str, Any]:
    meta = {"internal_chat_message_metadata_passthrough": {"turn_id": "t1"}}
    return _record("response_item", {**payload, **meta}, second)


def _count(tokens: int) -> dict[str, Any]:
    usage = {"input_tokens": tokens, "cached_input_tokens": 0, "output_tokens": 10}
    return _record("event_msg", {"type": "token_count", "info": {"last_token_usage": usage}})


def _user(*texts: str) -> dict[str, Any]:
    parts = [{"type": "input_text", "text": text} for text in texts]
    return _item({"type": "message", "role": "user", "content": parts})


def rollout() -> list[dict[str, Any]]:
    """A Codex 0.14x rollout: instructions, environment and request as parts of one user
    message, reasoning with and without ids, the three call kinds, a web search, and a
    server-side compaction that kept an encrypted compaction item."""
    patch = "*** Begin Patch\n*** Update File: src/parse.rs\n@@\n-a\n+b\n*** End Patch"
    return [
        _record("session_meta", {"id": "s1", "cwd": "/w", "cli_version": "0.144.2"}),
        _record("turn_context", {"cwd": "/w", "model": "gpt-5.5"}),
        _item(
            {
                "type": "message",
                "role": "developer",
                "content": [{"type": "input_text", "text": "<permissions>ask</permissions>"}],
            }
        ),
        _user(AGENTS, ENVIRONMENT, REQUEST),
        _item(
            {
                "type": "reasoning",
                "summary": [{"type": "summary_text", "text": "**Reading the parser**"}],
                "content": None,
                "encrypted_content": SECRET,
            },
            1,
        ),
        _item(
            {
                "type": "message",
                "id": "msg_1",
                "role": "assistant",
                "phase": "commentary",
                "content": [{"type": "output_text", "text": "Reading the parser first."}],
            },
            1,
        ),
        _item(
            {
                "type": "function_call",
                "id": "fc_1",
                "name": "exec_command",
                "arguments": json.dumps({"cmd": "cat src/parse.rs", "workdir": "/w"}),
                "call_id": "call_1",
            },
            1,
        ),
        _count(12_000),
        _item({"type": "function_call_output", "call_id": "call_1", "output": "fn parse() {}"}, 2),
        _item({"type": "reasoning", "id": "rs_2", "summary": []}, 3),
        _item(
            {
                "type": "custom_tool_call",
                "id": "ctc_1",
                "status": "completed",
                "call_id": "call_2",
                "name": "apply_patch",
                "input": patch,
            },
            3,
        ),
        _item(
            {
                "type": "web_search_call",
                "id": "ws_1",
                "status": "completed",
                "action": {"type": "search", "query": "rust comments", "queries": ["x"]},
            },
            3,
        ),
        _count(13_000),
        _item(
            {
                "type": "custom_tool_call_output",
                "call_id": "call_2",
                "output": [{"type": "input_text", "text": "Success. Updated src/parse.rs"}],
            },
            4,
        ),
        _record(
            "compacted",
            {
                "message": "",
                "replacement_history": [
                    {
                        "type": "message",
                        "role": "user",
                        "content": [{"type": "input_text", "text": REQUEST}],
                    },
                    {"type": "compaction", "encrypted_content": "ENC-COMPACTION"},
                ],
            },
            5,
        ),
        _user("Now add a test for it"),
        _item(
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Adding the test."}],
            },
            6,
        ),
    ]


def test_a_rollout_imports_as_responses_items_the_sdk_accepts(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "rollout.jsonl", rollout())

    transcript = read_transcript(path, format="responses")

    assert (transcript.source, transcript.format) == ("codex", "responses")
    items = transcript.messages
    assert [(i.get("type"), i.get("role")) for i in items] == [
        ("message", "developer"),
        ("message", "user"),
        ("reasoning", None),
        ("message", "assistant"),
        ("function_call", None),
        ("function_call_output", None),
        ("reasoning", None),
        ("custom_tool_call", None),
        ("web_search_call", None),
        ("custom_tool_call_output", None),
        ("compaction", None),
        ("message", "user"),
        ("message", "assistant"),
    ]
    check_sdk_types("responses", items)
    # The user message keeps its three parts; Codex's bookkeeping keys are left out.
    assert [p["text"] for p in items[1]["content"]] == [AGENTS, ENVIRONMENT, REQUEST]
    assert all("internal_chat_message_metadata_passthrough" not in i for i in items)
    # Reasoning: the encrypted content verbatim; an id made when Codex wrote none.
    first, second = items[2], items[6]
    assert first["encrypted_content"] == SECRET and first["id"].startswith("rs_")
    assert first["summary"] == [{"type": "summary_text", "text": "**Reading the parser**"}]
    assert second == {"type": "reasoning", "id": "rs_2", "summary": []}
    assert items[3] == {
        "type": "message",
        "role": "assistant",
        "content": "Reading the parser first.",
        "phase": "commentary",
    }
    assert items[9]["output"] == "Success. Updated src/parse.rs"
    assert items[8]["action"] == {"type": "search", "query": "rust comments", "queries": ["x"]}
    # The compaction: a boundary, then the encrypted item Codex continued with.
    (boundary,) = transcript.boundaries
    assert boundary.first_kept_index == 10
    assert items[10] == {"type": "compaction", "encrypted_content": "ENC-COMPACTION"}
    assert REQUEST in boundary.summary_text and "ENC-COMPACTION" not in boundary.summary_text
    # Each model response's first item carries its prompt size; reads and writes as before.
    assert transcript.usage[2] == 12_000 and transcript.usage[6] == 13_000
    assert transcript.usage[3] is None and transcript.usage[4] is None
    assert transcript.read_paths[5] == "/w/src/parse.rs"
    assert transcript.write_paths[7] == ["/w/src/parse.rs"]


def test_the_default_stays_openai_and_keeps_the_user_parts(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "rollout.jsonl", rollout())

    transcript = read_transcript(path)

    assert transcript.format == "openai"
    user = transcript.messages[1]
    assert user["role"] == "user"
    assert [p["text"] for p in user["content"]] == [AGENTS, ENVIRONMENT, REQUEST]
    assert not any(m.get("type") == "reasoning" for m in transcript.messages)
    # The openai format cannot carry the compaction item: the summary names it.
    assert "encrypted content only the provider" in transcript.boundaries[0].summary_text


@pytest.mark.parametrize("fmt", ["openai", "responses"])
@pytest.mark.slow
def test_the_summary_quotes_the_request_part(tmp_path: Path, fmt: str) -> None:
    lines = [line for line in rollout() if line["type"] != "compacted"]
    for n in range(30):
        lines.append(_user(f"step {n}: " + "more detail " * 40))
        lines.append(
            _item(
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": f"done {n}"}],
                }
            )
        )
    path = write_lines(tmp_path / "rollout.jsonl", lines)
    with CompactStore.open(tmp_path / "s.db") as store:
        session = import_file(store, path, session_id="codex", format=fmt)
        text = session.compact(now=2_000_000_000.0).summary_text

    request = text.split("## Original request\n")[1].split("\n\n")[0]
    assert request == REQUEST


@pytest.mark.slow
def test_the_cli_imports_a_rollout_as_responses(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "rollout.jsonl", rollout())
    db = str(tmp_path / "s.db")

    result = CliRunner().invoke(
        cli, ["import", str(path), "--format", "responses", "--db", db, "--json"]
    )

    assert result.exit_code == 0, result.output
    found = json.loads(result.stdout)
    assert (found["format"], found["messages"], found["boundaries"]) == ("responses", 13, 1)
    with CompactStore.open(db) as store:
        params = store.get_session("rollout").request_params()
    sent = params["input"]
    check_sdk_types("responses", sent)
    assert {"type": "compaction", "encrypted_content": "ENC-COMPACTION"} in sent
    # A reasoning item without encrypted content cannot be resolved by the provider: the
    # log keeps it, the request leaves it out.
    assert not any(i.get("id") == "rs_2" for i in sent)


def test_responses_is_refused_for_a_source_that_cannot_give_it(tmp_path: Path) -> None:
    lines = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    claude = {
        "type": "user",
        "uuid": "u1",
        "parentUuid": None,
        "sessionId": "s",
        "message": {"role": "user", "content": "hi"},
    }
    path = write_lines(tmp_path / "chat.jsonl", [claude, *lines[1:]])

    with pytest.raises(InvalidInputError, match="imports as format 'anthropic', not 'responses'"):
        read_transcript(path, format="responses")


# -- the corpus: every Codex transcript ----------------------------------------------------


def _codex_files() -> list[Any]:
    """The dev corpus's Codex rollouts (without any, one parameter skipped saying so)."""
    folder = CORPUS_DEV / "codex"
    return corpus_params(sorted(folder.glob("*.jsonl")), folder, "Codex rollouts")


@pytest.mark.corpus
@pytest.mark.parametrize("path", _codex_files(), ids=lambda p: p.name)
def test_every_codex_rollout_imports_as_items_the_sdk_accepts(path: Path) -> None:
    transcript = read_transcript(path, format="responses")
    plain = read_transcript(path)

    check_sdk_types("responses", transcript.messages)
    kinds = ("function_call", "custom_tool_call", "web_search_call")
    calls = sum(m.get("type") in kinds for m in transcript.messages)
    assert calls == sum(len(m.get("tool_calls", [])) for m in plain.messages)
    assert len(transcript.boundaries) == len(plain.boundaries)
    reasoning = [m for m in transcript.messages if m.get("type") == "reasoning"]
    raw = [line for line in path.read_text(encoding="utf-8").splitlines() if '"reasoning"' in line]
    assert len(reasoning) == sum('"type":"reasoning"' in line for line in raw)


@pytest.mark.slow
@pytest.mark.corpus
@pytest.mark.parametrize("path", _codex_files(), ids=lambda p: p.name)
def test_every_codex_rollout_as_responses_is_valid_at_each_window(path: Path) -> None:
    for window in (200_000, 64_000, 32_000):
        report = simulate(path, window=window, format="responses")
        assert report.format == "responses" and report.sdk_checked
        assert report.valid_calls == report.calls, report.invalid_examples


@pytest.mark.slow
def test_simulate_makes_one_model_call_per_response(tmp_path: Path) -> None:
    # A Responses turn is several items (reasoning, text, calls): one call before them all,
    # never one between a call and the next, which could cut a call from its output.
    path = write_lines(tmp_path / "rollout.jsonl", rollout())

    report = simulate(path, window=200_000, format="responses")

    # The three responses, and the compaction Codex asked the provider for.
    assert report.calls == 4 and report.valid_calls == 4


def _long_rollout(path: Path, size: int) -> None:
    """A rollout of about ``size`` bytes: turns of reasoning, a call and its output."""
    with path.open("w", encoding="utf-8") as out:
        for line in rollout()[:4]:
            out.write(json.dumps(line) + "\n")
        turn = 0
        while out.tell() < size:
            turn += 1
            call = json.dumps({"cmd": f"cat src/f{turn}.rs"})
            for line in (
                _item({"type": "reasoning", "summary": [], "encrypted_content": SECRET}),
                _item(
                    {
                        "type": "function_call",
                        "name": "exec_command",
                        "arguments": call,
                        "call_id": f"c{turn}",
                    }
                ),
                _count(10_000 + turn),
                _item(
                    {"type": "function_call_output", "call_id": f"c{turn}", "output": "x" * 2000}
                ),
            ):
                out.write(json.dumps(line) + "\n")


@pytest.mark.slow
def test_import_memory_as_responses_does_not_grow_with_the_rollout(tmp_path: Path) -> None:
    peaks: list[int] = []
    for size in (1_000_000, 4_000_000):
        path = tmp_path / f"r{size}.jsonl"
        _long_rollout(path, size)
        with CompactStore.open(tmp_path / f"{size}.db") as store:
            tracemalloc.start()
            try:
                session = import_file(store, path, format="responses")
                peaks.append(tracemalloc.get_traced_memory()[1])
            finally:
                tracemalloc.stop()
            assert session.format == "responses"
    assert peaks[1] < peaks[0] + 1_500_000, [f"{p / 1e6:.1f} MB" for p in peaks]
