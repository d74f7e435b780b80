"""Exporting a session as plain JSONL, and importing the export back (round trip), on both
backends: the whole log verbatim, and the active context.
"""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from compactstore import CompactStore, Session
from compactstore._cli import cli
from compactstore._importers import import_file, read_transcript
from compactstore._store.export import export_lines
from tests.conftest import CORPUS_DEV
from tests.helpers import per_seq

Message = dict[str, Any]

SPOTTER = CORPUS_DEV / "claude-code" / "spotter-258c7280.jsonl"
CODEX = CORPUS_DEV / "codex" / "agentcmd-rollout-2025-09-25T08-02-05.jsonl"


def _use(call_id: str) -> Message:
    return {"type": "tool_use", "id": call_id, "name": "read_file", "input": {"path": "é.py"}}


CONVERSATIONS: dict[str, list[Message]] = {
    "anthropic": [
        {"role": "user", "content": "lis é.py — 読んで"},
        {"role": "assistant", "content": [{"type": "text", "text": "ok"}, _use("t1")]},
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "t1",
                    "content": "x = '\\n'",
                    "is_error": False,
                }
            ],
        },
        {"role": "assistant", "content": "fini"},
    ],
    "openai": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "lis é.py — 読んで"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "t1",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": '{"path":"é.py"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "t1", "content": "x = '\\n'"},
        {"role": "assistant", "content": "fini"},
    ],
    "minicode": [
        {"role": "user", "content": "lis é.py — 読んで"},
        {"role": "assistant", "content": [_use("t1")]},
        {
            "role": "tool_result",
            "content": "x = '\\n'",
            "toolName": "read_file",
            "toolUseId": "t1",
            "isError": False,
        },
        {"role": "assistant", "content": "fini"},
    ],
}


def export_to(path: Path, session: Session, *, active: bool = False) -> Path:
    lines = list(export_lines(session, active=active))
    assert all(line.endswith("\n") and "\n" not in line[:-1] for line in lines)
    path.write_text("".join(lines), "utf-8")
    return path


@pytest.mark.slow
@pytest.mark.corpus
def test_real_transcripts_round_trip(store: CompactStore, tmp_path: Path) -> None:
    for source in (SPOTTER, CODEX):
        original = import_file(store, source)
        log = original.messages()

        whole = export_to(tmp_path / f"{source.stem}.log.jsonl", original)
        lines = whole.read_text("utf-8").splitlines()
        assert [json.loads(line) for line in lines] == log
        copy = import_file(store, whole, session_id=f"{source.stem}-copy")
        assert copy.format == original.format
        assert copy.messages() == log
        assert per_seq(copy) == log  # the copy has no boundary: all of it is active

        active = export_to(tmp_path / f"{source.stem}.active.jsonl", original, active=True)
        context = original.active_context()
        again = import_file(store, active, session_id=f"{source.stem}-active")
        assert again.format == original.format
        assert again.messages() == context

    # The Claude Code session was compacted by Claude Code: its active context is shorter.
    spotter = store.get_session(SPOTTER.stem)
    assert len(spotter.active_context()) < len(spotter.messages())


@pytest.mark.slow
@pytest.mark.corpus
def test_export_after_a_compaction_by_the_store(store: CompactStore, tmp_path: Path) -> None:
    session = import_file(store, CODEX)
    result = session.compact(now=2_000_000_000.0)
    assert result.success
    active = export_to(tmp_path / "active.jsonl", session, active=True)
    lines = [json.loads(line) for line in active.read_text("utf-8").splitlines()]
    assert lines == session.active_context()
    assert lines != session.messages()
    assert any(m.get("content") == result.summary_text for m in lines)
    assert import_file(store, active, session_id="resumed").messages() == lines
    whole = export_to(tmp_path / "whole.jsonl", session)
    assert read_transcript(whole).messages == read_transcript(CODEX).messages


@pytest.mark.slow
def test_every_format_round_trips(store: CompactStore, tmp_path: Path) -> None:
    for format_name, messages in CONVERSATIONS.items():
        session = store.session(format_name, format=format_name)
        session.extend(messages)
        path = export_to(tmp_path / f"{format_name}.jsonl", session)
        text = path.read_text("utf-8")
        assert "読んで" in text and "é.py" in text  # non-ASCII stays readable
        transcript = read_transcript(path)
        assert (transcript.source, transcript.format) == ("jsonl", format_name)
        copy = import_file(store, path, session_id=f"{format_name}-copy")
        assert copy.format == format_name
        assert copy.messages() == messages == session.messages()
        assert list(export_lines(copy)) == list(export_lines(session))


@pytest.mark.slow
def test_exporting_a_long_log_reads_it_a_page_at_a_time(store: CompactStore) -> None:
    """Memory does not grow with the log: the whole log (6 MB here) is never held at once."""
    session = store.session("long", format="anthropic")
    text = "word " * 2_000  # 10 kB a message
    session.extend(
        [
            {"role": "user" if i % 2 == 0 else "assistant", "content": f"{i} {text}"}
            for i in range(600)
        ]
    )
    lines = 0
    tracemalloc.start()
    try:
        for line in export_lines(session):
            lines += 1
            assert line.startswith('{"role":')
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert lines == 600
    assert peak < 3_000_000, f"exporting held {peak / 1e6:.1f} MB"


@pytest.mark.slow
def test_the_cli_export_streams_to_a_file(tmp_path: Path) -> None:
    db = tmp_path / "long.db"
    with CompactStore.open(db) as store:
        text = "word " * 2_000
        store.session("long").extend(
            [{"role": "user" if i % 2 == 0 else "assistant", "content": text} for i in range(600)]
        )
    out = tmp_path / "long.jsonl"
    tracemalloc.start()
    try:
        result = CliRunner().invoke(cli, ["export", "long", "--db", str(db), "-o", str(out)])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert result.exit_code == 0, result.output
    assert len(out.read_text("utf-8").splitlines()) == 600
    assert peak < 3_000_000, f"exporting held {peak / 1e6:.1f} MB"
