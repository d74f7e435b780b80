"""The demo's script: what the user asks, says and the agent writes down as memory."""

from __future__ import annotations

USER_REQUEST = (
    "Refactor the error handling of the payments service. Right now most modules in "
    "src/payments catch bare `Exception`, log it and return None, so callers cannot tell a "
    "declined card from a gateway timeout and the dashboard shows 'payment failed: None'. "
    "Please introduce typed errors in src/payments/errors.py (retryable vs. permanent), "
    "raise them with `from exc` at the module boundaries (gateway, refunds, webhooks, "
    "ledger), keep the public API of PaymentService unchanged, and make sure "
    "`pytest tests/payments -q` and `mypy src/payments` pass at the end."
)
FOLLOW_UPS = [
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
BREAK_MESSAGE = (
    "Back after the incident review. The webhook handler swallowed a signature error in "
    "production last night — please look at src/payments/webhooks.py next."
)
BURST_REQUEST = (
    "Run every payments test module in parallel with DEBUG logs so we can see which code "
    "paths still swallow errors."
)
MANUAL_INSTRUCTIONS = (
    "Keep the list of changed files and the open question about webhook retries; the "
    "test logs can go."
)
ROLLBACK_MESSAGE = "Hmm, that compaction dropped the webhook details I still need — please undo it."
FIRST_MEMORY = [
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
LATER_MEMORY = [
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
REASONING = [
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
THOUGHTS = [
    "Let me look at how {path} handles failures.",
    "The traceback points into {path}; reading it.",
    "I'll check {path} for the remaining bare `except Exception` blocks.",
    "Next, {path} — it calls the gateway and may swallow timeouts.",
    "To see the call sites I need {path}.",
]
