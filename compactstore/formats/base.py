"""The one small interface every message format implements.

Engines and the store never look inside a message themselves: they ask the session's
format for its role, tool calls, tool results and text, and ask it to build the messages
compaction adds (summaries, tool-result stubs, synthetic error results). Messages are plain
dicts stored verbatim; adapters never mutate them and always return new dicts.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from compactstore._context.media import MEDIA_BLOCK_TYPES, has_media, media_tokens
from compactstore._context.tokens import TokenCounter
from compactstore._text import storable_text, storage_json
from compactstore.errors import InvalidInputError, InvalidMessageError, MissingExtraError

__all__ = [
    "MAX_NESTING",
    "THINKING_NOTE",
    "Kind",
    "MessageFormat",
    "ResultContent",
    "ToolCall",
    "ToolResult",
    "check_blocks",
    "check_nesting",
    "check_nonempty_str",
    "check_role",
    "content_blocks",
    "content_text",
    "error_prefixed",
    "flatten_result",
    "json_text",
    "result_blocks",
    "storable_text",
    "storage_json",
    "type_name",
    "usage_count",
]

# How deep lists and objects may nest inside one message. Real tool inputs nest a handful of
# levels; far deeper values could not be encoded, decoded or compared without running out of
# Python's recursion limit, so they are refused before anything is stored.
MAX_NESTING = 256

# What a summarizer is given in place of a thinking block or reasoning item.
THINKING_NOTE = "[thinking left out]"

# A tool result's content as append_tool_result takes it: text, or content blocks in the
# session format's own dialect.
ResultContent = str | list[dict[str, Any]]

# What a message is, whatever the format spells it as.
Kind = Literal["system", "user", "assistant", "tool"]


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool call made by an assistant message."""

    id: str
    name: str
    input: Any


@dataclass(frozen=True, slots=True)
class ToolResult:
    """A tool result carried by a message, with its content flattened to text."""

    tool_use_id: str
    text: str
    is_error: bool
    # False for results whose content no text can stand for (a screenshot, an approval
    # decision): compaction stages never preview or clear them.
    replaceable: bool = True
    # The result's content blocks when they carry media (images, documents),
    # else None. ``text`` is then the text blocks only: media is never counted or shown as
    # its base64. Such a result is exempt from the character budget; microcompact and
    # ``max_media_in_context`` persist it whole (these blocks, as JSON) behind a note.
    blocks: Any = None

    @property
    def has_media(self) -> bool:
        return self.blocks is not None


def check_nesting(value: Any, what: str = "message") -> None:
    """Refuse a value whose lists and objects nest deeper than MAX_NESTING (no recursion)."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        if depth == MAX_NESTING:
            raise InvalidMessageError(
                f"{what} nests lists or objects more than {MAX_NESTING} levels deep"
            )
        stack.extend((child, depth + 1) for child in children)


def json_text(value: Any) -> str:
    """Compact, deterministic JSON used when a structured value must count as text."""
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


class MessageFormat(ABC):
    """How one API spells messages, tool calls and tool results.

    Everything the library knows about a format is here or in its module: how to read and
    build its messages, which block types each role may carry, its SDK's request type and
    response object, the shape of a provider request and of a tool definition. Adding a
    format is one module with a subclass, plus its registration in
    :mod:`compactstore.formats`; tests/test_format_conformance.py is the checklist.
    """

    name: str
    # Whether consecutive assistant items form one turn (responses: a turn is several items,
    # reasoning, calls and messages); otherwise each assistant message is a turn of its own.
    groups_turns: bool = False
    # Whether a tool call id may be used again once its earlier call is closed (the documentation:
    # openai and responses; Anthropic's API refuses a repeated tool_use id).
    reuses_call_ids: bool = False
    # Assistant content blocks that are the model's signed thinking:
    # sent only while nothing before their message changed since the context it answered.
    thinking_block_types: frozenset[str] = frozenset()

    @abstractmethod
    def validate(self, message: Any) -> None:
        """Check the message's shape; raise InvalidMessageError naming the problem.

        Pairing (does a result's call exist?) is checked by the store, not here.
        """

    @abstractmethod
    def kind(self, message: dict[str, Any]) -> Kind:
        """system, user, assistant, or tool (a message that carries only tool results)."""

    @abstractmethod
    def tool_calls(self, message: dict[str, Any]) -> list[ToolCall]:
        """Tool calls made by this message, in order (empty for non-assistant messages)."""

    @abstractmethod
    def tool_results(self, message: dict[str, Any]) -> list[ToolResult]:
        """Tool results carried by this message, in order."""

    @abstractmethod
    def text(self, message: dict[str, Any]) -> str:
        """The prose of the message (text blocks only; no tool calls or results)."""

    def text_parts(self, message: dict[str, Any]) -> list[str]:
        """The prose of the message part by part (its text blocks, in order): :meth:`text`
        is them joined by newlines. A client writes its own content (environment,
        instructions) as parts of their own, so what a person typed is told apart by part."""
        return [self.text(message)]

    @abstractmethod
    def replace_tool_results(
        self, message: dict[str, Any], replacements: dict[str, str]
    ) -> dict[str, Any]:
        """A copy of the message whose results for the given tool-use ids have new text."""

    @abstractmethod
    def tool_result_message(
        self, tool_use_id: str, content: ResultContent, *, tool_name: str, is_error: bool
    ) -> dict[str, Any]:
        """A message carrying one tool result."""

    @abstractmethod
    def summary_message(self, text: str) -> dict[str, Any]:
        """The message that stands for the summarised part of the conversation."""

    @abstractmethod
    def synthetic_results(self, calls: list[ToolCall], text: str) -> list[dict[str, Any]]:
        """Messages that answer calls that never got a result with an error ``text``."""

    # -- block types (compactstore.formats.block_types reads these) ----------------------------

    # Role (or nested block list: ``tool_result``, an output item type) -> the content block
    # types it may carry. A format that lists none accepts any block type.
    block_types: ClassVar[Mapping[str, frozenset[str]]] = {}
    # Members of the SDK's block union listed for no role -> why.
    excluded_block_types: ClassVar[Mapping[str, str]] = {}

    def block_lists(self, message: dict[str, Any]) -> Iterator[tuple[str, str, list[Any]]]:
        """(role key, where, list) of every block list of ``message`` that ``block_types``
        governs: by default the content list of the message's role."""
        role, content = message.get("role"), message.get("content")
        if isinstance(role, str) and isinstance(content, list):
            yield role, "content", content

    # Block types that text(), tool_calls() and tool_results() read: recall shows any other
    # block of a message as its JSON.
    read_block_types: ClassVar[frozenset[str]] = frozenset({"text"})

    def thinking_count(self, message: Mapping[str, Any]) -> int:
        """How many thinking blocks the message carries (what recall says it left out)."""
        content = message.get("content")
        if not self.thinking_block_types or not isinstance(content, list):
            return 0
        return sum(
            1
            for block in content
            if isinstance(block, dict) and block.get("type") in self.thinking_block_types
        )

    def text_block(self, role: str, text: str) -> dict[str, Any]:
        """A text block ``role`` may carry (a note standing for a block left out)."""
        del role
        return {"type": "text", "text": text}

    # -- tool results as append_tool_result takes them -----------------------------------------

    # Block types a tool result's content list may hold (None: only a string).
    result_block_types: ClassVar[tuple[str, ...] | None] = None

    def result_block_problem(self, kind: Any) -> str | None:
        """Why a tool result's content list may not hold a block of type ``kind`` (None:
        it may)."""
        allowed = self.result_block_types or ()
        if kind in allowed:
            return None
        return (
            f"block type {kind!r} is not allowed in a {self.name} tool result "
            f"(expected one of: {', '.join(allowed)})"
        )

    # -- the provider's SDK and API ----------------------------------------------------------

    # The extra that installs the SDK whose request type the format's messages are (None:
    # no official SDK type; no provider API takes them as they are).
    sdk_extra: ClassVar[str | None] = None
    # The keyword argument of the provider call that takes the messages (None: no provider
    # API takes them: request_params() refuses the format).
    request_key: ClassVar[str | None] = None
    # Whether system messages go in a separate ``system`` parameter (Anthropic's Messages).
    system_parameter: ClassVar[bool] = False
    # Whether request_params() may place cache_control breakpoints and add the session's
    # provider fields (thinking binding, server-side context editing, beta headers).
    prompt_caching: ClassVar[bool] = False
    # How append_response() names the response object it takes (None: it takes none).
    response_name: ClassVar[str | None] = None

    def request_type(self) -> Any:
        """The SDK type of one item of the format's request list.

        Raises:
            InvalidInputError: the format has no SDK type.
            MissingExtraError: the SDK is not installed (the error names the extra).
        """
        raise InvalidInputError(f"format {self.name!r} has no official SDK type to check against")

    def sdk_missing(self) -> MissingExtraError:
        """The error :meth:`request_type` raises when the format's SDK is not installed."""
        extra = self.sdk_extra
        return MissingExtraError(
            f"checking {self.name} requests against the SDK types needs the {extra} SDK: "
            f"pip install 'compactstore[{extra}]'"
        )

    def system_type(self) -> Any:
        """The SDK type of the ``system`` parameter (with ``system_parameter``)."""
        return None

    def is_response(self, response: Any) -> bool:
        """Whether ``response`` is the SDK's response object of this format (by its shape)."""
        del response
        return False

    def response_turn(self, response: Any) -> tuple[list[dict[str, Any]], int | None]:
        """The messages to store for a provider response (see :meth:`is_response`), and
        the prompt size its usage reports (None when it reports none)."""
        raise InvalidInputError(f"format {self.name!r} takes no provider response object")

    def tool_definition(
        self, name: str, description: str, schema: dict[str, Any]
    ) -> dict[str, Any]:
        """A tool as the format's API declares tools (by default Anthropic's ``ToolParam``:
        ``{"name", "description", "input_schema"}``)."""
        return {"name": name, "description": description, "input_schema": schema}

    def examples(self) -> list[dict[str, Any]]:
        """A short conversation in the format that carries every block type each role (and
        nested list) of ``block_types`` may carry, and tool calls each answered by a
        result: the format by example, and what tests/test_format_conformance.py checks
        the adapter against (a fresh copy the caller may change)."""
        return []

    # -- behaviour ----------------------------------------------------------------------------

    def check_config(self, message: dict[str, Any], config: Any) -> None:
        """Checks that depend on the session's ``CompactionConfig`` (none by default)."""
        del message, config

    def glued(self, message: dict[str, Any]) -> bool:
        """Whether the message belongs to the one after it: no cut between them, nothing
        inserted between them (responses: a reasoning item)."""
        return False

    def answer_orphans(
        self, message: dict[str, Any], calls: list[ToolCall], text: str
    ) -> list[dict[str, Any]] | None:
        """Messages answering the crash-orphaned ``calls`` of ``message`` with an error
        ``text``; None when no stand-in is possible and the message must leave the context."""
        return self.synthetic_results(calls, text)

    def wire_view(self, messages: list[dict[str, Any]], config: Any) -> list[dict[str, Any]]:
        """The messages as they are sent to the provider (the active context as is, by
        default). ``messages`` are the caller's own copies; the result may reuse them."""
        return messages

    def sent(self, message: Mapping[str, Any], config: Any) -> bool:
        """Whether the wire view sends the message at all: its tokens count only then.
        Formats whose wire view
        leaves whole messages out say so with ``leaves_messages_out``."""
        return True

    # Whether sent() may be False for some message (responses: reasoning items).
    leaves_messages_out: bool = False

    def wire_restart(self, messages: Sequence[Mapping[str, Any]]) -> int:
        """The index from which the wire view of ``messages`` followed by more messages may
        differ from the wire view of ``messages`` alone; before it, the view is built from
        those messages only. By default each message's view is its own: the end."""
        return len(messages)

    def thinking_text(self, message: Mapping[str, Any]) -> str | None:
        """The text of the message's thinking blocks (a redacted block's ``data``), what
        they cost when sent; None when it carries none."""
        if not self.thinking_block_types or message.get("role") != "assistant":
            return None
        content = message.get("content")
        if not isinstance(content, list):
            return None
        found = [
            block
            for block in content
            if isinstance(block, dict) and block.get("type") in self.thinking_block_types
        ]
        if not found:
            return None
        return "\n".join(
            str(block.get("thinking" if block.get("type") == "thinking" else "data") or "")
            for block in found
        )

    def without_thinking(self, message: Mapping[str, Any]) -> dict[str, Any]:
        """A copy of the message without its thinking blocks (the wire view leaves them
        out once their prefix changed); the other blocks are the message's own."""
        content = message.get("content")
        assert isinstance(content, list), "only messages with thinking blocks are stripped"
        kept = [
            block
            for block in content
            if not (isinstance(block, dict) and block.get("type") in self.thinking_block_types)
        ]
        return {**message, "content": kept}

    def thinking_noted(self, message: dict[str, Any]) -> dict[str, Any]:
        """The message with each thinking block replaced by the text block
        ``[thinking left out]``: what a summarizer is given (the documentation: thinking is never
        sent to a summarizer). ``message`` is the caller's copy; it may be returned."""
        if self.thinking_text(message) is None:
            return message
        content = message["content"]
        return {
            **message,
            "content": [
                {"type": "text", "text": THINKING_NOTE}
                if isinstance(block, dict) and block.get("type") in self.thinking_block_types
                else block
                for block in content
            ],
        }

    def token_text(self, message: dict[str, Any]) -> str:
        """Everything in the message that costs tokens: prose, calls and results."""
        parts = [self.text(message)]
        for call in self.tool_calls(message):
            parts.append(call.name)
            parts.append(call.input if isinstance(call.input, str) else json_text(call.input))
        parts.extend(result.text for result in self.tool_results(message))
        return "\n".join(p for p in parts if p)

    def message_tokens(self, message: dict[str, Any], count: TokenCounter) -> int:
        """The estimate stored with a message: ``count`` over :meth:`token_text`, plus the
        figure of each image or document it carries."""
        return count(self.token_text(message)) + media_tokens(message)

    def is_request(self, message: dict[str, Any]) -> bool:
        """True for a user message written by a person (prose, no tool results)."""
        return (
            self.kind(message) == "user"
            and not self.tool_results(message)
            and bool(self.text(message).strip())
        )

    @staticmethod
    def fail(problem: str) -> InvalidMessageError:
        """The error adapters raise: ``raise self.fail("...")``."""
        return InvalidMessageError(problem)


# -- validation and reading helpers shared by the adapters ---------------------------------


def usage_count(usage: Any, *names: str) -> int | None:
    """The sum of a response usage's whole-number fields ``names`` (a field that is not a
    whole number counts 0); None when the response carries no usage."""
    if usage is None:
        return None
    total = 0
    for name in names:
        value = getattr(usage, name, 0)
        if isinstance(value, int) and not isinstance(value, bool):
            total += value
    return total


def type_name(value: Any) -> str:
    """The Python type name of a value, as error messages spell it."""
    return "None" if value is None else type(value).__name__


def check_role(message: Any, roles: Iterable[str], format_name: str) -> str:
    """Check that ``message`` is a dict with a known role, and return the role."""
    if not isinstance(message, dict):
        raise MessageFormat.fail(f"a message must be a dict, got {type_name(message)}")
    if "role" not in message:
        raise MessageFormat.fail("message has no 'role'")
    role = message["role"]
    if not isinstance(role, str):
        raise MessageFormat.fail(f"message 'role' must be a string, got {type_name(role)}")
    allowed = sorted(roles)
    if role not in allowed:
        raise MessageFormat.fail(
            f"unknown role {role!r} for format {format_name} "
            f"(expected one of: {', '.join(allowed)})"
        )
    return role


def check_nonempty_str(block: dict[str, Any], key: str, what: str, where: str) -> str:
    """Return ``block[key]``, which must be a non-empty string (ids and names)."""
    value = block.get(key)
    if not isinstance(value, str):
        raise MessageFormat.fail(f"{where}{what} needs a string {key!r}, got {type_name(value)}")
    if not value:
        raise MessageFormat.fail(f"{where}{what} {key!r} must not be empty")
    return value


def check_blocks(content: Any, where: str) -> list[dict[str, Any]]:
    """Check that every item of a content list is a dict with a string ``type``."""
    blocks: list[dict[str, Any]] = []
    for i, block in enumerate(content):
        at = f"{where}[{i}]: "
        if not isinstance(block, dict):
            raise MessageFormat.fail(f"{at}content block must be a dict, got {type_name(block)}")
        block_type = block.get("type")
        if not isinstance(block_type, str):
            raise MessageFormat.fail(
                f"{at}content block needs a string 'type', got {type_name(block_type)}"
            )
        if block_type == "text" and not isinstance(block.get("text"), str):
            raise MessageFormat.fail(
                f"{at}text block needs a string 'text', got {type_name(block.get('text'))}"
            )
        blocks.append(block)
    return blocks


def content_blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The content as a list of blocks (empty for string content)."""
    content = message.get("content")
    if isinstance(content, list):
        return [block for block in content if isinstance(block, dict)]
    return []


def content_parts(content: Any) -> list[str]:
    """The texts of a content value: the string itself, or its text blocks in order."""
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        return [
            block["text"]
            for block in content
            if isinstance(block, dict) and block.get("type") == "text"
        ]
    return []


def content_text(content: Any) -> str:
    """The prose of a content value: the string itself, or its text blocks joined."""
    return "\n".join(content_parts(content))


def flatten_result(content: Any) -> str:
    """A tool result's content as text; non-text blocks count as their JSON, except media
    (images, documents), which count by their size (:mod:`compactstore._context.media`)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            block["text"]
            if isinstance(block, dict) and block.get("type") == "text"
            else json_text(block)
            for block in content
            if not (isinstance(block, dict) and block.get("type") in MEDIA_BLOCK_TYPES)
        )
    return ""


def error_prefixed(content: ResultContent, text_type: str) -> ResultContent:
    """Content marked as an error where the format has no error flag: ``Error: `` before
    the text, or before the first text block of a list (a text block of its own when the
    list starts with another block)."""
    prefix = "Error: "
    if isinstance(content, str):
        return prefix + content
    first = content[0] if content else None
    if isinstance(first, dict) and first.get("type") == text_type:
        return [{**first, "text": prefix + str(first.get("text", ""))}, *content[1:]]
    return [{"type": text_type, "text": prefix.strip()}, *content]


def result_blocks(content: Any) -> Any:
    """``content`` when it is a list carrying media (ToolResult.blocks), else None."""
    return content if isinstance(content, list) and has_media(content) else None
