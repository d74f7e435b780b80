"""The caller's summarizer as the engines meet it: a summary service.

:class:`SummaryCall` runs a sync summarizer in a bounded executor with
``summarizer_timeout_seconds``, with the redactor applied to what it is sent; it turns every
failure (an exception, SummarizerError included, a timeout, no text, an awaitable) into an
answer without text, so the engine writes the rule-based summary and the row records a
fallback and its reason. It remembers its answers by what was asked, so a compaction that
re-plans reuses the text instead of calling the summarizer again. :class:`RecordedSummary`
gives replay the recorded text back.

No database here: the driver runs a summary call in *decide*, with no transaction open.
"""

from __future__ import annotations

import asyncio
import inspect
import re
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

from compactstore._core.checks import MAX_INT
from compactstore._core.provider_compaction import ProviderCompactionError, is_async_compactor
from compactstore._engines.base import Summarizer, SummaryAnswer, SummaryRequest, SummaryResult
from compactstore.errors import InvalidInputError
from compactstore.formats.base import storable_text
from compactstore.models import SummaryInfo

__all__ = [
    "RecordedSummary",
    "Redactor",
    "SummaryCall",
    "SummaryMemo",
    "check_compactor",
    "check_summarizer",
    "is_async",
    "redact_credentials",
    "redact_message",
    "stored_reason",
    "summarizer_name",
]

Redactor = Callable[[str], str]

# Keys whose values are structure, not text a person wrote: never redacted.
_STRUCTURE_KEYS = frozenset(
    {"role", "type", "id", "tool_use_id", "tool_call_id", "call_id", "name", "toolUseId"}
)


REDACTED = "[REDACTED]"

# A credential given as a header, a field or a query parameter, in any of the forms error
# texts show them: "Authorization: Bearer ...", {'x-api-key': '...'}, "?api_key=...". The
# value is its scheme, if any, and the word after it. Every repetition is bounded or
# possessive: an error text of any size is scanned in linear time.
_CREDENTIAL_FIELD = re.compile(
    r"""(?<![\w-])
        (?P<name>[\w-]{0,24}?
            (?:authorization|api[-_]?key|(?:auth|access|refresh)[-_]?token|secret|password)
            [\w-]{0,24}+)
        (?P<between>['"]?\s*+[:=]\s*+['"]?)
        (?P<value>(?:(?:Bearer|Basic|Token|Digest)\s++)?[^'"\s,;&}\]]++)""",
    re.IGNORECASE | re.VERBOSE,
)
# A token after its scheme, wherever it stands.
_SCHEMED_TOKEN = re.compile(r"\b(?P<scheme>Bearer|Basic)\s++[A-Za-z0-9._~+/=-]{6,}+", re.IGNORECASE)
# Shapes of provider keys: OpenAI and Anthropic (sk-, sk-proj-, sk-ant-...), Google (AIza),
# xAI, Groq, Hugging Face, GitHub, AWS access key ids, Replicate, Perplexity; and JWTs. A
# shape starts a word: each run of key characters is scanned once.
_KEY_SHAPE = re.compile(
    r"""(?<![\w-])(?:sk-[A-Za-z0-9_-]{8,}+|AIza[A-Za-z0-9_-]{20,}+|xai-[A-Za-z0-9_-]{16,}+
        |gsk_[A-Za-z0-9]{16,}+|hf_[A-Za-z0-9]{16,}+|(?:ghp|gho|ghs|ghu)_[A-Za-z0-9]{16,}+
        |github_pat_[A-Za-z0-9_]{16,}+|AKIA[0-9A-Z]{16}|r8_[A-Za-z0-9]{16,}+
        |pplx-[A-Za-z0-9]{16,}+
        |eyJ[A-Za-z0-9_-]{8,}+\.eyJ[A-Za-z0-9_-]{8,}+\.[A-Za-z0-9_-]++)""",
    re.VERBOSE,
)


def redact_credentials(text: str) -> str:
    """``text`` with what looks like a credential replaced by ``[REDACTED]``: the values of
    Authorization, x-api-key and api-key headers or fields, Bearer and Basic tokens, and
    provider key shapes (``sk-...``, ``sk-ant-...``, ``AIza...`` and the like).

    A provider's error text can echo the request (a proxy that prints its headers); the
    store keeps such text as a fallback's reason, so it never keeps the key with it.
    """
    text = _CREDENTIAL_FIELD.sub(lambda m: f"{m.group('name')}{m.group('between')}{REDACTED}", text)
    text = _SCHEMED_TOKEN.sub(lambda m: f"{m.group('scheme')} {REDACTED}", text)
    return _KEY_SHAPE.sub(REDACTED, text)


def stored_reason(reason: str, redactor: Redactor | None) -> str:
    """A summary's reason as the store records it: credentials redacted, then the session's
    ``redactor`` applied (it is text that leaves the caller's hands), storable on every
    backend (no NUL). A redactor that fails or returns no text withholds the reason rather
    than let it be stored unredacted."""
    text = redact_credentials(reason)
    if redactor is not None:
        try:
            redacted = redactor(text)
        except Exception as exc:  # a plug-in's failure must not fail the compaction
            return f"reason withheld: the redactor raised {type(exc).__name__}"
        if not isinstance(redacted, str):
            return f"reason withheld: the redactor returned {type(redacted).__name__}"
        text = redacted
    return storable_text(text)


def summarizer_name(summarizer: Any) -> str:
    """How a summarizer is recorded: its ``name`` attribute, else ``module:qualname`` (the
    form ``--summarizer module:callable`` takes)."""
    name = getattr(summarizer, "name", None)
    if isinstance(name, str) and name:
        return storable_text(name)[:255]
    target = summarizer if inspect.isfunction(summarizer) else type(summarizer)
    module = getattr(target, "__module__", None) or "?"
    qualname = getattr(target, "__qualname__", None) or type(summarizer).__name__
    return storable_text(f"{module}:{qualname}")[:255]


def is_async(function: Any) -> bool:
    """Whether calling ``function`` gives a coroutine: a coroutine function or an object
    with an async ``__call__``."""
    call = getattr(function, "__call__", None)  # noqa: B004 - the method itself is inspected
    return inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(call)


def check_summarizer(summarizer: Any, *, allow_async: bool = False) -> Summarizer | None:
    """A summarizer the store can run: a plain callable, or with ``allow_async`` (the
    async store) an async one too (None passes through).

    Raises:
        InvalidInputError: not callable, or a coroutine function / async ``__call__``
            without ``allow_async`` (those need :class:`AsyncCompactStore`).
    """
    if summarizer is None:
        return None
    if not callable(summarizer):
        raise InvalidInputError(f"summarizer must be a callable, got {summarizer!r}")
    if not allow_async and is_async(summarizer):
        raise InvalidInputError(
            f"summarizer {summarizer_name(summarizer)} is a coroutine function (a built-in "
            f"summarizer over an async SDK client such as AsyncAnthropic or AsyncOpenAI is "
            f"one): CompactStore runs plain callables only; use AsyncCompactStore for an "
            f"async summarizer, or give the built-in summarizer a sync client"
        )
    return summarizer  # type: ignore[no-any-return]


def check_compactor(compactor: Any, *, allow_async: bool = False) -> Any:
    """A provider compactor the store can run (compactstore.providers), or None: with
    ``allow_async`` (the async store) one over an async client too.

    Raises:
        InvalidInputError: not callable, or async without ``allow_async``.
    """
    if compactor is None:
        return None
    if not callable(compactor):
        raise InvalidInputError(
            f"compactor must be a provider compactor (compactstore.providers), got {compactor!r}"
        )
    if not allow_async and is_async_compactor(compactor):
        raise InvalidInputError(
            f"compactor {summarizer_name(compactor)} is async (a compactor over an async "
            f"client such as AsyncAnthropic or AsyncOpenAI): CompactStore runs sync "
            f"compactors only; use AsyncCompactStore, or give the compactor a sync client"
        )
    return compactor


def redact_message(value: Any, redactor: Redactor, key: str | None = None) -> Any:
    """A copy of a JSON value with ``redactor`` applied to every text (not to roles, types,
    ids or names)."""
    if isinstance(value, str):
        return value if key in _STRUCTURE_KEYS else redactor(value)
    if isinstance(value, dict):
        return {k: redact_message(v, redactor, k) for k, v in value.items()}
    if isinstance(value, list):
        return [redact_message(item, redactor, key) for item in value]
    return value


@dataclass
class SummaryMemo:
    """Answers already given in one compaction call, by what was asked: a re-plan that
    removes the same seqs reuses the text (and records the same figures)."""

    answers: dict[tuple[Any, ...], SummaryAnswer] = field(default_factory=dict)

    @staticmethod
    def key(request: SummaryRequest) -> tuple[Any, ...]:
        return (request.removed_seqs, request.previous_summary, request.instructions)


@dataclass
class SummaryCall:
    """One compaction call's summary service over the caller's summarizer.

    ``recorded`` is the summarizer name the session was opened with: when it is not the
    one configured here, the summary is rule-based and counts a fallback. ``calls_left``
    is what ``summarizer_max_calls_per_hour`` still allows.
    """

    summarizer: Summarizer | None
    name: str | None
    recorded: str | None
    executor: Executor
    timeout: float
    calls_left: int
    redactor: Redactor | None = None
    memo: SummaryMemo = field(default_factory=SummaryMemo)
    # The async store's event loop: an async summarizer is awaited there (this call runs
    # in a worker thread then, never on the loop itself).
    loop: asyncio.AbstractEventLoop | None = None
    # A provider compactor (compactstore.providers): it summarises the range first; the
    # summarizer (or the rule-based summary) is its fallback. ``model`` and ``system`` are
    # the session's, as its requests send them.
    compactor: Any = None
    model: str | None = None
    system: Any = None
    drop_block: bool = False  # the session's thinking binding (its requests carry it)

    def __call__(self, request: SummaryRequest) -> SummaryAnswer:
        key = SummaryMemo.key(request)
        known = self.memo.answers.get(key)
        if known is not None:
            return known
        answer = self._ask(request)
        self.memo.answers[key] = answer
        return answer

    def _ask(self, request: SummaryRequest) -> SummaryAnswer:
        if self.compactor is None:
            return self._summarize(request)
        answer, reason = self._provider(request)
        if answer is not None:
            return answer
        client = self._summarize(request)
        name = getattr(self.compactor, "name", None) or summarizer_name(self.compactor)
        if client.text is None:
            return self._fallback(name, f"{reason}; {client.info.reason or 'rule-based summary'}")
        info = client.info.model_copy(
            update={"fallback": True, "reason": stored_reason(reason, self.redactor)}
        )
        return SummaryAnswer(client.text, info)

    def _provider(self, request: SummaryRequest) -> tuple[SummaryAnswer | None, str]:
        """The provider's compaction of the range, or (None, why it gave none). It is sent
        the messages as they went on the wire (no redactor: they went to it already)."""
        compactor = self.compactor
        name = getattr(compactor, "name", None) or summarizer_name(compactor)
        if not request.wire:
            return None, f"provider compaction ({name}): nothing to send"
        started = time.perf_counter()
        args = (
            compactor,
            [dict(message) for message in request.wire],
            self.model,
            self.system,
            request.instructions,
            self.drop_block,
        )
        future: Future[Any]
        if is_async_compactor(compactor):
            if self.loop is None:
                return None, f"provider compaction ({name}) is async: use AsyncCompactStore"
            # Awaited on the async store's event loop (this call runs in a worker thread).
            future = asyncio.run_coroutine_threadsafe(_acompact(*args), self.loop)
        else:
            future = self.executor.submit(_compact, *args)
        try:
            result = future.result(timeout=self.timeout)
        except FutureTimeout:
            future.cancel()
            return None, f"provider compaction ({name}) timed out after {self.timeout:g} s"
        except ProviderCompactionError as exc:
            return None, f"provider compaction ({name}) failed: {exc}"
        except Exception as exc:  # every failure falls back to the client summary
            return None, f"provider compaction ({name}) failed ({type(exc).__name__}: {exc})"
        latency = (time.perf_counter() - started) * 1000
        usage = result.usage
        text = result.text
        return (
            SummaryAnswer(
                storable_text(text) if text else None,
                SummaryInfo(
                    source="provider",
                    summarizer=name,
                    model=storable_text(str(result.model))[:255],
                    latency_ms=latency,
                    input_tokens=_count(usage["input_tokens"]),
                    output_tokens=_count(usage["output_tokens"]),
                ),
                message=result.message,
                iterations=tuple(result.iterations),
            ),
            "",
        )

    def _summarize(self, request: SummaryRequest) -> SummaryAnswer:
        refused = self._refusal()
        if refused is not None:
            return refused
        summarizer, name = self.summarizer, self.name
        assert summarizer is not None and name is not None
        future, started = self._submit(summarizer, request)
        try:
            value = future.result(timeout=self.timeout)
        except FutureTimeout:
            # A call still queued never starts, a coroutine is cancelled; a running sync
            # call is abandoned.
            future.cancel()
            return self._fallback(name, f"summarizer {name} timed out after {self.timeout:g} s")
        except Exception as exc:  # every failure falls back, SummarizerError too
            return self._fallback(name, f"summarizer {name} failed ({type(exc).__name__}: {exc})")
        latency = (time.perf_counter() - started) * 1000
        self.calls_left -= 1
        return self._answer(name, value, latency)

    def _refusal(self) -> SummaryAnswer | None:
        """The answer when the summarizer is not called: the session's summarizer is not
        configured here, none is set, or the hourly limit is reached; None: call it."""
        if self.recorded is not None and (self.summarizer is None or self.name != self.recorded):
            return self._fallback(
                self.recorded,
                f"summarizer {self.recorded} was set for this session but is not configured "
                f"in this process (store.session(..., summarizer=))",
            )
        if self.summarizer is None or self.name is None:
            return SummaryAnswer(None, SummaryInfo(source="rule"))
        if self.calls_left <= 0:
            return SummaryAnswer(
                None,
                SummaryInfo(
                    source="rule",
                    summarizer=self.name,
                    reason="summarizer_max_calls_per_hour reached for this session",
                ),
            )
        return None

    def _submit(self, summarizer: Summarizer, request: SummaryRequest) -> tuple[Future[Any], float]:
        """Start the call (redacted first): a coroutine on the store's loop, else a sync
        call in the executor; and when it started (``time.perf_counter()``)."""
        redact = self.redactor
        messages = request.messages
        previous, instructions = request.previous_summary, request.instructions
        if redact is not None:
            messages = [redact_message(message, redact) for message in messages]
            previous = None if previous is None else redact(previous)
            instructions = None if instructions is None else redact(instructions)
        started = time.perf_counter()
        loop = self.loop
        if loop is not None and is_async(summarizer):
            coroutine = _awaited(summarizer, messages, previous, instructions)
            return asyncio.run_coroutine_threadsafe(coroutine, loop), started
        return self.executor.submit(summarizer, messages, previous, instructions), started

    def _answer(self, name: str, value: Any, latency: float) -> SummaryAnswer:
        """What the summarizer returned, as the answer recorded (a fallback when unusable)."""
        if inspect.isawaitable(value):
            close = getattr(value, "close", None)
            if close is not None:
                close()  # never awaited: closed so it does not warn
            return self._fallback(
                name,
                f"summarizer {name} returned an awaitable; use AsyncCompactStore for an "
                f"async summarizer",
                latency,
            )
        result = value if isinstance(value, SummaryResult) else None
        text = result.text if result is not None else value
        if not isinstance(text, str) or not text.strip():
            return self._fallback(name, f"summarizer {name} returned no text", latency)
        # What the summarizer reports is recorded as far as the columns can hold it: a
        # model name that is not storable text, or counts that are not whole numbers an
        # INTEGER column takes, must not fail the compaction its summary serves.
        model = result.model if result is not None else None
        return SummaryAnswer(
            text,  # stored as the cut keeps it: a NUL becomes U+FFFD (engines.base.Cut)
            SummaryInfo(
                source="summarizer",
                summarizer=name,
                model=storable_text(str(model))[:255] if model is not None else None,
                latency_ms=latency,
                input_tokens=_count(result.input_tokens) if result is not None else None,
                output_tokens=_count(result.output_tokens) if result is not None else None,
            ),
        )

    def _fallback(self, name: str, reason: str, latency: float | None = None) -> SummaryAnswer:
        """The rule-based summary, recording why: the reason may quote the summarizer's
        exception, which may quote the provider's reply, so it is stored redacted."""
        return SummaryAnswer(
            None,
            SummaryInfo(
                source="rule",
                summarizer=name,
                latency_ms=latency,
                fallback=True,
                reason=stored_reason(reason, self.redactor),
            ),
        )


def _count(value: Any) -> int | None:
    """A token count a summarizer reported, or None when no INTEGER column could hold it."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_INT:
        return value
    return None


def _compact(
    compactor: Any,
    messages: list[dict[str, Any]],
    model: str | None,
    system: Any,
    instructions: str | None,
    drop_block: bool,
) -> Any:
    if drop_block:
        return compactor(
            messages, model=model, system=system, instructions=instructions, drop_block=True
        )
    return compactor(messages, model=model, system=system, instructions=instructions)


async def _acompact(
    compactor: Any,
    messages: list[dict[str, Any]],
    model: str | None,
    system: Any,
    instructions: str | None,
    drop_block: bool,
) -> Any:
    """An async compactor's answer: its ``acompact`` (a compactor over an async client),
    or the compactor itself when calling it gives a coroutine."""
    call = getattr(compactor, "acompact", None) or compactor
    if drop_block:
        return await call(
            messages, model=model, system=system, instructions=instructions, drop_block=True
        )
    return await call(messages, model=model, system=system, instructions=instructions)


async def _awaited(summarizer: Any, *args: Any) -> Any:
    return await summarizer(*args)


@dataclass(frozen=True)
class RecordedSummary:
    """Replay's summary service: the recorded text when the replayed cut removes exactly
    the recorded seqs; otherwise rule-based."""

    removed_seqs: tuple[int, ...]
    text: str
    recorded: SummaryInfo | None

    def __call__(self, request: SummaryRequest) -> SummaryAnswer:
        if request.removed_seqs != self.removed_seqs:
            return SummaryAnswer(
                None,
                SummaryInfo(
                    source="rule",
                    reason="the replayed cut removes other seqs than the recorded one",
                ),
            )
        recorded = self.recorded
        return SummaryAnswer(
            self.text,
            SummaryInfo(
                source="recorded",
                summarizer=recorded.summarizer if recorded is not None else None,
                model=recorded.model if recorded is not None else None,
            ),
        )
