"""Checks of the arguments a caller passes, before anything is read or written.

Each raises :class:`InvalidInputError` (or :class:`NotFoundError` for an id that cannot
exist) with a message naming the argument and what was wrong with it.
"""

from __future__ import annotations

import math
import time
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from compactstore._context.media_checks import check_media_block
from compactstore._context.tokens import TokenCounter, message_tokens
from compactstore.capabilities import ModelCapabilities
from compactstore.errors import InvalidInputError, InvalidMessageError, NotFoundError
from compactstore.formats import FORMAT_NAMES, MessageFormat, get_format
from compactstore.formats.base import ResultContent, check_nesting, storable_text, storage_json
from compactstore.formats.block_types import NO_EXTENSION, BlockTypeExtension, check_block_types
from compactstore.models import MEMORY_KINDS, CompactionConfig

__all__ = [
    "MAX_INT",
    "MAX_NAME",
    "MAX_TIMESTAMP",
    "NewToolResult",
    "PendingMessage",
    "check_cache_sessions",
    "check_capabilities",
    "check_column_text",
    "check_config",
    "check_cwd",
    "check_file_path",
    "check_id",
    "check_memory",
    "check_model",
    "check_pool",
    "check_result_blocks",
    "check_session_id",
    "check_size",
    "check_timestamp",
    "check_tool_result",
    "check_utf8",
    "check_whole",
    "check_window",
    "now_or_clock",
    "prepare_message",
]

# 9999-12-31T23:59:59Z: the last second a date can show (and a datetime can hold).
MAX_TIMESTAMP = 253_402_300_799

MAX_NAME = 255  # tool ids and names live in VARCHAR(255) columns

# Whole numbers stored in INTEGER columns must fit them on every backend.
MAX_INT = 2**31 - 1


def check_timestamp(value: Any, what: str = "timestamp") -> float:
    """Epoch seconds between 0 and MAX_TIMESTAMP, as a float."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInputError(f"{what} must be a number of epoch seconds, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidInputError(f"{what} must be a finite, non-negative number, got {value!r}")
    if not 0 <= value <= MAX_TIMESTAMP:
        shown = value if abs(value) < 10**20 else "a far larger number"
        raise InvalidInputError(
            f"{what} must be epoch seconds between 0 and {MAX_TIMESTAMP} "
            f"(9999-12-31 23:59:59 UTC), got {shown}"
        )
    return float(value)


def now_or_clock(value: float | None, what: str = "now") -> float:
    """A caller's ``now=`` checked, or the clock when it is None."""
    return time.time() if value is None else check_timestamp(value, what)


def check_session_id(session_id: Any) -> str:
    """A valid session id in Unicode normalization form NFC: the id every session is stored
    and looked up under, so an id typed in NFD (as macOS file names give it: "é" as "e" and
    a combining accent) names the same session as the same text in NFC."""
    if not isinstance(session_id, str) or not session_id:
        raise InvalidInputError(f"session id must be a non-empty string, got {session_id!r}")
    if len(session_id) > 255:
        raise InvalidInputError("session id is longer than 255 characters")
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in session_id):
        raise InvalidInputError(f"session id {session_id!r} contains control characters")
    if any(unicodedata.category(ch) == "Cf" for ch in session_id):
        # Bidi overrides and zero-width characters make an id look like another one.
        raise InvalidInputError(
            f"session id {session_id!r} contains invisible formatting characters (bidi "
            f"controls or zero-width characters)"
        )
    check_utf8(session_id, "session id")
    return unicodedata.normalize("NFC", session_id)


def check_column_text(text: str, what: str, max_length: int | None = None) -> None:
    """Text stored in its own column (not inside the JSON payload) must be storable on
    every backend: PostgreSQL text cannot hold NUL, and VARCHAR columns have a length."""
    if "\x00" in text:
        raise InvalidInputError(f"{what} contains a NUL character")
    if max_length is not None and len(text) > max_length:
        raise InvalidInputError(f"{what} is longer than {max_length} characters")
    check_utf8(text, what)


def check_whole(value: Any, what: str, *, minimum: int = 0) -> int:
    """A whole number that fits an INTEGER column, at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInputError(f"{what} must be a whole number, got {value!r}")
    if not minimum <= value <= MAX_INT:
        raise InvalidInputError(f"{what} must be between {minimum} and {MAX_INT}, got {value}")
    return value


def check_id(value: Any, what: str, session_id: str) -> None:
    """A row id given by a caller: a whole number, and one that can exist."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInputError(f"{what} id must be a whole number, got {value!r}")
    if not 0 < value <= MAX_INT:
        raise NotFoundError(f"no {what} {value} in session {session_id!r}")


def check_utf8(text: str, what: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidInputError(
            f"{what} is not valid Unicode text (a lone surrogate at position {exc.start})"
        ) from None


def check_config(config: Any) -> CompactionConfig | None:
    if config is not None and not isinstance(config, CompactionConfig):
        raise InvalidInputError("config must be a CompactionConfig")
    return config


@dataclass(frozen=True, slots=True)
class PendingMessage:
    """A message that passed the format's checks, ready to be numbered and stored."""

    message: dict[str, Any]
    payload: str
    size: int  # bytes of the payload
    tokens: int
    created_at: float
    pinned: bool = False
    dedup_of_seq: int | None = None
    # A read-dedup stub: the tokens the re-read would have taken in full.
    tokens_in_full: int | None = None


def check_cache_sessions(cache_sessions: Any) -> int:
    """The number of sessions whose active context a store keeps in memory
    (``open(cache_sessions=)``)."""
    return check_whole(cache_sessions, "cache_sessions", minimum=1)


def prepare_message(
    adapter: MessageFormat,
    config: CompactionConfig,
    count_tokens: TokenCounter,
    message: Any,
    timestamp: Any,
    *,
    pinned: bool = False,
    index: int | None = None,
    allow_block_types: BlockTypeExtension = NO_EXTENSION,
) -> PendingMessage:
    """Check one message on its own (shape, block types, JSON, size, pin), serialise and
    count it.

    Pairing with the session's other messages is checked when it is inserted.
    ``index`` (its place in a batch) prefixes the error message; ``allow_block_types``
    extends the format's per-role block lists (``CompactStore.open(allow_block_types=)``).
    """
    where = "" if index is None else f"message {index}: "
    if not isinstance(message, dict):
        raise InvalidMessageError(f"{where}a message must be a dict, got {type(message).__name__}")
    try:
        check_nesting(message)
        adapter.validate(message)
        check_block_types(adapter.name, message, allow_block_types)
        adapter.check_config(message, config)
    except InvalidMessageError as exc:
        raise InvalidMessageError(f"{where}{exc}") from None
    try:
        payload = storage_json(message)
    except (TypeError, ValueError) as exc:
        raise InvalidMessageError(f"{where}message is not JSON-serialisable: {exc}") from None
    try:
        size = len(payload.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidMessageError(
            f"{where}message text is not valid Unicode (a lone surrogate at position {exc.start})"
        ) from None
    check_size(size, config, where)
    if not isinstance(pinned, bool):
        raise InvalidInputError(f"{where}pinned must be True or False")
    if pinned and (adapter.tool_calls(message) or adapter.tool_results(message)):
        raise InvalidMessageError(
            f"{where}a message with tool calls or results cannot be pinned: pinning it "
            f"would separate it from its pair"
        )
    created_at = now_or_clock(timestamp, "timestamp")
    tokens = message_tokens(adapter, message, count_tokens)
    return PendingMessage(message, payload, size, tokens, created_at, pinned)


def check_size(size: int, config: CompactionConfig, where: str = "") -> None:
    """A stored message's JSON must fit ``max_message_bytes``."""
    if size > config.max_message_bytes:
        raise InvalidMessageError(
            f"{where}message is {size} bytes, over the limit of "
            f"{config.max_message_bytes} (CompactionConfig.max_message_bytes)"
        )


@dataclass(frozen=True, slots=True)
class NewToolResult:
    """The arguments of ``append_tool_result``, checked."""

    tool_use_id: str
    content: ResultContent
    tool_name: str
    file_path: str | None
    is_error: bool


def check_tool_result(
    tool_use_id: Any,
    content: Any,
    *,
    tool_name: Any,
    file_path: Any,
    is_error: Any,
    format_name: str,
) -> NewToolResult:
    for name, value in (("tool_use_id", tool_use_id), ("tool_name", tool_name)):
        if not isinstance(value, str) or not value:
            raise InvalidInputError(f"{name} must be a non-empty string, got {value!r}")
    if isinstance(content, list):
        content = check_result_blocks(format_name, content)
    elif not isinstance(content, str):
        raise InvalidInputError(
            f"tool result content must be a string or a list of content blocks, "
            f"got {type(content).__name__}"
        )
    else:
        check_utf8(content, "tool result content")
    if file_path is not None and (not isinstance(file_path, str) or not file_path):
        raise InvalidInputError(f"file_path must be a non-empty string, got {file_path!r}")
    if not isinstance(is_error, bool):
        raise InvalidInputError("is_error must be True or False")
    check_column_text(tool_name, "tool_name", MAX_NAME)
    if file_path is not None:
        file_path = check_file_path(file_path)
    return NewToolResult(tool_use_id, content, tool_name, file_path, is_error)


def check_result_blocks(format_name: str, content: list[Any]) -> list[dict[str, Any]]:
    """A tool result given as a list of content blocks, in the session format's dialect.

    The format says which blocks (``MessageFormat.result_block_types``): anthropic takes
    ``text``, ``image`` and ``document`` blocks; responses ``input_text``, ``input_image``
    and ``input_file`` parts; openai text parts only (a Chat Completions tool message
    cannot carry media); minicode none (a string only, the article's shape). Each
    media block is checked as the provider would (base64 that decodes, image bytes of the
    declared type).
    """
    fmt = get_format(format_name)
    if fmt.result_block_types is None:
        raise InvalidInputError(
            f"format {format_name}: a tool result's content is a string (the format's tool "
            f"results hold no content blocks), got a list"
        )
    if not content:
        raise InvalidInputError("tool result content is an empty list; give at least one block")
    check_nesting(content, "tool result content")
    for i, block in enumerate(content):
        at = f"tool result content[{i}]: "
        if not isinstance(block, dict):
            raise InvalidInputError(
                f"{at}a content block must be a dict, got {type(block).__name__}"
            )
        kind = block.get("type")
        problem = fmt.result_block_problem(kind)
        if problem is not None:
            raise InvalidInputError(f"{at}{problem}")
        if kind in ("text", "input_text"):
            text = block.get("text")
            if not isinstance(text, str):
                raise InvalidInputError(f"{at}{kind} block needs a string 'text'")
            check_utf8(text, f"{at}text")
        else:
            check_media_block(block, at)
    return content


def check_file_path(file_path: Any) -> str:
    """A file path as read dedup keys it: any text (a tool's input may hold anything), with
    NUL as U+FFFD so every backend can store it (no file's name holds NUL, so no two real
    files share a key)."""
    if not isinstance(file_path, str) or not file_path:
        raise InvalidInputError(f"file_path must be a non-empty string, got {file_path!r}")
    check_utf8(file_path, "file_path")
    return storable_text(file_path)


def check_memory(kind: Any, text: Any, scope: Any) -> str:
    """The arguments of ``remember``; the text as stored. It is often a message's text, so
    it may hold anything: NUL becomes U+FFFD, as in the other text the store derives."""
    if kind not in MEMORY_KINDS:
        raise InvalidInputError(
            f"unknown memory kind {kind!r}; expected one of: {', '.join(MEMORY_KINDS)}"
        )
    if not isinstance(text, str) or not text.strip():
        raise InvalidInputError("memory text must be a non-empty string")
    if not isinstance(scope, str) or not scope:
        raise InvalidInputError("scope must be a non-empty string of at most 32 characters")
    check_column_text(scope, "scope", 32)
    check_utf8(text, "memory text")
    return storable_text(text)


def check_cwd(cwd: Any) -> str:
    if not isinstance(cwd, str) or not cwd.strip():
        raise InvalidInputError(f"cwd must be a directory path, got {cwd!r}")
    check_column_text(cwd, "cwd", 4_096)
    return cwd


def check_window(session_id: str, context_window: int, config: CompactionConfig) -> None:
    """A window the fixed overhead (system prompt, tool definitions) fills leaves no room
    for any message, so no compaction could ever help."""
    if context_window <= config.fixed_overhead_tokens:
        raise InvalidInputError(
            f"session {session_id!r}: context_window {context_window:,} is not larger than "
            f"fixed_overhead_tokens {config.fixed_overhead_tokens:,}: the system prompt and "
            f"tool definitions alone fill the window; give a larger window or a smaller "
            f"overhead"
        )


def check_pool(pool_size: Any, max_overflow: Any, pool_timeout: Any) -> dict[str, int | float]:
    """The connection pool options given to ``open()`` (only those that were given)."""
    pool: dict[str, int | float] = {}
    if pool_size is not None:
        pool["pool_size"] = check_whole(pool_size, "pool_size", minimum=1)
    if max_overflow is not None:
        pool["max_overflow"] = check_whole(max_overflow, "max_overflow")
    if pool_timeout is not None:
        if (
            isinstance(pool_timeout, bool)
            or not isinstance(pool_timeout, int | float)
            or not 0 < pool_timeout < math.inf
        ):
            raise InvalidInputError(
                f"pool_timeout must be a number of seconds > 0, got {pool_timeout!r}"
            )
        pool["pool_timeout"] = float(pool_timeout)
    return pool


def check_model(model: object) -> str:
    """A model id: a non-empty string of at most 255 characters."""
    if not isinstance(model, str) or not model.strip() or len(model) > 255:
        raise InvalidInputError(f"model must be a model id (1-255 characters), got {model!r}")
    return model


def check_capabilities(table: object) -> Mapping[str, ModelCapabilities] | None:
    """``CompactStore.open(model_capabilities=)``: None, or model id -> ModelCapabilities."""
    if table is None:
        return None
    if not isinstance(table, Mapping) or not all(
        isinstance(key, str) and key and isinstance(value, ModelCapabilities)
        for key, value in table.items()
    ):
        raise InvalidInputError(
            "model_capabilities must map model ids to compactstore.capabilities."
            f"ModelCapabilities, got {table!r}"
        )
    return table


def check_session_options(
    cwd: Any, format: Any, context_window: Any, config: Any, model: Any
) -> None:
    """The settings ``store.session()`` was given (each may be None: not given)."""
    if cwd is not None:
        check_cwd(cwd)
    if format is not None and format not in FORMAT_NAMES:
        get_format(format)  # raises, naming the valid formats
    if context_window is not None:
        check_whole(context_window, "context_window (tokens)", minimum=1_000)
    check_config(config)
    if model is not None:
        check_model(model)
