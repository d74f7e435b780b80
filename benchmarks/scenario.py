"""A deterministic, synthetic coding-agent session for the store benchmarks.

    from benchmarks.scenario import generate
    scenario = generate(n_steps=1000, seed=1)
    for step in scenario.steps:          # step 0 = [system, request]; then one per model call
        step.messages, step.timestamps, step.tool

Messages are Anthropic Messages-format dicts (no extra keys); each has a timestamp (epoch
seconds) in the parallel ``timestamps`` list, and each agent step carries a
:class:`ToolInfo` that says what the tool call was (name, file path of a read, error flag),
so an adapter can route reads through a store's file-aware API.

Shape of the session:

* step 0: a system prompt of about 7,400 characters (``{"role": "system", "content": str}``)
  and the initial user request (one text block);
* steps 1..N: an assistant message with a short text block and one ``tool_use`` block
  (``Read`` with ``file_path``, ``Bash`` with ``command``, ``Grep`` with ``pattern``, or
  ``Write`` with ``file_path`` and ``content``), then a user message with the matching
  ``tool_result`` block (``is_error: true`` for about 5% of calls);
* every 18-32 steps a user text message follows the tool result.

Tool-result sizes: 90% uniform 200-3,000 characters, 10% log-uniform 5,000-80,000. About 30%
of reads re-read a file read earlier and get byte-identical content (a ``Write`` to a path
makes later reads of it fresh). Messages are 10-30 s apart; a 1-4 h pause precedes about 15%
of user messages (and always the second one, so short sessions have a pause too).

The same (n_steps, seed) always gives the same session. Run the module for its statistics:
``python -m benchmarks.scenario 1000``.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import sys
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Scenario",
    "Step",
    "ToolInfo",
    "estimate",
    "generate",
    "generate_tool_loop",
    "is_tool_result",
]

EPOCH = 1_767_225_600.0  # 2026-01-01T00:00:00Z
SYSTEM_PROMPT_CHARS = 7_400

P_LARGE = 0.10
P_ERROR = 0.05
P_REREAD = 0.30
P_PAUSE = 0.15
USER_EVERY = (18, 32)
TOOL_MIX = {"Read": 0.45, "Bash": 0.25, "Grep": 0.20, "Write": 0.10}
LARGE_TOOL_MIX = {"Read": 0.5, "Grep": 0.3, "Bash": 0.2}

_AREAS = (
    "billing",
    "ledger",
    "accounts",
    "gateway",
    "sync",
    "jobs",
    "search",
    "notify",
    "export",
    "auth",
    "inventory",
    "reports",
)
_FILES = (
    "service",
    "models",
    "views",
    "tasks",
    "repository",
    "serializers",
    "settings",
    "utils",
    "clients",
    "retry",
    "cache",
    "signals",
    "locks",
    "schema",
    "handlers",
    "commands",
    "backends",
    "middleware",
    "storage",
    "metrics",
)
_NOUNS = (
    "invoice",
    "amount",
    "account",
    "batch",
    "cursor",
    "entry",
    "job",
    "lock",
    "owner",
    "page",
    "payload",
    "queue",
    "record",
    "retries",
    "row",
    "snapshot",
    "status",
    "total",
    "txn",
    "user",
    "window",
    "deadline",
    "checksum",
    "offset",
)
_VERBS = (
    "load",
    "save",
    "apply",
    "build",
    "check",
    "fetch",
    "flush",
    "merge",
    "parse",
    "render",
    "resolve",
    "split",
    "update",
    "validate",
)
_INTRO = (
    "Let me read",
    "I'll look at",
    "Next I'll check",
    "Running",
    "Searching for",
    "Checking",
    "Now let me inspect",
    "I'll write the change to",
    "Let me confirm with",
)
_WHY = (
    "to see where the rounding happens.",
    "because the traceback ends there.",
    "to find the other callers.",
    "to check that the fix holds.",
    "since the retry logic lives there.",
    "to compare with the old behaviour.",
    "to see which tests cover this.",
    "to find where the lock is released.",
)
_USER_TEXTS = (
    "Also keep the old CSV export working, customers still use it.",
    "Please add a test for the empty-batch case.",
    "That change to the retry loop is too broad, keep it local to the gateway.",
    "Run the whole suite now and fix what breaks.",
    "Update the changelog when you are done.",
    "Next, look at why the nightly job runs twice.",
    "Make the error message say which invoice failed.",
    "Can you avoid loading every row into memory there?",
    "Ok. Now clean up the duplicated parsing code you found.",
    "Please double-check the migration on a copy of production data.",
)


@dataclass(frozen=True, slots=True)
class ToolInfo:
    """What the tool call of one agent step was, for adapters that care."""

    tool_use_id: str
    name: str
    input: dict[str, Any]
    content: str
    is_error: bool
    file_path: str | None = None  # set for Read: the file whose content the result holds
    reread: bool = False  # an unchanged re-read of a file read before
    writes: str | None = None  # set for Write: later reads of this path are fresh


@dataclass(frozen=True, slots=True)
class Step:
    """The messages one model call adds: [system, request] first, then the agent's turns."""

    messages: list[dict[str, Any]]
    timestamps: list[float]
    tool: ToolInfo | None = None


@dataclass(slots=True)
class Scenario:
    seed: int
    steps: list[Step] = field(default_factory=list)

    @property
    def n_steps(self) -> int:
        return len(self.steps) - 1

    def messages(self) -> list[dict[str, Any]]:
        return [m for step in self.steps for m in step.messages]

    def timestamps(self) -> list[float]:
        return [t for step in self.steps for t in step.timestamps]


def estimate(message: dict[str, Any]) -> int:
    """The shared token estimate of a message: ceil(len(JSON text) / 4)."""
    return math.ceil(len(json.dumps(message)) / 4)


def is_tool_result(message: dict[str, Any]) -> bool:
    content = message.get("content")
    return (
        message.get("role") == "user"
        and isinstance(content, list)
        and any(isinstance(b, dict) and b.get("type") == "tool_result" for b in content)
    )


class _Text:
    """Tool output text, built from a per-seed pool of lines (fast at 50 MB per session)."""

    def __init__(self, rng: random.Random, paths: list[str]) -> None:
        self.rng = rng
        self.paths = paths
        self.code = [self._code_line() for _ in range(3000)]
        self.test_lines = [self._test_line() for _ in range(1500)]

    def _name(self) -> str:
        r = self.rng
        return f"{r.choice(_VERBS)}_{r.choice(_NOUNS)}"

    def _code_line(self) -> str:
        r = self.rng
        pad = "    " * r.choice((0, 1, 1, 2, 2, 2, 3))
        pick = r.random()
        noun, other = r.choice(_NOUNS), r.choice(_NOUNS)
        if pick < 0.12:
            return f"{pad}def {self._name()}(self, {noun}: {other.title()}) -> {noun.title()}:"
        if pick < 0.40:
            return f"{pad}{noun} = self.{self._name()}({other}, limit={r.randint(1, 500)})"
        if pick < 0.52:
            return f"{pad}if {noun}.{other} is None or {noun}.{other} < {r.randint(0, 99)}:"
        if pick < 0.60:
            return f"{pad}return {noun}"
        if pick < 0.68:
            return f"{pad}# {r.choice(_WHY)}"
        if pick < 0.75:
            return f'{pad}raise {other.title()}Error(f"bad {noun}: {{{noun}!r}}")'
        if pick < 0.82:
            return f'{pad}log.info("{self._name()} %s", {noun}.id)'
        if pick < 0.88:
            return ""
        return f"{pad}for {noun} in self.{other}s:"

    def _test_line(self) -> str:
        r = self.rng
        pick = r.random()
        path = r.choice(self.paths).replace("src/", "tests/test_", 1)
        if pick < 0.55:
            verdict = "PASSED" if r.random() < 0.9 else "FAILED"
            return f"{path}::test_{self._name()} {verdict}"
        if pick < 0.75:
            return f'  File "{r.choice(self.paths)}", line {r.randint(1, 800)}, in {self._name()}'
        if pick < 0.9:
            return f"E       assert {r.randint(0, 99)} == {r.randint(0, 99)}"
        return f"    {r.choice(self.code).strip()}"

    @staticmethod
    def _fill(lines: list[str], size: int) -> str:
        return "\n".join(lines)[:size]

    def file(self, size: int) -> str:
        """``cat -n``-style file content of exactly ``size`` characters."""
        n = size // 30 + 2
        body = self.rng.choices(self.code, k=n)
        return self._fill([f"{i:6d}\t{line}" for i, line in enumerate(body, 1)], size)

    def grep(self, pattern: str, size: int) -> str:
        r = self.rng
        n = size // 45 + 2
        code = r.choices(self.code, k=n)
        paths = r.choices(self.paths, k=n)
        lines = [
            f"{p}:{r.randint(1, 900)}:{c.strip()} {pattern}"
            for p, c in zip(paths, code, strict=True)
        ]
        return self._fill(lines, size)

    def shell(self, command: str, size: int) -> str:
        n = size // 40 + 2
        return self._fill([f"$ {command}", *self.rng.choices(self.test_lines, k=n)], size)


def _system_prompt(rng: random.Random) -> str:
    head = (
        "You are a coding agent working in a git checkout of a payments monorepo. Use the "
        "tools Read, Grep, Bash and Write to inspect and change code. Read a file before "
        "editing it, keep diffs small, run the relevant tests after every change and report "
        "what you changed and why. Never guess file contents.\n\n# Rules\n"
    )
    tools = json.dumps(
        [
            {"name": "Read", "input_schema": {"file_path": "string", "offset": "integer"}},
            {"name": "Grep", "input_schema": {"pattern": "string", "path": "string"}},
            {"name": "Bash", "input_schema": {"command": "string", "timeout": "integer"}},
            {"name": "Write", "input_schema": {"file_path": "string", "content": "string"}},
        ],
        indent=1,
    )
    rules = []
    for i in range(1, 120):
        area, noun = rng.choice(_AREAS), rng.choice(_NOUNS)
        rules.append(
            f"{i}. In {area}/, treat every {noun} as untrusted input; "
            f"{rng.choice(_INTRO).lower()} the {rng.choice(_FILES)} module {rng.choice(_WHY)}"
        )
    body = head + "\n".join(rules)
    tail = "\n\n# Tools\n" + tools
    return body[: SYSTEM_PROMPT_CHARS - len(tail)] + tail


def _size(rng: random.Random, large: bool) -> int:
    if large:
        return int(5_000 * 16 ** rng.random())  # log-uniform over 5k..80k
    return rng.randint(200, 3_000)


_ID_CHARS = "ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz0123456789"


def _tool_id(rng: random.Random) -> str:
    return "toolu_01" + "".join(rng.choices(_ID_CHARS, k=22))


def generate(n_steps: int, seed: int = 1) -> Scenario:
    """The session of ``n_steps`` agent steps for ``seed`` (plus the opening step 0)."""
    rng = random.Random(seed)
    paths = sorted({f"src/{rng.choice(_AREAS)}/{rng.choice(_FILES)}.py" for _ in range(300)})
    text = _Text(rng, paths)
    clock = EPOCH + seed * 86_400.0

    def tick() -> float:
        nonlocal clock
        clock += rng.uniform(10.0, 30.0)
        return round(clock, 3)

    scenario = Scenario(seed=seed)
    request = (
        "Refunds for split invoices are off by one cent since the last release, and the "
        "nightly reconciliation job reports them as mismatches. Find the cause, fix it, add "
        "regression tests and keep the public API of billing/ unchanged."
    )
    opening: list[dict[str, Any]] = [
        {"role": "system", "content": _system_prompt(rng)},
        {"role": "user", "content": [{"type": "text", "text": request}]},
    ]
    scenario.steps.append(Step(opening, [round(clock, 3), tick()]))

    read_cache: dict[str, str] = {}  # path -> content of its last read (unchanged since)
    fresh_reads = 0
    next_user = rng.randint(*USER_EVERY)
    users = 0
    paused = False
    names, weights = list(TOOL_MIX), list(TOOL_MIX.values())
    large_names, large_weights = list(LARGE_TOOL_MIX), list(LARGE_TOOL_MIX.values())

    for number in range(1, n_steps + 1):
        large = rng.random() < P_LARGE
        failed = rng.random() < P_ERROR
        if large:
            name = rng.choices(large_names, large_weights)[0]
        else:
            name = rng.choices(names, weights)[0]
        tool_use_id = _tool_id(rng)
        file_path: str | None = None
        writes: str | None = None
        reread = False
        tool_input: dict[str, Any]
        if name == "Read":
            reread = bool(read_cache) and not failed and rng.random() < P_REREAD
            if reread:
                file_path = rng.choice(sorted(read_cache))
            else:
                fresh_reads += 1
                file_path = rng.choice(paths)
                if file_path in read_cache:  # a fresh read gets a path with no cached content
                    file_path = file_path.replace(".py", f"_{fresh_reads}.py")
            tool_input = {"file_path": file_path}
            subject = file_path
        elif name == "Grep":
            pattern = f"{rng.choice(_VERBS)}_{rng.choice(_NOUNS)}"
            tool_input = {"pattern": pattern, "path": f"src/{rng.choice(_AREAS)}/"}
            subject = pattern
        elif name == "Bash":
            area = rng.choice(_AREAS)
            tool_input = {
                "command": rng.choice(
                    (
                        f"python -m pytest tests/{area} -x -q",
                        f"python -m pytest -q -k {rng.choice(_NOUNS)}",
                        "git status --short",
                        f"git log --oneline -{rng.randint(5, 30)} -- src/{area}",
                        f"ruff check src/{area}",
                    )
                )
            }
            subject = tool_input["command"]
        else:
            writes = rng.choice(paths)
            tool_input = {"file_path": writes, "content": text.file(rng.randint(200, 2_500))}
            subject = writes
        assistant = {
            "role": "assistant",
            "content": [
                {"type": "text", "text": f"{rng.choice(_INTRO)} {subject} {rng.choice(_WHY)}"},
                {"type": "tool_use", "id": tool_use_id, "name": name, "input": tool_input},
            ],
        }
        if failed:
            content = rng.choice(
                (
                    f"Error: no such file: {file_path or 'src/unknown.py'}",
                    f"Error: exit status 1\n{text.shell(subject, rng.randint(80, 500))}",
                    "Error: the command timed out after 120 s",
                    "Error: permission denied",
                )
            )
        elif reread:
            assert file_path is not None
            content = read_cache[file_path]
        else:
            size = _size(rng, large)
            if name == "Read":
                content = text.file(size)
            elif name == "Grep":
                content = text.grep(subject, size)
            elif name == "Bash":
                content = text.shell(subject, size)
            else:
                head = f"Wrote {len(tool_input['content'])} characters to {writes}\n"
                content = head + text.shell("git diff --stat", max(0, size - len(head)))
        if name == "Read" and not failed:
            assert file_path is not None
            read_cache[file_path] = content
        if writes is not None:
            read_cache.pop(writes, None)
        block: dict[str, Any] = {"type": "tool_result", "tool_use_id": tool_use_id}
        block["content"] = content
        if failed:
            block["is_error"] = True
        messages: list[dict[str, Any]] = [assistant, {"role": "user", "content": [block]}]
        stamps = [tick(), tick()]
        if number == next_user and number < n_steps:
            users += 1
            if rng.random() < P_PAUSE or (users >= 2 and not paused):
                paused = True
                clock += rng.uniform(3_600.0, 4 * 3_600.0)
            messages.append(
                {"role": "user", "content": [{"type": "text", "text": rng.choice(_USER_TEXTS)}]}
            )
            stamps.append(tick())
            next_user = number + rng.randint(*USER_EVERY)
        info = ToolInfo(
            tool_use_id=tool_use_id,
            name=name,
            input=tool_input,
            content=content,
            is_error=failed,
            file_path=file_path if name == "Read" else None,
            reread=reread,
            writes=writes,
        )
        scenario.steps.append(Step(messages, stamps, info))
    return scenario


def generate_tool_loop(n_steps: int, seed: int = 1) -> Scenario:
    """The many-small-tool-calls session of issue 18, for ``n_steps`` steps and ``seed``.

    Step 0 is the same [system, request] as :func:`generate`. Every later step is one
    assistant message (one ``tool_use`` block, no text) and its ``tool_result``: 80% of
    results 2,500-3,000 characters, 15% 300-2,500, 5% log-uniform 3,000-20,000. Steps are
    exactly 20 s apart and there are no user interjections or pauses, so under the default
    config microcompact clears old results every 180 steps and tool budget persists the
    results over 4,000 characters: the active context holds thousands of small messages.
    """
    rng = random.Random(seed)
    paths = sorted({f"src/{rng.choice(_AREAS)}/{rng.choice(_FILES)}.py" for _ in range(300)})
    text = _Text(rng, paths)
    clock = EPOCH + seed * 86_400.0
    scenario = Scenario(seed=seed)
    opening = generate(0, seed).steps[0]
    scenario.steps.append(Step(opening.messages, [clock, clock + 10.0]))
    names = ("Read", "Grep", "Bash")
    for number in range(1, n_steps + 1):
        pick = rng.random()
        if pick < 0.80:
            size = rng.randint(2_500, 3_000)
        elif pick < 0.95:
            size = rng.randint(300, 2_500)
        else:
            size = int(3_000 * (20_000 / 3_000) ** rng.random())
        name = names[number % 3]
        tool_use_id = _tool_id(rng)
        if name == "Read":
            tool_input: dict[str, Any] = {"file_path": rng.choice(paths)}
            content = text.file(size)
        elif name == "Grep":
            tool_input = {"pattern": f"{rng.choice(_VERBS)}_{rng.choice(_NOUNS)}"}
            content = text.grep(tool_input["pattern"], size)
        else:
            tool_input = {"command": f"python -m pytest tests/{rng.choice(_AREAS)} -x -q"}
            content = text.shell(tool_input["command"], size)
        messages = [
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": tool_use_id, "name": name, "input": tool_input}
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": tool_use_id, "content": content}
                ],
            },
        ]
        at = clock + 20.0 * number
        info = ToolInfo(tool_use_id, name, tool_input, content, is_error=False)
        scenario.steps.append(Step(messages, [at - 10.0, at], info))
    return scenario


def stats(scenario: Scenario) -> dict[str, Any]:
    """What the generated session looks like (sizes, mix, pauses)."""
    messages = scenario.messages()
    stamps = scenario.timestamps()
    tools = [s.tool for s in scenario.steps if s.tool is not None]
    results = [t for t in tools if not t.is_error]
    reads = [t for t in tools if t.name == "Read"]
    sizes = [len(t.content) for t in results if not t.reread]
    chars = sum(len(json.dumps(m)) for m in messages)
    users = sum(
        1 for m in messages[2:] if m["role"] == "user" and not is_tool_result(m)
    )  # interjections
    return {
        "steps": scenario.n_steps,
        "messages": len(messages),
        "json_mb": round(chars / 1e6, 2),
        "est_tokens_per_step": round(chars / 4 / max(1, scenario.n_steps)),
        "system_prompt_chars": len(messages[0]["content"]),
        "errors_pct": round(100 * sum(t.is_error for t in tools) / max(1, len(tools)), 1),
        "large_pct": round(100 * sum(s >= 5_000 for s in sizes) / max(1, len(sizes)), 1),
        "reads": len(reads),
        "rereads_pct": round(100 * sum(t.reread for t in reads) / max(1, len(reads)), 1),
        "user_messages": users,
        "pauses_over_1h": sum(1 for a, b in itertools.pairwise(stamps) if b - a > 3600),
        "mean_gap_s": round((stamps[-1] - stamps[0]) / max(1, len(stamps) - 1), 1),
    }


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    began = time.perf_counter()
    generated = generate(n, int(sys.argv[2]) if len(sys.argv) > 2 else 1)
    took = time.perf_counter() - began
    print(json.dumps({**stats(generated), "generate_s": round(took, 2)}, indent=1))
