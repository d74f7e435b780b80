"""Recall: the original of anything that is not in the active context in full.

A message is out of the context when a cut removed it (it is before the live boundary's
first kept seq and not pinned), or in part when a compaction cleared or persisted one of its
tool results (a live edit; a persisted result is also a blob). The model asks for it back
with the ``recall`` tool, in one of three ways:

- ``{"from_seq": a, "to_seq": b}``: the originals of the messages of that range that are out
  of the context (messages in the context in full are not repeated);
- ``{"query": "text"}``: a case-insensitive substring search over what is out of the context,
  newest first, at most :data:`MAX_HITS` hits, each with its seq and a
  :data:`SNIPPET_CHARS`-character snippet;
- ``{"blob_id": n}``: a persisted tool result, byte for byte.

An answer is capped at ``CompactionConfig.recall_max_tokens``; a longer one ends with a line
naming a ``{"cursor": "..."}`` that continues exactly where it stopped (the pages of an
answer joined, less their cursor lines and "continued" headers, are the whole answer).

This module is pure: it parses arguments, renders messages and pages answers. The reads are
:mod:`compactstore.db.recall`; :mod:`compactstore._core.recall` puts the two together.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from compactstore._context.media import describe, media_blocks
from compactstore._context.tokens import TokenCounter
from compactstore.errors import InvalidInputError
from compactstore.formats import MessageFormat, get_format
from compactstore.formats.base import content_blocks, storage_json, type_name

__all__ = [
    "MAX_HITS",
    "RECALL_LINE",
    "RECALL_TOOL_NAME",
    "SNIPPET_CHARS",
    "BlobRequest",
    "OutOfContext",
    "RangeRequest",
    "RecallRequest",
    "SearchRequest",
    "answer_blob",
    "answer_range",
    "answer_search",
    "parse_arguments",
    "render",
    "search_hit",
    "tool_definition",
]

RECALL_TOOL_NAME = "recall"
MAX_HITS = 20
SNIPPET_CHARS = 200
# Whole numbers go into INTEGER columns and bind parameters: they must fit them.
_MAX_INT = 2**31 - 1
_MAX_QUERY = 1_000

# The summary's recall section, written when recall is enabled.
RECALL_LINE = (
    f"Anything summarised here, cleared or persisted can be fetched verbatim with the "
    f"`{RECALL_TOOL_NAME}` tool: by seq range "
    '({"from_seq": a, "to_seq": b}), by text search ({"query": "..."}) or by blob id '
    '({"blob_id": n}).'
)

DESCRIPTION = (
    "Fetch, verbatim, earlier parts of this conversation that are no longer in your context "
    "in full: messages a compaction summarised away, tool results cleared from the context, "
    "and tool results persisted as blobs (the context shows a preview naming the blob id). "
    "Give exactly one of: from_seq and to_seq (a range of message seqs, as the summary names "
    "them), query (a case-insensitive text search; answers list seq and snippet, newest "
    "first), blob_id, or cursor (from the last line of a previous answer that was cut at the "
    "size limit, to continue it)."
)

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "from_seq": {
            "type": "integer",
            "minimum": 0,
            "description": "First message seq of the range to fetch.",
        },
        "to_seq": {
            "type": "integer",
            "minimum": 0,
            "description": "Last message seq of the range (default: from_seq).",
        },
        "query": {
            "type": "string",
            "minLength": 1,
            "description": "Text to search for (case-insensitive substring).",
        },
        "blob_id": {
            "type": "integer",
            "minimum": 1,
            "description": "Id of a persisted tool result, as its preview names it.",
        },
        "cursor": {
            "type": "string",
            "description": "Continue a previous answer that was cut at the size limit.",
        },
    },
    "additionalProperties": False,
}


def tool_definition(format_name: str) -> dict[str, Any]:
    """The ``recall`` tool as the session's format declares tools
    (``MessageFormat.tool_definition``): anthropic and minicode ``{"name", "description",
    "input_schema"}`` (Anthropic's ``ToolParam``); openai ``{"type": "function",
    "function": {...}}`` (Chat Completions); responses ``{"type": "function", "name",
    "description", "parameters", "strict"}``.

    Raises:
        InvalidInputError: an unknown format.
    """
    schema = json.loads(json.dumps(SCHEMA))  # a fresh copy the caller may change
    return get_format(format_name).tool_definition(RECALL_TOOL_NAME, DESCRIPTION, schema)


# -- arguments ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RangeRequest:
    """Messages ``first``..``last`` (seqs, inclusive); ``offset`` characters of the first
    one's text were already given (a continued answer)."""

    first: int
    last: int
    offset: int = 0


@dataclass(frozen=True, slots=True)
class SearchRequest:
    """A search; ``skip`` hits were already given."""

    query: str
    skip: int = 0


@dataclass(frozen=True, slots=True)
class BlobRequest:
    """A persisted tool result; ``offset`` characters were already given."""

    blob_id: int
    offset: int = 0


RecallRequest = RangeRequest | SearchRequest | BlobRequest

_KEYS = ("from_seq", "to_seq", "query", "blob_id", "cursor")
_CURSOR = re.compile(r"(?:seq:(\d+)-(\d+):(\d+)|blob:(\d+):(\d+)|search:(\d+):(.+))", re.DOTALL)


def parse_arguments(arguments: Any) -> RecallRequest:
    """The request a ``recall`` call makes: its input as a dict, or the JSON text of one
    (OpenAI passes arguments as a string).

    Raises:
        InvalidInputError: naming what is wrong with the arguments.
    """
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError as exc:
            raise InvalidInputError(f"recall arguments are not valid JSON: {exc}") from None
    if not isinstance(arguments, dict):
        raise InvalidInputError(
            f"recall arguments must be an object (a dict or its JSON text), "
            f"got {type_name(arguments)}"
        )
    unknown = sorted(str(key) for key in arguments if key not in _KEYS)
    if unknown:
        raise InvalidInputError(
            f"unknown recall argument {unknown[0]!r} (expected: {', '.join(_KEYS)})"
        )
    given = [key for key in ("from_seq", "query", "blob_id", "cursor") if key in arguments]
    if "to_seq" in arguments and "from_seq" not in arguments:
        raise InvalidInputError("recall: to_seq needs from_seq")
    if len(given) != 1:
        raise InvalidInputError(
            "recall takes exactly one of from_seq (with to_seq), query, blob_id or cursor"
            + (f"; got {', '.join(given)}" if given else "")
        )
    mode = given[0]
    if mode == "from_seq":
        first = _whole(arguments["from_seq"], "from_seq")
        last = _whole(arguments.get("to_seq", first), "to_seq")
        if last < first:
            raise InvalidInputError(f"recall: to_seq {last} is before from_seq {first}")
        return RangeRequest(first, last)
    if mode == "query":
        return SearchRequest(_query(arguments["query"]))
    if mode == "blob_id":
        blob_id = _whole(arguments["blob_id"], "blob_id")
        if blob_id < 1:
            raise InvalidInputError("recall: blob_id must be 1 or more")
        return BlobRequest(blob_id)
    return _cursor(arguments["cursor"])


def _whole(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInputError(f"recall: {what} must be a whole number, got {value!r}")
    if not 0 <= value <= _MAX_INT:
        raise InvalidInputError(f"recall: {what} must be between 0 and {_MAX_INT}, got {value}")
    return value


def _query(value: Any) -> str:
    if not isinstance(value, str):
        raise InvalidInputError(f"recall: query must be a string, got {type_name(value)}")
    if not value.strip():
        raise InvalidInputError("recall: query must not be empty")
    if len(value) > _MAX_QUERY:
        raise InvalidInputError(f"recall: query is longer than {_MAX_QUERY} characters")
    if "\x00" in value:
        raise InvalidInputError("recall: query must not contain NUL characters")
    return value


def _cursor(value: Any) -> RecallRequest:
    match = _CURSOR.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise InvalidInputError(
            f"recall: cursor {value!r} is not one this tool gave (copy it from the last line "
            "of the answer it continues)"
        )
    seq_first, seq_last, seq_offset, blob, blob_offset, skip, query = match.groups()
    if seq_first is not None:
        first, last = _whole(int(seq_first), "cursor"), _whole(int(seq_last), "cursor")
        if last < first:
            raise InvalidInputError(f"recall: cursor {value!r} names an empty range")
        return RangeRequest(first, last, _whole(int(seq_offset), "cursor"))
    if blob is not None:
        return BlobRequest(_whole(int(blob), "cursor"), _whole(int(blob_offset), "cursor"))
    return SearchRequest(_query(query), _whole(int(skip), "cursor"))


def cursor_of(request: RecallRequest) -> str:
    """The cursor that asks for ``request`` (a continuation)."""
    if isinstance(request, RangeRequest):
        return f"seq:{request.first}-{request.last}:{request.offset}"
    if isinstance(request, BlobRequest):
        return f"blob:{request.blob_id}:{request.offset}"
    return f"search:{request.skip}:{request.query}"


# -- rendering ------------------------------------------------------------------------------

Why = Literal["removed", "cleared", "persisted"]
_WHY = {
    "removed": "removed from the context by a compaction",
    "cleared": "cleared from the context by microcompact",
}
_KIND = {"system": "system", "user": "user", "assistant": "assistant", "tool": "tool result"}


@dataclass(frozen=True, slots=True)
class OutOfContext:
    """A message that is not in the context in full, as recall gives it back."""

    seq: int
    why: Why
    label: str  # "[seq 12 · assistant · removed from the context by a compaction"
    body: str  # the original: prose, calls, results, other blocks as JSON


def render(
    fmt: MessageFormat,
    seq: int,
    message: dict[str, Any],
    why: Why,
    blob_ids: Iterable[int] = (),
    call_seqs: Mapping[str, int] | None = None,
) -> OutOfContext:
    """A logged message as recall returns it: a header line and its original content.

    The body holds the message's prose, each tool call (name, id and input as stored JSON),
    each tool result's full text with the seq of the call it answers (``call_seqs``, by
    tool-use id: an id may be used again, so the id alone may not say which call), and any
    other block as its JSON; thinking is left out (with a note), as it never leaves the agent.
    """
    reason = _WHY.get(why)
    if reason is None:
        blobs = ", ".join(str(blob) for blob in sorted(blob_ids))
        reason = (
            f"persisted as blob {blobs}; the context holds a preview"
            if blobs
            else "persisted; the context holds a preview"
        )
    label = f"[seq {seq} · {_KIND[fmt.kind(message)]} · {reason}"
    parts: list[str] = []
    text = fmt.text(message)
    if text:
        parts.append(text)
    for call in fmt.tool_calls(message):
        arguments = call.input if isinstance(call.input, str) else storage_json(call.input)
        parts.append(f"→ tool call {call.name} (id {call.id}): {arguments}")
    for result in fmt.tool_results(message):
        flag = " (error)" if result.is_error else ""
        call_seq = None if call_seqs is None else call_seqs.get(result.tool_use_id)
        answers = "" if call_seq is None else f" (the call at seq {call_seq})"
        parts.append(f"← tool result for {result.tool_use_id}{answers}{flag}:\n{result.text}")
        parts.extend(  # its images and documents, which its text leaves out
            f"[{media.kind}: {media.label()}; not shown as text]"
            for media in map(describe, media_blocks(result.blocks))
            if media is not None
        )
    if (media := describe(message)) is not None:  # an item that is an image it generated
        parts.append(f"[generated {media.kind}: {media.label()}; not shown as text]")
    thinking = fmt.thinking_count(message)
    for block in content_blocks(message):
        kind = block.get("type")
        if kind in fmt.thinking_block_types:
            continue
        if (media := describe(block)) is not None:
            parts.append(f"[{media.kind}: {media.label()}; not shown as text]")
        elif kind not in fmt.read_block_types:
            parts.append(f"[{kind} block] {storage_json(block)}")
    if thinking:
        parts.append(f"({thinking} thinking block{'s' if thinking > 1 else ''} left out)")
    return OutOfContext(seq, why, label, "\n".join(parts))


def search_hit(item: OutOfContext, query: str) -> str | None:
    """The hit line of a message whose text holds ``query`` (any case), else None."""
    match = re.search(re.escape(query), item.body, re.IGNORECASE)
    if match is None:
        return None
    lead = max(0, (SNIPPET_CHARS - len(match.group(0))) // 3)
    start = max(0, match.start() - lead)
    snippet = item.body[start : start + SNIPPET_CHARS]
    shown = " ".join(snippet.split())
    before = "…" if start > 0 else ""
    after = "…" if start + SNIPPET_CHARS < len(item.body) else ""
    return f"- seq {item.seq} ({item.why}): {before}{shown}{after}"


# -- paging ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Part:
    """One piece of an answer: an opening line and a body that may be cut."""

    opening: str  # the header line (with its newline), or a whole search hit
    body: str
    resume: Callable[[int], RecallRequest]  # the request that continues at body offset n
    separator: str = "\n\n"  # before the next part
    whole: bool = False  # never cut inside (a search hit)


def _more_line(cap: int, request: RecallRequest) -> str:
    cursor = json.dumps({"cursor": cursor_of(request)}, ensure_ascii=False)
    return f"[cut at the recall limit of {cap} tokens; call recall with {cursor} for the rest]"


def _fit(text: str, room: int, count: TokenCounter) -> int:
    """The length of the longest prefix of ``text`` that counts at most ``room`` tokens."""
    if room <= 0:
        return 0
    low, high = 0, min(len(text), room * 16)
    if count(text[:high]) <= room:
        return high
    while low < high - 1:
        middle = (low + high) // 2
        if count(text[:middle]) <= room:
            low = middle
        else:
            high = middle
    return low


def _page(parts: Iterable[_Part], count: TokenCounter, cap: int, lead: str = "") -> str:
    """``lead``, then the parts that fit in ``cap`` tokens, the last one cut if need be and
    followed by a line with the cursor that continues; "" when there are no parts.

    A page that stops between two parts ends without their separator; one that stops inside
    a part continues it on the next page after a "continued" header.
    """
    pending: Iterator[_Part] = iter(parts)
    part = next(pending, None)
    if part is None:
        return ""
    out = [lead]
    used = count(lead)
    separator = ""  # the separator the last part written ends with
    while part is not None:
        following = next(pending, None)
        after = "" if following is None else part.separator
        cost = count(part.opening) + count(part.body) + count(after)
        if following is None and used + cost <= cap:
            out.append(part.opening + part.body)
            break
        reserve = count("\n" + _more_line(cap, part.resume(len(part.body))))
        if used + cost + reserve <= cap:
            out.append(part.opening + part.body + after)
            used, separator, part = used + cost, after, following
            continue
        # Cut here: as much of this part as fits, then the cursor that continues.
        first = len(out) == 1  # nothing given yet: give something, so an answer moves on
        if part.whole:
            shown = len(part.body) if first else -1
        else:
            room = cap - used - reserve - count(part.opening)
            shown = _fit(part.body, room, count)
            if first and shown == 0:
                shown = min(len(part.body), 1)
        more: RecallRequest
        if shown < 0 or (shown == 0 and part.body):
            out[-1] = out[-1][: len(out[-1]) - len(separator)]
            more = part.resume(0)
        elif shown >= len(part.body):
            out.append(part.opening + part.body)
            if following is None:
                break
            more = following.resume(0)
        else:
            out.append(part.opening + part.body[:shown])
            more = part.resume(shown)
        out.append("\n" + _more_line(cap, more))
        break
    return "".join(out)


def answer_range(
    request: RangeRequest,
    items: Iterable[OutOfContext],
    count: TokenCounter,
    cap: int,
) -> str:
    """The originals of ``items`` (the out-of-context messages of the range, from the
    request's first seq on, in seq order), paged at ``cap`` tokens."""

    def part(item: OutOfContext) -> _Part:
        offset = request.offset if item.seq == request.first else 0
        note = f" · continued from character {offset}" if offset else ""
        return _Part(
            f"{item.label}{note}]\n",
            item.body[offset:],
            lambda n: RangeRequest(item.seq, request.last, offset + n),
        )

    answer = _page((part(item) for item in items), count, cap)
    if answer:
        return answer
    span = (
        f"seq {request.first}"
        if request.first == request.last
        else f"seqs {request.first}–{request.last}"
    )
    return f"Nothing to recall in {span}: those messages are in the context in full."


def answer_search(
    request: SearchRequest,
    items: Iterable[OutOfContext],
    count: TokenCounter,
    cap: int,
) -> str:
    """Hits of the query in ``items`` (out-of-context messages, newest first): at most
    MAX_HITS, from the request's ``skip`` on, paged at ``cap`` tokens."""
    hits: list[str] = []
    for item in items:
        hit = search_hit(item, request.query)
        if hit is not None:
            hits.append(hit)
            if len(hits) > MAX_HITS:
                break
    more = len(hits) > MAX_HITS
    hits = hits[:MAX_HITS]
    quoted = json.dumps(request.query, ensure_ascii=False)
    if not hits:
        return (
            f"No match for {quoted} in what is out of the context (messages in the context "
            "in full are not searched)."
        )
    if request.skip >= len(hits):
        return f"No more hits for {quoted}."
    shown = f"the first {MAX_HITS} hits" if more else f"{len(hits)} hit{'s' * (len(hits) > 1)}"
    lead = (
        f"Search {quoted}: {shown}, newest first; fetch a message whole with "
        '{"from_seq": n, "to_seq": n}.\n'
        if request.skip == 0
        else ""
    )

    def hit_part(index: int, line: str) -> _Part:
        return _Part(
            line, "", lambda n: SearchRequest(request.query, index), separator="\n", whole=True
        )

    parts = [hit_part(index, line) for index, line in enumerate(hits) if index >= request.skip]
    return _page(parts, count, cap, lead)


def answer_blob(
    request: BlobRequest,
    seq: int,
    tool_name: str | None,
    content: str,
    count: TokenCounter,
    cap: int,
) -> str:
    """A persisted tool result (or with ``tool_name`` None, a user message's media), from
    the request's offset on, paged at ``cap`` tokens."""
    note = f" · continued from character {request.offset}" if request.offset else ""
    what = (
        f"tool result of seq {seq} ({tool_name})"
        if tool_name is not None
        else (f"media of the user message at seq {seq}")
    )
    header = f"[blob {request.blob_id} · {what} · {len(content)} characters{note}]\n"
    offset = request.offset
    part = _Part(header, content[offset:], lambda n: BlobRequest(request.blob_id, offset + n))
    return _page([part], count, cap)
