"""The built-in LLM summarizers over the official Anthropic and OpenAI SDK clients.

Each one sends :func:`compactstore.summarizers.prompt.build_prompt`'s system and user text
in one call, with the output capped at ``max_tokens`` (default ``summary_max_tokens``), and
returns a :class:`~compactstore.SummaryResult` with the text and the usage and model the API
reported. The SDK is imported only when a summarizer is built.

Over an async client (``AsyncAnthropic``, ``AsyncOpenAI``, or any of the SDK's async clients)
the summarizer is async (``await summarizer(...)``), for
:class:`~compactstore.AsyncCompactStore`; a sync :class:`~compactstore.CompactStore` refuses
it when opened, naming the async store.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Mapping
from types import ModuleType
from typing import Any, Self

from compactstore._engines.base import SummaryResult
from compactstore.errors import InvalidInputError, MissingExtraError
from compactstore.models import CompactionConfig
from compactstore.summarizers.prompt import DEFAULT_MAX_INPUT_TOKENS, SummaryPrompt, build_prompt

__all__ = ["AnthropicSummarizer", "OpenAISummarizer", "require_sdk"]

DEFAULT_MAX_TOKENS: int = CompactionConfig.model_fields["summary_max_tokens"].default


def require_sdk(module: str, extra: str) -> ModuleType:
    """The SDK module, or a MissingExtraError naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingExtraError(
            f"the {module} summarizer needs the official {module} SDK, the {extra!r} extra: "
            f"pip install 'compactstore[{extra}]'"
        ) from None


def _whole(value: Any, name: str, *, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidInputError(f"{name} must be a whole number ≥ {minimum}, got {value!r}")
    return value


def _is_async_client(client: Any, module: str) -> bool:
    """Whether ``client`` is one of the SDK's async clients (its calls return coroutines)."""
    try:
        base = importlib.import_module(f"{module}._base_client").AsyncAPIClient
    except (ImportError, AttributeError):
        base = None
    if base is not None and isinstance(client, base):
        return True
    return type(client).__name__.startswith("Async")


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class _LLMSummarizer(ABC):
    """What both built-in summarizers share: the caps, the prompt, the checks."""

    name: str
    _module: str
    _extra: str
    _client: str  # the SDK's client class
    _sdk_error: str  # the SDK's base exception class
    _credentials: tuple[str, ...]  # the client's attributes, one of which holds a credential
    _credentials_hint: str  # what to set when none does

    def _result(
        self, response: Any, text: str | None, input_tokens: int | None, output_tokens: int | None
    ) -> SummaryResult:
        return SummaryResult(
            text=(text or "").strip(),
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            model=getattr(response, "model", None) or self.model,
        )

    @classmethod
    def from_env(cls, *, model: str, **options: Any) -> Self:
        """A summarizer over the SDK's default client (``anthropic.Anthropic()``,
        ``openai.OpenAI()``), configured by the SDK's own environment variables
        (``ANTHROPIC_API_KEY``/``ANTHROPIC_BASE_URL``, ``OPENAI_API_KEY``/``OPENAI_BASE_URL``).

        Raises:
            InvalidInputError: the SDK finds no credentials (the message names the variable
                to set), or cannot build its client.
        """
        sdk = require_sdk(cls._module, cls._extra)
        try:
            client = getattr(sdk, cls._client)()
        except getattr(sdk, cls._sdk_error) as exc:  # e.g. openai: no OPENAI_API_KEY
            hint = f"{cls._credentials_hint} " if "credential" in str(exc).lower() else ""
            raise InvalidInputError(
                f"the {cls.name} summarizer cannot start: {hint}(the {cls._module} SDK says: {exc})"
            ) from None
        if all(getattr(client, name, None) is None for name in cls._credentials):
            # The client would fail on its first request instead: say it now.
            raise InvalidInputError(
                f"the {cls.name} summarizer cannot start: {cls._credentials_hint}"
            )
        return cls(client, model=model, **options)

    def __init__(
        self,
        client: Any,
        *,
        model: str,
        max_tokens: int | None = None,
        max_input_tokens: int = DEFAULT_MAX_INPUT_TOKENS,
        recall: bool = False,
        request_options: Mapping[str, Any] | None = None,
    ) -> None:
        require_sdk(self._module, self._extra)
        if client is None:
            raise InvalidInputError(
                f"{type(self).__name__} needs an {self._module} client "
                f"(or use {type(self).__name__}.from_env(model=...))"
            )
        if not isinstance(model, str) or not model.strip():
            raise InvalidInputError(f"{type(self).__name__} needs a model name, got {model!r}")
        self.client = client
        self.model = model
        self.max_tokens = _whole(
            DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens, "max_tokens"
        )
        self.max_input_tokens = _whole(max_input_tokens, "max_input_tokens", minimum=1_000)
        self.recall = bool(recall)
        self.request_options = dict(request_options or {})

    def __repr__(self) -> str:
        return f"{type(self).__name__}(model={self.model!r}, max_tokens={self.max_tokens})"

    def __call__(
        self,
        messages: list[dict[str, Any]],
        previous_summary: str | None,
        instructions: str | None,
    ) -> SummaryResult:
        prompt = self.prompt(messages, previous_summary, instructions)
        return self._result(*self._create(prompt))

    def __new__(cls, client: Any = None, *args: Any, **kwargs: Any) -> Self:
        # Over an async client, the async variant of the class (whose __call__ is awaited).
        variant = next((_ASYNC_VARIANTS[k] for k in cls.__mro__ if k in _ASYNC_VARIANTS), None)
        if variant is not None and _is_async_client(client, cls._module):
            return super().__new__(variant)  # type: ignore[return-value]
        return super().__new__(cls)

    def _create(self, prompt: SummaryPrompt) -> tuple[Any, str | None, int | None, int | None]:
        """One provider call: (the response, its text, input tokens, output tokens)."""
        return self._read(self._send(prompt))

    @abstractmethod
    def _send(self, prompt: SummaryPrompt) -> Any:
        """The provider call (its response; over an async client, an awaitable of it)."""

    @abstractmethod
    def _read(self, response: Any) -> tuple[Any, str | None, int | None, int | None]:
        """(the response, its text, input tokens, output tokens)."""

    def prompt(
        self,
        messages: list[dict[str, Any]],
        previous_summary: str | None,
        instructions: str | None,
    ) -> SummaryPrompt:
        """What this summarizer sends for these inputs (no call is made)."""
        return build_prompt(
            messages,
            previous_summary,
            instructions,
            max_input_tokens=self.max_input_tokens,
            max_output_tokens=self.max_tokens,
            recall=self.recall,
        )


class AnthropicSummarizer(_LLMSummarizer):
    """Summaries written by a Claude model through ``anthropic.Anthropic().messages``.

    Args:
        client: an ``anthropic.Anthropic`` client (its retries and timeout apply).
        model: the model name, e.g. ``"claude-haiku-4-5"``.
        max_tokens: the output cap; default ``CompactionConfig.summary_max_tokens`` (6,000).
        max_input_tokens: the input cap by compactstore's estimate (default 60,000): the
            oldest removed messages are left out first, the previous summary always stays.
        recall: ask for the recall line (set it when the session has recall enabled).
        request_options: more keyword arguments for ``messages.create`` (e.g. ``temperature``).

    Raises:
        MissingExtraError: the ``anthropic`` extra is not installed.
        InvalidInputError: no client, no model, or a cap that is not a whole number.
    """

    name = "anthropic"
    _module = "anthropic"
    _extra = "anthropic"
    _client = "Anthropic"
    _sdk_error = "AnthropicError"
    _credentials = ("api_key", "auth_token")
    _credentials_hint = "no credentials: set ANTHROPIC_API_KEY (or ANTHROPIC_AUTH_TOKEN)"

    def _send(self, prompt: SummaryPrompt) -> Any:
        return self.client.messages.create(
            **self.request_options,
            model=self.model,
            max_tokens=self.max_tokens,
            system=prompt.system,
            messages=[{"role": "user", "content": prompt.user}],
        )

    def _read(self, response: Any) -> tuple[Any, str | None, int | None, int | None]:
        text = "".join(
            block.text for block in response.content if getattr(block, "type", None) == "text"
        )
        usage = response.usage
        parts = [
            _count(getattr(usage, key, None))
            for key in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
        ]
        counted = [part for part in parts if part is not None]
        input_tokens = sum(counted) if counted else None
        return response, text, input_tokens, _count(getattr(usage, "output_tokens", None))


class OpenAISummarizer(_LLMSummarizer):
    """Summaries written by an OpenAI model through ``openai.OpenAI().chat.completions``.

    Chat Completions, so any server that speaks it (``base_url=``) works too. Arguments as
    :class:`AnthropicSummarizer`'s; the output cap is sent as ``max_completion_tokens``.

    Raises:
        MissingExtraError: the ``openai`` extra is not installed.
        InvalidInputError: no client, no model, or a cap that is not a whole number.
    """

    name = "openai"
    _module = "openai"
    _extra = "openai"
    _client = "OpenAI"
    _sdk_error = "OpenAIError"
    _credentials = ("api_key",)
    _credentials_hint = "no credentials: set OPENAI_API_KEY"

    def _send(self, prompt: SummaryPrompt) -> Any:
        return self.client.chat.completions.create(
            **self.request_options,
            model=self.model,
            max_completion_tokens=self.max_tokens,
            messages=[
                {"role": "system", "content": prompt.system},
                {"role": "user", "content": prompt.user},
            ],
        )

    def _read(self, response: Any) -> tuple[Any, str | None, int | None, int | None]:
        text = response.choices[0].message.content if response.choices else None
        usage = response.usage
        return (
            response,
            text,
            _count(getattr(usage, "prompt_tokens", None)),
            _count(getattr(usage, "completion_tokens", None)),
        )


class _Async:
    """The async variant of a built-in summarizer: ``await summarizer(...)``."""

    async def __call__(
        self: Any,
        messages: list[dict[str, Any]],
        previous_summary: str | None,
        instructions: str | None,
    ) -> SummaryResult:
        prompt = self.prompt(messages, previous_summary, instructions)
        result: SummaryResult = self._result(*self._read(await self._send(prompt)))
        return result


class _AsyncAnthropicSummarizer(_Async, AnthropicSummarizer):  # type: ignore[misc]
    """:class:`AnthropicSummarizer` over ``anthropic.AsyncAnthropic``."""


class _AsyncOpenAISummarizer(_Async, OpenAISummarizer):  # type: ignore[misc]
    """:class:`OpenAISummarizer` over ``openai.AsyncOpenAI``."""


# Each summarizer class's variant over an async client (a subclass finds its base's).
_ASYNC_VARIANTS: dict[type[_LLMSummarizer], type[_LLMSummarizer]] = {
    AnthropicSummarizer: _AsyncAnthropicSummarizer,
    OpenAISummarizer: _AsyncOpenAISummarizer,
}
