"""The demo's simulated repository: a payments service whose files the agent reads, greps,
edits and tests. A file's text is a pure function of its path and version (one seed per path),
so an unchanged re-read returns byte-identical text and an edit changes it."""

from __future__ import annotations

import functools
import random

# path -> approximate size in characters of its source (before line numbers).
FILES: dict[str, int] = {
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
ROOT = "/home/dev/payments-service"
SOURCES = [p for p in FILES if p.startswith("src/")]
TESTS = [p for p in FILES if p.startswith("tests/") and "test_" in p]

VERBS = [
    "charge", "capture", "authorize", "refund", "void", "settle", "reconcile", "retry",
    "record", "lookup", "verify", "parse", "dispatch", "handle", "load", "post",
]  # fmt: skip
NOUNS = [
    "payment", "intent", "customer", "charge", "refund", "event", "entry", "invoice",
    "payout", "signature", "receipt", "balance", "dispute", "webhook", "session",
]  # fmt: skip
ERRORS = [
    "GatewayUnavailable", "PaymentDeclined", "RefundFailed", "WebhookSignatureError",
    "LedgerConflict", "IdempotencyMismatch", "CurrencyNotSupported",
]  # fmt: skip


def module_name(path: str) -> str:
    return path.rsplit("/", 1)[-1].removesuffix(".py")


def function(rng: random.Random, refactored: bool) -> list[str]:
    verb, noun = rng.choice(VERBS), rng.choice(NOUNS)
    name = f"{verb}_{noun}"
    arg = rng.choice(["request", "event", "payload", "record", "intent"])
    error = rng.choice(ERRORS)
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
def source(path: str, version: int) -> str:
    """The text of a simulated file at a version; each edit refactors two more functions."""
    rng = random.Random(f"{path}")
    module = module_name(path)
    target = FILES[path]
    if module == "errors":
        return errors_module()
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
            verb, noun = rng.choice(VERBS), rng.choice(NOUNS)
            error = rng.choice(ERRORS)
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
        f'"""payments.{module}: {rng.choice(NOUNS)} handling for the payments service."""',
        "",
        "from __future__ import annotations",
        "",
        "import logging",
        "",
        "import httpx",
        "",
        "from payments.errors import " + ", ".join(sorted(set(rng.sample(ERRORS, 3)))),
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
        lines += function(rng, refactored=index < version * 2)
        index += 1
    return "\n".join(lines)


def errors_module() -> str:
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
    for name in ERRORS:
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


def next_refactoring(path: str, version: int) -> tuple[int, str, str] | None:
    """The Edit taking a file from ``version`` to the next: (line index, old, new).

    None when the file has nothing left to refactor.
    """
    before = source(path, version).splitlines()
    after = source(path, version + 1).splitlines()
    # The next version differs from the first legacy block on, at the same line.
    start = next((i for i, (a, b) in enumerate(zip(before, after, strict=False)) if a != b), None)
    if start is None:
        return None
    # A pytest.raises line in a test; an except block (3 lines, 4 once typed) in the code.
    old, new = (1, 1) if path.startswith("tests/") else (3, 4)
    return start, "\n".join(before[start : start + old]), "\n".join(after[start : start + new])


def numbered(text: str, start: int = 1) -> str:
    """Lines as the Read tool shows them (``cat -n``)."""
    return "\n".join(f"{n:>6}\t{line}" for n, line in enumerate(text.splitlines(), start))
