"""Importing OpenHands event streams, mini-swe-agent trajectories and GitHub Copilot CLI
event logs.

Each format is tested on a small synthetic transcript built here (so these tests need no
corpus), and, marked ``corpus``, on every transcript of these kinds in the corpus's
``dev/other`` folder, whatever their names: they import with their tool calls paired, and
the session's context is one the OpenAI SDK types accept at several windows, after
``process_request`` and through ``simulate``.
"""

from __future__ import annotations

import gzip
import json
import tracemalloc
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from compactstore import CompactStore, CompactTrigger, InvalidInputError
from compactstore._cli import cli
from compactstore._importers import SOURCES, detect, import_file, read_transcript
from compactstore._importers.openhands import HOLD
from compactstore._simulate import simulate
from compactstore.formats import get_format
from compactstore.formats.sdk_types import check_sdk_types
from tests.conftest import CORPUS_DEV, Snapshot, corpus_params

Message = dict[str, Any]
NEW_SOURCES = ("openhands", "mini-swe-agent", "copilot-cli")
WINDOWS = (200_000, 64_000, 32_000)


def write_lines(path: Path, lines: Iterable[Any]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), "utf-8")
    return path


def check_pairing(messages: list[Message]) -> None:
    """Every tool result answers an earlier call of its id that is still unanswered, before
    the conversation moves on past it (the rules the store applies)."""
    fmt = get_format("openai")
    open_calls: set[str] = set()
    for index, message in enumerate(messages):
        results = fmt.tool_results(message)
        for result in results:
            assert result.tool_use_id in open_calls, f"message {index}: result without its call"
            open_calls.discard(result.tool_use_id)
        if not results:
            open_calls = set()
        open_calls |= {call.id for call in fmt.tool_calls(message)}


def check_valid(messages: list[Message]) -> None:
    check_pairing(messages)
    check_sdk_types("openai", messages)


# -- OpenHands --------------------------------------------------------------------------------


def _oh_action(
    event_id: str, call_id: str, response: str, name: str, arguments: dict[str, Any], thought: str
) -> dict[str, Any]:
    return {
        "kind": "ActionEvent",
        "id": event_id,
        "timestamp": "2025-09-25T18:58:40.000000",
        "source": "agent",
        "thought": [{"type": "text", "text": thought}] if thought else [],
        "action": {"kind": "ExecuteBashAction", **arguments},
        "tool_name": name,
        "tool_call_id": call_id,
        "tool_call": {
            "index": 0,
            "id": call_id,
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)},
        },
        "llm_response_id": response,
        "security_risk": "LOW",
    }


def _oh_observation(event_id: str, call_id: str, observation: dict[str, Any]) -> dict[str, Any]:
    return {
        "kind": "ObservationEvent",
        "id": event_id,
        "timestamp": "2025-09-25T18:58:41.000000",
        "source": "environment",
        "tool_name": "execute_bash",
        "tool_call_id": call_id,
        "observation": observation,
        "action_id": "a",
    }


def openhands_events() -> list[dict[str, Any]]:
    """A run with parallel calls, a rejected call, an error, two condensations (one with
    no summary), telemetry and an event kind this importer does not know."""
    bash = {"kind": "ExecuteBashObservation", "output": "main.py", "metadata": {"exit_code": 0}}
    return [
        {
            "kind": "SystemPromptEvent",
            "id": "e0",
            "timestamp": "2025-09-25T18:58:33.527478",
            "source": "agent",
            "system_prompt": {"type": "text", "text": "You are OpenHands agent."},
            "tools": [{"type": "function", "function": {"name": "execute_bash"}}],
        },
        {
            "kind": "MessageEvent",
            "id": "e1",
            "timestamp": "2025-09-25T18:58:34.404768",
            "source": "user",
            "llm_message": {
                "role": "user",
                "content": [{"type": "text", "text": "Fix the failing test in main.py"}],
            },
            "extended_content": [],
        },
        {"kind": "ConversationStateUpdateEvent", "id": "s1", "source": "environment", "key": "x"},
        _oh_action("e2", "c1", "r1", "execute_bash", {"command": "ls"}, "Let me look."),
        _oh_action(
            "e3",
            "c2",
            "r1",
            "str_replace_editor",
            {"command": "view", "path": "/w/main.py"},
            "",
        ),
        _oh_observation("e4", "c1", bash),
        _oh_observation(
            "e5",
            "c2",
            {"kind": "StrReplaceEditorObservation", "output": "1 print()", "error": ""},
        ),
        _oh_action(
            "e6",
            "c3",
            "r2",
            "str_replace_editor",
            {"command": "str_replace", "path": "/w/main.py", "old_str": "a", "new_str": "b"},
            "Edit it.",
        ),
        {
            "kind": "UserRejectObservation",
            "id": "e7",
            "source": "user",
            "tool_name": "str_replace_editor",
            "tool_call_id": "c3",
            "rejection_reason": "not that way",
            "action_id": "e6",
        },
        {"kind": "SomethingNewEvent", "id": "n1", "source": "environment", "data": {"x": 1}},
        _oh_action("e8", "c4", "r3", "execute_bash", {"command": "pytest"}, "Run tests."),
        {
            "kind": "AgentErrorEvent",
            "id": "e9",
            "source": "agent",
            "tool_name": "execute_bash",
            "tool_call_id": "c4",
            "error": "the sandbox went away",
        },
        _oh_action("e10", "c5", "r4", "execute_bash", {"command": "pytest -x"}, "Again."),
        _oh_observation("e11", "c5", {"kind": "ExecuteBashObservation", "output": "1 passed"}),
        {
            "kind": "Condensation",
            "id": "k1",
            "timestamp": "2025-09-25T19:03:18.003433",
            "source": "environment",
            "forgotten_event_ids": ["e2", "e3", "e4", "e5", "e6", "e7"],
            "summary": "USER_CONTEXT: fix main.py; looked at it, the edit was rejected",
            "summary_offset": 2,
        },
        {"kind": "CondensationRequest", "id": "q1", "source": "environment"},
        _oh_action("e12", "c6", "r5", "execute_bash", {"command": "git diff"}, "Check."),
        _oh_observation("e13", "c6", {"kind": "ExecuteBashObservation", "output": "diff"}),
        {
            "kind": "Condensation",
            "id": "k2",
            "source": "environment",
            "forgotten_event_ids": ["e8", "e9", "e10", "e11"],
            "summary": None,
        },
        {
            "kind": "MessageEvent",
            "id": "e14",
            "source": "agent",
            "llm_message": {"role": "assistant", "content": [{"type": "text", "text": "Done."}]},
        },
        {"kind": "PauseEvent", "id": "p1", "source": "user"},
    ]


def test_an_openhands_event_stream_imports_with_its_condensations(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "run.events.jsonl", openhands_events())
    assert detect(path) == "openhands"
    transcript = read_transcript(path)
    assert (transcript.source, transcript.format) == ("openhands", "openai")
    roles = [m["role"] for m in transcript.messages]
    assert roles == [
        "system",
        "user",
        "assistant",  # c1 and c2: one response
        "tool",
        "tool",
        "assistant",  # c3, rejected
        "tool",
        "assistant",  # c4, failed
        "tool",
        "assistant",  # c5
        "tool",
        "assistant",  # c6
        "tool",
        "assistant",  # Done.
    ]
    m = transcript.messages
    assert m[0]["content"] == "You are OpenHands agent."
    assert m[2]["content"] == "Let me look."
    assert [c["id"] for c in m[2]["tool_calls"]] == ["c1", "c2"]
    assert m[3]["content"] == "main.py\n[The command completed with exit code 0.]"
    assert m[6]["content"] == "Action rejected: not that way"
    assert m[8]["content"] == "the sandbox went away"
    check_valid(transcript.messages)
    # The first condensation forgot up to the rejected edit: c4 and c5 stay. The second one,
    # without a summary, forgot those too.
    first, second = transcript.boundaries
    assert first.first_kept_index == 7 and first.summary_text.startswith("USER_CONTEXT")
    assert first.trigger == CompactTrigger.AUTO and first.timestamp is not None
    assert second.first_kept_index == 11
    assert "forgot 4 earlier events without a summary" in second.summary_text
    # Reads and writes of the editor.
    assert transcript.read_paths[4] == "/w/main.py"
    assert transcript.write_paths[5] == ["/w/main.py"]


def test_an_openhands_session_works_in_the_terminal_s_directory(tmp_path: Path) -> None:
    # OpenHands names files by absolute path; its own summaries name them relative to the
    # repository the terminal works in (observation metadata.working_dir).
    events = [event for event in openhands_events() if event["kind"] != "Condensation"]
    for event in events:
        observation = event.get("observation")
        if isinstance(observation, dict):
            observation["metadata"] = {"exit_code": 0, "working_dir": "/w"}
            observation["output"] += "\n" + "output line\n" * 400
    path = write_lines(tmp_path / "run.events.jsonl", events)

    assert read_transcript(path).cwd == "/w"
    with CompactStore.open(tmp_path / "s.db") as store:
        sess = import_file(store, path, session_id="oh")
        text = sess.compact(up_to_seq=6, now=0.0).summary_text

    files = text.split("## Files (newest first)\n")[1].split("\n\n")[0].splitlines()
    assert [line.split(" — ")[0] for line in files] == ["- main.py"]


def test_an_openhands_condensation_keeps_a_result_with_its_call(tmp_path: Path) -> None:
    """Forgetting a call but not its result cuts after the result, not between them."""
    events = openhands_events()[:7]
    events.append(
        {
            "kind": "Condensation",
            "id": "k",
            "source": "environment",
            "forgotten_event_ids": ["e2", "e3"],
            "summary": "looked around",
        }
    )
    events.append(_oh_action("e20", "c9", "r9", "execute_bash", {"command": "ls"}, "More."))
    events.append(_oh_observation("e21", "c9", {"kind": "ExecuteBashObservation", "output": ""}))
    transcript = read_transcript(write_lines(tmp_path / "cut.jsonl", events))
    assert [b.first_kept_index for b in transcript.boundaries] == [5]
    check_valid(transcript.messages)


def test_a_long_openhands_run_is_held_only_in_part(tmp_path: Path) -> None:
    """A condensation forgetting events no longer held cuts where the held ones start; the
    import still gives a valid, paired transcript."""
    events = openhands_events()[:2]
    for i in range(HOLD):
        events.append(_oh_action(f"a{i}", f"c{i}", f"r{i}", "execute_bash", {"command": "ls"}, ""))
        events.append(_oh_observation(f"o{i}", f"c{i}", {"kind": "X", "output": str(i)}))
    events.append(
        {
            "kind": "Condensation",
            "id": "k",
            "source": "environment",
            "forgotten_event_ids": ["a0", "o0", "a1", "o1"],
            "summary": "early work",
        }
    )
    transcript = read_transcript(write_lines(tmp_path / "long.jsonl", events))
    (boundary,) = transcript.boundaries
    assert boundary.first_kept_index == len(transcript.messages) - HOLD
    check_valid(transcript.messages)


# -- mini-swe-agent ---------------------------------------------------------------------------


def mini_trajectory() -> dict[str, Any]:
    """The classic text-action agent, then a tool-calling turn (later versions)."""
    usage = {"response": {"usage": {"prompt_tokens": 1200, "completion_tokens": 30}}}
    return {
        "info": {
            "exit_status": "Submitted",
            "mini_version": "1.15.0",
            "config": {"environment": {"cwd": "/testbed"}},
        },
        "messages": [
            {"role": "system", "content": "You can run bash commands."},
            {"role": "user", "content": "<pr_description>Fix the timezone bug</pr_description>"},
            {
                "role": "assistant",
                "content": "THOUGHT: read it.\n\n```bash\ncat django/utils/timezone.py\n```",
                "extra": usage,
            },
            {
                "role": "user",
                "content": "<returncode>0</returncode>\n<output>\nimport x\n</output>",
            },
            {
                "role": "assistant",
                "content": "THOUGHT: a missing file.\n\n```bash\ncat nope.py\n```",
                "extra": {"response": {"usage": {"prompt_tokens": 1400}}},
            },
            {"role": "user", "content": "<returncode>1</returncode>\n<output>\nno\n</output>"},
            {
                "role": "assistant",
                "content": [{"type": "text", "text": "Listing."}],
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "bash", "arguments": {"command": "ls"}},
                    }
                ],
                "extra": {"timestamp": 1763510130.5},
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "a.py"},
            {"role": "tool", "tool_call_id": "call_1", "content": "again"},
            {
                "role": "exit",
                "content": "diff --git a/x b/x",
                "extra": {"exit_status": "Submitted"},
            },
        ],
        "trajectory_format": "mini-swe-agent-1",
        "instance_id": "django__django-11138",
    }


def test_a_mini_swe_agent_trajectory_imports(tmp_path: Path) -> None:
    path = tmp_path / "run.traj.json"
    path.write_text(json.dumps(mini_trajectory(), indent=2), "utf-8")
    assert detect(path) == "mini-swe-agent"
    transcript = read_transcript(path)
    assert (transcript.source, transcript.format) == ("mini-swe-agent", "openai")
    m = transcript.messages
    assert [x["role"] for x in m] == [
        "system",
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
        "assistant",
        "tool",
    ]
    assert "extra" not in m[2] and m[6]["content"] == "Listing."
    assert m[6]["tool_calls"][0]["function"] == {"name": "bash", "arguments": '{"command": "ls"}'}
    assert transcript.usage[:5] == [None, None, 1200, None, 1400]
    assert transcript.read_paths[3] == "/testbed/django/utils/timezone.py"
    assert transcript.read_paths[5] is None  # the command failed
    assert transcript.timestamps[6] == 1763510130.5
    assert not transcript.boundaries
    check_valid(m)


# -- GitHub Copilot CLI -----------------------------------------------------------------------


def _cp(kind: str, data: dict[str, Any], n: int) -> dict[str, Any]:
    return {
        "type": kind,
        "data": data,
        "id": f"ev{n}",
        "timestamp": f"2026-06-23T23:{n // 60:02d}:{n % 60:02d}.000Z",
        "parentId": f"ev{n - 1}" if n else None,
    }


def copilot_events() -> list[dict[str, Any]]:
    prompt = {"role": "system", "content": "You are the GitHub Copilot CLI."}
    request = {
        "toolCallId": "t1",
        "name": "view",
        "arguments": {"path": "/repo/README.md"},
        "type": "function",
    }
    edit = {"toolCallId": "t2", "name": "edit", "arguments": {"path": "/repo/a.ts"}}
    task = {"toolCallId": "t3", "name": "task", "arguments": {"prompt": "explore"}}
    events: list[tuple[str, dict[str, Any]]] = [
        ("session.start", {"sessionId": "s", "context": {"cwd": "/repo"}}),
        ("session.model_change", {"newModel": "claude-opus-4.8"}),
        ("system.message", prompt),
        (
            "user.message",
            {
                "content": "Rename finalize to update",
                "transformedContent": "<current_datetime>x</current_datetime>\n\nRename it",
            },
        ),
        ("assistant.turn_start", {"turnId": "0"}),
        (
            "assistant.message",
            {"messageId": "m1", "content": "Reading.", "toolRequests": [request, edit]},
        ),
        ("tool.execution_start", {"toolCallId": "t1", "toolName": "view"}),
        ("hook.start", {"hookType": "postToolUse", "input": {"toolResult": {"x": 1}}}),
        ("hook.end", {"hookType": "postToolUse", "success": True}),
        (
            "tool.execution_complete",
            {"toolCallId": "t1", "success": True, "result": {"content": "1. # Readme"}},
        ),
        (
            "tool.execution_complete",
            {"toolCallId": "t2", "success": False, "error": {"message": "no match"}},
        ),
        ("tool.execution_complete", {"toolCallId": "t2", "success": True, "result": {}}),
        ("assistant.message", {"messageId": "m2", "content": "", "toolRequests": [task]}),
        # The subagent's own conversation.
        ("assistant.message", {"content": "sub", "parentToolCallId": "t3", "toolRequests": []}),
        (
            "tool.execution_complete",
            {"toolCallId": "s1", "parentToolCallId": "t3", "result": {"content": "x"}},
        ),
        (
            "tool.execution_complete",
            {"toolCallId": "t3", "success": True, "result": {"content": "found"}},
        ),
        ("assistant.usage", {"model": "m", "inputTokens": 10}),
        ("session.brand_new_event", {"whatever": True}),
        ("session.compaction_start", {}),
        (
            "session.compaction_complete",
            {"success": True, "preCompactionTokens": 150_000, "summaryContent": "Summary: renamed"},
        ),
        ("system.message", prompt),  # the same prompt again: kept once
        ("user.message", {"content": "now push"}),
        ("assistant.message", {"messageId": "m3", "content": "Pushed."}),
        ("assistant.turn_end", {"turnId": "1"}),
        ("abort", {"reason": "user_initiated"}),
    ]
    return [_cp(kind, data, n) for n, (kind, data) in enumerate(events)]


def test_a_copilot_cli_event_log_imports(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "events.jsonl", copilot_events())
    assert detect(path) == "copilot-cli"
    transcript = read_transcript(path)
    assert (transcript.source, transcript.format) == ("copilot-cli", "openai")
    m = transcript.messages
    assert [x["role"] for x in m] == [
        "system",
        "user",
        "assistant",
        "tool",
        "tool",
        "assistant",
        "tool",
        "user",
        "assistant",
    ]
    assert m[1]["content"] == "Rename finalize to update"  # typed, not the client's copy
    assert [c["id"] for c in m[2]["tool_calls"]] == ["t1", "t2"]
    assert m[3]["content"] == "1. # Readme" and m[4]["content"] == "no match"
    assert m[5]["content"] is None and m[6]["content"] == "found"
    assert transcript.read_paths[3] == "/repo/README.md"
    assert transcript.write_paths[2] == ["/repo/a.ts"]
    (boundary,) = transcript.boundaries
    assert boundary.first_kept_index == 7 and boundary.summary_text == "Summary: renamed"
    assert boundary.tokens_before == 150_000
    check_valid(m)


# -- all three: bad input, gzip, standard input, all or nothing ------------------------------


def _write(kind: str, tmp_path: Path) -> Path:
    if kind == "openhands":
        return write_lines(tmp_path / "oh.jsonl", openhands_events())
    if kind == "copilot-cli":
        return write_lines(tmp_path / "events.jsonl", copilot_events())
    path = tmp_path / "mini.traj.json"
    path.write_text(json.dumps(mini_trajectory(), indent=2), "utf-8")
    return path


@pytest.mark.parametrize("kind", ["openhands", "copilot-cli"])
def test_a_broken_line_is_named(kind: str, tmp_path: Path) -> None:
    path = _write(kind, tmp_path)
    lines = path.read_text("utf-8").splitlines(keepends=True)
    lines[3] = lines[3][: len(lines[3]) // 2] + "\n"
    path.write_text("".join(lines), "utf-8")
    with pytest.raises(InvalidInputError, match=rf"^{path.name} line 4: not valid JSON"):
        read_transcript(path)
    with pytest.raises(InvalidInputError, match=rf"^{path.name} line 4: not valid JSON"):
        read_transcript(path, format=kind)


def test_a_broken_record_is_named(tmp_path: Path) -> None:
    events = openhands_events()
    events[1]["llm_message"] = "hello"
    path = write_lines(tmp_path / "oh.jsonl", events)
    with pytest.raises(InvalidInputError, match=r"^oh\.jsonl line 2: a MessageEvent needs"):
        read_transcript(path)
    events = copilot_events()
    events[5]["data"]["toolRequests"] = [{"name": "view"}]
    path = write_lines(tmp_path / "events.jsonl", events)
    with pytest.raises(InvalidInputError, match=r"^events\.jsonl line 6: assistant\.message"):
        read_transcript(path)


def test_a_cut_trajectory_is_named(tmp_path: Path) -> None:
    path = _write("mini-swe-agent", tmp_path)
    text = path.read_text("utf-8")
    path.write_text(text[: len(text) // 2], "utf-8")
    with pytest.raises(InvalidInputError, match=r"^mini\.traj\.json line \d+: .*looks truncated"):
        read_transcript(path, format="mini-swe-agent")


@pytest.mark.parametrize(
    ("kind", "told"),
    [
        ("openhands", "copilot-cli"),
        ("copilot-cli", "openhands"),
        ("copilot-cli", "codex"),
        ("openhands", "claude-code"),
    ],
)
def test_the_wrong_format_says_what_the_file_is(kind: str, told: str, tmp_path: Path) -> None:
    path = _write(kind, tmp_path)
    with pytest.raises(InvalidInputError, match=rf"holds no {told} messages.*format '{kind}'"):
        read_transcript(path, format=told)


def test_a_file_of_another_kind_is_not_a_mini_swe_agent_trajectory(tmp_path: Path) -> None:
    path = _write("copilot-cli", tmp_path)
    with pytest.raises(InvalidInputError, match=r"looks like a GitHub Copilot CLI event log"):
        read_transcript(path, format="mini-swe-agent")
    swe_agent = tmp_path / "other.json"
    swe_agent.write_text(json.dumps({"history": [{"role": "user", "content": "hi"}]}), "utf-8")
    with pytest.raises(InvalidInputError, match=r"looks like a SWE-agent trajectory"):
        read_transcript(swe_agent, format="mini-swe-agent")
    neither = tmp_path / "neither.json"
    neither.write_text(json.dumps({"messages": 3}), "utf-8")
    with pytest.raises(InvalidInputError, match=r"^neither\.json holds no mini-swe-agent messages"):
        read_transcript(neither, format="mini-swe-agent")


@pytest.mark.parametrize("kind", NEW_SOURCES)
def test_gzip_and_the_format_name(kind: str, tmp_path: Path) -> None:
    assert kind in SOURCES
    path = _write(kind, tmp_path)
    zipped = tmp_path / f"{path.name}.gz"
    zipped.write_bytes(gzip.compress(path.read_bytes()))
    plain = read_transcript(path, format=kind)
    assert read_transcript(zipped).messages == plain.messages
    assert read_transcript(path, format="openai").messages == plain.messages


@pytest.mark.slow
@pytest.mark.parametrize("kind", NEW_SOURCES)
def test_the_cli_imports_each_kind_from_stdin_all_or_nothing(
    kind: str, tmp_path: Path, store: CompactStore, db_snapshot: Snapshot
) -> None:
    path = _write(kind, tmp_path)
    db = str(tmp_path / "cli.db")
    data = path.read_bytes()
    out = CliRunner().invoke(
        cli,
        ["import", "-", "--session", "piped", "--format", kind, "--db", db, "--json"],
        input=data,
    )
    assert out.exit_code == 0, out.output
    found = json.loads(out.stdout)
    expected = read_transcript(path)
    assert (found["format"], found["messages"]) == ("openai", len(expected.messages))
    assert found["boundaries"] == len(expected.boundaries)
    # A broken file stores nothing.
    before = db_snapshot(store)
    broken = tmp_path / f"broken-{path.name}"
    broken.write_bytes(data[: len(data) - 40] + b"}\n")
    with pytest.raises(InvalidInputError, match=broken.name):
        import_file(store, broken)
    assert db_snapshot(store) == before


# -- the corpus: every transcript of these kinds ---------------------------------------------


def _corpus_files() -> list[tuple[Path, str]]:
    """The corpus's ``dev/other`` transcripts of these kinds (its other files, such as a
    run's configuration, are no transcript)."""
    found: list[tuple[Path, str]] = []
    for path in sorted((CORPUS_DEV / "other").glob("*")):
        try:
            kind = detect(path)
        except InvalidInputError:
            continue
        if kind in NEW_SOURCES:
            found.append((path, kind))
    return found


CORPUS_FILES = _corpus_files()


@pytest.mark.corpus
def test_the_corpus_has_each_kind() -> None:
    assert {kind for _, kind in CORPUS_FILES} == set(NEW_SOURCES)


def _last_time(timestamps: list[float | None]) -> float:
    return max((t for t in timestamps if t is not None), default=1_000_000.0)


@pytest.mark.slow
@pytest.mark.corpus
@pytest.mark.parametrize(
    ("path", "kind"),
    corpus_params(CORPUS_FILES, CORPUS_DEV / "other", f"{'/'.join(NEW_SOURCES)} transcripts", 2),
    ids=lambda v: getattr(v, "name", v),
)
def test_corpus_transcripts_import_valid_at_each_window(
    path: Path, kind: str, tmp_path: Path
) -> None:
    transcript = read_transcript(path)
    assert (transcript.source, transcript.format) == (kind, "openai")
    fmt = get_format("openai")
    calls = sum(len(fmt.tool_calls(m)) for m in transcript.messages)
    results = sum(len(fmt.tool_results(m)) for m in transcript.messages)
    assert results <= calls and (calls == 0 or results >= 0.9 * calls)
    assert any(fmt.kind(m) == "assistant" for m in transcript.messages)
    check_valid(transcript.messages)
    for boundary in transcript.boundaries:
        first = transcript.messages[boundary.first_kept_index : boundary.first_kept_index + 1]
        assert not first or first[0]["role"] != "tool"
    now = _last_time(transcript.timestamps) + 3600
    with CompactStore.open(tmp_path / "store.db") as store:
        for window in WINDOWS:
            session = import_file(store, path, session_id=f"w{window}", context_window=window)
            assert session.message_count() == len(transcript.messages)
            assert len(session.boundaries()) == len(transcript.boundaries)
            session.process_request(now=now)
            check_valid(session.active_context())
    for window in WINDOWS:
        report = simulate(path, window=window)
        assert report.sdk_checked and report.valid_calls == report.calls, report.invalid_examples
        assert report.request_retained == report.calls


# -- memory ----------------------------------------------------------------------------------


def _long_openhands(path: Path, size: int) -> None:
    """An OpenHands run of about ``size`` bytes, condensed every 80 events as its
    LLMSummarizingCondenser does (forgetting the older half, keeping the first events)."""
    events = openhands_events()[:2]
    written = 0
    step = 0
    kept: list[str] = []
    with path.open("w", encoding="utf-8") as out:
        for event in events:
            out.write(json.dumps(event) + "\n")
        while written < size:
            step += 1
            action = _oh_action(
                f"a{step}", f"c{step}", f"r{step}", "execute_bash", {"command": "ls"}, ""
            )
            result = _oh_observation(
                f"o{step}", f"c{step}", {"kind": "X", "output": f"{step} " + "x" * 2_000}
            )
            kept += [f"a{step}", f"o{step}"]
            for event in (action, result):
                line = json.dumps(event) + "\n"
                out.write(line)
                written += len(line)
            if len(kept) >= 80:
                condensation = {
                    "kind": "Condensation",
                    "id": f"k{step}",
                    "source": "environment",
                    "forgotten_event_ids": kept[:40],
                    "summary": f"summary at step {step}",
                }
                out.write(json.dumps(condensation) + "\n")
                kept = kept[40:]


def _long_copilot(path: Path, size: int) -> None:
    """A Copilot CLI log of about ``size`` bytes, compacted every ~600 KB."""
    written = 0
    n = 0
    since = 0
    with path.open("w", encoding="utf-8") as out:
        for event in copilot_events()[:4]:
            out.write(json.dumps(event) + "\n")
        while written < size:
            n += 1
            request = {"toolCallId": f"t{n}", "name": "bash", "arguments": {"command": "ls"}}
            lines = [
                _cp("assistant.message", {"content": "", "toolRequests": [request]}, n),
                _cp("hook.start", {"hookType": "postToolUse", "input": {"x": "y" * 500}}, n),
                _cp(
                    "tool.execution_complete",
                    {"toolCallId": f"t{n}", "result": {"content": f"{n} " + "z" * 2_000}},
                    n,
                ),
            ]
            if since > 600_000:
                since = 0
                lines.append(
                    _cp("session.compaction_complete", {"summaryContent": f"up to {n}"}, n)
                )
            for event in lines:
                line = json.dumps(event) + "\n"
                out.write(line)
                written += len(line)
                since += len(line)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["openhands", "copilot-cli"])
def test_import_memory_does_not_grow_with_the_event_stream(kind: str, tmp_path: Path) -> None:
    """Memory held while importing stays bounded: a 4x longer stream needs no more."""
    generate = _long_openhands if kind == "openhands" else _long_copilot
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
            assert session.boundaries()  # the agent's own compactions came along
            check_valid(session.active_context())
    assert peaks[1] < peaks[0] + 1_500_000, [f"{p / 1e6:.1f} MB" for p in peaks]


def test_a_mini_swe_agent_trajectory_of_a_responses_model_imports(tmp_path: Path) -> None:
    """With a Responses-API model, mini-swe-agent 2 keeps whole responses and
    function_call_output items in ``messages``."""
    response = {
        "id": "resp_1",
        "object": "response",
        "output": [
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Reading the module."}],
            },
            {
                "type": "function_call",
                "call_id": "call_9",
                "name": "bash",
                "arguments": '{"command": "cat src/app.py"}',
            },
        ],
        "usage": {"input_tokens": 2048, "output_tokens": 40},
        "extra": {"actions": [{"command": "cat src/app.py", "tool_call_id": "call_9"}]},
    }
    document = {
        "info": {"mini_version": "2.1.0", "config": {"environment": {"cwd": "/repo"}}},
        "messages": [
            {"role": "system", "content": "You are a helpful assistant.", "extra": {}},
            {"role": "user", "content": "Fix the crash in app.py", "extra": {}},
            response,
            {
                "type": "function_call_output",
                "call_id": "call_9",
                "output": "print('hi')",
                "extra": {"returncode": 0},
            },
            {"role": "exit", "content": "", "extra": {"exit_status": "Submitted"}},
        ],
        "trajectory_format": "mini-swe-agent-1.1",
    }
    path = tmp_path / "resp.traj.json"
    path.write_text(json.dumps(document), "utf-8")
    assert detect(path) == "mini-swe-agent"
    transcript = read_transcript(path)
    m = transcript.messages
    assert [x["role"] for x in m] == ["system", "user", "assistant", "tool"]
    assert m[2]["content"] == "Reading the module."
    assert m[2]["tool_calls"] == [
        {
            "id": "call_9",
            "type": "function",
            "function": {"name": "bash", "arguments": '{"command": "cat src/app.py"}'},
        }
    ]
    assert m[3] == {"role": "tool", "tool_call_id": "call_9", "content": "print('hi')"}
    assert transcript.usage[2] == 2048
    assert transcript.read_paths[3] == "/repo/src/app.py"
    check_valid(m)


def test_a_changed_copilot_prompt_is_kept_again(tmp_path: Path) -> None:
    events = copilot_events()
    again = next(i for i, e in enumerate(events) if e["type"] == "system.message" and i > 2)
    events[again]["data"] = {"role": "developer", "content": "You are Copilot, now in plan mode."}
    transcript = read_transcript(write_lines(tmp_path / "events.jsonl", events))
    prompts = [m for m in transcript.messages if m["role"] in ("system", "developer")]
    assert [m["role"] for m in prompts] == ["system", "developer"]
    check_valid(transcript.messages)
