"""compactstore simulate: replaying transcripts through compaction and measuring quality."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from compactstore import CompactStore
from compactstore import _summary_audit as audit
from compactstore._cli import cli
from compactstore._importers import read_transcript
from compactstore._simulate import simulate, simulate_transcript
from tests.conftest import CORPUS_DEV
from tests.helpers import claude_code_record

FORMATS = ["anthropic", "openai", "minicode"]


def call(fmt: str, call_id: str, path: str) -> dict[str, Any]:
    if fmt == "openai":
        return {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": "Read", "arguments": json.dumps({"file_path": path})},
                }
            ],
        }
    return {
        "role": "assistant",
        "content": [
            {"type": "text", "text": f"Reading {path}"},
            {"type": "tool_use", "id": call_id, "name": "Read", "input": {"file_path": path}},
        ],
    }


def result(fmt: str, call_id: str, text: str) -> dict[str, Any]:
    if fmt == "openai":
        return {"role": "tool", "tool_call_id": call_id, "content": text}
    if fmt == "minicode":
        return {"role": "tool_result", "content": text, "toolName": "Read", "toolUseId": call_id}
    return {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": call_id, "content": text}],
    }


def transcript(
    fmt: str, turns: int = 60, *, orphan: bool = True, huge: bool = True
) -> list[dict[str, Any]]:
    """A coding session: reads of many files, a crash-orphaned call, one huge result."""
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Refactor src/app/ error handling"}
    ]
    for i in range(turns):
        call_id = f"call_{i}"
        path = f"src/app/module_{i % 23}.py"
        messages.append(call(fmt, call_id, path))
        if orphan and i == 7:
            # The agent crashed mid-tool: no result, the user speaks next.
            messages.append({"role": "user", "content": "You stopped. Please continue."})
            continue
        body = "\n".join(f"def f{i}_{k}(): return {k}  # {path}" for k in range(60))
        if huge and i == 30:
            body = "x = 1\n" * 40_000
        messages.append(result(fmt, call_id, body))
        messages.append({"role": "assistant", "content": f"Module {i} looks fine."})
        if i % 10 == 9:
            messages.append({"role": "user", "content": f"Now look at batch {i // 10 + 1}."})
    return messages


def write_jsonl(path: Path, messages: list[dict[str, Any]]) -> Path:
    path.write_text("\n".join(json.dumps(m) for m in messages) + "\n", encoding="utf-8")
    return path


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
def test_every_call_of_a_generated_transcript_gets_a_valid_context_that_fits(
    tmp_path: Path, fmt: str
) -> None:
    file = write_jsonl(tmp_path / f"{fmt}.jsonl", transcript(fmt))
    report = simulate(file, window=8_000)
    assert report.format == fmt
    assert report.calls == sum(1 for m in transcript(fmt) if m["role"] == "assistant")
    assert report.validity == 1.0, report.invalid_examples
    assert report.request_share == 1.0
    assert report.fit_max <= 1.0
    assert report.loops == 0
    # The huge result was persisted, and the small window forced real compactions.
    assert report.freed["tool_budget"] > 9_000
    strategies = {e.strategy for e in report.compactions}
    assert strategies & {"full", "reactive"}, strategies
    assert report.file_recall is not None and report.file_recall >= 0.8


@pytest.mark.slow
def test_a_large_window_needs_no_cut(tmp_path: Path) -> None:
    file = write_jsonl(tmp_path / "a.jsonl", transcript("anthropic", huge=False))
    report = simulate(file, window=1_000_000)
    assert [e for e in report.compactions if e.messages_removed] == []
    assert report.validity == 1.0
    assert report.fit_max < 0.1


@pytest.mark.slow
def test_the_cli_prints_compactions_and_quality(tmp_path: Path) -> None:
    file = write_jsonl(tmp_path / "s.jsonl", transcript("openai"))
    out = CliRunner().invoke(cli, ["simulate", str(file), "--window", "8000"])
    assert out.exit_code == 0, out.output
    assert "validity 100.0%" in out.output
    assert "original request retained 100.0%" in out.output
    assert "tool_budget" in out.output
    as_json = CliRunner().invoke(cli, ["simulate", str(file), "--window", "8000", "--json"])
    data = json.loads(as_json.stdout)
    assert data["validity"] == 1.0
    assert data["calls"] > 0 and data["compactions"]
    kept = tmp_path / "kept.db"
    CliRunner().invoke(cli, ["simulate", str(file), "--window", "8000", "--db", str(kept)])
    listed = CliRunner().invoke(cli, ["sessions", "--db", str(kept), "--json"])
    assert json.loads(listed.stdout)[0]["message_count"] == len(transcript("openai"))


def test_a_malformed_transcript_is_one_error_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"role": "user", "content": "hi"}\n{not json\n', encoding="utf-8")
    out = CliRunner().invoke(cli, ["simulate", str(bad)])
    assert out.exit_code == 1
    assert "line 2" in out.stderr


@pytest.mark.slow
@pytest.mark.corpus
def test_a_real_claude_code_transcript_with_its_own_compaction() -> None:
    file = CORPUS_DEV / "claude-code" / "spotter-258c7280.jsonl"
    report = simulate(file, window=64_000)
    assert report.validity == 1.0 and report.request_share == 1.0
    assert report.fit_max <= 1.0
    assert report.fit_after_auto_max is not None and report.fit_after_auto_max <= 0.6
    assert report.loops == 0
    assert report.file_recall is not None and report.file_recall >= 0.8
    assert report.reference_agreement is not None and report.reference_agreement >= 0.9
    # The handoff after every cut, by checks independent of the summary code.
    assert report.cuts > 0
    assert report.noise_lines == report.duplicate_files == 0
    assert report.escaped_summaries == report.over_budget_summaries == 0
    assert report.instruction_share == report.last_text_share == 1.0
    # Recall gives back exactly what every compaction took out of the context.
    assert report.recall_due > 100 and report.recall_blobs_due > 0
    assert report.recall_share == 1.0, report.recall_examples
    # The provider's counts drive calibration: the store predicts the next prompt closely.
    calibrated = report.error_stats(report.usage_errors)
    assert calibrated is not None and calibrated["within_5pct"] >= 0.95
    assert report.missed_over_window["calibrated"] == 0


@pytest.mark.slow
def test_format_takes_the_names_import_takes(tmp_path: Path) -> None:
    file = write_jsonl(tmp_path / "s.jsonl", transcript("openai", turns=4, huge=False))
    for name in ("jsonl", "openai"):
        out = CliRunner().invoke(cli, ["simulate", str(file), "--format", name, "--json"])
        assert out.exit_code == 0, out.output
        assert json.loads(out.stdout)["validity"] == 1.0
    wrong = CliRunner().invoke(cli, ["simulate", str(file), "--format", "claude-code"])
    assert wrong.exit_code == 1
    # Read as Claude Code it holds nothing, and the error says what it looks like.
    assert "s.jsonl holds no claude-code messages to import: it looks like plain" in wrong.stderr
    unknown = CliRunner().invoke(cli, ["simulate", str(file), "--format", "yaml"])
    assert unknown.exit_code != 0 and "yaml" in unknown.stderr


@pytest.mark.slow
@pytest.mark.corpus
def test_a_windows_transcript_lists_each_file_once(store: CompactStore) -> None:
    """A Windows session (cwd D:\\oh-my-posh) names its files as D:\\…\\x, /d/…/x and
    relative to the cwd: each summary lists a file under the cwd once, relative to it."""
    path = CORPUS_DEV / "claude-code" / "ohmyposh-windows-powershell-compacted.jsonl"
    transcript = read_transcript(path)
    assert transcript.cwd == "D:\\oh-my-posh"
    simulate_transcript(transcript, window=64_000, store=store, session_id="win", use_usage=False)
    session = store.get_session("win")
    assert session.context().cwd == "D:\\oh-my-posh"
    summaries = [b.summary_text for b in session.boundaries()]
    assert len(summaries) >= 3
    for text in summaries:
        files = audit.listed_files(text)
        assert files and len(files) == len(set(files))
        spelt_from_root = [
            f for f in files if f.lower().startswith(("d:\\oh-my-posh", "d:/oh-my-posh", "/d/"))
        ]
        assert spelt_from_root == []


@pytest.mark.slow
def test_a_window_below_what_the_transcript_needs_is_said_in_one_line(tmp_path: Path) -> None:
    """The first call's prompt (system prompt, tools, opening messages) is more than the
    window: no compaction can make it fit, so simulate says so with the numbers and stops,
    unless --force (then the report still says it)."""
    usage = {"input_tokens": 3, "cache_read_input_tokens": 40_000, "output_tokens": 9}
    file = tmp_path / "cc.jsonl"
    reply = claude_code_record(
        "assistant", [{"type": "text", "text": "On it."}], uuid="a1", message_id="m1"
    )
    reply["message"]["usage"] = usage
    records = [claude_code_record("user", "Port the parser", uuid="u1"), reply]
    file.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")

    out = CliRunner().invoke(cli, ["simulate", str(file), "--window", "32000"])
    assert out.exit_code == 1
    (line,) = out.stderr.strip().splitlines()[-1:]
    assert "window 32,000 is smaller than the 40,003 tokens" in line
    assert "system prompt and tools" in line and "force" in line
    assert "compactions:" not in out.stdout

    forced = CliRunner().invoke(cli, ["simulate", str(file), "--window", "32000", "--force"])
    assert forced.exit_code == 0, forced.output
    assert "window 32,000 is smaller than the 40,003 tokens" in forced.stdout
    assert simulate(file, window=64_000).needed_tokens == 40_003
