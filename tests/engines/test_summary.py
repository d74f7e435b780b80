"""The rule-based summary as a handoff: request, later instructions, pending tasks,
current work and next step, files, errors, recall line; within its budget; cumulative; the
same sections from full, session-memory and reactive compaction; client noise never shows.
"""

from __future__ import annotations

import json

import pytest
from sqlalchemy import create_engine
from sqlalchemy import text as sql

from compactstore import CompactStore, DatabaseError
from compactstore._context.tokens import estimate_tokens
from compactstore._engines import summary
from compactstore.formats import ToolCall
from compactstore.models import SummaryState
from tests.helpers import T0, Chat, assistant, calls_message, new_session, plain, user, words


def section(text: str, title: str) -> str:
    """The body of the summary section whose heading starts with ``title`` ("" if none)."""
    for part in text.split("\n\n## ")[1:]:
        heading, _, body = part.partition("\n")
        if heading.startswith(title):
            return body.split("\n\nContinue from where we left off.")[0]
    return ""


def filler(chat: Chat, count: int) -> None:
    chat.chatter(count, "f", chars=150)


def coding_session(chat: Chat, cwd: str) -> int:
    """A request, boilerplate, instructions, a plan, files, errors and their fixes, then
    talk; returns the seq of the last assistant text before the talk."""
    chat.request("Add a --json flag to the export command")
    chat.user("<system-reminder>\nThe TodoWrite tool hasn't been used.\n</system-reminder>")
    chat.tool_turns(
        [
            ("Read", {"file_path": f"{cwd}/src/cli.py"}, "def export(): ...", False),
            ("Read", {"file_path": "src/cli.py"}, "def export(): ...", False),
            ("Edit", {"file_path": f"{cwd}/src/cli.py", "old_string": "a"}, "ok", False),
            ("Write", {"file_path": "tests/test_json.py", "content": "x"}, "File created", False),
            ("Bash", {"command": "rm docs/old.md"}, "", False),
            (
                "Bash",
                {"command": "pytest tests/test_json.py", "description": "run it"},
                'Exit code 1\\nFAILED tests/test_json.py::test_flag - KeyError: "json"',
                True,
            ),
            ("Bash", {"command": "ruff check src", "description": "lint"}, "E501 line", True),
        ]
    )
    chat.user("Also keep the CSV output unchanged")
    _, (todo_id,) = chat.calls(
        [
            (
                "TodoWrite",
                {
                    "todos": [
                        {"content": "Add the flag", "status": "completed"},
                        {"content": "Fix the KeyError in export", "status": "in_progress"},
                        {"content": "Update the README", "status": "pending"},
                    ]
                },
            )
        ]
    )
    chat.result(todo_id, "Todos updated", name="TodoWrite")
    chat.tool_turns(
        [
            (
                "Bash",
                {"command": "pytest  tests/test_json.py", "description": "again"},
                "1 passed",
                False,
            )
        ]
    )
    said = chat.say(
        "The flag works and the test passes. Next I will update the README with an example."
    )
    filler(chat, 60)
    return said


def test_the_summary_is_a_handoff_in_sections(store: CompactStore) -> None:
    cwd = "/home/me/proj"
    chat = new_session(store, "anthropic", sid="handoff", cwd=cwd)
    said = coding_session(chat, cwd)

    text = chat.sess.compact(up_to_seq=said, now=T0 + 1_000).summary_text

    assert section(text, "Original request") == "Add a --json flag to the export command"
    instructions = section(text, "Later instructions")
    assert "Also keep the CSV output unchanged" in instructions
    assert "system-reminder" not in text and "TodoWrite tool hasn't" not in text
    # The open tasks: the completed one is left out.
    assert section(text, "Pending tasks").splitlines() == [
        "- [in_progress] Fix the KeyError in export",
        "- [pending] Update the README",
    ]
    work = section(text, "Current work")
    assert work.startswith("The flag works and the test passes.")
    assert work.endswith("Next step: Next I will update the README with an example.")
    files = section(text, "Files").splitlines()
    # One line per file (the absolute and the relative spelling of src/cli.py are one),
    # newest first: the test file was run last.
    assert files == [
        "- tests/test_json.py — created",
        "- docs/old.md — deleted",
        "- src/cli.py — modified, read",
    ]
    errors = section(text, "Errors").splitlines()
    assert len(errors) == 2
    assert errors[0].endswith("— resolved"), "the same command (white space aside) passed later"
    assert 'Exit code 1 FAILED tests/test_json.py::test_flag - KeyError: "json"' in errors[0]
    assert "E501 line" in errors[1] and not errors[1].endswith("resolved")
    assert "\\n" not in text
    assert "## Recall" not in text, "no recall line unless recall is enabled"


def test_paths_are_relative_to_the_environment_blocks_cwd(store: CompactStore) -> None:
    chat = new_session(store, "openai", sid="env")
    chat.request("<environment_context>\n  <cwd>/w/app</cwd>\n</environment_context>")
    chat.user("Rename the helper")
    chat.tool_turns(
        [
            (
                "shell",
                {"command": ["bash", "-lc", "sed -n 1,80p /w/app/lib/util.py"]},
                '{"output":"def helper(): ...\\n","metadata":{"exit_code":0}}',
                False,
            ),
            (
                "shell",
                {
                    "command": [
                        "bash",
                        "-lc",
                        "apply_patch <<'P'\n*** Begin Patch\n*** Update File: lib/util.py\n@@\n"
                        "-a\n+b\n*** Add File: lib/new.py\n+x\n*** End Patch\nP",
                    ]
                },
                '{"output":"Success","metadata":{"exit_code":0}}',
                False,
            ),
            (
                "shell",
                {"command": ["bash", "-lc", "npm test"]},
                '{"output":"Error: cannot find module\\n  at x.js","metadata":{"exit_code":1}}',
                False,
            ),
        ]
    )
    filler(chat, 60)

    text = chat.sess.compact(now=T0 + 1_000).summary_text

    assert section(text, "Files").splitlines() == [
        "- lib/new.py — created",
        "- lib/util.py — modified, read",
    ]
    assert "Error: cannot find module at x.js" in section(text, "Errors")
    assert section(text, "Original request") == "Rename the helper"


def test_without_a_cwd_two_spellings_of_one_file_are_one_line(store: CompactStore) -> None:
    chat = new_session(store, "anthropic", sid="spellings")
    chat.request("Tidy the parser")
    chat.tool_turns(
        [
            ("Read", {"file_path": "/repo/pkg/parse.py"}, "x", False),
            ("Edit", {"file_path": "pkg/parse.py"}, "ok", False),
            ("Read", {"file_path": "/repo/pkg/lex.py"}, "x", False),
        ]
    )
    filler(chat, 60)

    files = section(chat.sess.compact(now=T0 + 1_000).summary_text, "Files").splitlines()

    assert files == ["- pkg/lex.py — read", "- pkg/parse.py — modified, read"]


@pytest.mark.parametrize(
    ("path", "cwd", "spelt"),
    [
        ("D:\\w\\site\\a.js", "D:\\w", "site/a.js"),
        ("d:/W/site/a.js", "D:\\w", "site/a.js"),  # Windows compares without case
        ("/d/w/site/a.js", "D:\\w", "site/a.js"),  # MSYS / Git Bash
        ("/mnt/d/w/site/a.js", "D:\\w", "site/a.js"),  # WSL
        ("site\\a.js", "D:\\w", "site/a.js"),
        (".\\site\\..\\site\\a.js", "D:\\w\\", "site/a.js"),
        ("C:\\Temp\\x.txt", "D:\\w", "C:/Temp/x.txt"),  # outside the cwd: absolute
        ("D:\\w", "D:\\w", "."),
        ("~/proj/a.py", "/home/me/proj", "a.py"),
        ("~/.bashrc", "/home/me/proj", "/home/me/.bashrc"),
        ("/home/me/proj/./lib/../a.py", "/home/me/proj/", "a.py"),
        ("/d/w/a.js", "/home/me", "/d/w/a.js"),  # on POSIX /d is a directory
        ("D:\\w\\a.js", None, "D:/w/a.js"),
    ],
)
def test_one_spelling_per_file_whatever_the_os(path: str, cwd: str | None, spelt: str) -> None:
    assert summary.normalise_path(path, cwd) == spelt


def test_a_windows_session_lists_each_file_once(store: CompactStore) -> None:
    """The spellings a Windows agent mixes (drive paths with backslashes, Git Bash
    drives, paths relative to the cwd or to where a command cd-ed) are one file each."""
    chat = new_session(store, "anthropic", sid="windows", cwd="D:\\oh-my-posh")
    chat.request("Rename the Open Studio button")
    chat.tool_turns(
        [
            ("Read", {"file_path": "D:\\oh-my-posh\\website\\docusaurus.config.js"}, "x", False),
            ("Edit", {"file_path": "D:\\oh-my-posh\\website\\src\\pages\\index.js"}, "ok", False),
            ("Bash", {"command": "cd website && grep -n studio docusaurus.config.js"}, "", False),
            ("Bash", {"command": "cat /d/oh-my-posh/website/src/pages/index.js"}, "x", False),
            (
                "PowerShell",
                {
                    "command": "Set-Location D:\\oh-my-posh\\website; "
                    "Get-Content src\\css\\custom.css"
                },
                "x",
                False,
            ),
            ("Bash", {"command": "wc -l website/src/css/custom.css"}, "1", False),
        ]
    )
    filler(chat, 60)

    files = section(chat.sess.compact(now=T0 + 1_000).summary_text, "Files").splitlines()

    assert files == [
        "- website/src/css/custom.css — read",
        "- website/src/pages/index.js — modified, read",
        "- website/docusaurus.config.js — read",
    ]


def test_plan_tools_are_configurable(store: CompactStore) -> None:
    chat = new_session(store, "openai", sid="plans", config=plain(plan_tool_names=("set_plan",)))
    chat.request("Ship it")
    chat.tool_turns(
        [
            ("update_plan", {"plan": [{"step": "ignored", "status": "pending"}]}, "ok", False),
            ("set_plan", {"items": [{"title": "Write docs", "status": "pending"}]}, "ok", False),
        ]
    )
    filler(chat, 60)

    text = chat.sess.compact(now=T0 + 1_000).summary_text

    assert section(text, "Pending tasks").splitlines() == ["- [pending] Write docs"]


@pytest.mark.slow_on_postgres
def test_over_budget_old_instructions_are_cut_then_folded_into_a_recall_line(
    store: CompactStore,
) -> None:
    config = plain(summary_max_tokens=600, recall_enabled=True)
    chat = new_session(store, "anthropic", sid="budget", config=config)
    chat.request("Build the importer")
    for i in range(40):
        last_asked = chat.user(f"instruction {i:02d}: " + words(300, f"i{i}"))
        done = chat.say(f"done {i}")
    filler(chat, 30)

    first = chat.sess.compact(up_to_seq=done, now=T0 + 1_000).summary_text

    assert estimate_tokens(first) <= 600
    lines = section(first, "Later instructions").splitlines()
    earlier = lines[0]
    assert earlier.startswith("- ") and "earlier instructions (seqs 1–" in earlier
    assert earlier.endswith(": use recall")
    count = int(earlier.split()[1])
    shown = lines[1:]
    assert count + len(shown) == 40, "every instruction is shown or counted"
    oldest = shown[0].split(") ", 1)[1]
    assert len(oldest) == 61 and oldest.endswith("…"), "the oldest shown is cut to 60 characters"
    assert shown[-1].startswith(f"- (seq {last_asked}) instruction 39")
    assert "## Recall\n" in first

    for i in range(40, 60):
        chat.user(f"instruction {i:02d}: " + words(300, f"i{i}"))
        done = chat.say(f"done {i}")
    filler(chat, 30)
    second = chat.sess.compact(up_to_seq=done, now=T0 + 2_000).summary_text

    assert estimate_tokens(second) <= 600
    lines = section(second, "Later instructions").splitlines()
    # 60 instructions and the 15 questions of the talk after the first batch.
    assert int(lines[0].split()[1]) + len(lines) - 1 == 75, "cumulative across compactions"


def test_session_memory_and_reactive_summaries_carry_the_same_sections(
    store: CompactStore,
) -> None:
    config = plain(session_memory_min_tail_tokens=2_000, session_memory_max_tail_tokens=4_000)
    chat = new_session(store, "anthropic", sid="memory", context_window=20_000, config=config)
    coding_session(chat, "/home/me/proj")
    chat.chatter(40, "m", chars=1_500)
    chat.sess.remember("user_intent", "Keep the CLI backwards compatible")

    memory = chat.sess.process_request(now=T0 + 100)
    assert memory.strategy is not None and memory.strategy.value == "session_memory"
    for title in ("Original request", "Later instructions", "Pending tasks", "Files", "Errors"):
        assert section(memory.summary_text, title), title

    chat = new_session(store, "anthropic", sid="reactive", context_window=20_000)
    coding_session(chat, "/home/me/proj")
    chat.chatter(60, "r", chars=1_500)
    recovered = chat.sess.reactive_recover("prompt is too long", now=T0 + 100)
    assert recovered is not None
    for title in ("Original request", "Pending tasks", "Files", "Errors"):
        assert section(recovered.summary_text, title), title


def test_a_version_1_state_is_upgraded_when_folded(store: CompactStore) -> None:
    chat = new_session(store, "anthropic", sid="v1")
    chat.request("Port it")
    chat.user("Now the docs")
    context = chat.sess.context()
    old = {
        "original_request": "Port it",
        "topics": ["Now the tests", "<command-name>/clear</command-name>"],
        "tools": ["Read"],
        "files": ["a.py", "b/c.py"],
        "errors": ["Error: boom"],
        "compactions": 2,
        "messages_removed": 30,
    }
    removed = [item for item in context.kept if not item.pinned]

    read = SummaryState.model_validate_json(json.dumps(old))  # as a stored row is read

    state = summary.fold(read, removed, context)
    text, written = summary.render(state, context.config, estimate_tokens)

    assert read.version == written.version == 2
    assert state.compactions == 3 and state.messages_removed == 31
    assert section("\n\n" + text, "Later instructions").splitlines() == [
        "- Now the tests",
        "- (seq 1) Now the docs",
    ]
    assert "command-name" not in text, "noise a version-1 topic held is dropped"
    assert "- b/c.py" in text and "- a.py" in text and "Error: boom" in text
    assert SummaryState.model_validate_json(written.model_dump_json()) == written  # stored


@pytest.mark.parametrize("fmt", ["anthropic", "openai"])
def test_the_summary_is_deterministic(store: CompactStore, fmt: str) -> None:
    texts = []
    for n in range(2):
        chat = new_session(store, fmt, sid=f"det-{fmt}-{n}", cwd="/home/me/proj")
        said = coding_session(chat, "/home/me/proj")
        texts.append(chat.sess.compact(up_to_seq=said, now=T0 + 1_000).summary_text)
    assert texts[0] == texts[1]


def test_a_plan_call_in_json_text_arguments_is_read(store: CompactStore) -> None:
    chat = new_session(store, "openai", sid="json-plan")
    chat.request("Plan it")
    plan = {"plan": [{"step": "Measure", "status": "in_progress"}]}
    message = calls_message("openai", [("call_plan", "update_plan", plan)])
    chat.add(message)
    chat.result("call_plan", "Plan updated", name="update_plan")
    chat.add(user("ok"))
    chat.add(assistant("Measuring now."))
    filler(chat, 60)

    text = chat.sess.compact(now=T0 + 1_000).summary_text

    assert section(text, "Pending tasks") == "- [in_progress] Measure"


def _set_summary_state(store: CompactStore, value: str) -> None:
    """Write ``value`` as every boundary's stored summary state, outside the library."""
    engine = create_engine(store.engine.url)
    try:
        with engine.begin() as connection:
            connection.execute(
                sql("UPDATE compact_boundaries SET summary_state = :value"), {"value": value}
            )
    finally:
        engine.dispose()


def test_a_stored_version_1_state_is_read_and_folded_as_version_2(store: CompactStore) -> None:
    chat = new_session(store, "anthropic", sid="stored-v1")
    chat.request("Port it")
    filler(chat, 40)
    chat.sess.compact(now=T0 + 100)
    # The shape version 1 wrote (every field, "version": 1).
    old = {
        "version": 1,
        "original_request": "Port it",
        "topics": ["Now the tests"],
        "tools": ["Read"],
        "files": ["lib/old.py"],
        "errors": ["Error: boom"],
        "compactions": 4,
        "messages_removed": 50,
    }
    _set_summary_state(store, json.dumps(old))
    url = store.engine.url.render_as_string(hide_password=False)
    with CompactStore.open(url) as fresh:  # a new process: nothing cached
        chat.sess = fresh.session("stored-v1")
        chat.user("Now the docs")
        filler(chat, 40)
        text = chat.sess.compact(now=T0 + 200).summary_text

    assert "over 5 compactions" in text
    assert section(text, "Later instructions").splitlines()[0] == "- Now the tests"
    assert "- lib/old.py — named" in text and "Error: boom" in text


@pytest.mark.parametrize(
    "damaged",
    [
        '{"version": 2, "files": [{"path": 7}]}',
        '{"version": 2, "instructions": [{"seq": 1}]}',
        '{"version": 1, "topics": "one"}',
        '{"version": 3}',
    ],
)
def test_a_damaged_stored_state_is_a_database_error(store: CompactStore, damaged: str) -> None:
    chat = new_session(store, "anthropic", sid="damaged")
    chat.request("Port it")
    filler(chat, 40)
    chat.sess.compact(now=T0 + 100)
    _set_summary_state(store, damaged)
    url = store.engine.url.render_as_string(hide_password=False)
    with CompactStore.open(url) as fresh, pytest.raises(DatabaseError, match="cannot read"):
        fresh.session("damaged").active_context()


def test_a_code_mode_program_works_on_the_files_of_its_inner_calls() -> None:
    """Codex's exec tool takes a program calling the tools: its files and plan are those
    of the inner calls (a patch bound to a constant, a command with a workdir)."""
    patch = (
        "*** Begin Patch\n*** Add File: src/new.rs\n+x\n*** Update File: src/a.rs\n*** End Patch"
    )
    program = (
        f"const patch = {json.dumps(patch)};\nawait tools.apply_patch(patch);\n"
        "const r = await tools.exec_command({cmd:\"sed -n '1,80p' src/lib.rs\", "
        'workdir:"/w/crates"});'
        '\nawait tools.update_plan({plan:[{step:"Port the parser",status:"in_progress"},\n'
        '  {step:"Run the tests", "status":"pending"}]}); text(r.output);'
    )
    call = ToolCall("c1", "exec", program)
    assert summary.file_actions(call) == [
        ("src/new.rs", "created"),
        ("src/a.rs", "modified"),
        ("/w/crates/src/lib.rs", "read"),
    ]
    items = summary.plan_items(call, ("update_plan",))
    assert items is not None
    assert [(i.text, i.status) for i in items] == [
        ("Port the parser", "in_progress"),
        ("Run the tests", "pending"),
    ]
    # Built at run time: nothing to read.
    assert summary.file_actions(ToolCall("c2", "exec", "await tools.exec_command({cmd})")) == []
