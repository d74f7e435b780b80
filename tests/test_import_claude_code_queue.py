"""Claude Code's queue: what a person typed while the agent worked is a user message; a
background task's notice the client queues the same way is not."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from compactstore._importers import read_transcript
from tests.conftest import CORPUS_DEV
from tests.helpers import claude_code_record

Message = dict[str, Any]


def _enqueue(content: str) -> Message:
    return {
        "type": "queue-operation",
        "operation": "enqueue",
        "timestamp": "2026-02-21T15:41:57.366Z",
        "sessionId": "s",
        "content": content,
    }


def test_a_queued_background_task_notice_is_not_a_user_message(tmp_path: Path) -> None:
    notice = {
        "task_id": "a9f59f7",
        "tool_use_id": "toolu_1",
        "description": "Find Phase 14 files and plans",
        "task_type": "local_agent",
    }
    call = {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "ls"}}
    result = {"type": "tool_result", "tool_use_id": "t1", "content": "a.py"}
    records = [
        claude_code_record("user", "review phase 14", uuid="u1"),
        claude_code_record("assistant", [call], uuid="a1", message_id="m1"),
        _enqueue(json.dumps(notice)),
        _enqueue('{"a person": "pasting JSON"} is typed'),
        claude_code_record("user", [result], uuid="u2"),
        claude_code_record("assistant", [{"type": "text", "text": "Done."}], uuid="a2"),
    ]
    path = tmp_path / "cc.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    said = [m["content"] for m in read_transcript(path).messages if isinstance(m["content"], str)]
    assert said == ["review phase 14", '{"a person": "pasting JSON"} is typed']


@pytest.mark.corpus
def test_no_queued_task_notice_of_a_real_transcript_is_imported() -> None:
    path = CORPUS_DEV / "claude-code" / "cipherbox-explore-subagents-compacted.jsonl"
    if not path.exists():
        pytest.skip(f"no {path.name} in {path.parent}")
    said = [m["content"] for m in read_transcript(path).messages if isinstance(m["content"], str)]
    assert said
    assert not [text for text in said if text.startswith('{"task_id"')]
