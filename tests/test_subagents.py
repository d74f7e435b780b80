"""Claude Code subagents imported as sessions of their own, linked to the tool call that
started them: sidechain records, agent_progress records and the subagents' own files; the
parent's context unchanged; all or nothing; delete, backup and restore take the children
along; show, import and the report name the links."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from compactstore import CompactStore, ConflictError, InvalidInputError, NotFoundError
from compactstore._cli import cli
from compactstore._importers import import_file, read_transcript
from compactstore.transfer import backup, restore
from tests.conftest import CORPUS_DEV, Snapshot
from tests.helpers import claude_code_record

Message = dict[str, Any]


def _use(call_id: str, name: str = "Bash", **input_: Any) -> Message:
    return {"type": "tool_use", "id": call_id, "name": name, "input": input_}


def _result(call_id: str, text: str = "ok") -> Message:
    return {"type": "tool_result", "tool_use_id": call_id, "content": text}


def _side(kind: str, content: Any, uuid: str, agent: str = "a1", **extra: Any) -> Message:
    return claude_code_record(kind, content, uuid=uuid, isSidechain=True, agentId=agent, **extra)


def _progress(kind: str, content: Any, uuid: str, agent: str, call: str) -> Message:
    """An agent_progress record (newer Claude Code) carrying one of the subagent's records."""
    inner = claude_code_record(kind, content, uuid=uuid, message_id=f"m-{uuid}")
    return {
        "type": "progress",
        "uuid": f"p-{uuid}",
        "sessionId": "s",
        "isSidechain": False,
        "parentToolUseID": call,
        "toolUseID": f"agent_msg_{uuid}",
        "data": {"type": "agent_progress", "agentId": agent, "prompt": "look", "message": inner},
    }


def _main(subagent_lines: list[Message], *, agent: str = "a1") -> list[Message]:
    """A main transcript: the user's request, a Task call, the subagent's lines, the Task
    call's result naming the subagent (toolUseResult.agentId), and the answer."""
    return [
        claude_code_record("user", "find the config files", uuid="u1"),
        claude_code_record(
            "assistant", [_use("task1", "Task", prompt="look")], uuid="a1", message_id="m1"
        ),
        *subagent_lines,
        claude_code_record(
            "user",
            [_result("task1", "found config.toml")],
            uuid="u2",
            toolUseResult={"status": "completed", "agentId": agent, "totalToolUseCount": 1},
        ),
        claude_code_record(
            "assistant", [{"type": "text", "text": "it is config.toml"}], uuid="a2", message_id="m2"
        ),
    ]


SIDECHAIN = [
    _side("user", "look for config files", "s1"),
    _side("assistant", [_use("side1", command="ls")], "s2", message_id="ms1"),
    _side("user", [_result("side1", "config.toml")], "s3"),
    _side("assistant", [{"type": "text", "text": "config.toml"}], "s4", message_id="ms2"),
]
SUBAGENT_MESSAGES = [
    {"role": "user", "content": "look for config files"},
    {"role": "assistant", "content": [_use("side1", command="ls")]},
    {"role": "user", "content": [_result("side1", "config.toml")]},
    {"role": "assistant", "content": [{"type": "text", "text": "config.toml"}]},
]


def _write(path: Path, lines: list[Message]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


def test_sidechain_records_become_a_linked_child_session(
    store: CompactStore, tmp_path: Path
) -> None:
    path = _write(tmp_path / "run.jsonl", _main(SIDECHAIN))
    without = _write(tmp_path / "plain.jsonl", _main([]))
    parent = import_file(store, path)
    # The parent's context is what it was without the subagent's records.
    assert parent.messages() == read_transcript(without).messages
    assert parent.subagents() == [("run/a1", "task1")]
    assert (parent.parent_session_id, parent.parent_tool_use_id) == (None, None)
    child = store.get_session("run/a1")
    assert child.messages() == SUBAGENT_MESSAGES
    assert (child.parent_session_id, child.parent_tool_use_id) == ("run", "task1")
    assert child.subagents() == []


@pytest.mark.slow
def test_agent_progress_records_become_a_linked_child_session(tmp_path: Path) -> None:
    lines = [
        _progress("user", "look for config files", "s1", "a1", "task1"),
        _progress("assistant", [_use("side1", command="ls")], "s2", "a1", "task1"),
        _progress("user", [_result("side1", "config.toml")], "s3", "a1", "task1"),
    ]
    # No toolUseResult.agentId here: the progress records' parentToolUseID names the call.
    main = _main(lines)
    del main[-2]["toolUseResult"]
    path = _write(tmp_path / "run.jsonl", main)
    with CompactStore.open(tmp_path / "s.db") as store:
        parent = import_file(store, path)
        assert (
            parent.messages() == read_transcript(_write(tmp_path / "p.jsonl", _main([]))).messages
        )
        assert parent.subagents() == [("run/a1", "task1")]
        assert store.get_session("run/a1").messages() == SUBAGENT_MESSAGES[:3]


@pytest.mark.slow
def test_a_subagents_own_file_is_imported_as_its_child(tmp_path: Path) -> None:
    """Claude Code's layout: <session>.jsonl, and <session>/subagents/agent-<id>.jsonl; the
    compaction call's file (agent-acompact-*) is not a subagent."""
    path = _write(tmp_path / "run.jsonl", _main([], agent="b7"))
    folder = tmp_path / "run" / "subagents"
    folder.mkdir(parents=True)
    _write(folder / "agent-b7.jsonl", [{**line, "agentId": "b7"} for line in SIDECHAIN])
    _write(folder / "agent-acompact-1f.jsonl", [_side("user", "summarise", "c1", "acompact-1f")])
    with CompactStore.open(tmp_path / "s.db") as store:
        parent = import_file(store, path)
        assert parent.subagents() == [("run/b7", "task1")]
        assert store.get_session("run/b7").messages() == SUBAGENT_MESSAGES
        assert sorted(info.id for info in store.sessions()) == ["run", "run/b7"]


@pytest.mark.slow
def test_meta_files_name_the_call_and_the_parent_agent(tmp_path: Path) -> None:
    """Newer Claude Code: the parent holds no sidechain lines and its result may not name
    the agent; agent-<id>.meta.json does (toolUseId, and parentAgentId for a subagent's
    subagent)."""
    main = _main([])
    del main[-2]["toolUseResult"]
    path = _write(tmp_path / "run.jsonl", main)
    folder = tmp_path / "run" / "subagents"
    folder.mkdir(parents=True)
    _write(folder / "agent-b7.jsonl", [{**line, "agentId": "b7"} for line in SIDECHAIN])
    _write(folder / "agent-c2.jsonl", [{**line, "agentId": "c2"} for line in SIDECHAIN])
    (folder / "agent-b7.meta.json").write_text(json.dumps({"toolUseId": "task1"}), "utf-8")
    (folder / "agent-c2.meta.json").write_text(
        json.dumps({"toolUseId": "side1", "parentAgentId": "b7"}), "utf-8"
    )
    (folder / "journal.jsonl").write_text('{"type": "started"}\n', "utf-8")  # not a transcript
    with CompactStore.open(tmp_path / "s.db") as store:
        parent = import_file(store, path)
        assert parent.subagents() == [("run/b7", "task1"), ("run/c2", "side1")]
        child = store.get_session("run/c2")
        assert (child.parent_session_id, child.parent_tool_use_id) == ("run/b7", "side1")
        assert store.get_session("run/b7").subagents() == [("run/c2", "side1")]
        store.delete_session("run")
        assert store.sessions() == []


@pytest.mark.slow
def test_parent_and_children_import_all_or_nothing(tmp_path: Path, db_snapshot: Snapshot) -> None:
    bad = [*SIDECHAIN[:2], _side("user", [{"type": "text", "text": 5}], "s3")]
    path = _write(tmp_path / "run.jsonl", _main(bad))
    with CompactStore.open(tmp_path / "s.db") as store:
        before = db_snapshot(store)
        with pytest.raises(InvalidInputError, match=r"run\.jsonl line 5"):
            import_file(store, path)
        assert db_snapshot(store) == before
        # A child's id already taken: neither the parent nor the child is stored.
        _write(tmp_path / "other.jsonl", SIDECHAIN)
        import_file(store, tmp_path / "other.jsonl", session_id="ok/a1")
        good = _write(tmp_path / "ok.jsonl", _main(SIDECHAIN))
        before = db_snapshot(store)
        with pytest.raises(ConflictError, match="ok/a1"):
            import_file(store, good)
        assert db_snapshot(store) == before


@pytest.mark.slow
def test_delete_backup_and_restore_take_the_children_along(tmp_path: Path) -> None:
    path = _write(tmp_path / "run.jsonl", _main(SIDECHAIN))
    with CompactStore.open(tmp_path / "s.db") as store:
        import_file(store, path)
        import_file(store, _write(tmp_path / "alone.jsonl", _main([])))
        backup(store, tmp_path / "b.db", ["run"])
        store.delete_session("run")
        assert [info.id for info in store.sessions()] == ["alone"]
        with pytest.raises(NotFoundError):
            store.get_session("run/a1")
        restore(store, tmp_path / "b.db", ["run"])
        assert sorted(info.id for info in store.sessions()) == ["alone", "run", "run/a1"]
        child = store.get_session("run/a1")
        assert (child.parent_session_id, child.parent_tool_use_id) == ("run", "task1")
        # A child alone can go; its parent stays.
        store.delete_session("run/a1")
        assert store.get_session("run").subagents() == []


@pytest.mark.slow
def test_the_cli_names_the_links(tmp_path: Path) -> None:
    path = _write(tmp_path / "run.jsonl", _main(SIDECHAIN))
    db = str(tmp_path / "s.db")
    runner = CliRunner()
    result = runner.invoke(cli, ["import", str(path), "--db", db])
    assert result.exit_code == 0, result.output
    assert "subagent session run/a1, started by tool call task1" in result.output
    shown = runner.invoke(cli, ["show", "run/a1", "--db", db])
    assert shown.exit_code == 0, shown.output
    assert shown.output.splitlines()[1] == "subagent of session run, started by tool call task1"
    parent = runner.invoke(cli, ["show", "run", "--db", db, "--json"])
    assert json.loads(parent.output)["subagents"] == [{"session": "run/a1", "tool_use_id": "task1"}]
    child = json.loads(runner.invoke(cli, ["show", "run/a1", "--db", db, "--json"]).output)
    assert child["parent"] == {"session": "run", "tool_use_id": "task1"}


@pytest.mark.slow
def test_the_report_names_the_links(tmp_path: Path) -> None:
    pytest.importorskip("jinja2", reason="the report needs the 'report' extra (Jinja2)")
    from compactstore.report import write_report

    path = _write(tmp_path / "run.jsonl", _main(SIDECHAIN))
    with CompactStore.open(tmp_path / "s.db") as store:
        import_file(store, path)
        child = write_report(store, "run/a1", tmp_path / "c.html").read_text("utf-8")
        parent = write_report(store, "run", tmp_path / "p.html").read_text("utf-8")
    assert 'subagent of session <b data-field="parent_session">run</b>' in child
    assert '<code data-field="parent_tool_use_id">task1</code>' in child
    assert '<b data-field="subagent">run/a1</b> (tool call <code>task1</code>)' in parent


@pytest.mark.corpus
@pytest.mark.slow
def test_the_subagents_of_real_transcripts(tmp_path: Path) -> None:
    """cipherbox: two Explore subagents as agent_progress records, each linked to its Task
    call and holding as many tool calls as the call's result counts; spotter, laid out as
    Claude Code keeps it: the subagent's own file."""
    cipherbox = CORPUS_DEV / "claude-code" / "cipherbox-explore-subagents-compacted.jsonl"
    counts: dict[str, tuple[str, int]] = {}
    for line in cipherbox.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        result = record.get("toolUseResult")
        if isinstance(result, dict) and "agentId" in result:
            call = record["message"]["content"][0]["tool_use_id"]
            counts[result["agentId"]] = (call, result["totalToolUseCount"])
    assert len(counts) == 2
    spotter = tmp_path / "4d5611e5.jsonl"
    shutil.copyfile(CORPUS_DEV / "claude-code" / "spotter-4d5611e5.jsonl", spotter)
    (tmp_path / "4d5611e5" / "subagents").mkdir(parents=True)
    shutil.copyfile(
        CORPUS_DEV / "claude-code" / "spotter-4d5611e5.subagent-a2898e3.jsonl",
        tmp_path / "4d5611e5" / "subagents" / "agent-a2898e3.jsonl",
    )
    with CompactStore.open(tmp_path / "s.db") as store:
        parent = import_file(store, cipherbox)
        assert parent.messages() == read_transcript(cipherbox).messages
        found = dict(parent.subagents())
        assert found == {f"{parent.id}/{agent}": call for agent, (call, _) in counts.items()}
        for agent, (_, calls) in counts.items():
            messages = store.get_session(f"{parent.id}/{agent}").messages()
            uses = [b for m in messages for b in m["content"] if b["type"] == "tool_use"]
            assert len(uses) == calls
        spotted = import_file(store, spotter)
        assert spotted.subagents() == [("4d5611e5/a2898e3", "toolu_017pLRuPHYTX5t99EnLyV53m")]
        child = store.get_session("4d5611e5/a2898e3").messages()
        uses = [b for m in child if isinstance(m["content"], list) for b in m["content"]]
        assert sum(b["type"] == "tool_use" for b in uses) == 33
