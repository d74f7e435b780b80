"""README.md is tested, in the manner of sqlite-utils' tests/test_docs.py.

1. Every command of ``compactstore --help`` (subcommands included) has a section
   ``### `compactstore COMMAND` `` under ``## Command line``, and every option of the command
   is named in its section (the top-level options in the text before the first section);
   every such section names a command that exists. A failure lists exactly what to add.

2. Every ```` ```python ```` block of the README runs, offline, in a temporary working
   directory. A snippet shows only the part the reader writes; the names it uses without
   defining them (the reader's own model call, an open store, ...) are given by the test,
   from :func:`_given` below, and nothing else is changed in the snippet. The agent loop thus
   runs against :class:`FakeModel`, a scripted model whose replies have the shape of the
   Anthropic SDK's (``content`` blocks, ``usage`` with the cache counters), and the stores
   are real databases: SQLite files in the temporary directory, and PostgreSQL for
   ``postgres_store`` when ``COMPACTSTORE_TEST_PG_URL`` is set (a SQLite file otherwise).
   A snippet using a name that is neither defined nor in GIVEN fails, naming it.
"""

from __future__ import annotations

import ast
import builtins
import re
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import click
import pytest

from compactstore import CompactStore
from compactstore.cli import cli
from tests.conftest import PG_URL, fresh_database

README = Path(__file__).resolve().parents[1] / "README.md"
SECTION = re.compile(r"^### `compactstore ([a-z][a-z -]*)`\s*$", re.MULTILINE)


# -- the command line ------------------------------------------------------------------------


def _commands(group: click.Group, prefix: str = "") -> Iterator[tuple[str, click.Command]]:
    for name, command in sorted(group.commands.items()):
        path = f"{prefix}{name}"
        yield path, command
        if isinstance(command, click.Group):
            yield from _commands(command, f"{path} ")


def _option_names(command: click.Command) -> list[str]:
    """Each option by its longest name (``--output`` for ``-o/--output``), help excluded."""
    names = []
    for param in command.params:
        if isinstance(param, click.Option) and param.name != "help":
            names.append(max([*param.opts, *param.secondary_opts], key=len))
    return names


def _cli_sections() -> tuple[str, dict[str, str]]:
    """The text of '## Command line' before its first command, and each command's section."""
    text = README.read_text(encoding="utf-8")
    start = text.find("\n## Command line\n")
    assert start >= 0, "README.md has no '## Command line' section"
    end = text.find("\n## ", start + 1)
    body = text[start : end if end >= 0 else len(text)]
    parts = SECTION.split(body)
    intro, sections = parts[0], dict(zip(parts[1::2], parts[2::2], strict=True))
    return intro, sections


def test_every_command_and_option_is_in_the_readme() -> None:
    intro, sections = _cli_sections()
    missing = [
        f"{option} (of `compactstore` itself) in the text before the first command's section"
        for option in _option_names(cli)
        if option not in intro
    ]
    commands = dict(_commands(cli))
    for path, command in commands.items():
        if path not in sections:
            missing.append(f"a section '### `compactstore {path}`' under '## Command line'")
            continue
        missing += [
            f"{option} in the section on `compactstore {path}`"
            for option in _option_names(command)
            if not re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", sections[path])
        ]
    stale = [
        f"'### `compactstore {path}`' (no such command)"
        for path in sections
        if path not in commands
    ]
    assert not missing and not stale, (
        "README.md is behind the CLI.\nAdd:\n  "
        + "\n  ".join(missing or ["nothing"])
        + "\nRemove:\n  "
        + "\n  ".join(stale or ["nothing"])
    )


# -- the Python snippets ---------------------------------------------------------------------


@dataclass
class FakeModel:
    """A scripted model: reads a few files with tool calls, then answers and is done.

    Replies look like the Anthropic SDK's ``Message``: ``content`` is a list of blocks and
    ``usage`` has ``input_tokens``, ``cache_creation_input_tokens``,
    ``cache_read_input_tokens`` and ``output_tokens`` (with prompt caching most of the
    prompt is counted as cache reads, as the real API does).
    """

    turns: int = 4
    calls: int = field(default=0, init=False)

    def __call__(self, messages: list[dict[str, Any]]) -> SimpleNamespace:
        self.calls += 1
        prompt = sum(len(str(message)) for message in messages) // 4
        usage = SimpleNamespace(
            input_tokens=3,
            cache_creation_input_tokens=prompt // 10,
            cache_read_input_tokens=prompt - 3 - prompt // 10,
            output_tokens=40,
        )
        if self.calls >= self.turns:
            return SimpleNamespace(content=[{"type": "text", "text": "Done."}], usage=usage)
        path = f"payments/module_{self.calls}.py"
        call: dict[str, Any] = {"type": "tool_use", "id": f"toolu_{self.calls:03d}", "name": "Read"}
        call["input"] = {"file_path": path}
        content = [{"type": "text", "text": f"Reading {path}."}, call]
        return SimpleNamespace(content=content, usage=usage)

    @staticmethod
    def tool_calls(reply: SimpleNamespace) -> list[SimpleNamespace]:
        return [
            SimpleNamespace(id=block["id"], name=block["name"], input=block["input"])
            for block in reply.content
            if block["type"] == "tool_use"
        ]

    @staticmethod
    def run_tool(call: SimpleNamespace) -> str:
        return "\n".join(f"def handler_{i}(): pass  # {call.input['file_path']}" for i in range(80))

    @staticmethod
    def path_of(call: SimpleNamespace) -> str | None:
        path: str | None = call.input.get("file_path")
        return path

    def done(self, reply: SimpleNamespace) -> bool:
        return not self.tool_calls(reply)


def _store_with_a_session(url: str | Path) -> CompactStore:
    store = CompactStore.open(url)
    sess = store.session("s1", now=1_767_225_600.0)
    sess.append({"role": "user", "content": "Fix the payment tests"}, timestamp=1_767_225_600.0)
    sess.append({"role": "assistant", "content": "On it."}, timestamp=1_767_225_660.0)
    return store


def _given(directory: Path, stack: ExitStack) -> dict[str, Callable[[], Any]]:
    """What README snippets may use without defining it: name -> how to make it."""
    model = FakeModel()

    def sqlite_store(name: str, *, with_session: bool) -> CompactStore:
        path = directory / f"{name}.db"
        store = _store_with_a_session(path) if with_session else CompactStore.open(path)
        stack.callback(store.close)
        return store

    def postgres_store() -> CompactStore:
        if not PG_URL:
            return sqlite_store("postgres_stand_in", with_session=False)
        url = stack.enter_context(fresh_database("postgres", directory, "docs"))
        store = CompactStore.open(url)
        stack.callback(store.close)
        return store

    return {
        "call_model": lambda: model,
        "tool_calls": lambda: model.tool_calls,
        "run_tool": lambda: model.run_tool,
        "path_of": lambda: model.path_of,
        "done": lambda: model.done,
        "store": lambda: sqlite_store("store", with_session=True),
        "other_store": lambda: sqlite_store("other", with_session=False),
        "sqlite_store": lambda: sqlite_store("source", with_session=True),
        "postgres_store": postgres_store,
    }


def _snippets() -> list[tuple[int, str]]:
    """(line number, code) of every ```python block of the README."""
    lines = README.read_text(encoding="utf-8").splitlines()
    found, start = [], None
    for number, line in enumerate(lines, 1):
        if start is None and line.strip() == "```python":
            start = number
        elif start is not None and line.strip() == "```":
            found.append((start, "\n".join(lines[start : number - 1])))
            start = None
    return found


def _free_names(code: str) -> set[str]:
    """Names a snippet reads but never binds (assignments, imports, loops, functions)."""
    tree = ast.parse(code)
    bound, read = set(dir(builtins)), set[str]()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    return read - bound


def test_the_readme_has_python_snippets() -> None:
    assert len(_snippets()) >= 2


@pytest.mark.slow
@pytest.mark.parametrize(
    ("line", "code"), _snippets(), ids=[f"README line {line}" for line, _ in _snippets()]
)
def test_a_readme_python_snippet_runs(
    line: int, code: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("COMPACTSTORE_DB", raising=False)
    with ExitStack() as stack:
        given = _given(tmp_path, stack)
        free = _free_names(code)
        unknown = sorted(free - set(given))
        assert not unknown, (
            f"the README's Python snippet at line {line} uses {', '.join(unknown)} without "
            f"defining it: define it in the snippet, or give it in _given() in tests/test_docs.py"
        )
        namespace: dict[str, Any] = {name: given[name]() for name in sorted(free)}
        exec(compile(code, f"README.md:{line}", "exec"), namespace)
        for value in namespace.values():
            if isinstance(value, CompactStore):
                value.close()


# -- the audit SQL -----------------------------------------------------------------------------


def _audit_statements() -> list[str]:
    """The statements of the ```` ```sql ```` block under '## Auditing with SQL'."""
    text = README.read_text(encoding="utf-8")
    start = text.find("\n## Auditing with SQL\n")
    assert start >= 0, "README.md has no '## Auditing with SQL' section"
    block = re.search(r"```sql\n(.*?)```", text[start:], re.DOTALL)
    assert block is not None, "'## Auditing with SQL' has no sql block"
    code = "\n".join(
        line for line in block.group(1).splitlines() if not line.lstrip().startswith("--")
    )
    return [s.strip() for s in code.split(";") if s.strip()]


@pytest.mark.slow
def test_the_readme_audit_sql_runs_and_counts_each_stage_as_stats_does(tmp_path: Path) -> None:
    import sqlite3

    from compactstore.admin import store_stats
    from compactstore.demo import run_demo

    path = tmp_path / "audit.db"
    with CompactStore.open(path) as store:
        report = run_demo(store, steps=150)
        stages = store_stats(store).stages
        compactions = store.get_session(report.session_id).compactions()
    statements = _audit_statements()
    assert len(statements) >= 6
    with sqlite3.connect(path) as plain:
        found = {sql: plain.execute(sql).fetchall() for sql in statements}
    # Each runs; the third lists every read dedup.
    assert len(found[statements[2]]) == report.fired["read_dedup"] > 0
    # The first: what each stage did, live compactions only (the demo rolled back its manual
    # compact and what came after it), as the recorded steps say; stats counts them all.
    live: dict[str, tuple[int, int]] = {}
    for c in compactions:
        for step in c.steps:
            if step.success and c.rolled_back_at is None:
                count, freed = live.get(step.strategy.value, (0, 0))
                live[step.strategy.value] = (count + 1, freed + step.tokens_freed)
    per_stage = {row[0]: (row[1], row[2]) for row in found[statements[0]]}
    assert per_stage == live
    assert (
        per_stage["read_dedup"]
        == stages["read_dedup"]
        == (
            report.fired["read_dedup"],
            report.tokens_freed["read_dedup"],
        )
    )
