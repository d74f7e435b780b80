"""The documentation is tested, in the manner of sqlite-utils' tests/test_docs.py.

The pages are README.md, CONTRIBUTING.md and every ``docs/**/*.md`` of the MkDocs site.

1. The generated pages (``docs/cli.md`` from click's help of every command,
   ``docs/configuration.md`` from ``CompactionConfig``'s field descriptions) are what
   ``scripts/gen_docs.py`` writes from the code now; every command of ``compactstore --help``
   has a section ``### `compactstore COMMAND` `` in ``docs/command-line.md`` and every such
   section names a command that exists.

2. Every ```` ```python ```` block of every page runs, offline, in a temporary working
   directory. A snippet shows only the part the reader writes; the names it uses without
   defining them (the reader's own model client, an open store, ...) are given by the test,
   from :func:`_given` below, and nothing else is changed in the snippet. The stores are
   real databases: SQLite files in the temporary directory, and PostgreSQL for
   ``postgres_store`` when ``COMPACTSTORE_TEST_PG_URL`` is set (a SQLite file otherwise).
   A snippet using a name that is neither defined nor in GIVEN fails, naming it.
   A block that cannot run on its own (an excerpt with a top-level ``await``, one that needs
   a server or the network) is preceded by the line
   ``<!-- docs-test: skip (the reason) -->``; the reason is required.

3. No page says "SPEC" (the contract file is not shipped), and every relative link of
   README.md and CONTRIBUTING.md reaches an existing file and heading (``mkdocs build
   --strict`` checks the links inside docs/, in .ci/run).
"""

from __future__ import annotations

import ast
import builtins
import importlib.util
import re
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from types import ModuleType
from typing import Any

import click
import pytest

from compactstore import CompactStore
from compactstore._cli import cli
from tests.conftest import PG_URL, fresh_database

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, ROOT / "CONTRIBUTING.md", *sorted(DOCS.rglob("*.md"))]
SECTION = re.compile(r"^### `compactstore ([a-z][a-z -]*)`\s*$", re.MULTILINE)
SKIP = re.compile(r"^<!-- docs-test: skip \((?P<reason>[^)]+)\) -->$")


def _page_name(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


def _gen_docs() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_docs", ROOT / "scripts" / "gen_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- the generated pages and the command line -------------------------------------------------


@pytest.mark.parametrize("name", ["cli.md", "configuration.md"])
def test_a_generated_page_is_up_to_date(name: str) -> None:
    gen = _gen_docs()
    assert (DOCS / name).read_text(encoding="utf-8") == gen.PAGES[name](), (
        f"docs/{name} is behind the code: run python scripts/gen_docs.py"
    )


def _commands(group: click.Group, prefix: str = "") -> Iterator[tuple[str, click.Command]]:
    context = click.Context(group)
    for name in group.list_commands(context):  # the top-level group imports them lazily
        command = group.get_command(context, name)
        assert command is not None, name
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


def test_the_cli_reference_has_every_command_and_option() -> None:
    text = (DOCS / "cli.md").read_text(encoding="utf-8")
    for path, command in [("", cli), *_commands(cli)]:
        heading = f"`compactstore{' ' + path if path else ''}`"
        section = text.split(heading + "\n", 1)[1].split("\n#", 1)[0]
        for option in _option_names(command):
            assert re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", section), (path, option)


def test_every_public_name_is_on_the_api_page() -> None:
    import compactstore

    directives = set(re.findall(r"^::: ([\w.]+)$", (DOCS / "api.md").read_text(), re.MULTILINE))
    missing = [
        name
        for name in compactstore.__all__
        if name != "__version__"
        and f"compactstore.{name}" not in directives
        and getattr(compactstore, name).__module__ not in directives
    ]
    assert not missing, f"add '::: compactstore.NAME' to docs/api.md for: {missing}"
    # And the other way: what the page documents as importable from compactstore is exported.
    documented = {d.split(".")[1] for d in directives if d.count(".") == 1}
    modules = {
        name for name in documented if importlib.util.find_spec(f"compactstore.{name}") is not None
    }
    unexported = sorted(documented - modules - set(compactstore.__all__))
    assert not unexported, f"docs/api.md documents names compactstore does not export: {unexported}"


def test_the_command_line_page_has_a_section_per_command() -> None:
    text = (DOCS / "command-line.md").read_text(encoding="utf-8")
    sections = set(SECTION.findall(text))
    commands = {path for path, _ in _commands(cli)}
    assert not commands - sections and not sections - commands, (
        "docs/command-line.md is behind the CLI.\nAdd a section '### `compactstore COMMAND`' "
        f"for: {sorted(commands - sections) or 'nothing'}\n"
        f"Remove: {sorted(sections - commands) or 'nothing'}"
    )


# -- no SPEC, no broken links -------------------------------------------------------------------


def test_no_page_cites_the_contract_file() -> None:
    found = [
        f"{_page_name(page)}:{number}"
        for page in [*PAGES, ROOT / "mkdocs.yml"]
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
        if "SPEC" in line
    ]
    assert not found, f"these lines cite SPEC, a file the repository does not ship: {found}"


def test_no_code_cites_the_contract_file() -> None:
    """Code, tests, migrations, benchmarks and examples say what they rely on in words or
    point at docs/, never at the contract file the repository does not ship."""
    word = "SP" + "EC"  # spelled apart, so that this line is no citation itself
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for folder in ("compactstore", "tests", "migrations", "benchmarks", "examples")
        for path in sorted((ROOT / folder).rglob("*.py"))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if word in line and path.name != "test_docs.py"
    ]
    assert not found, f"these lines cite {word}, a file the repository does not ship: {found}"


def _anchors(page: Path) -> set[str]:
    """The ids python-markdown's toc gives the page's headings."""
    ids = set()
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("#") and not line.startswith("#!"):
            title = re.sub(r"[`*]", "", line.lstrip("#").strip()).lower()
            ids.add(re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", title)).strip("-"))
    return ids


@pytest.mark.parametrize("page", [README, ROOT / "CONTRIBUTING.md"], ids=_page_name)
def test_every_relative_link_of_a_top_level_page_resolves(page: Path) -> None:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.DOTALL)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path) if path else page
        if not resolved.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and anchor not in _anchors(resolved):
            broken.append(f"{target} (no such heading)")
    assert not broken, f"{_page_name(page)} links to: {broken}"


# -- the Python snippets ---------------------------------------------------------------------


def _example_stand_in() -> dict[str, Any]:
    """``client`` and ``run_tool`` of examples/anthropic_loop.py: the official Anthropic client
    over a mocked transport that plays the Messages API, and the example's tool."""
    example = (ROOT / "examples" / "anthropic_loop.py").read_text(encoding="utf-8")
    setup = example[: example.index("# The agent loop")]
    namespace: dict[str, Any] = {}
    exec(compile(setup, "examples/anthropic_loop.py", "exec"), namespace)
    return namespace


def _store_with_a_session(url: str | Path) -> CompactStore:
    store = CompactStore.open(url)
    sess = store.session("s1", now=1_767_225_600.0)
    sess.append({"role": "user", "content": "Fix the payment tests"}, timestamp=1_767_225_600.0)
    sess.append({"role": "assistant", "content": "On it."}, timestamp=1_767_225_660.0)
    return store


def _given(directory: Path, stack: ExitStack) -> dict[str, Callable[[], Any]]:
    """What snippets may use without defining it: name -> how to make it."""

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
        "client": lambda: _example_stand_in()["client"],
        "run_tool": lambda: _example_stand_in()["run_tool"],
        "store": lambda: sqlite_store("store", with_session=True),
        "other_store": lambda: sqlite_store("other", with_session=False),
        "sqlite_store": lambda: sqlite_store("source", with_session=True),
        "postgres_store": postgres_store,
    }


def _snippets() -> list[tuple[str, int, str, str | None]]:
    """(page, line number, code, skip reason) of every ```python block of every page."""
    found = []
    for page in PAGES:
        lines = page.read_text(encoding="utf-8").splitlines()
        start: int | None = None
        for number, line in enumerate(lines, 1):
            if start is None and line.strip() == "```python":
                start = number
            elif start is not None and line.strip() == "```":
                before = SKIP.match(lines[start - 2]) if start >= 2 else None
                reason = before.group("reason") if before else None
                code = "\n".join(lines[start : number - 1])
                found.append((_page_name(page), start, code, reason))
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


def test_the_pages_have_python_snippets_and_skip_few() -> None:
    snippets = _snippets()
    assert len(snippets) >= 12
    assert {page for page, *_ in snippets} >= {"README.md", "docs/getting-started.md"}
    skipped = [(page, line) for page, line, _, reason in snippets if reason]
    assert len(skipped) <= 2, skipped


def test_the_readme_loop_is_the_end_of_the_example() -> None:
    example = (ROOT / "examples" / "anthropic_loop.py").read_text(encoding="utf-8")
    glue = example[example.index("store = CompactStore.open") :]
    readme = README.read_text(encoding="utf-8")
    assert f"```python\nfrom compactstore import CompactStore\n\n{glue}```" in readme


@pytest.mark.slow
@pytest.mark.parametrize(
    ("page", "line", "code", "reason"),
    _snippets(),
    ids=[f"{page} line {line}" for page, line, _, _ in _snippets()],
)
def test_a_python_snippet_runs(
    page: str,
    line: int,
    code: str,
    reason: str | None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if reason:
        ast.parse(code.replace("await ", ""))  # it still reads as Python
        pytest.skip(reason)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("COMPACTSTORE_DB", raising=False)
    with ExitStack() as stack:
        given = _given(tmp_path, stack)
        free = _free_names(code)
        unknown = sorted(free - set(given))
        assert not unknown, (
            f"the Python snippet of {page} at line {line} uses {', '.join(unknown)} without "
            f"defining it: define it in the snippet, or give it in _given() in tests/test_docs.py"
        )
        namespace: dict[str, Any] = {name: given[name]() for name in sorted(free)}
        exec(compile(code, f"{page}:{line}", "exec"), namespace)
        for value in namespace.values():
            if isinstance(value, CompactStore):
                value.close()


# -- the audit SQL -----------------------------------------------------------------------------


def _audit_statements() -> list[str]:
    """The statements of the ```` ```sql ```` block under '## Auditing with SQL'."""
    text = (DOCS / "operations.md").read_text(encoding="utf-8")
    start = text.find("\n## Auditing with SQL\n")
    assert start >= 0, "docs/operations.md has no '## Auditing with SQL' section"
    block = re.search(r"```sql\n(.*?)```", text[start:], re.DOTALL)
    assert block is not None, "'## Auditing with SQL' has no sql block"
    code = "\n".join(
        line for line in block.group(1).splitlines() if not line.lstrip().startswith("--")
    )
    return [s.strip() for s in code.split(";") if s.strip()]


@pytest.mark.slow
def test_the_audit_sql_runs_and_counts_each_stage_as_stats_does(tmp_path: Path) -> None:
    import sqlite3

    from compactstore._demo import run_demo
    from compactstore._store.admin import store_stats

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
