"""The demo's agent: one model turn per step, its tool calls answered from the simulated
repository, the compaction pipeline run before every model call."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from compactstore._demo.script import (
    BREAK_MESSAGE,
    BURST_REQUEST,
    FIRST_MEMORY,
    FOLLOW_UPS,
    LATER_MEMORY,
    MANUAL_INSTRUCTIONS,
    REASONING,
    ROLLBACK_MESSAGE,
    THOUGHTS,
)
from compactstore._demo.workspace import (
    FILES,
    NOUNS,
    ROOT,
    SOURCES,
    TESTS,
    VERBS,
    module_name,
    next_refactoring,
    numbered,
    source,
)
from compactstore._store.store import CompactStore, Session
from compactstore.models import CompactionResult, CompactStrategy

START_EPOCH = 1_767_225_600  # 2026-01-01T00:00:00Z
DEMO_SEED = 20_260_101
DEMO_CONTEXT_WINDOW = 25_000
FIRED_KEYS = (
    "tool_budget",
    "read_dedup",
    "microcompact",
    "session_memory",
    "full",
    "reactive",
    "manual",
    "rollback",
)
# The keys of FIRED_KEYS that are stages (strategies of compaction_steps rows); the others
# are events of the script.
STAGE_KEYS = FIRED_KEYS[:6]
# Stages of process_request() counted from each call's steps while the script runs (it
# waits for some); the report counts every stage from the rows at the end.
_PIPELINE_STAGES = {
    CompactStrategy.TOOL_BUDGET: "tool_budget",
    CompactStrategy.MICROCOMPACT: "microcompact",
    CompactStrategy.SESSION_MEMORY: "session_memory",
    CompactStrategy.FULL: "full",
}


@dataclass
class Call:
    """One tool call of an assistant turn and what the tool answered."""

    name: str
    input: dict[str, Any]
    output: str
    is_error: bool = False
    read_path: str | None = None  # a Read: pass file_path= so read dedup can act
    edited_path: str | None = None  # a successful Edit: invalidate the path afterwards
    id: str = ""


class Agent:
    """Plays the session: one call of :meth:`step` is one model turn and its tool results."""

    def __init__(self, store: CompactStore, session: Session, steps: int) -> None:
        self.store = store
        self.session = session
        self.rng = random.Random(DEMO_SEED)
        self.clock = float(START_EPOCH)
        self.versions = dict.fromkeys(FILES, 0)
        self.read_versions: dict[str, int] = {}  # what the agent last read of each file
        self.next_call = 0
        self.messages = 0
        self.fired = dict.fromkeys(FIRED_KEYS, 0)
        self.freed = dict.fromkeys(FIRED_KEYS[:-1], 0)
        self.peak = 0
        self.peak_sent = 0
        self.follow_ups = iter(FOLLOW_UPS)
        self.later_memory = iter(LATER_MEMORY)
        self.memory_written = False
        self.next_follow_up = 20
        # Scripted events follow the stages they need; the deadlines keep short runs complete.
        self.break_deadline = steps - 30
        self.break_step: int | None = None
        self.manual_step = steps - 6
        self.rollback_step = steps - 3
        self.burst_done = False
        self.manual_boundary: int | None = None

    # -- time and ids --

    def tick(self, low: int, high: int) -> float:
        self.clock += self.rng.randint(low, high)
        return self.clock

    def call_id(self) -> str:
        self.next_call += 1
        return f"toolu_{self.next_call:04d}{self.rng.getrandbits(40):010x}"

    # -- writing to the session --

    def say(self, text: str) -> None:
        self.session.append({"role": "user", "content": text}, timestamp=self.tick(20, 90))
        self.messages += 1

    def turn(self, text: str, calls: Sequence[Call]) -> None:
        """An assistant message with tool_use blocks, then one result message per call."""
        reasons = self.rng.sample(REASONING, self.rng.randint(1, 3))
        text = " ".join([text, *reasons])
        blocks: list[dict[str, Any]] = [{"type": "text", "text": text}]
        for call in calls:
            call.id = self.call_id()
            blocks.append(
                {"type": "tool_use", "id": call.id, "name": call.name, "input": call.input}
            )
        self.session.append({"role": "assistant", "content": blocks}, timestamp=self.tick(4, 25))
        self.messages += 1
        for call in calls:
            at = self.tick(1, 12)
            self.session.append_tool_result(
                call.id,
                call.output,
                tool_name=call.name,
                file_path=call.read_path,
                is_error=call.is_error,
                timestamp=at,
            )
            self.messages += 1
            if call.read_path is not None:
                self.read_versions[call.read_path] = self.versions[call.read_path]
            if call.edited_path is not None:
                self.session.invalidate(call.edited_path)

    def pipeline(self) -> None:
        """The pre-call pipeline, as an agent runs it before every model call."""
        result = self.session.process_request(now=self.tick(1, 3))
        self.peak = max(self.peak, result.tokens_before)
        self.peak_sent = max(self.peak_sent, result.tokens_after)  # what the model is sent
        # The model call: its provider counts about 1.45 tokens per estimated token (the
        # Claude Code transcripts' ratio), which the store learns from (a model_calls row).
        self.session.record_usage(round(1.45 * self.session.context().raw_tokens), now=self.clock)
        for step in result.steps:
            key = _PIPELINE_STAGES.get(step.strategy)
            if key is not None and step.success:
                self.fired[key] += 1
                self.freed[key] += step.tokens_freed

    def count(self, key: str, result: CompactionResult | None) -> None:
        if result is not None and result.effective:
            self.fired[key] += 1
            self.freed[key] += result.tokens_freed

    # -- tools --

    def read(self, path: str) -> Call:
        tool_input = {"file_path": f"{ROOT}/{path}"}
        return Call("Read", tool_input, numbered(source(path, self.versions[path])), read_path=path)

    def edit(self, path: str) -> Call:
        """Refactor the next legacy block of a file (the Edit tool's rules apply)."""
        version = self.versions[path]
        found = next_refactoring(path, version)
        assert found is not None, "edits only target files with something left to refactor"
        start, old, new = found
        tool_input = {"file_path": f"{ROOT}/{path}", "old_string": old, "new_string": new}
        if path not in self.read_versions:
            error = "File has not been read yet. Read it first before writing to it."
            return Call("Edit", tool_input, f"<tool_use_error>{error}</tool_use_error>", True)
        if self.rng.random() < 0.08:  # the model misremembered the indentation
            tool_input["old_string"] = old.strip()
            error = f"String to replace not found in file.\nString: {old.strip()}"
            return Call("Edit", tool_input, f"<tool_use_error>{error}</tool_use_error>", True)
        self.versions[path] = version + 1
        lines = source(path, version + 1).splitlines()
        first = max(0, start - 4)
        snippet = numbered("\n".join(lines[first : first + 12]), first + 1)
        return Call(
            "Edit",
            tool_input,
            f"The file {ROOT}/{path} has been updated. Here's the result of running "
            f"`cat -n` on a snippet of the edited file:\n{snippet}",
            edited_path=path,
        )

    def grep(self, pattern: str, *, content: bool) -> Call:
        hits: list[str] = []
        for path in FILES:
            for number, line in enumerate(source(path, self.versions[path]).splitlines(), 1):
                if pattern in line:
                    hits.append(f"{path}:{number}:{line}" if content else path)
        if not content:
            hits = sorted(set(hits))
            output = f"Found {len(hits)} files\n" + "\n".join(hits) if hits else "No files found"
        else:
            output = "\n".join(hits[:250]) if hits else "No matches found"
        mode = "content" if content else "files_with_matches"
        return Call("Grep", {"pattern": pattern, "path": "src", "output_mode": mode}, output)

    def pytest(self, target: str, *, verbose: bool = False) -> Call:
        """A pytest run; failures get rarer as the refactor progresses."""
        rng = self.rng
        modules = list(TESTS) if target == "tests/payments" else [target]
        budget = max(0, 8 - sum(self.versions.values()) // 2)
        lines = [
            "============================= test session starts ==============================",
            "platform linux -- Python 3.12.8, pytest-8.3.4, pluggy-1.5.0",
            f"rootdir: {ROOT}",
            "configfile: pyproject.toml",
            "plugins: anyio-4.7.0, cov-6.0.0, respx-0.22.0",
            f"collected {len(modules) * _TESTS_PER_MODULE} items",
            "",
        ]
        failures: list[str] = []
        for number, module in enumerate(modules, 1):
            marks = []
            for index in range(_TESTS_PER_MODULE):
                verb, noun = rng.choice(VERBS), rng.choice(NOUNS)
                name = f"{module}::test_{verb}_{noun}_{index}"
                failed = len(failures) < budget and rng.random() < 0.1
                if failed:
                    failures.append(name)
                marks.append("F" if failed else ".")
                if verbose:
                    percent = 100 * index // _TESTS_PER_MODULE
                    lines += [
                        f"{name} {'FAILED' if failed else 'PASSED'} [{percent:>3}%]",
                        "-------------------------------- live log call "
                        "---------------------------------",
                        f"DEBUG    payments.gateway:gateway.py:{rng.randint(40, 160)} POST "
                        f"/v1/{noun}s key={rng.getrandbits(48):012x} "
                        f"amount={rng.randint(1, 900)}.00 EUR",
                        "DEBUG    httpx:_client.py:1025 HTTP Request: POST "
                        f"https://api.processor.test/v1/{noun}s "
                        f'"HTTP/1.1 {rng.choice([200, 200, 201, 402, 409, 503])}"',
                        f"WARNING  payments.{module_name(module).removeprefix('test_')}:"
                        f"{verb}_{noun} retrying after {rng.randint(1, 8) * 250} ms "
                        f"(attempt {rng.randint(1, 3)}/3)",
                    ]
            if not verbose:
                percent = 100 * number // len(modules)
                lines.append(f"{module} {''.join(marks)} [{percent:>3}%]")
        if failures:
            lines += ["", "=" * 35 + " FAILURES " + "=" * 35]
            for failure in failures:
                path, name = failure.split("::")
                lines += [
                    f"{'_' * 20} {name} {'_' * 20}",
                    "",
                    f"    def {name}(service, fake_http):",
                    '        fake_http.fail_with(httpx.ReadTimeout("timed out"))',
                    ">       with pytest.raises(GatewayUnavailable):",
                    "E       Failed: DID NOT RAISE <class 'payments.errors.GatewayUnavailable'>",
                    "",
                    f"{path}:{rng.randint(20, 140)}: Failed",
                ]
            lines.append("=" * 27 + " short test summary info " + "=" * 28)
            lines += [f"FAILED {f} - Failed: DID NOT RAISE GatewayUnavailable" for f in failures]
        total = len(modules) * _TESTS_PER_MODULE
        passed = f"{total - len(failures)} passed"
        counts = f"{len(failures)} failed, {passed}" if failures else passed
        lines.append(f"{'=' * 24} {counts} in {rng.randint(150, 900) / 100:.2f}s {'=' * 24}")
        output = "\n".join(lines)
        if failures:
            output = "Exit code 1\n" + output
        flags = "-vv --log-cli-level=DEBUG" if verbose else "-q"
        return Call(
            "Bash",
            {"command": f"pytest {target} {flags}", "description": "Run the payments tests"},
            output,
            is_error=bool(failures),
        )

    def worker_log(self) -> Call:
        """The tail of the payment worker's log: long and repetitive."""
        rng = self.rng
        lines = []
        stamp = self.clock - 6 * 3600
        for _ in range(260):
            stamp += rng.randint(1, 90)
            noun = rng.choice(NOUNS)
            level = rng.choice(["INFO", "INFO", "INFO", "WARNING", "ERROR"])
            lines.append(
                f"{_iso(stamp)} {level:<7} payments.worker[{rng.randint(1000, 9999)}] "
                f"{rng.choice(VERBS)}_{noun} id={noun[:2]}_{rng.getrandbits(40):010x} "
                + (
                    "failed: None"
                    if level == "ERROR"
                    else f"took {rng.randint(20, 4000)} ms status={rng.choice([200, 201, 503])}"
                )
            )
        return Call(
            "Bash",
            {
                "command": "tail -n 260 /var/log/payments/worker.log",
                "description": "Show the payment worker's recent log",
            },
            "\n".join(lines),
        )

    def check(self) -> Call:
        """mypy, ruff or git: short outputs, mypy sometimes failing."""
        rng = self.rng
        kind = rng.choice(["mypy", "mypy", "ruff", "git"])
        if kind == "git":
            changed = [p for p, v in self.versions.items() if v]
            body = "\n".join(f" M {p}" for p in changed) or "nothing to commit, working tree clean"
            return Call("Bash", {"command": "git status --short", "description": "Status"}, body)
        if kind == "ruff":
            return Call(
                "Bash",
                {"command": "ruff check src/payments", "description": "Lint"},
                "All checks passed!",
            )
        legacy = [p for p in SOURCES if self.versions[p] < 2 and p in self.read_versions]
        if not legacy or rng.random() < 0.4:
            return Call(
                "Bash",
                {"command": "mypy src/payments", "description": "Type-check"},
                f"Success: no issues found in {len(SOURCES)} source files",
            )
        errors = [
            f"{path}:{rng.randint(30, 180)}: error: Incompatible return value type (got "
            f'"None", expected "{rng.choice(NOUNS).title()}Result")  [return-value]'
            for path in legacy[:4]
        ]
        return Call(
            "Bash",
            {"command": "mypy src/payments", "description": "Type-check"},
            "Exit code 1\n"
            + "\n".join(errors)
            + f"\nFound {len(errors)} errors in {len(errors)} files (checked "
            f"{len(SOURCES)} source files)",
            is_error=True,
        )

    # -- the session --

    def step(self, index: int) -> None:
        """One model turn: maybe a user message first, then tool calls and the pipeline."""
        session = self.session
        if not self.memory_written and self.fired["full"]:
            # The agent writes down what it knows once the first compaction lost detail.
            for kind, text in FIRST_MEMORY:
                session.remember(kind, text, now=self.tick(1, 5))
            self.memory_written = True
        if (
            self.break_step is None
            and index > 0
            and (self.fired["session_memory"] or index >= self.break_deadline)
        ):
            # A break after the first session-memory compact: time-based microcompact is due.
            self.clock += 2 * 3600 + self.rng.randint(0, 1800)
            self.say(BREAK_MESSAGE)
            self.break_step = index
        elif index >= self.next_follow_up:
            self.next_follow_up = index + self.rng.randint(16, 30)
            follow_up = next(self.follow_ups, None)
            if follow_up is not None:
                self.say(follow_up)
                memory = next(self.later_memory, None) if self.memory_written else None
                if memory is not None:
                    session.remember(memory[0], memory[1], now=self.tick(1, 5))
        if not self.burst_done and self.break_step is not None and index >= self.break_step + 2:
            self.burst()
            return
        if index == self.rollback_step and self.manual_boundary is not None:
            self.say(ROLLBACK_MESSAGE)
            session.rollback(self.manual_boundary, now=self.tick(5, 20))
            self.fired["rollback"] += 1
        text, calls = self.choose(index)
        self.turn(text, calls)
        self.pipeline()
        if index == self.manual_step:
            result = session.compact(instructions=MANUAL_INSTRUCTIONS, now=self.tick(5, 30))
            self.count("manual", result)
            if result.effective and result.boundary is not None:
                self.manual_boundary = result.boundary.id

    def burst(self) -> None:
        """Parallel runs with huge output, sent before the pipeline ran: prompt too long."""
        self.say(BURST_REQUEST)
        calls = [self.pytest(module, verbose=True) for module in TESTS]
        while sum(len(call.output) for call in calls) < 4 * DEMO_CONTEXT_WINDOW:
            calls.append(self.worker_log())
        self.turn("Running every test module with DEBUG logs, plus the worker log.", calls)
        usage = self.session.token_usage()
        self.peak = max(self.peak, usage)
        error = f"prompt is too long: {usage} tokens > {self.session.context_window} maximum"
        result = self.session.reactive_recover(error, now=self.tick(2, 6))
        self.count("reactive", result)
        # The retried call goes through: its real count resets the recovery counter.
        self.session.record_usage(self.session.token_usage())
        self.burst_done = True

    def choose(self, index: int) -> tuple[str, list[Call]]:
        """The next turn: a scripted opening, then a weighted choice of actions."""
        rng = self.rng
        opening: dict[int, Callable[[], tuple[str, list[Call]]]] = {
            0: lambda: (
                "I'll start by finding every place that swallows exceptions.",
                [self.grep("except Exception", content=True)],
            ),
            1: lambda: (
                "Let me read the existing error types first.",
                [self.read("src/payments/errors.py")],
            ),
            2: lambda: (
                "PaymentService is the entry point; reading it.",
                [self.read("src/payments/service.py")],
            ),
            3: lambda: (
                "The gateway and the retry helper decide what is retryable; reading both.",
                [self.read("src/payments/gateway.py"), self.read("src/payments/retry.py")],
            ),
            4: lambda: (
                "Checking the error hierarchy again before I design the new types.",
                [self.read("src/payments/errors.py")],
            ),
        }
        if index in opening:
            return opening[index]()
        action = rng.choices(
            ["read", "reread", "grep", "edit", "test", "check"],
            weights=[30, 12, 8, 26, 14, 10],
        )[0]
        unchanged = [p for p, v in self.read_versions.items() if self.versions[p] == v]
        if action == "reread" and unchanged:
            path = rng.choice(unchanged)
            return f"Let me re-check {path} before changing its callers.", [self.read(path)]
        if action in ("read", "reread"):
            paths = rng.sample(list(FILES), rng.choice([1, 1, 1, 2]))
            thought = rng.choice(THOUGHTS).format(path=paths[0])
            return thought, [self.read(path) for path in paths]
        if action == "grep":
            pattern = rng.choice(
                ["except Exception", "raise ", "log.exception", "retryable", "return None"]
            )
            content = rng.random() < 0.6
            return f"Searching for `{pattern}` across src.", [self.grep(pattern, content=content)]
        if action == "edit":
            left = [p for p in FILES if next_refactoring(p, self.versions[p]) is not None]
            known = [p for p in left if p in self.read_versions]
            if left:
                # Mostly files it has read; sometimes one it has not (the Edit tool refuses).
                path = rng.choice(known if known and rng.random() < 0.9 else left)
                what = "pytest.raises(Exception)" if path.startswith("tests/") else "except"
                return (
                    f"Replacing the bare `{what}` in {path} with the typed error.",
                    [self.edit(path)],
                )
        if action == "test":
            target = rng.choice([*TESTS, "tests/payments", "tests/payments"])
            return f"Running {target} to check the change.", [self.pytest(target)]
        return "Checking types and lint.", [self.check()]


_TESTS_PER_MODULE = 31


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")
