"""A deterministic coding-agent session that drives every compaction stage.

:func:`run_demo` plays an agent refactoring the error handling of a payments service:
it reads, greps, edits and tests a simulated repository (``src/payments/*.py``), answers
follow-up requests from the user and writes down memory. Tool results are generated from
the simulated files, so an unchanged re-read returns byte-identical text and an edit
changes it. Everything comes from one seeded ``random.Random`` and a simulated clock that
starts at :data:`START_EPOCH`: the store is always given ``timestamp=`` / ``now=``, so two
runs produce the same rows, summaries and active context.

The window is small (:data:`DEMO_CONTEXT_WINDOW`) so a few hundred steps show every stage:

- tool-result budget: big file reads, grep dumps and test logs (> 4,000 characters);
- read dedup: re-reads of files that did not change since they were read;
- microcompact: the clock passes 3,600 s, and the user takes a two-hour break;
- auto-compact: the first one runs before any memory exists (a full compact); memory is
  written afterwards, so later ones are session-memory compacts;
- reactive recovery: a burst of parallel test runs is sent without the pre-call
  pipeline, the API answers "prompt is too long", and ``reactive_recover`` takes over;
- a manual ``compact(instructions=...)`` near the end, which the user then rolls back.

:data:`DEMO_CONFIG` scales the session-memory tail to the small window (the defaults are
sized for 200,000 tokens, where a 40,000-token tail fits); every other threshold is the
default. :func:`audit_queries` gives SQL to inspect the result with ``sqlite3`` or ``psql``.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from compactstore.errors import InvalidInputError
from compactstore.models import CompactionConfig, CompactionResult, CompactStrategy
from compactstore.store import CompactStore, Session

__all__ = [
    "DEMO_CONFIG",
    "DEMO_CONTEXT_WINDOW",
    "DEMO_SEED",
    "FIRED_KEYS",
    "START_EPOCH",
    "DemoReport",
    "audit_queries",
    "run_demo",
]

START_EPOCH = 1_767_225_600  # 2026-01-01T00:00:00Z
DEMO_SEED = 20_260_101
DEMO_CONTEXT_WINDOW = 25_000
DEMO_CONFIG = CompactionConfig(
    session_memory_max_tokens=1_500,
    session_memory_min_tail_tokens=3_000,
    session_memory_max_tail_tokens=9_000,
)
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
# Stages of process_request() counted from each call's steps.
_PIPELINE_STAGES = {
    CompactStrategy.TOOL_BUDGET: "tool_budget",
    CompactStrategy.MICROCOMPACT: "microcompact",
    CompactStrategy.SESSION_MEMORY: "session_memory",
    CompactStrategy.FULL: "full",
}


@dataclass(frozen=True)
class DemoReport:
    """What a demo run did."""

    session_id: str
    steps: int
    messages: int
    fired: dict[str, int]  # per stage/event, every key of FIRED_KEYS
    compactions: int
    tokens_freed: dict[str, int]  # per stage/event (rollback frees nothing)
    peak_usage: int
    context_window: int


def audit_queries() -> list[tuple[str, str]]:
    """Three (title, SQL) queries to audit the demo; portable to SQLite and PostgreSQL.

    Paste one into ``sqlite3 compactstore.db`` (or ``psql``). The first two read the
    ``compaction_history`` view, the third the persisted tool results.
    """
    return [
        (
            "Tokens freed per strategy",
            """SELECT session_id, strategy, trigger,
       COUNT(*) AS compactions,
       SUM(tokens_freed) AS tokens_freed,
       SUM(CASE WHEN rolled_back IS NULL THEN 0 ELSE 1 END) AS rolled_back
FROM compaction_history
WHERE strategy IS NOT NULL
GROUP BY session_id, strategy, trigger
ORDER BY session_id, SUM(tokens_freed) DESC, strategy, trigger;""",
        ),
        (
            "What each boundary removed",
            """SELECT session_id, compaction_id, boundary_id, parent_boundary_id, created,
       trigger, strategy, messages_removed, first_kept_seq, last_kept_seq,
       tokens_before, tokens_after, tokens_freed,
       CASE WHEN rolled_back IS NULL THEN 'live' ELSE 'rolled back' END AS state
FROM compaction_history
WHERE boundary_id IS NOT NULL
ORDER BY session_id, compaction_id;""",
        ),
        (
            "Largest persisted tool results",
            """SELECT t.session_id, t.id AS blob_id, t.tool_name, t.size AS bytes,
       t.seq AS message_seq, t.tool_use_id,
       c.strategy AS persisted_by, c.trigger
FROM tool_result_blobs AS t
JOIN compactions AS c ON c.id = t.compaction_id
ORDER BY t.size DESC, t.session_id, t.id
LIMIT 10;""",
        ),
    ]


# -- the simulated repository ---------------------------------------------------------------

# path -> approximate size in characters of its source (before line numbers).
_FILES: dict[str, int] = {
    "src/payments/__init__.py": 450,
    "src/payments/errors.py": 1_900,
    "src/payments/service.py": 6_800,
    "src/payments/gateway.py": 5_600,
    "src/payments/webhooks.py": 4_800,
    "src/payments/refunds.py": 2_900,
    "src/payments/retry.py": 1_700,
    "src/payments/ledger.py": 3_100,
    "src/payments/idempotency.py": 1_600,
    "src/payments/models.py": 2_600,
    "src/payments/config.py": 1_100,
    "src/payments/api/handlers.py": 3_300,
    "src/payments/api/schemas.py": 2_200,
    "tests/payments/conftest.py": 1_800,
    "tests/payments/test_service.py": 4_300,
    "tests/payments/test_gateway.py": 3_200,
    "tests/payments/test_webhooks.py": 2_800,
    "tests/payments/test_refunds.py": 2_300,
}
_ROOT = "/home/dev/payments-service"
_SOURCES = [p for p in _FILES if p.startswith("src/")]
_TESTS = [p for p in _FILES if p.startswith("tests/") and "test_" in p]

_VERBS = [
    "charge", "capture", "authorize", "refund", "void", "settle", "reconcile", "retry",
    "record", "lookup", "verify", "parse", "dispatch", "handle", "load", "post",
]  # fmt: skip
_NOUNS = [
    "payment", "intent", "customer", "charge", "refund", "event", "entry", "invoice",
    "payout", "signature", "receipt", "balance", "dispute", "webhook", "session",
]  # fmt: skip
_ERRORS = [
    "GatewayUnavailable", "PaymentDeclined", "RefundFailed", "WebhookSignatureError",
    "LedgerConflict", "IdempotencyMismatch", "CurrencyNotSupported",
]  # fmt: skip


def _module_name(path: str) -> str:
    return path.rsplit("/", 1)[-1].removesuffix(".py")


def _function(rng: random.Random, refactored: bool) -> list[str]:
    verb, noun = rng.choice(_VERBS), rng.choice(_NOUNS)
    name = f"{verb}_{noun}"
    arg = rng.choice(["request", "event", "payload", "record", "intent"])
    error = rng.choice(_ERRORS)
    lines = [
        f"    def {name}(self, {arg}: {noun.title()}Request) -> {noun.title()}Result:",
        f'        """{verb.title()} a {noun} through the processor."""',
        f"        key = {arg}.idempotency_key or self._keys.new()",
        f'        log.debug("{name} start key=%s amount=%s", key, {arg}.amount)',
        "        try:",
        f'            response = self._client.post("/v1/{noun}s", json={arg}.as_payload(), '
        "timeout=self._timeout)",
    ]
    if refactored:
        lines += [
            "        except httpx.TimeoutException as exc:",
            f'            raise GatewayUnavailable("{name} timed out", retryable=True) from exc',
            "        except httpx.HTTPStatusError as exc:",
            f"            raise {error}.from_response(exc.response) from exc",
        ]
    else:
        lines += [
            "        except Exception as exc:  # TODO: narrow this",
            f'            log.exception("{name} failed: %s", exc)',
            "            return None",
        ]
    lines += [
        f"        if response.status_code >= {rng.choice([400, 402, 409, 422])}:",
        f'            raise {error}(response.json().get("error", {{}}).get("code", "unknown"))',
        f'        self._ledger.record(key, {arg}.amount, kind="{noun}")',
        f"        return {noun.title()}Result.from_payload(response.json())",
        "",
    ]
    return lines


@functools.cache  # pure, and read again and again: a few dozen (path, version) pairs
def _source(path: str, version: int) -> str:
    """The text of a simulated file at a version; each edit refactors two more functions."""
    rng = random.Random(f"{path}")
    module = _module_name(path)
    target = _FILES[path]
    if module == "errors":
        return _errors_module()
    if path.startswith("tests/"):
        lines = [
            f'"""Tests for payments.{module.removeprefix("test_")}."""',
            "",
            "import httpx",
            "import pytest",
            "",
            "from payments.errors import GatewayUnavailable, PaymentDeclined, RefundFailed",
            "",
        ]
        index = 0
        while len("\n".join(lines)) < target:
            verb, noun = rng.choice(_VERBS), rng.choice(_NOUNS)
            error = rng.choice(_ERRORS)
            lines += [
                "",
                f"def test_{verb}_{noun}_{index}_raises_{error.lower()}(service, fake_http):",
                f'    fake_http.fail_with(httpx.ReadTimeout("{verb} {noun}"))',
                f"    with pytest.raises({error if index < version * 2 else 'Exception'}):",
                f'        service.{verb}_{noun}(make_{noun}(amount="{rng.randint(1, 999)}.00"))',
            ]
            index += 1
        return "\n".join(lines) + "\n"
    lines = [
        f'"""payments.{module}: {rng.choice(_NOUNS)} handling for the payments service."""',
        "",
        "from __future__ import annotations",
        "",
        "import logging",
        "",
        "import httpx",
        "",
        "from payments.errors import " + ", ".join(sorted(set(rng.sample(_ERRORS, 3)))),
        "",
        "log = logging.getLogger(__name__)",
        "",
        "",
        f"class {module.title().replace('_', '')}Service:",
        f"    def __init__(self, client: httpx.Client, ledger: Ledger, *, timeout: float = "
        f"{rng.choice([5.0, 10.0, 15.0])}) -> None:",
        "        self._client = client",
        "        self._ledger = ledger",
        "        self._timeout = timeout",
        "",
    ]
    index = 0
    while len("\n".join(lines)) < target:
        lines += _function(rng, refactored=index < version * 2)
        index += 1
    return "\n".join(lines)


def _errors_module() -> str:
    """src/payments/errors.py: the hierarchy the refactor raises (it does not change)."""
    lines = [
        '"""payments.errors: every failure the payments service raises."""',
        "",
        "from __future__ import annotations",
        "",
        "",
        "class PaymentError(Exception):",
        '    """Base class. ``code`` is stable (handlers map it to HTTP); ``retryable`` says',
        '    whether the same request may be sent again with its idempotency key."""',
        "",
        '    code = "payment_error"',
        "    retryable = False",
        "",
        '    def __init__(self, message: str = "", *, retryable: bool | None = None) -> None:',
        "        super().__init__(message or self.code)",
        "        if retryable is not None:",
        "            self.retryable = retryable",
        "",
        "    @classmethod",
        "    def from_response(cls, response: httpx.Response) -> PaymentError:",
        '        body = response.json().get("error", {})',
        '        return cls(body.get("message", response.reason_phrase))',
    ]
    for name in _ERRORS:
        code = "".join(f"_{c.lower()}" if c.isupper() else c for c in name).lstrip("_")
        retryable = name in ("GatewayUnavailable", "LedgerConflict")
        lines += [
            "",
            "",
            f"class {name}(PaymentError):",
            f'    code = "{code}"',
            f"    retryable = {retryable}",
        ]
    return "\n".join(lines) + "\n"


def _next_refactoring(path: str, version: int) -> tuple[int, str, str] | None:
    """The Edit taking a file from ``version`` to the next: (line index, old, new).

    None when the file has nothing left to refactor.
    """
    before = _source(path, version).splitlines()
    after = _source(path, version + 1).splitlines()
    # The next version differs from the first legacy block on, at the same line.
    start = next((i for i, (a, b) in enumerate(zip(before, after, strict=False)) if a != b), None)
    if start is None:
        return None
    # A pytest.raises line in a test; an except block (3 lines, 4 once typed) in the code.
    old, new = (1, 1) if path.startswith("tests/") else (3, 4)
    return start, "\n".join(before[start : start + old]), "\n".join(after[start : start + new])


def _numbered(text: str, start: int = 1) -> str:
    """Lines as the Read tool shows them (``cat -n``)."""
    return "\n".join(f"{n:>6}\t{line}" for n, line in enumerate(text.splitlines(), start))


# -- the agent ------------------------------------------------------------------------------


@dataclass
class _Call:
    """One tool call of an assistant turn and what the tool answered."""

    name: str
    input: dict[str, Any]
    output: str
    is_error: bool = False
    read_path: str | None = None  # a Read: pass file_path= so read dedup can act
    edited_path: str | None = None  # a successful Edit: invalidate the path afterwards
    id: str = ""


_USER_REQUEST = (
    "Refactor the error handling of the payments service. Right now most modules in "
    "src/payments catch bare `Exception`, log it and return None, so callers cannot tell a "
    "declined card from a gateway timeout and the dashboard shows 'payment failed: None'. "
    "Please introduce typed errors in src/payments/errors.py (retryable vs. permanent), "
    "raise them with `from exc` at the module boundaries (gateway, refunds, webhooks, "
    "ledger), keep the public API of PaymentService unchanged, and make sure "
    "`pytest tests/payments -q` and `mypy src/payments` pass at the end."
)
_FOLLOW_UPS = [
    "Also make sure refunds go through the same error types — support keeps seeing "
    "'refund failed: None' in the dashboard.",
    "Please don't change the public signatures of PaymentService; the checkout team calls "
    "it directly.",
    "Can you add a test for the gateway timeout path? It should come out as retryable.",
    "Run mypy on src/payments as well, CI enforces it.",
    "Good progress. Make sure ledger errors are never swallowed either — an IntegrityError "
    "there means money is missing.",
    "Idempotency: a replayed request with a different amount must raise "
    "IdempotencyMismatch, not silently return the first result.",
    "Please keep the log messages greppable — ops alert on 'payments.gateway' lines.",
    "Looks good. Check the API handlers map each error to the right HTTP status.",
]
_BREAK_MESSAGE = (
    "Back after the incident review. The webhook handler swallowed a signature error in "
    "production last night — please look at src/payments/webhooks.py next."
)
_BURST_REQUEST = (
    "Run every payments test module in parallel with DEBUG logs so we can see which code "
    "paths still swallow errors."
)
_MANUAL_INSTRUCTIONS = (
    "Keep the list of changed files and the open question about webhook retries; the "
    "test logs can go."
)
_ROLLBACK_MESSAGE = (
    "Hmm, that compaction dropped the webhook details I still need — please undo it."
)
_FIRST_MEMORY = [
    (
        "user_intent",
        "Refactor payments error handling: typed errors from payments.errors instead of bare "
        "`except Exception`; keep PaymentService's public API; mark retryable failures.",
    ),
    (
        "convention",
        "Run tests with `pytest tests/payments -q`; fixtures live in tests/payments/conftest.py.",
    ),
    (
        "decision",
        "Gateway timeouts and 5xx raise GatewayUnavailable(retryable=True); 4xx card errors "
        "raise PaymentDeclined(retryable=False).",
    ),
]
_LATER_MEMORY = [
    (
        "decision",
        "Webhook signature failures raise WebhookSignatureError and map to HTTP 400; "
        "duplicate events are acknowledged with 200 and logged at INFO.",
    ),
    (
        "fact",
        "ledger.record must run inside the caller's transaction; never swallow IntegrityError.",
    ),
    (
        "pattern",
        "Wrap third-party exceptions at the module boundary with `raise X(...) from exc`.",
    ),
    ("decision", "IdempotencyMismatch is permanent (retryable=False) and maps to HTTP 409."),
]
_REASONING = [
    "The current code logs the exception and returns None, which is why the dashboard shows "
    "'payment failed: None' instead of the processor's decline code.",
    "A timeout here is safe to retry because every request carries its idempotency key, so "
    "the new error should say retryable=True.",
    "Retryable and permanent failures need to differ by type; callers should never have to "
    "parse an error message to decide what to do.",
    "api/handlers.py maps exceptions to HTTP statuses, so each new error type keeps a stable "
    "`code` attribute the handlers can switch on.",
    "Before changing it I want to know which tests cover this path, otherwise a behaviour "
    "change could slip through unnoticed.",
    "The ledger write must not be swallowed: an IntegrityError there means the entry was not "
    "recorded and the books no longer balance.",
    "Wrapping with `raise ... from exc` keeps the original httpx traceback in the logs, which "
    "on-call relies on when the processor misbehaves.",
    "The retry helper only looks at RetryableError subclasses, so GatewayUnavailable has to "
    "inherit from it or the worker will give up after the first timeout.",
    "Webhook events can arrive twice; a duplicate is not an error and should be acknowledged "
    "with 200 rather than raised.",
    "I'll keep the public signatures of PaymentService as they are and only change what "
    "they raise, as the checkout team asked.",
]
_THOUGHTS = [
    "Let me look at how {path} handles failures.",
    "The traceback points into {path}; reading it.",
    "I'll check {path} for the remaining bare `except Exception` blocks.",
    "Next, {path} — it calls the gateway and may swallow timeouts.",
    "To see the call sites I need {path}.",
]


class _Agent:
    """Plays the session: one call of :meth:`step` is one model turn and its tool results."""

    def __init__(self, store: CompactStore, session: Session, steps: int) -> None:
        self.store = store
        self.session = session
        self.rng = random.Random(DEMO_SEED)
        self.clock = float(START_EPOCH)
        self.versions = dict.fromkeys(_FILES, 0)
        self.read_versions: dict[str, int] = {}  # what the agent last read of each file
        self.next_call = 0
        self.messages = 0
        self.fired = dict.fromkeys(FIRED_KEYS, 0)
        self.freed = dict.fromkeys(FIRED_KEYS[:-1], 0)
        self.peak = 0
        self.rereads: list[tuple[int, str]] = []  # (seq, content) of unchanged re-reads
        self.follow_ups = iter(_FOLLOW_UPS)
        self.later_memory = iter(_LATER_MEMORY)
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

    def turn(self, text: str, calls: Sequence[_Call]) -> None:
        """An assistant message with tool_use blocks, then one result message per call."""
        reasons = self.rng.sample(_REASONING, self.rng.randint(1, 3))
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
            unchanged = call.read_path is not None and (
                self.read_versions.get(call.read_path) == self.versions[call.read_path]
            )
            seq = self.session.append_tool_result(
                call.id,
                call.output,
                tool_name=call.name,
                file_path=call.read_path,
                is_error=call.is_error,
                timestamp=at,
            )
            self.messages += 1
            if call.read_path is not None:
                if unchanged:
                    self.rereads.append((seq, call.output))
                self.read_versions[call.read_path] = self.versions[call.read_path]
            if call.edited_path is not None:
                self.session.invalidate(call.edited_path)

    def pipeline(self) -> None:
        """The pre-call pipeline, as an agent runs it before every model call."""
        result = self.session.process_request(now=self.tick(1, 3))
        self.peak = max(self.peak, result.tokens_before)
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

    def read(self, path: str) -> _Call:
        tool_input = {"file_path": f"{_ROOT}/{path}"}
        return _Call(
            "Read", tool_input, _numbered(_source(path, self.versions[path])), read_path=path
        )

    def edit(self, path: str) -> _Call:
        """Refactor the next legacy block of a file (the Edit tool's rules apply)."""
        version = self.versions[path]
        found = _next_refactoring(path, version)
        assert found is not None, "edits only target files with something left to refactor"
        start, old, new = found
        tool_input = {"file_path": f"{_ROOT}/{path}", "old_string": old, "new_string": new}
        if path not in self.read_versions:
            error = "File has not been read yet. Read it first before writing to it."
            return _Call("Edit", tool_input, f"<tool_use_error>{error}</tool_use_error>", True)
        if self.rng.random() < 0.08:  # the model misremembered the indentation
            tool_input["old_string"] = old.strip()
            error = f"String to replace not found in file.\nString: {old.strip()}"
            return _Call("Edit", tool_input, f"<tool_use_error>{error}</tool_use_error>", True)
        self.versions[path] = version + 1
        lines = _source(path, version + 1).splitlines()
        first = max(0, start - 4)
        snippet = _numbered("\n".join(lines[first : first + 12]), first + 1)
        return _Call(
            "Edit",
            tool_input,
            f"The file {_ROOT}/{path} has been updated. Here's the result of running "
            f"`cat -n` on a snippet of the edited file:\n{snippet}",
            edited_path=path,
        )

    def grep(self, pattern: str, *, content: bool) -> _Call:
        hits: list[str] = []
        for path in _FILES:
            for number, line in enumerate(_source(path, self.versions[path]).splitlines(), 1):
                if pattern in line:
                    hits.append(f"{path}:{number}:{line}" if content else path)
        if not content:
            hits = sorted(set(hits))
            output = f"Found {len(hits)} files\n" + "\n".join(hits) if hits else "No files found"
        else:
            output = "\n".join(hits[:250]) if hits else "No matches found"
        mode = "content" if content else "files_with_matches"
        return _Call("Grep", {"pattern": pattern, "path": "src", "output_mode": mode}, output)

    def pytest(self, target: str, *, verbose: bool = False) -> _Call:
        """A pytest run; failures get rarer as the refactor progresses."""
        rng = self.rng
        modules = list(_TESTS) if target == "tests/payments" else [target]
        budget = max(0, 8 - sum(self.versions.values()) // 2)
        lines = [
            "============================= test session starts ==============================",
            "platform linux -- Python 3.12.8, pytest-8.3.4, pluggy-1.5.0",
            f"rootdir: {_ROOT}",
            "configfile: pyproject.toml",
            "plugins: anyio-4.7.0, cov-6.0.0, respx-0.22.0",
            f"collected {len(modules) * _TESTS_PER_MODULE} items",
            "",
        ]
        failures: list[str] = []
        for number, module in enumerate(modules, 1):
            marks = []
            for index in range(_TESTS_PER_MODULE):
                verb, noun = rng.choice(_VERBS), rng.choice(_NOUNS)
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
                        f"WARNING  payments.{_module_name(module).removeprefix('test_')}:"
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
        return _Call(
            "Bash",
            {"command": f"pytest {target} {flags}", "description": "Run the payments tests"},
            output,
            is_error=bool(failures),
        )

    def worker_log(self) -> _Call:
        """The tail of the payment worker's log: long and repetitive."""
        rng = self.rng
        lines = []
        stamp = self.clock - 6 * 3600
        for _ in range(260):
            stamp += rng.randint(1, 90)
            noun = rng.choice(_NOUNS)
            level = rng.choice(["INFO", "INFO", "INFO", "WARNING", "ERROR"])
            lines.append(
                f"{_iso(stamp)} {level:<7} payments.worker[{rng.randint(1000, 9999)}] "
                f"{rng.choice(_VERBS)}_{noun} id={noun[:2]}_{rng.getrandbits(40):010x} "
                + (
                    "failed: None"
                    if level == "ERROR"
                    else f"took {rng.randint(20, 4000)} ms status={rng.choice([200, 201, 503])}"
                )
            )
        return _Call(
            "Bash",
            {
                "command": "tail -n 260 /var/log/payments/worker.log",
                "description": "Show the payment worker's recent log",
            },
            "\n".join(lines),
        )

    def check(self) -> _Call:
        """mypy, ruff or git: short outputs, mypy sometimes failing."""
        rng = self.rng
        kind = rng.choice(["mypy", "mypy", "ruff", "git"])
        if kind == "git":
            changed = [p for p, v in self.versions.items() if v]
            body = "\n".join(f" M {p}" for p in changed) or "nothing to commit, working tree clean"
            return _Call("Bash", {"command": "git status --short", "description": "Status"}, body)
        if kind == "ruff":
            return _Call(
                "Bash",
                {"command": "ruff check src/payments", "description": "Lint"},
                "All checks passed!",
            )
        legacy = [p for p in _SOURCES if self.versions[p] < 2 and p in self.read_versions]
        if not legacy or rng.random() < 0.4:
            return _Call(
                "Bash",
                {"command": "mypy src/payments", "description": "Type-check"},
                f"Success: no issues found in {len(_SOURCES)} source files",
            )
        errors = [
            f"{path}:{rng.randint(30, 180)}: error: Incompatible return value type (got "
            f'"None", expected "{rng.choice(_NOUNS).title()}Result")  [return-value]'
            for path in legacy[:4]
        ]
        return _Call(
            "Bash",
            {"command": "mypy src/payments", "description": "Type-check"},
            "Exit code 1\n"
            + "\n".join(errors)
            + f"\nFound {len(errors)} errors in {len(errors)} files (checked "
            f"{len(_SOURCES)} source files)",
            is_error=True,
        )

    # -- the session --

    def step(self, index: int) -> None:
        """One model turn: maybe a user message first, then tool calls and the pipeline."""
        session = self.session
        if not self.memory_written and self.fired["full"]:
            # The agent writes down what it knows once the first compaction lost detail.
            for kind, text in _FIRST_MEMORY:
                session.remember(kind, text, now=self.tick(1, 5))
            self.memory_written = True
        if (
            self.break_step is None
            and index > 0
            and (self.fired["session_memory"] or index >= self.break_deadline)
        ):
            # A break after the first session-memory compact: time-based microcompact is due.
            self.clock += 2 * 3600 + self.rng.randint(0, 1800)
            self.say(_BREAK_MESSAGE)
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
            self.say(_ROLLBACK_MESSAGE)
            session.rollback(self.manual_boundary, now=self.tick(5, 20))
            self.fired["rollback"] += 1
        text, calls = self.choose(index)
        self.turn(text, calls)
        self.pipeline()
        if index == self.manual_step:
            result = session.compact(instructions=_MANUAL_INSTRUCTIONS, now=self.tick(5, 30))
            self.count("manual", result)
            if result.effective and result.boundary is not None:
                self.manual_boundary = result.boundary.id

    def burst(self) -> None:
        """Parallel runs with huge output, sent before the pipeline ran: prompt too long."""
        self.say(_BURST_REQUEST)
        calls = [self.pytest(module, verbose=True) for module in _TESTS]
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

    def choose(self, index: int) -> tuple[str, list[_Call]]:
        """The next turn: a scripted opening, then a weighted choice of actions."""
        rng = self.rng
        opening: dict[int, Callable[[], tuple[str, list[_Call]]]] = {
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
            paths = rng.sample(list(_FILES), rng.choice([1, 1, 1, 2]))
            thought = rng.choice(_THOUGHTS).format(path=paths[0])
            return thought, [self.read(path) for path in paths]
        if action == "grep":
            pattern = rng.choice(
                ["except Exception", "raise ", "log.exception", "retryable", "return None"]
            )
            content = rng.random() < 0.6
            return f"Searching for `{pattern}` across src.", [self.grep(pattern, content=content)]
        if action == "edit":
            left = [p for p in _FILES if _next_refactoring(p, self.versions[p]) is not None]
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
            target = rng.choice([*_TESTS, "tests/payments", "tests/payments"])
            return f"Running {target} to check the change.", [self.pytest(target)]
        return "Checking types and lint.", [self.check()]

    def dedup_stats(self) -> tuple[int, int]:
        """How many unchanged re-reads the store deduplicated, and the tokens that saved."""
        log = self.session.messages()
        count = self.store.token_counter
        fired = saved = 0
        for seq, content in self.rereads:
            stored = log[seq]["content"][0]["content"]
            if stored != content:
                fired += 1
                saved += count(content) - count(stored)
        return fired, saved


_TESTS_PER_MODULE = 31


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")


def _fresh_id(store: CompactStore, wanted: str) -> str:
    taken = {info.id for info in store.sessions()}
    if wanted not in taken:
        return wanted
    number = 2
    while f"{wanted}-{number}" in taken:
        number += 1
    return f"{wanted}-{number}"


def run_demo(
    store: CompactStore,
    *,
    session_id: str = "demo",
    steps: int = 300,
    progress: Callable[[int, int], None] | None = None,
) -> DemoReport:
    """Play the demo session into ``store`` and report what every stage did.

    Args:
        store: where to write the session.
        session_id: the session's id; when it is taken, the first free of
            ``<id>-2``, ``<id>-3``, ... is used (see the report's ``session_id``).
        steps: model turns to play. Around 150 or more reach every stage; 300 is the default.
        progress: called with (steps done, steps) after each turn.

    Raises:
        InvalidInputError: steps is not a positive whole number.

    Returns:
        A :class:`DemoReport`; the same ``steps`` always give the same report and rows.
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise InvalidInputError(f"steps must be a positive whole number, got {steps!r}")
    sid = _fresh_id(store, session_id)
    session = store.session(
        sid,
        context_window=DEMO_CONTEXT_WINDOW,
        format="anthropic",
        config=DEMO_CONFIG,
        now=START_EPOCH,
    )
    agent = _Agent(store, session, steps)
    agent.say(_USER_REQUEST)
    for index in range(steps):
        agent.step(index)
        if progress is not None:
            progress(index + 1, steps)
    fired, saved = agent.dedup_stats()
    agent.fired["read_dedup"] = fired
    agent.freed["read_dedup"] = saved
    return DemoReport(
        session_id=sid,
        steps=steps,
        messages=agent.messages,
        fired=agent.fired,
        compactions=len(session.compactions()),
        tokens_freed=agent.freed,
        peak_usage=agent.peak,
        context_window=DEMO_CONTEXT_WINDOW,
    )
