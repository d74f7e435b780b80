"""SDK response objects as what a session stores: ``Session.append_response``.

Nothing here imports an SDK: objects are recognised by their shape (an Anthropic
``Message`` has ``type == "message"``, ``role``, ``content`` and ``usage.input_tokens``; an
OpenAI ``ChatCompletion`` has ``choices`` and ``usage.prompt_tokens``; a Responses ``Response``
has ``object == "response"``, ``output`` and ``usage.input_tokens``), each format's
adapter says which objects are its own (``MessageFormat.is_response``) and what to store
for one (``MessageFormat.response_turn``).
"""

from __future__ import annotations

from typing import Any

from compactstore.errors import InvalidInputError
from compactstore.formats import FORMAT_NAMES, get_format

__all__ = ["applied_edits", "cleared_tokens", "has_sdk_object", "response_model", "response_turn"]


def has_sdk_object(message: Any) -> bool:
    """Whether a message is, or holds (at most two levels down), a pydantic object.

    A shallow look, so appending a plain dict costs next to nothing: SDK objects sit where a
    caller puts a reply's parts (``content``, ``tool_calls``) or are the message itself.
    """
    from pydantic import BaseModel

    if isinstance(message, BaseModel):
        return True
    if not isinstance(message, dict):
        return False
    for value in message.values():
        if isinstance(value, BaseModel):
            return True
        if isinstance(value, list) and any(isinstance(item, BaseModel) for item in value):
            return True
    return False


def response_turn(format_name: str, response: Any) -> tuple[list[dict[str, Any]], int | None]:
    """The messages to store for a provider response, and the prompt size it reports: the
    session format's ``response_turn`` (anthropic: a ``Message``; openai: a
    ``ChatCompletion``; responses: a ``Response``). The count is None when the response
    carries no usage.

    Raises:
        InvalidInputError: not a response of the session's format.
    """
    fmt = get_format(format_name)
    kind = _kind(response)
    if kind != format_name:
        raise InvalidInputError(
            f"append_response() takes the response object of the session's format "
            f"({fmt.response_name or 'none for this format'}), got "
            f"{type(response).__name__}"
            + (f" (a response of format {kind})" if kind is not None else "")
        )
    return fmt.response_turn(response)


def _kind(response: Any) -> str | None:
    """Which format's API a response object came from, by its shape."""
    if isinstance(response, dict) or not hasattr(response, "model_dump"):
        return None
    return next((name for name in FORMAT_NAMES if get_format(name).is_response(response)), None)


def response_model(response: Any) -> str | None:
    """The model a provider response names (None when it names none)."""
    model = getattr(response, "model", None)
    return model if isinstance(model, str) and model else None


def applied_edits(response: Any) -> list[dict[str, Any]]:
    """The server-side context edits an Anthropic response reports it applied
    (``context_management.applied_edits``; on a plain ``Message`` an extra field), as
    plain dicts; [] when it reports none."""
    management = getattr(response, "context_management", None)
    if management is None:
        extra = getattr(response, "model_extra", None) or {}
        management = extra.get("context_management")
    edits = (
        management.get("applied_edits")
        if isinstance(management, dict)
        else getattr(management, "applied_edits", None)
    )
    if not isinstance(edits, list):
        return []
    plain = [edit.model_dump() if hasattr(edit, "model_dump") else edit for edit in edits]
    return [edit for edit in plain if isinstance(edit, dict)]


def cleared_tokens(edits: list[dict[str, Any]]) -> int:
    """The input tokens server-side edits report they cleared, together."""
    total = 0
    for edit in edits:
        value = edit.get("cleared_input_tokens")
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            total += value
    return total
