"""Check a request against the official SDK types of its format, strictly.

Plain pydantic validation of the SDKs' request ``TypedDict`` types ignores keys a type does
not declare, so "it passes the SDK types" has not meant "the API accepts it". This module
checks three things more, walking the ``TypedDict`` annotations itself (unions, ``Literal``,
nested lists and dicts included):

- no key that the matching type does not declare, at any depth;
- every ``Required`` key present;
- ``None`` only where the type allows it (``Optional[...]``).

The SDKs are imported lazily, only when a format's types are first needed; without them the
functions raise :class:`~compactstore.errors.MissingExtraError` naming the extra to install.

Public names: :func:`sdk_problems` (the problems, empty when valid), :func:`check_sdk_types`
(raise :class:`~compactstore.errors.InvalidMessageError` listing them), :func:`request_type`
(the SDK type of one item of a format's request list) and :func:`request_params_problems`
(the keyword arguments ``Session.request_params()`` returns).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from compactstore.errors import InvalidInputError, InvalidMessageError
from compactstore.formats import FORMAT_NAMES, get_format
from compactstore.formats._typed import pydantic_problems, strict_problems
from compactstore.formats._typed import to_request as _to_request

__all__ = [
    "SDK_FORMATS",
    "check_sdk_types",
    "request_params_problems",
    "request_type",
    "sdk_problems",
    "strict_problems",
    "to_request",
]

# The formats with an official SDK request type, and the extra that installs that SDK.
SDK_FORMATS: dict[str, str] = {
    name: extra for name in FORMAT_NAMES if (extra := get_format(name).sdk_extra) is not None
}

# How many problems one check reports at most (a broken context could list thousands).
MAX_PROBLEMS = 20


def request_type(format_name: str) -> Any:
    """The SDK type of one item of a format's request list (messages or input items).

    anthropic: ``anthropic.types.MessageParam``; openai:
    ``openai.types.chat.ChatCompletionMessageParam``; responses:
    ``openai.types.responses.ResponseInputItemParam``.

    Raises:
        InvalidInputError: the format has no SDK type (minicode, or an unknown name).
        MissingExtraError: the SDK is not installed (the error names the extra).
    """
    if format_name not in SDK_FORMATS:
        raise InvalidInputError(
            f"format {format_name!r} has no official SDK type to check against "
            f"(formats with one: {', '.join(sorted(SDK_FORMATS))})"
        )
    return get_format(format_name).request_type()


def sdk_problems(format_name: str, items: Sequence[Any]) -> list[str]:
    """Why the official SDK type of ``format_name`` refuses ``items`` (empty: accepted).

    Each item must validate against the format's request type (see :func:`request_type`)
    with pydantic, and pass :func:`strict_problems`. At most ``MAX_PROBLEMS`` are listed.
    """
    item_type = request_type(format_name)
    if isinstance(items, str | bytes | Mapping) or not isinstance(items, Sequence):
        return [f"the request must be a list of items, got {type(items).__name__}"]
    # The strict walk names the problem plainly; pydantic's own check (which explains a
    # refusal by listing every member of a union) is reported only when the walk found none.
    problems = strict_problems(list[item_type], list(items))  # type: ignore[valid-type]
    if not problems:
        problems = pydantic_problems(item_type, list(items))
    return problems[:MAX_PROBLEMS]


def check_sdk_types(format_name: str, items: Sequence[Any]) -> None:
    """Raise unless the official SDK type of the format accepts ``items`` strictly.

    Raises:
        InvalidMessageError: the problems found, one per line.
        InvalidInputError: the format has no SDK type.
        MissingExtraError: the SDK is not installed.
    """
    problems = sdk_problems(format_name, items)
    if problems:
        raise InvalidMessageError(
            f"the {format_name} SDK types refuse the request:\n" + "\n".join(problems)
        )


def request_params_problems(format_name: str, params: Mapping[str, Any]) -> list[str]:
    """The problems of keyword arguments for the provider call, as ``request_params()``
    returns them: the format's request key (``messages``, ``input``), and ``system`` where
    the format takes system messages as a parameter of their own."""
    fmt = get_format(format_name)
    key = fmt.request_key or "messages"
    problems: list[str] = []
    allowed = {key, "system"} if fmt.system_parameter else {key}
    problems.extend(f"undeclared parameter {name!r}" for name in params if name not in allowed)
    if key not in params:
        return [*problems, f"missing parameter {key!r}"]
    problems.extend(sdk_problems(format_name, params[key]))
    if "system" in params:
        system_type = fmt.system_type()
        problems.extend(
            f"system: {p}" for p in strict_problems(system_type, params["system"], "system")
        )
    return problems[:MAX_PROBLEMS]


def to_request(format_name: str, value: Any) -> Any:
    """A message (or item) with every SDK pydantic object in it turned into a request dict.

    An object becomes ``model_dump(mode="json", by_alias=True, exclude_unset=True)`` keeping
    only the keys the matching request ``Param`` type declares, at every depth (output-only
    keys such as ``status`` or ``created_by`` go; declared keys are kept, ``None`` included).
    Plain dicts and lists around the objects are kept as they are. Values without objects
    come back unchanged (the same object). A format with no SDK type dumps objects whole.
    """
    fmt = get_format(format_name)
    return _to_request(fmt.request_type() if fmt.sdk_extra else None, value)
