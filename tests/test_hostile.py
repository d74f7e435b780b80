"""Hostile input across the API, the command line and import: a clear error, nothing stored.

One table of bad inputs, each run against a prepared database on each backend: the call
must raise the named CompactStoreError subclass (the CLI: exit 1 with one ``Error:`` line,
or click's exit 2 for a usage error; never a traceback), and every row of every table must
be exactly as it was before. A few inputs are not errors but must be handled correctly
(NUL bytes, SQL metacharacters and path separators in ids are just data): those check the
round trip instead. Then a hypothesis fuzz test of the import parsers: whatever bytes a
transcript file holds, only InvalidInputError may escape.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tracemalloc
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import inspect

from compactstore import (
    CompactStore,
    CompactStoreError,
    ConflictError,
    InvalidInputError,
    InvalidMessageError,
    NotFoundError,
    Session,
)
from compactstore._cli import cli
from compactstore._importers import import_file, read_transcript
from compactstore.formats.base import MAX_NESTING
from tests.conftest import BACKENDS, fresh_database, snapshot

T0 = 1_700_000_000.0
MB = 1024 * 1024
Message = dict[str, Any]


# -- the prepared world --------------------------------------------------------------------------


@dataclass
class World:
    """A database with sessions in every format, boundaries and blobs, and a scratch dir."""

    store: CompactStore
    url: str
    tmp: Path
    a: Session  # anthropic: two blobs, a live boundary
    b: Session  # anthropic: one blob, a live boundary
    o: Session  # openai
    m: Session  # minicode
    a_boundary: int
    b_boundary: int
    a_only_blob: int  # a blob id that exists in a but not in b
    pending_b: str  # a tool call of b still waiting for its result

    def file(self, name: str, data: bytes | str) -> Path:
        path = self.tmp / name
        path.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
        return path


def _tool_use(call_id: str, name: str = "read_file", **input_: Any) -> Message:
    return {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": call_id, "name": name, "input": input_}],
    }


def _talk(sess: Session, tag: str, count: int, t: float) -> float:
    for i in range(count):
        role = "user" if i % 2 == 0 else "assistant"
        sess.append({"role": role, "content": f"{tag} {i} " + "lorem ipsum " * 60}, timestamp=t)
        t += 1
    return t


def _build(store: CompactStore, url: str, tmp: Path) -> World:
    a = store.session("a", now=T0)
    t = _talk(a, "a", 4, T0 + 1)
    for n in (1, 2, 3):
        a.append(_tool_use(f"toolu_a{n}", path=f"f{n}.py"), timestamp=t)
        a.append_tool_result(f"toolu_a{n}", "x = 1\n" * (1_000 * n), tool_name="read_file")
        t += 1
    t = _talk(a, "a-more", 12, t)
    persisted = a.process_request(now=t)
    assert len(persisted.blob_ids) == 3, persisted
    a_boundary = a.compact(now=t + 1).boundary
    assert a_boundary is not None and a_boundary.id is not None

    b = store.session("b", now=T0)
    t = _talk(b, "b", 4, T0 + 1)
    b.append(_tool_use("toolu_b1"), timestamp=t)
    b.append_tool_result("toolu_b1", "y = 2\n" * 1_000, tool_name="read_file")
    t = _talk(b, "b-more", 12, t + 1)
    assert b.process_request(now=t).blob_ids == [1]
    b_boundary = b.compact(now=t + 1).boundary
    assert b_boundary is not None and b_boundary.id is not None
    b.append(_tool_use("toolu_b_pending"), timestamp=t + 2)

    o = store.session("o", format="openai", now=T0)
    o.append({"role": "system", "content": "be brief"}, timestamp=T0)
    o.append({"role": "user", "content": "hello"}, timestamp=T0)
    o.append(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_o1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
        timestamp=T0,
    )
    o.append_tool_result("call_o1", "done", tool_name="f", timestamp=T0)

    m = store.session("m", format="minicode", now=T0)
    m.append({"role": "user", "content": "hello"}, timestamp=T0)
    m.append(_tool_use("toolu_m1"), timestamp=T0)
    return World(
        store=store,
        url=url,
        tmp=tmp,
        a=a,
        b=b,
        o=o,
        m=m,
        a_boundary=a_boundary.id,
        b_boundary=b_boundary.id,
        a_only_blob=3,
        pending_b="toolu_b_pending",
    )


@pytest.fixture(scope="module", params=BACKENDS)
def world(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp(f"hostile-{request.param}")
    with fresh_database(request.param, tmp, "hostile") as url, CompactStore.open(url) as store:
        yield _build(store, url, tmp)


# -- deeply nested values -------------------------------------------------------------------------


def _nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


def _deep_json(depth: int) -> str:
    return "[" * depth + "]" * depth


# -- the table ------------------------------------------------------------------------------------

Api = Callable[[World], object]


@dataclass(frozen=True)
class Cli:
    """A command line: ``{a_boundary}``-style fields are filled from the world."""

    args: tuple[str, ...]
    files: tuple[tuple[str, bytes], ...] = ()


def _case(
    name: str,
    action: Api | Cli,
    error: type[CompactStoreError] | int,
    match: str = "",
    *,
    slow: bool = False,
) -> Any:
    marks = [pytest.mark.slow] if slow else []
    return pytest.param(name, action, error, match, id=name, marks=marks)


def _msg(text: Any, role: str = "user") -> Message:
    return {"role": role, "content": text}


NOT_UTF8 = "bonjour \xe9t\xe9".encode("latin-1")
GOOD_LINE = b'{"role": "user", "content": "hi"}\n'

CASES = [
    # -- messages: wrong types and shapes
    _case("append-a-list", lambda w: w.a.append([_msg("x")]), InvalidMessageError, "dict"),  # type: ignore[arg-type]
    _case("append-none", lambda w: w.a.append(None), InvalidMessageError, "dict"),  # type: ignore[arg-type]
    _case("append-a-string", lambda w: w.a.append('{"role":"user"}'), InvalidMessageError),  # type: ignore[arg-type]
    _case("unknown-role", lambda w: w.a.append(_msg("x", "wizard")), InvalidMessageError, "role"),
    _case("role-not-a-string", lambda w: w.a.append(_msg("x", 7)), InvalidMessageError, "role"),  # type: ignore[arg-type]
    _case("content-a-number", lambda w: w.a.append(_msg(42)), InvalidMessageError, "content"),
    _case("content-a-dict", lambda w: w.a.append(_msg({"t": 1})), InvalidMessageError, "content"),
    _case("content-bytes", lambda w: w.a.append(_msg(b"x")), InvalidMessageError, "content"),
    _case("content-missing", lambda w: w.a.append({"role": "user"}), InvalidMessageError),
    _case(
        "block-not-a-dict",
        lambda w: w.a.append(_msg(["just text"])),
        InvalidMessageError,
        "content",
    ),
    _case(
        "openai-arguments-not-a-string",
        lambda w: w.o.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c9", "type": "function", "function": {"name": "f", "arguments": {}}}
                ],
            }
        ),
        InvalidMessageError,
        "arguments",
    ),
    _case(
        "tool-use-without-id",
        lambda w: w.a.append(
            {"role": "assistant", "content": [{"type": "tool_use", "name": "x", "input": {}}]}
        ),
        InvalidMessageError,
        "id",
    ),
    _case(
        "nan-inside-a-message",
        lambda w: w.a.append(_tool_use("toolu_nan", v=float("nan"))),
        InvalidMessageError,
        "JSON",
    ),
    _case(
        "a-set-inside-a-message",
        lambda w: w.a.append(_tool_use("toolu_set", v={1, 2})),
        InvalidMessageError,
        "JSON",
    ),
    # -- NUL bytes and lone surrogates
    _case(
        "lone-surrogate-in-content",
        lambda w: w.a.append(_msg("bad \ud800 text")),
        InvalidMessageError,
        "surrogate",
    ),
    _case(
        "lone-surrogate-in-a-dict-key",
        lambda w: w.a.append(
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": "toolu_sur", "name": "x", "input": {"\udc00": 1}}
                ],
            }
        ),
        InvalidMessageError,
        "surrogate",
    ),
    _case(
        "lone-surrogate-in-a-tool-result",
        lambda w: w.b.append_tool_result(w.pending_b, "x\udfff", tool_name="read_file"),
        InvalidInputError,
        "surrogate",
    ),
    _case(
        "nul-in-a-tool-call-id",
        lambda w: w.a.append(_tool_use("toolu_\x00nul")),
        InvalidMessageError,
        "NUL",
    ),
    _case(
        "nul-in-a-tool-name",
        lambda w: w.b.append_tool_result(w.pending_b, "ok", tool_name="read\x00file"),
        InvalidInputError,
        "NUL",
    ),
    # -- sizes and depth
    _case(
        "a-100-MB-tool-result",
        lambda w: w.b.append_tool_result(w.pending_b, "x" * (100 * MB), tool_name="read_file"),
        InvalidMessageError,
        "max_message_bytes",
        slow=True,
    ),
    _case(
        "a-40-MB-message",
        lambda w: w.a.append(_msg("y" * (40 * MB))),
        InvalidMessageError,
        "over the limit",
        slow=True,
    ),
    _case(
        "content-nested-100000-deep",
        lambda w: w.a.append(_msg(_nested(100_000))),
        InvalidMessageError,
        slow=True,
    ),
    _case(
        "tool-input-nested-100000-deep",
        lambda w: w.a.append(_tool_use("toolu_deep", v=_nested(100_000))),
        InvalidMessageError,
        slow=True,
    ),
    _case(
        "text-block-field-nested-100000-deep",
        lambda w: w.a.append(_msg([{"type": "text", "text": "x", "extra": _nested(100_000)}])),
        InvalidMessageError,
        slow=True,
    ),
    _case(
        "a-tool-name-of-300-characters",
        lambda w: w.b.append_tool_result(w.pending_b, "ok", tool_name="n" * 300),
        InvalidInputError,
        "longer than",
    ),
    # -- tool ids
    _case(
        "unknown-tool-id",
        lambda w: w.a.append_tool_result("toolu_never_called", "x", tool_name="read_file"),
        InvalidMessageError,
        "no tool call",
    ),
    _case(
        "unknown-tool-id-openai",
        lambda w: w.o.append({"role": "tool", "tool_call_id": "call_nope", "content": "x"}),
        InvalidMessageError,
        "no tool call",
    ),
    _case(
        "unknown-tool-id-minicode",
        lambda w: w.m.append(
            {
                "role": "tool_result",
                "content": "x",
                "toolName": "f",
                "toolUseId": "toolu_nope",
                "isError": False,
            }
        ),
        InvalidMessageError,
        "no tool call",
    ),
    _case(
        "a-tool-id-of-another-session",
        lambda w: w.a.append_tool_result(w.pending_b, "x", tool_name="read_file"),
        InvalidMessageError,
        "no tool call",
    ),
    _case(
        "duplicate-tool-call-id",
        lambda w: w.b.append(_tool_use("toolu_b_pending")),
        InvalidMessageError,
        "duplicate",
    ),
    _case(
        "duplicate-ids-in-one-message",
        lambda w: w.a.append(
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": "toolu_d", "name": "x", "input": {}},
                    {"type": "tool_use", "id": "toolu_d", "name": "x", "input": {}},
                ],
            }
        ),
        InvalidMessageError,
        "duplicate",
    ),
    _case(
        "a-second-result-for-one-call",
        lambda w: w.o.append_tool_result("call_o1", "again", tool_name="f"),
        InvalidMessageError,
        "already has a result",
    ),
    _case(
        "pinning-a-tool-call",
        lambda w: w.a.append(_tool_use("toolu_pin"), pinned=True),
        InvalidMessageError,
        "pinned",
    ),
    _case(
        "one-bad-message-in-a-batch",
        lambda w: w.a.extend([_msg("fine"), _msg(3), _msg("fine too")]),
        InvalidMessageError,
        "message 1",
    ),
    # -- timestamps
    _case("negative-timestamp", lambda w: w.a.append(_msg("x"), timestamp=-1), InvalidInputError),
    _case(
        "nan-timestamp",
        lambda w: w.a.append(_msg("x"), timestamp=float("nan")),
        InvalidInputError,
        "finite",
    ),
    _case(
        "infinite-timestamp",
        lambda w: w.a.append(_msg("x"), timestamp=float("inf")),
        InvalidInputError,
        "finite",
    ),
    _case(
        "timestamp-a-string",
        lambda w: w.a.append(_msg("x"), timestamp="2024-01-01"),  # type: ignore[arg-type]
        InvalidInputError,
    ),
    _case("timestamp-a-bool", lambda w: w.a.append(_msg("x"), timestamp=True), InvalidInputError),
    _case(
        "nan-now",
        lambda w: w.a.process_request(now=float("nan")),
        InvalidInputError,
        "finite",
    ),
    _case("negative-now", lambda w: w.a.compact(now=-5), InvalidInputError),
    _case(
        "timestamp-a-huge-integer",
        lambda w: w.a.append(_msg("x"), timestamp=10**400),
        InvalidInputError,
    ),
    _case(
        "now-past-year-9999",
        lambda w: w.a.compact(now=1e12),
        InvalidInputError,
    ),
    # -- session ids
    _case("empty-session-id", lambda w: w.store.session(""), InvalidInputError),
    _case("session-id-not-a-string", lambda w: w.store.session(5), InvalidInputError),  # type: ignore[arg-type]
    _case("nul-in-session-id", lambda w: w.store.session("a\x00b"), InvalidInputError),
    _case("lone-surrogate-session-id", lambda w: w.store.session("\ud83d"), InvalidInputError),
    _case("session-id-of-256-chars", lambda w: w.store.session("s" * 256), InvalidInputError),
    _case(
        "unknown-session-with-sql",
        lambda w: w.store.get_session("a' OR '1'='1"),
        NotFoundError,
    ),
    _case(
        "reopen-with-another-format",
        lambda w: w.store.session("a", format="openai"),
        ConflictError,
    ),
    _case("unknown-format", lambda w: w.store.session("new", format="xml"), InvalidInputError),
    _case(
        "negative-context-window",
        lambda w: w.store.session("new", context_window=-5),
        InvalidInputError,
    ),
    _case("config-a-dict", lambda w: w.store.session("new", config={}), InvalidInputError),  # type: ignore[arg-type]
    # -- ids of boundaries and blobs, across sessions
    _case(
        "roll-back-a-boundary-of-another-session",
        lambda w: w.b.rollback(w.a_boundary),
        NotFoundError,
        "no boundary",
    ),
    _case(
        "replay-a-boundary-of-another-session",
        lambda w: w.b.replay(w.a_boundary),
        NotFoundError,
        "no boundary",
    ),
    _case(
        "apply-a-replay-of-another-sessions-boundary",
        lambda w: w.b.replay(w.a_boundary, apply=True),
        NotFoundError,
    ),
    _case(
        "read-a-blob-of-another-session",
        lambda w: w.b.get_blob(w.a_only_blob),
        NotFoundError,
        "no blob",
    ),
    _case("blob-id-a-string", lambda w: w.a.get_blob("1"), InvalidInputError),  # type: ignore[arg-type]
    _case("negative-blob-id", lambda w: w.a.get_blob(-1), NotFoundError),
    _case("boundary-id-a-bool", lambda w: w.a.rollback(True), InvalidInputError),
    _case("boundary-id-beyond-any-row", lambda w: w.a.rollback(2**40), NotFoundError),
    _case(
        "compact-up-to-a-negative-seq",
        lambda w: w.a.compact(up_to_seq=-1),
        InvalidInputError,
    ),
    _case(
        "compact-up-to-a-seq-past-the-log",
        lambda w: w.a.compact(up_to_seq=10**6),
        InvalidInputError,
        "past the last message",
    ),
    # -- other arguments
    _case("negative-usage", lambda w: w.a.record_usage(-1), InvalidInputError),
    _case("fractional-usage", lambda w: w.a.record_usage(1.5), InvalidInputError),  # type: ignore[arg-type]
    _case("unknown-memory-kind", lambda w: w.a.remember("secret", "x"), InvalidInputError),
    _case("empty-memory", lambda w: w.a.remember("fact", "  "), InvalidInputError),
    _case("reactive-error-not-text", lambda w: w.a.reactive_recover(None), InvalidInputError),  # type: ignore[arg-type]
    _case(
        "tool-result-content-bytes",
        lambda w: w.b.append_tool_result(w.pending_b, b"x", tool_name="r"),  # type: ignore[arg-type]
        InvalidInputError,
    ),
    _case(
        "is-error-not-a-bool",
        lambda w: w.b.append_tool_result(w.pending_b, "x", tool_name="r", is_error="no"),  # type: ignore[arg-type]
        InvalidInputError,
    ),
    _case("pinned-not-a-bool", lambda w: w.a.append(_msg("x"), pinned="yes"), InvalidInputError),  # type: ignore[arg-type]
    _case("extend-a-dict", lambda w: w.a.extend(_msg("x")), InvalidInputError),  # type: ignore[arg-type]
    _case("invalidate-an-empty-path", lambda w: w.a.invalidate(""), InvalidInputError),
    _case(
        "a-url-whose-driver-is-missing",
        lambda w: CompactStore.open("mysql://agent@localhost/agents"),
        CompactStoreError,
        "mysql",
    ),
    _case(
        "a-url-of-an-unknown-dialect",
        lambda w: CompactStore.open("foo://bar/baz"),
        CompactStoreError,
        "foo",
    ),
    # -- import (API)
    _case(
        "import-malformed-json",
        lambda w: import_file(w.store, w.file("bad.jsonl", GOOD_LINE + b'{"role": "user", \n')),
        InvalidInputError,
        "line 2",
    ),
    _case(
        "import-a-json-array-line",
        lambda w: import_file(w.store, w.file("arr.jsonl", GOOD_LINE + b"[1, 2]\n")),
        InvalidInputError,
        "line 2",
    ),
    _case(
        "import-not-utf8",
        lambda w: import_file(w.store, w.file("latin.jsonl", NOT_UTF8)),
        InvalidInputError,
        "UTF-8",
    ),
    _case(
        "import-utf16",
        lambda w: import_file(w.store, w.file("u16.jsonl", GOOD_LINE.decode().encode("utf-16"))),
        InvalidInputError,
        "UTF-8",
    ),
    _case(
        "import-an-empty-file",
        lambda w: import_file(w.store, w.file("empty.jsonl", "\n  \n")),
        InvalidInputError,
        "empty",
    ),
    _case(
        "import-binary-garbage",
        lambda w: import_file(w.store, w.file("garbage.jsonl", b"\x00\x01\x02SQLite\x00\xff")),
        InvalidInputError,
    ),
    _case(
        "import-a-lone-surrogate-escape",
        lambda w: import_file(
            w.store, w.file("sur.jsonl", b'{"role": "user", "content": "a \\ud800 b"}\n')
        ),
        InvalidInputError,
    ),
    _case(
        "import-a-result-without-its-call",
        lambda w: import_file(
            w.store,
            w.file(
                "orphan.jsonl",
                GOOD_LINE + b'{"role": "tool", "tool_call_id": "call_x", "content": "r"}\n',
            ),
        ),
        InvalidInputError,
        "line 2",
    ),
    _case(
        "import-duplicate-tool-ids",
        lambda w: import_file(
            w.store,
            w.file(
                "dups.jsonl",
                GOOD_LINE
                + (json.dumps(_tool_use("toolu_1")) + "\n").encode()
                + (json.dumps(_tool_use("toolu_1")) + "\n").encode(),
            ),
        ),
        InvalidInputError,
        "duplicate",
    ),
    _case(
        "import-nan-content",
        lambda w: import_file(w.store, w.file("nan.jsonl", b'{"role": "user", "content": NaN}\n')),
        InvalidInputError,
    ),
    _case(
        "import-a-deep-line-after-the-first",
        lambda w: import_file(
            w.store, w.file("deep2.jsonl", GOOD_LINE + _deep_json(100_000).encode())
        ),
        InvalidInputError,
        "nested too deeply",
    ),
    _case(
        "import-a-deep-first-line",
        lambda w: import_file(w.store, w.file("deep1.jsonl", _deep_json(100_000))),
        InvalidInputError,
    ),
    _case(
        "import-into-an-existing-session",
        lambda w: import_file(w.store, w.file("dup.jsonl", GOOD_LINE), session_id="a"),
        ConflictError,
    ),
    _case(
        "import-a-directory",
        lambda w: import_file(w.store, w.tmp),
        InvalidInputError,
    ),
    _case(
        "import-an-unknown-format",
        lambda w: import_file(w.store, w.file("ok.jsonl", GOOD_LINE), format="yaml"),
        InvalidInputError,
    ),
    # -- the command line: exit 1 with one Error: line, or a usage error (2)
    _case("cli-show-unknown-session", Cli(("show", "nope")), 1, "no session"),
    _case(
        "cli-a-db-url-whose-driver-is-missing",
        Cli(("sessions", "--db", "mysql://agent@localhost/agents")),
        1,
        "mysql",
    ),
    _case("cli-history-unknown-session", Cli(("history", "nope")), 1, "no session"),
    _case("cli-export-unknown-session", Cli(("export", "nope")), 1, "no session"),
    _case("cli-breaker-unknown-session", Cli(("breaker", "nope", "--reset")), 1, "no session"),
    _case("cli-show-sql-session-id", Cli(("show", "a'; DROP TABLE sessions; --")), 1),
    _case("cli-blob-unknown-id", Cli(("blob", "a", "999")), 1, "no blob"),
    _case("cli-blob-id-not-a-number", Cli(("blob", "a", "abc")), 2),
    _case("cli-blob-of-another-session", Cli(("blob", "b", "{a_only_blob}")), 1, "no blob"),
    _case(
        "cli-rollback-a-boundary-of-another-session",
        Cli(("rollback", "b", "--boundary", "{a_boundary}", "--yes")),
        1,
        "no boundary",
    ),
    _case(
        "cli-replay-a-boundary-of-another-session",
        Cli(("replay", "b", "--boundary", "{a_boundary}")),
        1,
        "no boundary",
    ),
    _case(
        "cli-rollback-a-negative-boundary",
        Cli(("rollback", "a", "--boundary", "-5", "--yes")),
        1,
    ),
    _case("cli-compact-up-to-past-the-log", Cli(("compact", "a", "--up-to", "999999")), 1),
    _case("cli-compact-up-to-negative", Cli(("compact", "a", "--up-to", "-1")), 2),
    _case(
        "cli-import-malformed-json",
        Cli(("import", "{tmp}/cli-bad.jsonl"), (("cli-bad.jsonl", GOOD_LINE + b"{nope\n"),)),
        1,
        "line 2",
    ),
    _case(
        "cli-import-not-utf8",
        Cli(("import", "{tmp}/cli-latin.jsonl"), (("cli-latin.jsonl", NOT_UTF8),)),
        1,
        "UTF-8",
    ),
    _case("cli-import-a-missing-file", Cli(("import", "{tmp}/missing.jsonl")), 2),
    _case(
        "cli-import-an-unknown-format",
        Cli(("import", "{tmp}/cli-ok.jsonl", "--format", "yaml"), (("cli-ok.jsonl", GOOD_LINE),)),
        2,
    ),
    _case(
        "cli-import-into-an-existing-session",
        Cli(("import", "{tmp}/cli-ok2.jsonl", "--session", "a"), (("cli-ok2.jsonl", GOOD_LINE),)),
        1,
        "already exists",
    ),
    _case(
        "cli-import-an-empty-session-id",
        Cli(("import", "{tmp}/cli-ok3.jsonl", "--session", ""), (("cli-ok3.jsonl", GOOD_LINE),)),
        1,
        "session id",
    ),
    _case(
        "cli-import-a-deep-first-line",
        Cli(
            ("import", "{tmp}/cli-deep.jsonl"), (("cli-deep.jsonl", _deep_json(100_000).encode()),)
        ),
        1,
    ),
    _case(
        "cli-replay-with-a-broken-config",
        Cli(
            ("replay", "a", "--boundary", "{a_boundary}", "--config", "{tmp}/cfg.json"),
            (("cfg.json", b'{"auto_compact_threshold": "high"}'),),
        ),
        1,
        "invalid config",
    ),
]


def _run_cli(w: World, command: Cli) -> Any:
    for name, data in command.files:
        w.file(name, data)
    fields = {"a_boundary": w.a_boundary, "a_only_blob": w.a_only_blob, "tmp": w.tmp}
    args = [arg.format(**fields) for arg in command.args]
    if "--db" not in args:
        args += ["--db", w.url]
    return CliRunner().invoke(cli, args, env={"COMPACTSTORE_DB": None})


@pytest.mark.parametrize(("name", "action", "error", "match"), CASES)
def test_bad_input_gets_a_clear_error_and_leaves_the_database_unchanged(
    world: World,
    name: str,
    action: Api | Cli,
    error: type[CompactStoreError] | int,
    match: str,
) -> None:
    before = snapshot(world.store)
    if isinstance(action, Cli):
        result = _run_cli(world, action)
        assert result.exception is None or isinstance(result.exception, SystemExit), (
            f"a traceback escaped: {result.exception!r}"
        )
        assert result.exit_code == error, (result.exit_code, result.stderr)
        if error == 1:
            assert result.stderr.startswith("Error: ") and result.stderr.count("\n") == 1
            assert match.lower() in result.stderr.lower(), result.stderr
        else:
            assert "Error:" in result.stderr and "Traceback" not in result.stderr
    else:
        assert isinstance(error, type)
        with pytest.raises(CompactStoreError) as caught:
            action(world)
        assert isinstance(caught.value, error), repr(caught.value)
        assert match.lower() in str(caught.value).lower(), str(caught.value)
    assert snapshot(world.store) == before


def test_the_table_has_at_least_40_bad_inputs_across_api_cli_and_import() -> None:
    ids = [param.values[0] for param in CASES]
    assert len(ids) >= 40 and len(set(ids)) == len(ids)
    assert sum(i.startswith("cli-") for i in ids) >= 10
    assert sum(i.startswith("import-") for i in ids) >= 10


# -- inputs that are not errors: handled correctly ---------------------------------------------


@pytest.mark.parametrize(
    "message",
    [
        pytest.param(_msg("a\x00b"), id="nul-in-content"),
        pytest.param(_msg([{"type": "text", "text": "\x00" * 10}]), id="nul-only-block"),
        pytest.param(_msg("日本語 한국어 ‮rtl‬ \U0001f600 \ufeff"), id="unicode-edge-cases"),
        pytest.param(_tool_use("toolu_q", sql="'; DROP TABLE messages; --"), id="sql-in-input"),
        pytest.param(_tool_use("toolu_n", v=_nested(200)), id="nested-200-deep"),
    ],
)
def test_unusual_but_valid_messages_round_trip_byte_exact(
    world: World, message: Message, request: pytest.FixtureRequest
) -> None:
    sess = world.store.session(f"rt-{request.node.callspec.id}", now=T0)
    sess.append(_msg("start"), timestamp=T0)
    seq = sess.append(message, timestamp=T0 + 1)
    if "tool_use" in json.dumps(message):
        sess.append_tool_result(message["content"][0]["id"], "ok", tool_name="read_file")
    again = CompactStore.open(world.url)
    try:
        assert again.get_session(sess.id).messages()[seq] == message
        assert message in again.get_session(sess.id).active_context()
    finally:
        again.close()


@pytest.mark.parametrize(
    "session_id",
    [
        "x'; DROP TABLE messages; --",
        '"); DELETE FROM sessions; --',
        "../../../etc/passwd",
        "..\\..\\windows\\system32",
        "%s %(x)s {0} $1 :name ?",
    ],
)
def test_session_ids_with_sql_or_path_characters_are_just_ids(
    world: World, session_id: str
) -> None:
    files = sorted(p.name for p in world.tmp.iterdir())
    tables = set(inspect(world.store.engine).get_table_names())
    sess = world.store.session(session_id, now=T0)
    sess.append(_msg("hello"), timestamp=T0)
    assert world.store.get_session(session_id).messages() == [_msg("hello")]
    assert session_id in [info.id for info in world.store.sessions()]
    result = CliRunner().invoke(cli, ["show", session_id, "--json", "--db", world.url])
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["session"] == session_id
    assert set(inspect(world.store.engine).get_table_names()) == tables
    assert sorted(p.name for p in world.tmp.iterdir()) == files


def test_an_import_with_negative_or_nan_timestamps_stores_sane_times(world: World) -> None:
    """Claude Code records with a negative, NaN or unreadable timestamp: imported, with
    the import time instead (never a negative or NaN created_at)."""
    lines = [
        {
            "type": "user",
            "uuid": "u1",
            "sessionId": "cc",
            "timestamp": -5,
            "message": {"role": "user", "content": "hi"},
        },
        {
            "type": "assistant",
            "uuid": "u2",
            "parentUuid": "u1",
            "sessionId": "cc",
            "timestamp": "not a time",
            "message": {"role": "assistant", "content": [{"type": "text", "text": "hello"}]},
        },
    ]
    path = world.file("cc-times.jsonl", "".join(json.dumps(x) + "\n" for x in lines))
    path.write_text(path.read_text().replace('"timestamp": "not a time"', '"timestamp": NaN'))
    sess = import_file(world.store, path, session_id="cc-times")
    context = sess.context()
    assert next(item.message for item in context.items) == {"role": "user", "content": "hi"}
    assert all(item.created_at is None or item.created_at >= 0 for item in context.items)


# -- whole-state bugs found by the crash harness ------------------------------------------------


def test_a_full_compact_after_a_partial_compact_took_everything(store: CompactStore) -> None:
    """Found by the crash harness: with nothing kept (a partial compact up to the last seq),
    compact() and reactive_recover() raised a raw IndexError from nearest_legal_cut."""
    sess = store.session("s", now=T0)
    _talk(sess, "p", 6, T0)
    partial = sess.compact(up_to_seq=5, now=T0 + 10)
    assert partial.success and sess.context().kept == ()
    attempts: list[Callable[[], object]] = [
        lambda: sess.compact(now=T0 + 20),
        lambda: sess.reactive_recover("prompt is too long", now=T0 + 30),
    ]
    for attempt in attempts:
        # A clear refusal is fine; a raw IndexError is the bug.
        with contextlib.suppress(CompactStoreError):
            attempt()


def test_nesting_is_allowed_up_to_the_documented_limit(store: CompactStore) -> None:
    sess = store.session("nest", now=T0)
    sess.append(_msg("start"), timestamp=T0)
    # The message dict and its content list are two levels; the rest is the nested value.
    deepest = [{"type": "text", "text": "x", "extra": _nested(MAX_NESTING - 3)}]
    sess.append(_msg(deepest, "assistant"), timestamp=T0)
    assert sess.active_context()[-1]["content"] == deepest
    before = snapshot(store)
    too_deep = [{"type": "text", "text": "x", "extra": _nested(MAX_NESTING - 2)}]
    with pytest.raises(InvalidMessageError, match=f"more than {MAX_NESTING} levels deep"):
        sess.append(_msg(too_deep, "assistant"), timestamp=T0)
    assert snapshot(store) == before


def test_messages_near_the_recursion_limit_are_refused_or_usable(store: CompactStore) -> None:
    """Scan nesting depths around Python's recursion limit: each message is either refused
    with InvalidMessageError or stored and then fully usable (never a raw RecursionError)."""
    raw: list[str] = []
    limit = sys.getrecursionlimit()
    for depth in range(limit - 160, limit + 10, 7):
        sess = store.session(f"d{depth}", now=T0)
        sess.append(_msg("start"), timestamp=T0)
        try:
            sess.append(_tool_use("toolu_x", v=_nested(depth)), timestamp=T0)
            sess.append_tool_result("toolu_x", "ok", tool_name="read_file", timestamp=T0)
        except InvalidMessageError:
            continue
        except RecursionError:
            raw.append(f"depth {depth}: append raised RecursionError")
            continue
        try:
            sess.active_context()
            sess.process_request(now=T0 + 10)
            sess.compact(now=T0 + 20)
        except CompactStoreError:
            pass
        except RecursionError:
            raw.append(f"depth {depth}: stored, then unusable (RecursionError)")
    assert not raw, raw


@pytest.mark.slow
def test_a_100_mb_tool_result_is_refused_without_exhausting_memory(tmp_path: Path) -> None:
    store = CompactStore.open(tmp_path / "big.db")
    sess = store.session("big", now=T0)
    sess.append(_msg("read it"), timestamp=T0)
    sess.append(_tool_use("toolu_big"), timestamp=T0)
    content = "z" * (100 * MB)
    tracemalloc.start()
    try:
        with pytest.raises(InvalidMessageError, match="max_message_bytes"):
            sess.append_tool_result("toolu_big", content, tool_name="read_file")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # A few copies of the input at most (encode, JSON), never unbounded growth.
    assert peak < 5 * len(content), f"peak {peak / MB:.0f} MB for a 100 MB input"
    assert len(sess.messages()) == 2
    store.close()


# -- fuzzing the import parsers ----------------------------------------------------------------

FUZZ = settings(
    max_examples=int(os.environ.get("COMPACTSTORE_FUZZ_EXAMPLES", "100")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=True,
    database=None,
)

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=5)
    ),
    max_leaves=25,
)
KEYS = [
    "role",
    "type",
    "content",
    "uuid",
    "parentUuid",
    "sessionId",
    "message",
    "timestamp",
    "tool_use_id",
    "tool_call_id",
    "tool_calls",
    "id",
    "name",
    "input",
    "is_error",
    "payload",
    "record_type",
    "history",
    "toolUseId",
    "isError",
    "summary",
    "leafUuid",
    "function",
    "arguments",
    "text",
]
ROLES = ["user", "assistant", "system", "tool", "tool_result", "developer", "summary"]
TYPES = ["user", "assistant", "system", "summary", "message", "function_call", "text"]
record = st.fixed_dictionaries(
    {},
    optional={
        "role": st.sampled_from(ROLES) | json_values,
        "type": st.sampled_from(TYPES) | json_values,
        "content": json_values,
        "uuid": st.text(max_size=8),
        "sessionId": st.text(max_size=8),
        "timestamp": json_scalars,
        "message": json_values,
        "payload": json_values,
        "tool_call_id": st.text(max_size=6),
        "history": json_values,
    },
).flatmap(
    lambda base: st.dictionaries(st.sampled_from(KEYS), json_values, max_size=3).map(
        lambda extra: {**extra, **base}
    )
)


def _read(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    with contextlib.suppress(InvalidInputError):
        read_transcript(path)


@pytest.mark.slow
@FUZZ
@given(data=st.binary(max_size=400))
def test_fuzz_random_bytes_only_raise_invalid_input(tmp_path: Path, data: bytes) -> None:
    _read(tmp_path / "fuzz.jsonl", data)


@pytest.mark.slow
@FUZZ
@given(
    lines=st.lists(
        st.one_of(
            record.map(lambda r: json.dumps(r, allow_nan=True)),
            json_values.map(json.dumps),
            st.text(max_size=40),
        ),
        min_size=1,
        max_size=8,
    ),
    suffix=st.sampled_from([".jsonl", ".traj", ".json"]),
)
def test_fuzz_json_lines_only_raise_invalid_input(
    tmp_path: Path, lines: list[str], suffix: str
) -> None:
    _read(tmp_path / f"fuzz{suffix}", "\n".join(lines).encode("utf-8", "surrogatepass"))


@pytest.mark.slow
@settings(FUZZ, max_examples=max(10, FUZZ.max_examples // 3))
@given(records=st.lists(record, min_size=1, max_size=6))
def test_fuzz_imports_store_all_or_nothing(tmp_path: Path, records: list[dict[str, Any]]) -> None:
    """Through the store: a refused import leaves no trace; an accepted one is readable."""
    db = tmp_path / "fuzz.db"
    path = tmp_path / "fuzz.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in records), encoding="utf-8")
    with CompactStore.open(db) as store:
        before = snapshot(store)
        sid = f"f{uuid.uuid4().hex[:8]}"
        try:
            sess = import_file(store, path, session_id=sid)
        except CompactStoreError:
            assert snapshot(store) == before
            return
        sess.active_context()
        assert sess.messages()
