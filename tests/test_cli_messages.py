"""What the command line says, read as a new user would: one line per error naming the
option the user typed, confirmation before replay --apply rolls anything back, the reason a
re-summary failed, what rollback and worker did, summarizers found in the current
directory, and counts and tables that read well.

Sessions are built through the library on a SQLite file (the CLI's wording does not depend
on the backend); the CLI runs in click's CliRunner.
"""

from __future__ import annotations

import json
import sys
import unicodedata
import uuid
from pathlib import Path

import pytest

from compactstore import CompactStore
from compactstore._cli import render, render_stats
from tests.conftest import Snapshot
from tests.test_cli import T0, big_file, build_session, fails, invoke, ok, read_call

# -- usage errors ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "problem", "command"),
    [
        (["show"], "Missing argument 'SESSION'", " show"),
        (["nonsense"], "No such command 'nonsense'", ""),
        (["show", "s1", "--bogus"], "No such option '--bogus'", " show"),
        (["compact", "s1", "--up-to", "x"], "Invalid value for '--up-to'", " compact"),
    ],
)
def test_a_usage_error_is_one_line_naming_the_help_and_exits_2(
    tmp_path: Path, args: list[str], problem: str, command: str
) -> None:
    result = invoke(str(tmp_path / "none.db"), *args)
    assert result.exit_code == 2
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"Error: {problem}")
    # (the runner names the program "cli"; the console script says "compactstore")
    assert line.endswith(f"(see 'cli{command} --help')")
    # Under --json it stays one JSON object.
    data = json.loads(invoke(str(tmp_path / "none.db"), *args, "--json").stderr)
    assert data["kind"] == "UsageError" and problem in data["error"]


# -- summarizers that cannot start ----------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "variables", "hint"),
    [
        ("openai", ("OPENAI_API_KEY", "OPENAI_ADMIN_KEY"), "set OPENAI_API_KEY"),
        ("anthropic", ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN"), "set ANTHROPIC_API_KEY"),
    ],
)
def test_a_builtin_summarizer_without_credentials_is_one_error_line(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    variables: tuple[str, ...],
    hint: str,
) -> None:
    for variable in variables:
        monkeypatch.delenv(variable, raising=False)
    db = str(tmp_path / "s.db")
    with CompactStore.open(db) as store:
        build_session(store)
    summarizer = ["--summarizer", name, "--model", "x"]
    for args in (
        ["worker", "--once", *summarizer],
        ["replay", "s1", "--boundary", "1", "--resummarize", *summarizer],
    ):
        result = fails(invoke(db, *args), f"the {name} summarizer cannot start")
        assert hint in result.stderr
        assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1


def test_resolve_checks_credentials_when_it_builds(monkeypatch: pytest.MonkeyPatch) -> None:
    from compactstore.errors import InvalidInputError
    from compactstore.summarizers import resolve

    for variable in ("OPENAI_API_KEY", "OPENAI_ADMIN_KEY", "ANTHROPIC_API_KEY"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
    with pytest.raises(InvalidInputError, match="no credentials: set OPENAI_API_KEY"):
        resolve("openai", "gpt-x")
    with pytest.raises(InvalidInputError, match="no credentials: set ANTHROPIC_API_KEY"):
        resolve("anthropic", "claude-x")
    monkeypatch.setenv("ANTHROPIC_AUTH_TOKEN", "token")  # either credential will do
    assert resolve("anthropic", "claude-x").client.auth_token == "token"


# -- replay --apply -------------------------------------------------------------------------


def _session_with_later_compactions(db: str) -> None:
    """s1 (boundaries 1 and 2, compactions 1-6, a read dedup among them), then a tool-result
    budget compaction after boundary 2 (compaction 7)."""
    with CompactStore.open(db) as store:
        sess = build_session(store)
        sess.append(read_call(9, "src/late.py"), timestamp=T0 + 500)
        sess.append_tool_result(
            "t9", big_file(9), tool_name="read_file", file_path="src/late.py", timestamp=T0 + 501
        )
        result = sess.process_request(now=T0 + 502)
        assert [c.id for c in sess.compactions()][-1] == 7, result


@pytest.mark.slow
def test_replay_apply_asks_before_rolling_back_and_says_what_it_rolled_back(
    tmp_path: Path, db_snapshot: Snapshot
) -> None:
    db = str(tmp_path / "s.db")
    _session_with_later_compactions(db)
    with CompactStore.open(db) as store:
        before = db_snapshot(store)
        result = invoke(db, "replay", "s1", "--boundary", "2", "--apply", input="n\n")
        assert result.exit_code == 1
        assert (
            "Replace boundary 2 (compaction 6) of session s1 and roll back the 1 compaction "
            "recorded after it (7: tool_budget 1)?" in result.stderr
        )
        assert "Aborted" in result.stderr and result.stdout == ""
        assert db_snapshot(store) == before
        out = ok(invoke(db, "replay", "s1", "--boundary", "2", "--apply", "--yes")).stdout
        lines = out.splitlines()
        assert lines[2].startswith("rolled back boundary 2 (partial, manual, ")
        assert lines[2].endswith("; compaction 6)")
        assert lines[3].startswith("rolled back compaction 7 (tool_budget, auto, ")
        assert lines[4].startswith("applied: compaction 8: partial (manual)")
        sess = store.get_session("s1")
        assert lines[5] == f"active context: {render.usage_of(sess.token_usage(), 8_000)}"
        assert [c.id for c in sess.compactions() if c.rolled_back_at is not None] == [6, 7]
    # A rolled-back boundary replaces nothing, so nothing is asked.
    ok(invoke(db, "rollback", "s1", "--yes"))
    data = json.loads(ok(invoke(db, "replay", "s1", "--boundary", "3", "--apply", "--json")).stdout)
    assert (data["applied"], data["rolled_back"]) == (True, [])


@pytest.mark.slow
def test_replay_apply_warns_when_the_context_no_longer_fits_the_window(tmp_path: Path) -> None:
    db = str(tmp_path / "s.db")
    _session_with_later_compactions(db)
    with CompactStore.open(db) as store:
        sess = store.get_session("s1")
        for i in range(12):  # the log grows past the window with no compaction after it
            sess.append({"role": "user", "content": f"note {i} " + "word " * 400})
            sess.append({"role": "assistant", "content": "ok"})
    result = ok(invoke(db, "replay", "s1", "--boundary", "2", "--apply", "--yes"))
    with CompactStore.open(db) as store:
        usage = store.get_session("s1").token_usage()
    assert usage > 8_000
    (warning,) = [line for line in result.stderr.splitlines() if line.startswith("Warning:")]
    assert f"now {render.usage_of(usage, 8_000)}" in warning
    assert "compactstore compact s1" in warning


# -- replay --resummarize that could not -----------------------------------------------------


def _module(tmp_path: Path, source: str) -> str:
    """A module in ``tmp_path`` (the working directory of the test), unique per test."""
    name = f"summarizers_{uuid.uuid4().hex[:10]}"
    (tmp_path / f"{name}.py").write_text(source)
    return name


FAILING = """
def broken(messages, previous, instructions):
    raise RuntimeError("the model server is down")

def good(messages, previous, instructions):
    return "written from the working directory"
"""


@pytest.fixture
def bare_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``tmp_path`` as the working directory, not on sys.path: as the console script runs."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    return tmp_path


@pytest.mark.slow
def test_a_failed_resummary_says_why_and_exits_1(bare_cwd: Path) -> None:
    db = str(bare_cwd / "s.db")
    with CompactStore.open(db) as store:
        build_session(store)
    module = _module(bare_cwd, FAILING)
    args = ["replay", "s1", "--boundary", "1", "--resummarize", "--summarizer"]
    result = fails(
        invoke(db, *args, f"{module}:broken"),
        "--resummarize could not re-summarise boundary 1: summarizer",
    )
    assert "RuntimeError: the model server is down" in result.stderr
    (summary,) = [line for line in result.stdout.splitlines() if line.startswith("summary:")]
    assert summary.startswith("summary: rule-based (summarizer ")
    assert "the model server is down" in summary
    # --json: the document still comes, then the error as JSON.
    result = invoke(db, *args, f"{module}:broken", "--json")
    assert result.exit_code == 1
    assert json.loads(result.stdout)["summary_source"] == "rule"
    assert json.loads(result.stderr.splitlines()[-1])["kind"] == "SummarizerError"


@pytest.mark.slow
def test_summarizer_module_is_found_in_the_working_directory(bare_cwd: Path) -> None:
    db = str(bare_cwd / "s.db")
    with CompactStore.open(db) as store:
        build_session(store)
    module = _module(bare_cwd, FAILING)
    args = ["replay", "s1", "--boundary", "1", "--resummarize", "--summarizer", f"{module}:good"]
    out = ok(invoke(db, *args)).stdout
    assert "+written from the working directory" in out.splitlines()
    assert out.splitlines()[-1] == "summary: written by the summarizer again"
    out = ok(invoke(db, "worker", "--once", "--summarizer", f"{module}:good")).stdout
    assert out == f"no background compaction pending in {db}\n"
    quiet = invoke(db, "worker", "--once", "--summarizer", f"{module}:good", "--json")
    assert ok(quiet).stdout == ""  # --json: one object per job, so none


# -- compact, rollback ----------------------------------------------------------------------


@pytest.mark.slow
def test_compact_up_to_errors_name_the_option(tmp_path: Path, db_snapshot: Snapshot) -> None:
    db = str(tmp_path / "s.db")
    with CompactStore.open(db) as store:
        build_session(store)
        before = db_snapshot(store)
        fails(invoke(db, "compact", "s1", "--up-to", "2"), "--up-to 2 is already summarised")
        fails(invoke(db, "compact", "s1", "--up-to", "999"), "--up-to 999 is past the last")
        assert db_snapshot(store) == before


@pytest.mark.slow
def test_rollback_of_a_compaction_says_what_it_undid(tmp_path: Path) -> None:
    db = str(tmp_path / "s.db")
    _session_with_later_compactions(db)
    out = ok(invoke(db, "rollback", "s1", "--compaction", "7", "--yes")).stdout.splitlines()
    assert out[0].startswith("rolled back compaction 7 (tool_budget, auto, ")
    assert out[0].endswith(" tokens)") and "had freed" in out[0]
    with CompactStore.open(db) as store:
        usage = store.get_session("s1").token_usage()
    assert out[1] == f"active context: {render.usage_of(usage, 8_000)}"
    data = json.loads(ok(invoke(db, "rollback", "s1", "--yes", "--json")).stdout)
    assert (data["compactions"], [b["id"] for b in data["rolled_back"]]) == ([6], [2])


# -- errors in the user's words -------------------------------------------------------------


@pytest.mark.slow
def test_a_session_missing_from_a_backup_or_restore_names_where_it_was_looked_for(
    tmp_path: Path,
) -> None:
    db = str(tmp_path / "s.db")
    with CompactStore.open(db) as store:
        build_session(store)
    result = fails(
        invoke(db, "backup", "nosuch", "-o", str(tmp_path / "b.db")),
        f"no session 'nosuch' in {db}",
    )
    assert "to copy" not in result.stderr
    assert not (tmp_path / "b.db").exists()
    backup = tmp_path / "backup.db"
    ok(invoke(db, "backup", "s1", "-o", str(backup)))
    target = str(tmp_path / "t.db")
    CompactStore.open(target).close()
    fails(
        invoke(target, "restore", str(backup), "--session", "nosuch"),
        f"no session 'nosuch' in the backup {backup}",
    )


@pytest.mark.slow
def test_a_truncated_trajectory_says_it_looks_truncated(tmp_path: Path) -> None:
    trajectory = {
        "history": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Fix the bug in parser.py " + "please " * 50},
        ],
        "trajectory": [],
    }
    whole = json.dumps(trajectory, indent=2)
    cut = tmp_path / "run.traj"
    cut.write_text(whole[: whole.index("please") + 100])  # inside the user's string
    result = fails(
        invoke(str(tmp_path / "s.db"), "import", str(cut)),
        "run.traj line 9: not valid JSON (Unterminated string starting at column ",
    )
    assert "starting at at" not in result.stderr
    assert "it looks truncated" in result.stderr
    # A mistyped (not cut) document does not claim to be truncated.
    typo = tmp_path / "typo.traj"
    typo.write_text(whole.replace('"trajectory": []', '"trajectory": [,]'))
    result = fails(invoke(str(tmp_path / "s.db"), "import", str(typo)), "typo.traj line ")
    assert "truncated" not in result.stderr


def _claude_code_transcript(path: Path) -> Path:
    records = [
        {
            "type": "user",
            "uuid": "u1",
            "parentUuid": None,
            "sessionId": "abc",
            "timestamp": "2026-02-12T16:02:25.227Z",
            "message": {"role": "user", "content": "Hello there"},
        },
        {
            "type": "assistant",
            "uuid": "a1",
            "parentUuid": "u1",
            "sessionId": "abc",
            "timestamp": "2026-02-12T16:02:27.227Z",
            "message": {
                "id": "msg_1",
                "role": "assistant",
                "content": [{"type": "text", "text": "Hi"}],
            },
        },
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.mark.slow
def test_a_transcript_given_the_wrong_format_says_which_it_looks_like(tmp_path: Path) -> None:
    file = _claude_code_transcript(tmp_path / "cc.jsonl")
    db = str(tmp_path / "s.db")
    fails(
        invoke(db, "import", str(file), "--format", "codex"),
        "cc.jsonl holds no codex messages to import: it looks like a Claude Code transcript",
    )
    data = json.loads(ok(invoke(db, "import", str(file), "--json")).stdout)  # detected
    assert (data["format"], data["messages"]) == ("anthropic", 2)


# -- session ids in NFC ---------------------------------------------------------------------

NFC = unicodedata.normalize("NFC", "café-résumé")
NFD = unicodedata.normalize("NFD", NFC)


def test_nfc_and_nfd_forms_of_an_id_are_one_session(store: CompactStore) -> None:
    assert NFC != NFD
    sess = store.session(NFD, now=T0)
    assert sess.id == NFC
    sess.append({"role": "user", "content": "hello"})
    assert store.session(NFC).id == NFC
    assert store.get_session(NFD).message_count() == 1
    assert [info.id for info in store.sessions()] == [NFC]
    store.delete_session(NFD)
    assert store.sessions() == []


def test_a_non_nfc_id_written_before_ids_were_normalised_is_still_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from compactstore._core import checks

    db = str(tmp_path / "old.db")
    with monkeypatch.context() as patch:  # an older compactstore stored ids as given
        patch.setattr(checks, "check_session_id", lambda session_id: session_id)
        with CompactStore.open(db) as store:
            store.session(NFD, now=T0).append({"role": "user", "content": "hello"})
    with CompactStore.open(db) as store:
        assert store.get_session(NFC).id == NFD
        assert store.session(NFC).message_count() == 1
        assert [info.id for info in store.sessions()] == [NFD]
    out = ok(invoke(db, "show", NFC)).stdout
    assert out.startswith(f"session {NFD} (anthropic): 1 message, ")


@pytest.mark.slow
def test_the_cli_takes_either_form_of_an_id(tmp_path: Path) -> None:
    db = str(tmp_path / "s.db")
    transcript = tmp_path / "t.jsonl"
    transcript.write_text(json.dumps({"role": "user", "content": "hi"}) + "\n")
    ok(invoke(db, "import", str(transcript), "--session", NFD))
    fails(
        invoke(db, "import", str(transcript), "--session", NFC), f"session {NFC!r} already exists"
    )
    data = json.loads(ok(invoke(db, "sessions", "--json")).stdout)
    assert [s["id"] for s in data] == [NFC]
    for command in ("show", "history"):  # the stored (NFC) id, whichever form was typed
        assert json.loads(ok(invoke(db, command, NFD, "--json")).stdout)["session"] == NFC


# -- simulate and import options ------------------------------------------------------------


def _chat(path: Path, turns: int = 30) -> Path:
    lines = []
    for i in range(turns):
        lines.append({"role": "user", "content": f"question {i} " + "detail " * 150})
        lines.append({"role": "assistant", "content": f"answer {i} " + "because " * 150})
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


@pytest.mark.slow
def test_simulate_names_the_session_it_keeps_and_takes_session(tmp_path: Path) -> None:
    chat = _chat(tmp_path / "chat.jsonl", turns=8)
    db = str(tmp_path / "s.db")
    out = ok(invoke(db, "simulate", str(chat), "--context-window", "8000")).stdout
    assert out.splitlines()[-1] == (
        f"kept as session simulate-1 in {db}: compactstore history simulate-1 --db {db}"
    )
    data = json.loads(ok(invoke(db, "simulate", str(chat), "--session", "mine", "--json")).stdout)
    assert data["session"] == "mine"
    fails(invoke(db, "simulate", str(chat), "--session", "mine"), "'mine' already exists")
    with CompactStore.open(db) as store:
        assert {info.id: info.context_window for info in store.sessions()} == {
            "simulate-1": 8_000,
            "mine": 200_000,
        }
    # Without --db nothing is kept, so there is nothing to name.
    result = invoke(None, "simulate", str(chat), "--session", "mine")
    assert result.exit_code == 2 and "--session names the session kept with --db" in result.stderr


@pytest.mark.slow
def test_import_takes_window_as_simulate_does(tmp_path: Path) -> None:
    chat = _chat(tmp_path / "chat.jsonl", turns=1)
    db = str(tmp_path / "s.db")
    data = json.loads(ok(invoke(db, "import", str(chat), "--window", "9000", "--json")).stdout)
    assert data["context_window"] == 9_000
    args = ["import", str(chat), "--session", "b", "--context-window", "12000", "--json"]
    assert json.loads(ok(invoke(db, *args)).stdout)["context_window"] == 12_000


# -- counts, tables and the demo's first lines ------------------------------------------------


@pytest.mark.slow
def test_counts_of_one_are_singular(tmp_path: Path) -> None:
    assert [render.plural(n, "boundary") for n in (0, 1, 2)] == [
        "0 boundaries",
        "1 boundary",
        "2 boundaries",
    ]
    assert render.plural(1_500, "message") == "1,500 messages"
    chat = tmp_path / "one.jsonl"
    chat.write_text(json.dumps({"role": "user", "content": "hi"}) + "\n")
    out = ok(invoke(str(tmp_path / "s.db"), "import", str(chat))).stdout
    assert out == "imported 1 message into session one (anthropic, 200,000 tokens, 0 boundaries)\n"
    assert ok(invoke(str(tmp_path / "s.db"), "show", "one")).stdout.startswith(
        "session one (anthropic): 1 message, "
    )


def test_sessions_columns_line_up_with_long_and_wide_ids(tmp_path: Path) -> None:
    ids = ["s", "会话-二〇二六-十二月-第一个-很长的名字", "x" * 70, NFD]
    db = str(tmp_path / "s.db")
    with CompactStore.open(db) as store:
        for sid in ids:
            store.session(sid, now=T0).append({"role": "user", "content": "hello"})
    lines = ok(invoke(db, "sessions")).stdout.splitlines()
    assert len(lines) == len(ids) + 1
    # Every row is as wide on a terminal, and its window column ends in the same column.
    assert len({render.display_width(line) for line in lines}) == 1
    ends = {render.display_width(line[: line.index("200,000") + 7]) for line in lines[1:]}
    assert len(ends) == 1
    assert render.display_width("会话") == 4 and render.display_width(NFD) == len(NFC)


def test_breaker_says_when_no_microcompact_ran(tmp_path: Path) -> None:
    db = str(tmp_path / "s.db")
    with CompactStore.open(db) as store:
        sess = store.session("chat", now=T0)
        sess.append({"role": "user", "content": "hello"})
    out = ok(invoke(db, "breaker", "chat")).stdout.splitlines()
    assert out[3] == "last microcompact:    none yet"
    state = sess.breaker()
    ran = state.model_copy(update={"last_microcompact_at": T0 + 3_600})
    assert render_stats.breaker_lines(ran, T0)[3] == "last microcompact:    2023-11-14 23:13:20 UTC"


def test_simulate_without_anything_freed_says_none(tmp_path: Path) -> None:
    from compactstore._simulate import summary_lines
    from compactstore._simulate.report import SimulationReport

    report = SimulationReport(
        file="t.jsonl", source="jsonl", format="anthropic", window=8_000, messages=1, calls=1
    )
    lines = summary_lines(report)
    assert lines[0].startswith("t.jsonl: jsonl (anthropic), 1 message, 1 model call, ")
    assert "tokens freed: none" in lines


@pytest.mark.slow
def test_the_demo_says_its_peak_was_the_staged_overflow_that_reactive_recovery_repaired(
    tmp_path: Path,
) -> None:
    db = str(tmp_path / "demo.db")
    out = ok(invoke(db, "demo", "--steps", "30")).stdout.splitlines()
    with CompactStore.open(db) as store:
        compactions = store.get_session("demo").compactions()
    (reactive,) = [c for c in compactions if c.strategy is not None and c.trigger == "reactive"]
    assert out[0] == f"Simulated 30 steps into session demo of {db}: 71 messages, " + (
        f"{len(compactions)} compactions."
    )
    assert out[1] == (
        f"Peak usage {reactive.tokens_before:,} of 25,000 tokens "
        f'({reactive.tokens_before / 25_000:.0%}): the staged "prompt is too long", a burst '
        f"of tool output sent without the pre-call pipeline, which reactive recovery repaired "
        f"(compaction {reactive.id}: {reactive.tokens_before:,} → {reactive.tokens_after:,} "
        f"tokens)."
    )
    data = json.loads(ok(invoke(db, "demo", "--steps", "30", "--json")).stdout)["report"]
    assert out[2] == (
        f"Largest context the pipeline sent to the model: {data['peak_sent']:,} tokens "
        f"({data['peak_sent'] / 25_000:.0%} of the window)."
    )
    assert 0 < data["peak_sent"] <= 25_000 < data["peak_usage"]
