"""Our summary against the agent's own handoff at the agent's own cuts
(compactstore._simulate.reference.agent_cuts, which benchmarks/quality.py reports): Claude
Code's summaries and what Codex's ``compacted`` records kept."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from compactstore._simulate import simulate
from compactstore._simulate.reference import agent_cuts, pending_tasks
from tests.conftest import CORPUS_DEV
from tests.helpers import claude_code_record

Message = dict[str, Any]
# What a tool call read: long enough that summarising the messages before the cut saves tokens.
LISTING = "\n".join(f"def rule_{i}(tokens): return tokens[{i}:]" for i in range(200))

SUMMARY = """Summary:
1. Primary Request and Intent:
   The user asked to fix the parser.

3. Files and Code Sections:
   - src/parser.py — read
   - src/lexer.py — edited
   - docs/never_opened.md — mentioned only

6. All user messages:
   - "fix the parser in src/parser.py"
   - "also fix the parser tests please"

7. Pending Tasks:
   - **Task 2 (in_progress)**: fix the parser tests
     - a detail under it, not a task of its own
   - **Task 3 (pending)**: deploy the staging cluster

8. Current Work:
   Editing src/lexer.py.
"""


def _cc(kind: str, content: Any, uuid: str, **extra: Any) -> Message:
    return claude_code_record(kind, content, uuid=uuid, cwd="/w", **extra)


def _boundary() -> Message:
    """Claude Code's record of an automatic compaction."""
    return {
        "type": "system",
        "subtype": "compact_boundary",
        "uuid": "b1",
        "sessionId": "s",
        "compactMetadata": {"trigger": "auto", "preTokens": 1000},
    }


def _write(path: Path, lines: list[Message]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


def test_pending_tasks_are_the_top_level_items_of_their_section() -> None:
    assert pending_tasks(SUMMARY) == [
        "**Task 2 (in_progress)**: fix the parser tests",
        "**Task 3 (pending)**: deploy the staging cluster",
    ]
    assert pending_tasks("7. Pending Tasks:\n   - None.\n\n8. Current Work:\n x") == []
    assert pending_tasks("no such section") == []


def _claude_code(tmp_path: Path) -> Path:
    def use(call_id: str, name: str, path: str) -> Message:
        return {"type": "tool_use", "id": call_id, "name": name, "input": {"file_path": path}}

    def result(call_id: str) -> list[Message]:
        return [{"type": "tool_result", "tool_use_id": call_id, "content": LISTING}]

    return _write(
        tmp_path / "cc.jsonl",
        [
            _cc("user", "fix the parser in src/parser.py", "u1"),
            _cc("assistant", [use("t1", "Read", "/w/src/parser.py")], "a1", message_id="m1"),
            _cc("user", result("t1"), "u2"),
            _cc("user", "also fix the parser tests please", "u3"),
            _cc("assistant", [use("t2", "Edit", "/w/src/lexer.py")], "a2", message_id="m2"),
            _cc("user", result("t2"), "u4"),
            _boundary(),
            _cc("user", SUMMARY, "u5", isCompactSummary=True),
            _cc("user", "carry on", "u6"),
        ],
    )


@pytest.mark.slow
def test_claude_code_summary_against_ours_at_its_cut(tmp_path: Path) -> None:
    """Our summary's paths are relative to the session's cwd, as an import makes them."""
    [cut] = agent_cuts(_claude_code(tmp_path))
    assert (cut.source, cut.kind, cut.cut) == ("claude-code", "summary", 6)
    # docs/never_opened.md was never touched before the cut: not counted.
    assert cut.files == (2, 2)
    assert cut.user_messages == (2, 2)
    # Ours carries the parser tests (the user's instruction), not the staging cluster.
    assert cut.tasks == (2, 1)


@pytest.mark.slow
def test_a_numbered_task_is_matched_by_its_number_whatever_its_wording(tmp_path: Path) -> None:
    """Claude Code numbers its TaskCreate tasks and its summary words them its own way (here
    in another language than the task's subject): a task is ours when our open tasks list
    its number; a task we closed is not."""

    def call(call_id: str, name: str, arguments: Message) -> list[Message]:
        return [{"type": "tool_use", "id": call_id, "name": name, "input": arguments}]

    def result(call_id: str, text: str = LISTING) -> list[Message]:
        return [{"type": "tool_result", "tool_use_id": call_id, "content": text}]

    summary = (
        "Summary:\n7. Pending Tasks:\n   - **Task 1 (in_progress)**: rewrite tokenizer handling\n"
        "   - **Task 2 (pending)**: ship the release\n\n8. Current Work:\n   Working.\n"
    )
    lines = [
        _cc("user", "파서를 고쳐 주세요", "u1"),
        _cc(
            "assistant",
            call("t1", "TaskCreate", {"subject": "토크나이저 재작성"}),
            "a1",
            message_id="m1",
        ),
        _cc("user", result("t1", "Task #1 created"), "u2"),
        _cc("assistant", call("t2", "TaskCreate", {"subject": "릴리스"}), "a2", message_id="m2"),
        _cc("user", result("t2", "Task #2 created"), "u3"),
        _cc(
            "assistant",
            call("t3", "Read", {"file_path": "/w/src/parser.py"}),
            "a3",
            message_id="m3",
        ),
        _cc("user", result("t3"), "u4"),
        _cc(
            "assistant",
            call("t4", "TaskUpdate", {"taskId": "2", "status": "completed"}),
            "a4",
            message_id="m4",
        ),
        _cc("user", result("t4", "Updated task #2"), "u5"),
        _boundary(),
        _cc("user", summary, "u6", isCompactSummary=True),
        _cc("user", "carry on", "u7"),
    ]
    [cut] = agent_cuts(_write(tmp_path / "tasks.jsonl", lines))
    assert cut.tasks == (2, 1)


@pytest.mark.slow
def test_simulate_compares_files_relative_to_the_sessions_cwd(tmp_path: Path) -> None:
    report = simulate(_claude_code(tmp_path), window=200_000)
    assert (report.reference_files, report.reference_files_named) == (3, 2)


def _rollout(kind: str, payload: Message) -> Message:
    return {"timestamp": "2026-07-01T10:00:00.000Z", "type": kind, "payload": payload}


ENVIRONMENT = "<environment_context>\n  <cwd>/w</cwd>\n</environment_context>"


def _user(text: str) -> Message:
    content = [{"type": "input_text", "text": text}]
    return {"type": "message", "role": "user", "content": content}


@pytest.mark.slow
def test_codex_replacement_history_against_ours_at_its_cut(tmp_path: Path) -> None:
    plan = {
        "plan": [
            {"step": "read the parser", "status": "completed"},
            {"step": "rewrite the tokenizer loop", "status": "in_progress"},
        ]
    }
    call = {"type": "function_call", "call_id": "c1", "name": "update_plan"}
    path = _write(
        tmp_path / "rollout.jsonl",
        [
            _rollout("session_meta", {"id": "1", "cwd": "/w"}),
            _rollout("response_item", _user(ENVIRONMENT)),
            _rollout("response_item", _user("fix the parser in src/parser.py")),
            _rollout("response_item", {**call, "arguments": json.dumps(plan)}),
            _rollout(
                "response_item",
                {"type": "function_call_output", "call_id": "c1", "output": "Plan updated"},
            ),
            _rollout(
                "response_item",
                {
                    "type": "function_call",
                    "call_id": "c2",
                    "name": "exec_command",
                    "arguments": json.dumps({"cmd": "cat src/lexer.py"}),
                },
            ),
            _rollout(
                "response_item",
                {"type": "function_call_output", "call_id": "c2", "output": LISTING},
            ),
            _rollout(
                "compacted",
                {
                    "message": "",
                    "replacement_history": [
                        _user(ENVIRONMENT),
                        _user("fix the parser in src/parser.py"),
                    ],
                },
            ),
            _rollout("response_item", _user("go on")),
        ],
    )
    [cut] = agent_cuts(path)
    assert (cut.source, cut.kind, cut.cut) == ("codex", "replacement_history", 6)
    # The environment block is client noise, not a message the user typed.
    assert cut.user_messages == (1, 1)
    # src/parser.py is named by the request, not by a tool call before the cut.
    assert cut.files == (0, 0)
    assert cut.tasks[0] == 1  # the open plan item


@pytest.mark.corpus
@pytest.mark.slow
def test_every_compaction_of_the_dev_corpus_is_compared() -> None:
    """Claude Code's five compactions with something before them (four files) and Codex's
    three ``compacted`` records each give one comparison."""
    cuts = [
        cut
        for folder in ("claude-code", "codex")
        for path in sorted((CORPUS_DEV / folder).glob("*.jsonl"))
        for cut in agent_cuts(path)
    ]
    claude = [c for c in cuts if c.source == "claude-code"]
    codex = [c for c in cuts if c.source == "codex"]
    assert len(claude) == 5 and len({c.file for c in claude}) == 4
    assert len(codex) == 3 and {c.kind for c in codex} == {"replacement_history"}
    files = [sum(c.files[i] for c in claude) for i in (0, 1)]
    assert files[0] > 0 and files[1] >= 0.9 * files[0]
    users = [sum(c.user_messages[i] for c in codex) for i in (0, 1)]
    assert users[0] > 0 and users[1] == users[0]
