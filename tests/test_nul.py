"""NUL in messages, and credentials in a summarizer's failure, on both backends.

A message may hold any text, NUL (U+0000) included: it is stored as JSON (where NUL is the
escape ``\\u0000``) and read back exactly. What the store derives from messages into text
columns (summaries, instructions, a recovery's error, a fallback's reason, read-dedup path
keys) has each NUL as U+FFFD, since PostgreSQL text cannot hold NUL: every compaction of
such a session succeeds on every backend. A fallback's reason may quote a provider's reply:
credentials are taken out of it and the store's redactor applied before it is stored.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import select

from compactstore import CompactStore
from compactstore._cli import cli
from compactstore._core.summarizing import redact_credentials
from compactstore._engines.base import SummaryResult
from compactstore._importers import import_file, read_transcript
from compactstore._store.export import export_lines
from compactstore.db.schema import (
    compact_boundaries,
    compaction_jobs,
    compactions,
    read_dedup_entries,
)
from compactstore.models import CompactionResult, CompactStrategy
from compactstore.transfer import backup, restore
from tests.helpers import T0, claude_code_record, new_session, per_seq, plain, words

Message = dict[str, Any]
NUL = "\x00"
KEY = "sk-ant-api03-Zx9" + "q" * 40
# What a proxy that echoes the request headers put into a provider's error text.
ECHOED = (
    f"502 from upstream; request was: POST /v1/messages\r\n"
    f"Authorization: Bearer {KEY}\r\nx-api-key: {KEY}\r\napi-key: azure-0123456789abcdef\r\n"
    f"host: llm-proxy.acme-internal.example{NUL}"
)


def _request_and_reads(chat: Any, reads: int = 12, *, nul_paths: bool = False) -> list[Message]:
    """A user request and file reads, every part of them holding a NUL: text, tool inputs,
    results (and with ``nul_paths`` the read paths given to append_tool_result); the same
    file read twice (read dedup). The messages appended."""
    sess = chat.sess
    log: list[Message] = [{"role": "user", "content": f"make the parser accept a{NUL}b"}]
    sess.append(log[0], timestamp=chat.tick())
    for i in range(reads):
        path = f"src/nul{NUL}{i % (reads - 1)}.py"  # the last read repeats the first
        call = {
            "role": "assistant",
            "content": [
                {"type": "text", "text": f"reading {path}"},
                {
                    "type": "tool_use",
                    "id": f"toolu_{i}",
                    "name": "read_file",
                    "input": {"path": path, f"opt{NUL}": [NUL, {"k": f"v{NUL}"}]},
                },
            ],
        }
        sess.append(call, timestamp=chat.tick())
        log.append(call)
        # One result over tool_result_max_chars: the tool budget persists it as a blob.
        body = f"{path}:\n" + f"line{NUL}end " * (250 if i != 1 else 500)
        read = path if nul_paths else path.replace(NUL, "-")
        sess.append_tool_result(
            f"toolu_{i}", body, tool_name="read_file", file_path=read, timestamp=chat.tick()
        )
        log.append(sess.messages()[-1])
    return log


def _no_nul(*texts: str | None) -> None:
    for text in texts:
        assert text is None or NUL not in text


@pytest.mark.slow
def test_nul_everywhere_in_messages_then_every_compaction(
    store: CompactStore, reopen: Callable[[], CompactStore]
) -> None:
    chat = new_session(store, context_window=7_000, config=plain())
    sess = chat.sess
    expected = _request_and_reads(chat)
    # A message holding NUL reads back exactly, as stored.
    assert sess.messages() == expected
    assert NUL in json.loads(json.dumps(sess.messages()))[0]["content"]

    # Automatic compaction of a session over its threshold: the tool budget persists the
    # large result (its blob holds it exactly), then a full compact whose rule-based
    # summary quotes the request, NUL as U+FFFD.
    auto = sess.process_request(now=chat.tick())
    assert auto.effective and auto.boundary is not None
    assert [step.strategy.value for step in auto.steps] == ["tool_budget", "full"]
    [blob_id] = auto.blob_ids
    assert sess.get_blob(blob_id) == expected[4]["content"][0]["content"]
    assert "a\ufffdb" in auto.summary_text
    _no_nul(auto.summary_text)

    # A manual compaction with NUL in its instructions.
    chat.sess.extend(
        [{"role": "user", "content": f"go on{NUL} " + words(3_000, "m")}], timestamps=[chat.tick()]
    )
    manual = sess.compact(instructions=f"keep the a{NUL}b case", now=chat.tick())
    assert manual.success and manual.instructions == "keep the a\ufffdb case"

    # Reactive recovery with NUL in the provider's error.
    sess.extend([{"role": "assistant", "content": words(20_000, "r")}], timestamps=[chat.tick()])
    recovered = sess.reactive_recover(f"prompt is too long{NUL}", now=chat.tick())
    assert recovered is not None and recovered.success
    assert recovered.error == "prompt is too long\ufffd"

    # A new process sees the same: the log exactly, the context as the compactions left it.
    expected = expected + sess.messages()[len(expected) :]
    again = reopen().session("s")
    assert again.messages() == expected == sess.messages()
    assert again.active_context() == sess.active_context()
    stored = again.compactions()
    assert [c.summary_text for c in stored[-3:]] == [
        auto.summary_text,
        manual.summary_text,
        recovered.summary_text,
    ]
    assert stored[-2].instructions == "keep the a\ufffdb case"
    assert stored[-1].error == "prompt is too long\ufffd"
    with store.engine.connect() as connection:
        for row in connection.execute(select(compactions)).mappings():
            _no_nul(*(v for v in row.values() if isinstance(v, str)))
        for row in connection.execute(select(compact_boundaries)).mappings():
            _no_nul(*(v for v in row.values() if isinstance(v, str)))


def test_a_read_path_with_nul_is_deduplicated_and_invalidated(
    store: CompactStore, reopen: Callable[[], CompactStore]
) -> None:
    """A read path a tool's input gave, NUL and all: read dedup keys it with NUL as U+FFFD."""
    chat = new_session(store)
    expected = _request_and_reads(chat, reads=4, nul_paths=True)
    assert chat.sess.messages() == expected
    with store.engine.connect() as connection:
        paths = set(connection.scalars(select(read_dedup_entries.c.file_path)))
    assert paths == {"src/nul\ufffd0.py", "src/nul\ufffd1.py", "src/nul\ufffd2.py"}
    # The last read repeated the first: in the context, a stub pointing at it.
    stub = per_seq(chat.sess)[-1]["content"][0]["content"]
    assert "[Read deduplicated: src/nul\ufffd0.py]" in stub
    assert chat.sess.invalidate(f"src/nul{NUL}1.py")
    again = reopen().session("s")
    assert again.messages() == expected
    assert not again.invalidate(f"src/nul{NUL}1.py")
    assert again.invalidate(f"src/nul{NUL}2.py")


def test_memory_with_nul_is_kept_and_compacted(
    store: CompactStore, reopen: Callable[[], CompactStore]
) -> None:
    """remember() of a message's text holding NUL: stored with U+FFFD (its own column), and
    session-memory compact summarises with it."""
    config = plain(session_memory_min_tail_tokens=500, session_memory_max_tail_tokens=2_000)
    chat = new_session(store, context_window=12_000, config=config)
    chat.sess.append({"role": "user", "content": f"parse a{NUL}b"}, timestamp=chat.tick())
    chat.sess.remember("user_intent", f"parse a{NUL}b too", now=chat.tick())
    chat.chatter(52, chars=800)
    result = chat.sess.process_request(now=chat.tick())
    assert result.effective and result.strategy is not None
    assert result.strategy.value == "session_memory"
    assert "- [user_intent] parse a\ufffdb too" in result.summary_text
    again = reopen().session("s")
    assert [entry.text for entry in again.memories()] == ["parse a\ufffdb too"]
    assert again.active_context() == chat.sess.active_context()


def _summarizer_session(store: CompactStore, summarizer: Any) -> Any:
    chat = new_session(store, context_window=50_000, summarizer=summarizer)
    _request_and_reads(chat, reads=4)
    return chat


def _cuts(recorded: list[CompactionResult]) -> list[CompactionResult]:
    """The compactions that cut (the re-reads the sessions make are read-dedup rows too)."""
    return [c for c in recorded if c.strategy != CompactStrategy.READ_DEDUP]


def test_a_summary_with_nul_is_used_not_refused(
    store: CompactStore, reopen: Callable[[], CompactStore]
) -> None:
    def summarizer(messages: list[Message], previous: str | None, instructions: str | None) -> Any:
        assert NUL in messages[0]["content"][0]["text"]  # sent the messages as they are
        return SummaryResult(f"The user wants a{NUL}b parsed.", model=f"m{NUL}1")

    chat = _summarizer_session(store, summarizer)
    result = chat.sess.compact(now=chat.tick())
    assert result.summary is not None and result.summary.source == "summarizer"
    assert not result.summary.fallback
    assert "The user wants a\ufffdb parsed." in result.summary_text
    assert result.summary.model == "m\ufffd1"
    again = reopen().session("s", summarizer=summarizer)
    assert again.active_context() == chat.sess.active_context()
    [stored] = _cuts(again.compactions())
    assert stored.summary_text == result.summary_text
    assert stored.summary == result.summary


def test_figures_a_summarizer_reports_that_no_column_holds_are_left_out(
    store: CompactStore, reopen: Callable[[], CompactStore]
) -> None:
    """A count past INTEGER (PostgreSQL refused the row), one that is not a number
    (pydantic refused it), a model name longer than its column: the summary is used and
    the figures are recorded as far as they fit."""

    def summarizer(messages: list[Message], previous: str | None, instructions: str | None) -> Any:
        text: Any = "12"  # a count that is not a number, on purpose
        return SummaryResult("a summary", input_tokens=10**12, output_tokens=text, model="m" * 300)

    chat = _summarizer_session(store, summarizer)
    result = chat.sess.compact(now=chat.tick())
    assert result.summary is not None and result.summary.source == "summarizer"
    assert result.summary.input_tokens is None and result.summary.output_tokens is None
    assert result.summary.model == "m" * 255
    [stored] = _cuts(reopen().session("s", summarizer=summarizer).compactions())
    assert stored.summary == result.summary


@pytest.mark.slow_on_postgres
def test_a_lone_surrogate_in_derived_text_is_stored_as_a_replacement_character(
    store: CompactStore, reopen: Callable[[], CompactStore]
) -> None:
    """A message with a lone surrogate is refused, but a summarizer's answer or exception,
    instructions and an API's error text may hold one: no UTF-8 column can store it, and
    each of these crashed the compaction with UnicodeEncodeError on both backends."""

    def answers(messages: list[Message], previous: str | None, instructions: str | None) -> str:
        assert instructions == "keep \ufffd"
        return "summary \ud800 text"

    def raises(messages: list[Message], previous: str | None, instructions: str | None) -> str:
        raise RuntimeError("bad \udc00 bytes")

    results = {}
    for sid, summarizer in (("answers", answers), ("raises", raises)):
        chat = new_session(store, sid=sid, context_window=50_000, summarizer=summarizer)
        _request_and_reads(chat, reads=4)
        results[sid] = chat.sess.compact(instructions="keep \udfff", now=chat.tick())
    assert results["answers"].summary_text == "summary \ufffd text"
    assert results["answers"].summary is not None
    assert results["answers"].summary.source == "summarizer"
    assert results["raises"].summary is not None
    assert results["raises"].summary.reason is not None
    assert results["raises"].summary.reason.endswith("(RuntimeError: bad \ufffd bytes)")
    recovered = store.session("answers").reactive_recover("too long \ud83d", now=T0 + 1e6)
    assert recovered is not None and recovered.error == "too long \ufffd"
    again = reopen()
    for sid in results:
        stored = again.session(sid, summarizer=answers if sid == "answers" else raises)
        cut = _cuts(stored.compactions())[0]
        assert cut.summary_text == results[sid].summary_text
        assert cut.summary == results[sid].summary


def test_a_summarizer_failure_is_stored_without_credentials_or_nul(
    db_url: str, reopen: Callable[[], CompactStore]
) -> None:
    def failing(messages: list[Message], previous: str | None, instructions: str | None) -> str:
        raise RuntimeError(ECHOED)

    store = CompactStore.open(
        db_url, redactor=lambda text: text.replace("acme-internal", "[internal host]")
    )
    try:
        chat = _summarizer_session(store, failing)
        result = chat.sess.compact(now=chat.tick())
    finally:
        store.close()
    assert result.success and result.summary is not None and result.summary.fallback
    [stored] = _cuts(reopen().session("s", summarizer=failing).compactions())
    reason = stored.summary.reason if stored.summary is not None else None
    assert reason == result.summary.reason
    assert reason is not None and reason.startswith("summarizer tests.test_nul:")
    assert "RuntimeError: 502 from upstream" in reason
    assert "Authorization: [REDACTED]" in reason and "x-api-key: [REDACTED]" in reason
    assert "api-key: [REDACTED]" in reason
    assert "llm-proxy.[internal host].example\ufffd" in reason  # the redactor, then NUL
    # Nowhere in the row: not the reason, not the steps that quote it.
    with reopen().engine.connect() as connection:
        row = (
            connection.execute(select(compactions).where(compactions.c.strategy != "read_dedup"))
            .mappings()
            .one()
        )
    for value in row.values():
        if isinstance(value, str):
            assert KEY not in value and "azure-0123" not in value and "acme-internal" not in value
    assert "[REDACTED]" in row["summarizer_reason"] and "[REDACTED]" in row["steps"]


def test_a_failing_redactor_withholds_the_reason(
    db_url: str, reopen: Callable[[], CompactStore]
) -> None:
    def failing(messages: list[Message], previous: str | None, instructions: str | None) -> str:
        raise RuntimeError(ECHOED)

    calls: list[str] = []

    def redactor(text: str) -> str:
        calls.append(text)
        if "502 from upstream" in text:
            raise ValueError("cannot redact this")
        return text

    store = CompactStore.open(db_url, redactor=redactor)
    try:
        chat = _summarizer_session(store, failing)
        result = chat.sess.compact(now=chat.tick())
    finally:
        store.close()
    assert result.success and result.summary is not None
    assert result.summary.reason == "reason withheld: the redactor raised ValueError"
    assert any(KEY not in text and "[REDACTED]" in text for text in calls if "502" in text)
    [stored] = _cuts(reopen().session("s", summarizer=failing).compactions())
    assert stored.summary == result.summary


def test_a_background_job_error_is_stored_redacted(
    db_url: str, reopen: Callable[[], CompactStore]
) -> None:
    """A plug-in's failure in a background compaction is stored in the job row as a
    summarizer's is: credentials out, the redactor applied, NUL as U+FFFD."""

    def summarizer(messages: list[Message], previous: str | None, instructions: str | None) -> str:
        return "a summary"

    def memory(session_id: str, entries: Any, max_tokens: int) -> str:
        raise RuntimeError(ECHOED)

    store = CompactStore.open(
        db_url,
        summarizer=summarizer,
        memory_provider=memory,
        redactor=lambda text: text.replace("acme-internal", "[internal host]"),
    )
    try:
        sess = store.session("s", context_window=10_000)
        for i in range(40):
            sess.extend([{"role": "user", "content": f"q{i} " + "word " * 300}], timestamps=[i])
            sess.append({"role": "assistant", "content": "a"}, timestamp=i)
            if sess.process_request(background=True, now=float(i)).background == "started":
                break
    finally:
        store.close()  # waits for the job
    with reopen().engine.connect() as connection:
        [job] = connection.execute(select(compaction_jobs)).mappings().all()
    assert job["state"] == "failed"
    assert job["error"].startswith("PluginError: memory_provider ")
    assert "Authorization: [REDACTED]" in job["error"] and KEY not in job["error"]
    assert "llm-proxy.[internal host].example\ufffd" in job["error"]


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        (f"Authorization: Bearer {KEY}\nhost: x", "Authorization: [REDACTED]\nhost: x"),
        (
            "{'authorization': 'Bearer abcdef123456', 'content-type': 'application/json'}",
            "{'authorization': '[REDACTED]', 'content-type': 'application/json'}",
        ),
        ('{"x-api-key":"k-123","model":"m"}', '{"x-api-key":"[REDACTED]","model":"m"}'),
        ("GET /v1/models?api_key=abc123&alt=json", "GET /v1/models?api_key=[REDACTED]&alt=json"),
        ("OPENAI_API_KEY=sk-proj-abcdefgh12345678 unset", "OPENAI_API_KEY=[REDACTED] unset"),
        ("Proxy-Authorization: Basic dXNlcjpwYXNz", "Proxy-Authorization: [REDACTED]"),
        ("sent Bearer eyJhbGciOiJIUzI1NiJ9.abc.def twice", "sent Bearer [REDACTED] twice"),
        (f"key {KEY} is invalid", "key [REDACTED] is invalid"),
        ("key AIzaSyA1234567890abcdefghijklmnopqrs", "key [REDACTED]"),
        ("id AKIAIOSFODNN7EXAMPLE", "id [REDACTED]"),
        # Nothing that is not a credential: words about keys and tokens stay.
        (
            "Error 401: invalid x-api-key; pass an `api_key` or set OPENAI_API_KEY "
            "(max_tokens: 10, input tokens 5, task-runner ok)",
            "Error 401: invalid x-api-key; pass an `api_key` or set OPENAI_API_KEY "
            "(max_tokens: 10, input tokens 5, task-runner ok)",
        ),
    ],
)
def test_redact_credentials(text: str, shown: str) -> None:
    assert redact_credentials(text) == shown


@pytest.mark.slow
def test_redacting_a_hostile_error_text_takes_linear_time() -> None:
    """Texts built to make a backtracking pattern quadratic (400 KB each: ~0.1 s each when
    scanned linearly, minutes when not). Run in a child process so a regression fails the
    test at the deadline instead of hanging it."""
    script = textwrap.dedent(
        """
        from compactstore._core.summarizing import redact_credentials
        for text in ("eyJ-" * 100_000, "api_key-" * 50_000, "sk-" * 130_000,
                     "x-api-key" + " " * 400_000, "Authorization: " * 26_000):
            redact_credentials(text)
        print("done")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout == "done\n"


def _nul_transcript(tmp_path: Path) -> Path:
    """A Claude Code transcript holding NUL in user text, a Read path, a tool result and the
    summary of a compaction the agent did."""
    read = {
        "type": "tool_use",
        "id": "toolu_r",
        "name": "Read",
        "input": {"file_path": f"/repo/a{NUL}b.py"},
    }
    result = {"type": "tool_result", "tool_use_id": "toolu_r", "content": f"x{NUL}y " * 900}
    records: list[Message] = [
        claude_code_record("user", f"fix a{NUL}b", uuid="u1"),
        claude_code_record("assistant", [read], uuid="a1", message_id="m1"),
        claude_code_record("user", [result], uuid="u2"),
        {
            "type": "system",
            "subtype": "compact_boundary",
            "uuid": "b1",
            "sessionId": "s",
            "timestamp": "2026-01-01T01:00:00Z",
            "compactMetadata": {"trigger": "auto", "preTokens": 9000},
        },
        claude_code_record(
            "user", f"Summary: the user asked to fix a{NUL}b.", uuid="u3", isCompactSummary=True
        ),
    ]
    for i in range(8):
        records.append(
            claude_code_record("user", f"step {i}{NUL} " + words(2_000, f"s{i}"), uuid=f"q{i}")
        )
        records.append(
            claude_code_record("assistant", [{"type": "text", "text": f"ok{NUL}"}], uuid=f"r{i}")
        )
    path = tmp_path / "nul.jsonl"
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


@pytest.mark.slow
def test_an_imported_transcript_with_nul_compacts_and_round_trips(
    store: CompactStore, tmp_path: Path, reopen: Callable[[], CompactStore]
) -> None:
    path = _nul_transcript(tmp_path)
    expected = read_transcript(path).messages
    assert sum("\\u0000" in json.dumps(message) for message in expected) >= 4
    sess = import_file(store, path, session_id="imp", context_window=8_000)
    assert sess.messages() == expected
    assert [json.loads(line) for line in export_lines(sess)] == expected
    [imported] = sess.boundaries()
    _no_nul(imported.summary_text)
    assert "fix a\ufffdb" in imported.summary_text
    result = sess.compact(now=T0)
    assert result.success and result.boundary is not None
    _no_nul(result.summary_text)
    assert sess.process_request(now=T0 + 1) is not None

    # A backup and a restore keep the messages exact and the derived text as stored.
    out = tmp_path / "backup.db"
    backup(store, out, ["imp"])
    context, history = sess.active_context(), sess.compactions()
    store.delete_session("imp")
    restore(store, out)
    back = reopen().session("imp")
    assert back.messages() == expected
    assert back.active_context() == context
    assert [c.summary_text for c in back.compactions()] == [c.summary_text for c in history]


@pytest.mark.slow
def test_the_cli_imports_compacts_and_exports_a_transcript_with_nul(
    db_url: str, tmp_path: Path
) -> None:
    path = _nul_transcript(tmp_path)
    expected = read_transcript(path).messages

    def run(*args: str) -> str:
        result = CliRunner().invoke(cli, [*args, "--db", db_url], env={"COMPACTSTORE_DB": None})
        assert result.exit_code == 0, result.output
        return result.stdout

    run("import", str(path), "--session", "imp", "--context-window", "8000")
    run("compact", "imp", "--instructions", "keep the a/b case")
    exported = run("export", "imp")
    assert [json.loads(line) for line in exported.splitlines()] == expected
    history = json.loads(run("history", "imp", "--json"))
    assert len(history["compactions"]) == 2 and NUL not in json.dumps(history, ensure_ascii=False)


@pytest.mark.slow
def test_restore_of_nul_an_older_version_stored(
    store: CompactStore, tmp_path: Path, reopen: Callable[[], CompactStore]
) -> None:
    """A SQLite file holds the NUL an older compactstore put in a summary: restoring it
    (into PostgreSQL too) stores that text as today's versions would."""
    old = tmp_path / "old.db"
    source = CompactStore.open(str(old))
    try:
        chat = new_session(source, context_window=50_000)
        _request_and_reads(chat, reads=4)
        chat.sess.compact(now=chat.tick())
        with source.engine.begin() as connection:
            for table in (compactions, compact_boundaries):  # one compaction, one boundary
                connection.execute(table.update().values(summary_text=f"an old summary of a{NUL}b"))
    finally:
        source.close()
    restore(store, old)
    again = reopen().session("s")
    [stored] = _cuts(again.compactions())
    assert stored.summary_text == "an old summary of a\ufffdb"
    assert again.boundaries()[0].summary_text == "an old summary of a\ufffdb"
