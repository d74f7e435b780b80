"""Recognising a provider's "the prompt is over the model's window" error, for the
integrations' reactive recovery."""

from __future__ import annotations

__all__ = ["is_context_overflow"]

# What providers say when a request is over the model's window: OpenAI (Responses and Chat
# Completions), Anthropic, and servers that speak their APIs.
_PHRASES = (
    "context_length_exceeded",
    "exceeds the context window",
    "maximum context length",
    "prompt is too long",
    "input is too long",
)


def is_context_overflow(error: BaseException) -> bool:
    """Whether ``error`` is a provider's "the prompt is over the window" answer: LangChain's
    ``ContextOverflowError`` (any subclass), or an API error (an ``openai``/``anthropic``
    ``BadRequestError``: HTTP 400 or 413) whose code or message says so."""
    if any(cls.__name__ == "ContextOverflowError" for cls in type(error).__mro__):
        return True
    if getattr(error, "code", None) == "context_length_exceeded":
        return True
    if getattr(error, "status_code", None) not in (400, 413):
        return False
    text = str(error).lower()
    return any(phrase in text for phrase in _PHRASES)
