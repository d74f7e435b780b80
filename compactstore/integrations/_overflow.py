"""Recognising a provider's "the prompt is over the model's window" error, for the
integrations' reactive recovery (LangChain, the OpenAI Agents SDK, Google ADK)."""

from __future__ import annotations

import re

__all__ = ["is_context_overflow"]

# What providers say when a request is over the model's window: OpenAI (Responses and Chat
# Completions), Anthropic, Gemini, and servers that speak their APIs.
_PHRASES = re.compile(
    r"context_length_exceeded|context[_ ]window[_ ]exceeded|exceeds the context window"
    r"|maximum context length|prompt is too long|input is too long"
    r"|input token count.*exceeds|exceeds the maximum number of tokens|too many tokens",
    re.IGNORECASE | re.DOTALL,
)


def _status(error: BaseException) -> int | None:
    """The HTTP status an API error carries: ``status_code`` (openai, anthropic) or an
    integer ``code`` (google-genai's ``ClientError``)."""
    for name in ("status_code", "code"):
        value = getattr(error, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def is_context_overflow(error: BaseException) -> bool:
    """Whether ``error`` is a provider's "the prompt is over the window" answer: LangChain's
    ``ContextOverflowError`` (any subclass), an error whose ``code`` is
    ``context_length_exceeded``, or an API error (HTTP 400 or 413: an ``openai``/``anthropic``
    ``BadRequestError``, a google-genai ``ClientError``) whose message says so."""
    if any(cls.__name__ == "ContextOverflowError" for cls in type(error).__mro__):
        return True
    if getattr(error, "code", None) == "context_length_exceeded":
        return True
    if _status(error) not in (400, 413):
        return False
    return bool(_PHRASES.search(str(error)))
