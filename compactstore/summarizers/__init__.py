"""Built-in LLM summarizers and the CLI's way of naming a summarizer.

``AnthropicSummarizer(client, model=...)`` and ``OpenAISummarizer(client, model=...)`` write
the summary of a compaction with the official SDK clients (extras ``anthropic`` and
``openai``; the SDK is imported only when one is built), asking for the handoff
sections. :func:`resolve` builds one from the strings ``compactstore worker`` and
``compactstore replay --resummarize --summarizer`` take.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from compactstore.errors import InvalidInputError
from compactstore.summarizers._llm import AnthropicSummarizer, OpenAISummarizer
from compactstore.summarizers.prompt import DEFAULT_MAX_INPUT_TOKENS, RESULT_CHARS

__all__ = [
    "BUILTIN_SUMMARIZERS",
    "DEFAULT_MAX_INPUT_TOKENS",
    "RESULT_CHARS",
    "AnthropicSummarizer",
    "OpenAISummarizer",
    "resolve",
]

BUILTIN_SUMMARIZERS: dict[str, type[AnthropicSummarizer] | type[OpenAISummarizer]] = {
    "anthropic": AnthropicSummarizer,
    "openai": OpenAISummarizer,
}


def resolve(spec: str, model: str | None = None, **options: Any) -> Any:
    """The summarizer a command-line spelling names.

    Args:
        spec: ``anthropic`` or ``openai`` (a built-in summarizer over a client the SDK
            configures from its environment variables, e.g. ``ANTHROPIC_API_KEY``), or
            ``module:attribute`` (dotted attribute allowed): a summarizer callable, or a
            class, which is instantiated (with ``model=`` when a model is given).
        model: the model name; required for ``anthropic`` and ``openai``.
        options: more keyword arguments for a built-in summarizer (``max_tokens``,
            ``max_input_tokens``, ``recall``, ``request_options``).

    Raises:
        InvalidInputError: an unknown name, a module or attribute that does not exist, a
            value that is not callable, a missing model, a model for a plain callable, or
            a built-in summarizer whose SDK finds no credentials (``OPENAI_API_KEY``...).
        MissingExtraError: the built-in summarizer's extra is not installed.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise InvalidInputError("a summarizer is 'anthropic', 'openai' or 'module:callable'")
    spec = spec.strip()
    builtin = BUILTIN_SUMMARIZERS.get(spec)
    if builtin is not None:
        if not model:
            raise InvalidInputError(f"the {spec} summarizer needs a model (--model NAME)")
        return builtin.from_env(model=model, **options)
    module_name, colon, attribute = spec.partition(":")
    if not colon or not module_name or not attribute:
        raise InvalidInputError(
            f"unknown summarizer {spec!r}: expected 'anthropic', 'openai' or 'module:callable'"
        )
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise InvalidInputError(
            f"summarizer {spec!r}: cannot import {module_name!r} ({exc})"
        ) from None
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise InvalidInputError(f"summarizer {spec!r}: {module_name!r} has no {attribute!r}")
        target = getattr(target, part)
    if inspect.isclass(target):
        factory: Any = target
        try:
            target = factory(model=model, **options) if model else factory(**options)
        except TypeError as exc:
            raise InvalidInputError(f"summarizer {spec!r}: cannot build it ({exc})") from None
    elif model or options:
        raise InvalidInputError(
            f"summarizer {spec!r} is a callable, not a class: it takes no model or options"
        )
    if not callable(target):
        raise InvalidInputError(f"summarizer {spec!r} is not callable")
    return target
