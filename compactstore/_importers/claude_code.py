"""Claude Code transcript JSONL → ``anthropic`` messages.

Claude Code writes one record per content block: the blocks of one API response share
``message.id`` and, for parallel tool calls, the tool results are written between them. The
API saw one assistant message followed by the results, so the blocks are grouped back into
one message, which keeps the position of its first block; the results written in between
already follow it.

Kept: user and assistant records of the main conversation (with their timestamps),
``isMeta`` records (Claude Code sends them to the model), and compactions: a
``compact_boundary`` system record becomes an imported boundary whose summary is the
``isCompactSummary`` user record that follows it; the messages before it stay in the log.
A newer boundary that keeps the last messages before it (``compactMetadata``'s
``preservedSegment``, from ``headUuid`` to the boundary) cuts before them instead: they
stay in the context after the summary, as they did for the model.

Queued user messages: what the user types while the agent works is written as a
``queue-operation`` ``enqueue`` record (its ``content`` the text; newer versions write a
``queued_command`` attachment, its ``prompt`` the text) and reaches the model during
the running turn without a user record of its own; Claude Code's own summary lists these
among the user's messages. Each becomes a user message, placed where the model could next see
it without coming between a tool call and its result: just before the next assistant
message, user message or compaction (or at the end). One whose text a later user record
repeats (delivered the ordinary way once the agent was idle) is left to that record. A
background task's notice queued the same way (a JSON object with its ``task_id``) is the
client's, not typed: it is left out.

Server tools whose result block the Messages API does not take back (the beta ``advisor``
tool's encrypted ``advisor_tool_result``): the call and its result become one short text note.

Subagents: what a ``Task`` (or ``Agent``) tool call's subagent did is not part of the
conversation that made the call (the call's result, the subagent's answer, is). Claude Code
keeps it as sidechain records (``isSidechain: true``, with the subagent's ``agentId``) in the
same file, as ``agent_progress`` progress records (``data.agentId``, ``data.message`` a user or
assistant record, ``parentToolUseID`` the call) in the same file, or (newer versions) in a
file of its own, ``<session>/subagents/agent-<agentId>.jsonl``. ``claude_records.subagents``
lists the subagents a transcript holds and the call that started each (the call's result
names the ``agentId`` in its ``toolUseResult``); ``convert(..., agent=ID)`` converts one subagent's
records as a conversation of its own.

Dropped: records that are not conversation (progress, file-history-snapshot, attachments,
other queue operations, legacy summary, other system records), sidechain records (subagent
traffic, unless the whole file is a sidechain, as a subagent's own transcript is),
synthetic API-error messages, whitespace-only text blocks (the API refuses them), thinking
blocks without their signature, repeated records and blocks, and tool results whose call
is unknown, already answered, or was compacted away — the store would refuse those.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from compactstore._importers.builder import Item, TranscriptBuilder, parse_timestamp
from compactstore._importers.claude_records import agent_records
from compactstore._importers.files import Progress, TranscriptFile
from compactstore._ledger import CallUsage, claude_code_usage
from compactstore.errors import InvalidInputError, InvalidMessageError
from compactstore.formats import get_format
from compactstore.formats.block_types import (
    NO_EXTENSION,
    BlockTypeExtension,
    allowed_block_types,
)
from compactstore.models import CompactTrigger, ImportedBoundary

__all__ = ["READ_TOOLS", "WRITE_TOOLS", "convert"]

READ_TOOLS = frozenset({"Read"})
WRITE_TOOLS = frozenset({"Write", "Edit", "MultiEdit", "NotebookEdit"})

_FORMAT = get_format("anthropic")
_TRIGGERS = {"auto": CompactTrigger.AUTO, "manual": CompactTrigger.MANUAL}


@dataclass
class _Call:
    index: int  # message index of the assistant message making the call
    read_path: str | None  # the file a read tool reads (only that is kept of the input)
    epoch: int  # how many boundaries preceded the call


@dataclass
class _Boundary:
    where: str
    first_kept_index: int
    trigger: CompactTrigger
    tokens_before: int | None
    timestamp: float | None
    summary: str | None = None


@dataclass
class _State:
    out: TranscriptBuilder
    extension: BlockTypeExtension = field(default_factory=dict)
    calls: dict[str, _Call] = field(default_factory=dict)
    answered: set[str] = field(default_factory=set)
    seen_uuids: set[str] = field(default_factory=set)
    epoch: int = 0
    # The API message being grouped: its message.id and index (None until a block is kept).
    group_id: str | None = None
    group_index: int | None = None
    boundary: _Boundary | None = None  # waiting for its summary record
    # Queued user messages not yet placed: (text, timestamp, where), and the texts of the
    # user records of the file (a queued message they repeat is delivered by them).
    queued: list[tuple[str, float | None, str]] = field(default_factory=list)
    user_texts: set[str] = field(default_factory=set)
    # Newer compactions keep the last messages before them (compactMetadata's
    # preservedSegment): the first record of each kept segment, and where the segment
    # seen last starts (its uuid and message index), held until its boundary comes.
    preserved_heads: set[str] = field(default_factory=set)
    preserved: tuple[str, int] | None = None


def convert(
    file: TranscriptFile,
    progress: Progress | None = None,
    extension: BlockTypeExtension = NO_EXTENSION,
    agent: str | None = None,
) -> Iterator[Item]:
    """Convert a Claude Code transcript (see the module docstring for what is kept); with
    ``agent``, the records of that subagent of it instead."""
    state = _State(TranscriptBuilder(file.name, "claude-code", "anthropic", extension), extension)
    main_only = _scan(state, file, agent)
    for number, record in agent_records(file, progress, agent):
        queued = _queued(record)
        if queued is not None:
            if queued not in state.user_texts and all(q[0] != queued for q in state.queued):
                state.queued.append(
                    (queued, parse_timestamp(record.get("timestamp")), f"line {number}")
                )
            continue
        if not _is_conversation(state.out, number, record):
            continue
        if main_only and record.get("isSidechain"):
            continue
        if file.cwd is None and isinstance(record.get("cwd"), str) and record["cwd"].strip():
            file.cwd = record["cwd"]  # the session's working directory (every record has it)
        _record(state, f"line {number}", record)
        state.out.release(_held_from(state))
        yield from state.out.drain()
    _flush_boundary(state)
    _place_queued(state)
    yield from state.out.finish()


def _scan(state: _State, file: TranscriptFile, agent: str | None) -> bool:
    """A first pass: the user texts and preserved segments' first records; returns whether
    the sidechain records are left out (the file shows a main-conversation record: a
    subagent's own transcript is all sidechain, and then the sidechain is the conversation)."""
    main_only = False
    for number, record in agent_records(file, None, agent):
        if _is_conversation(state.out, number, record):
            main_only = main_only or not record.get("isSidechain")
            if record["type"] == "user":
                state.user_texts.add(_text(record["message"]["content"]).strip())
            head = _preserved_head(record)
            if head is not None:
                state.preserved_heads.add(head)
    return main_only


def _record(state: _State, where: str, record: dict[str, Any]) -> None:
    """One conversation record: queued messages placed before it, repeats skipped."""
    if state.queued and _opens_a_turn(state, record):
        _place_queued(state)
    uuid = record.get("uuid")
    if isinstance(uuid, str):
        if uuid in state.seen_uuids:
            return  # written twice (resumed sessions repeat records)
        state.seen_uuids.add(uuid)
    before = state.out.count
    if record.get("type") == "system":
        _boundary(state, where, record)
    elif record["type"] == "assistant":
        _assistant(state, where, record)
    else:
        _user(state, where, record)
    if isinstance(uuid, str) and uuid in state.preserved_heads:
        grouped = record["type"] == "assistant" and state.out.count == before
        start = state.group_index if grouped and state.group_index is not None else before
        state.preserved = (uuid, start)


def _queued(record: dict[str, Any]) -> str | None:
    """The text of a user message queued while the agent worked, else None: a
    ``queue-operation`` ``enqueue`` record, or (newer Claude Code) a ``queued_command``
    attachment typed by a person (``origin.kind`` ``human``, when given)."""
    if record.get("type") == "queue-operation" and record.get("operation") == "enqueue":
        text = record.get("content")
    elif record.get("type") == "attachment" and isinstance(record.get("attachment"), dict):
        attachment = record["attachment"]
        origin = attachment.get("origin")
        kind = origin.get("kind") if isinstance(origin, dict) else None
        if attachment.get("type") != "queued_command" or kind not in (None, "human"):
            return None
        text = attachment.get("prompt")
    else:
        return None
    if not isinstance(text, str) or not text.strip() or _task_notice(text):
        return None
    return text.strip()


def _task_notice(text: str) -> bool:
    """A background task's notice the client queues (``{"task_id": …, "task_type": …}``)."""
    if not text.lstrip().startswith("{"):
        return False
    try:
        value = json.loads(text)
    except ValueError:
        return False
    return isinstance(value, dict) and "task_id" in value


def _opens_a_turn(state: _State, record: dict[str, Any]) -> bool:
    """Whether a message may go before this record: a compaction, a new assistant message
    (not another block of the one being grouped), or a user record that is not a tool
    result or a compaction's summary."""
    kind = record.get("type")
    if kind == "system":
        return True
    message = record["message"]
    if kind == "assistant":
        return record.get("isApiErrorMessage") is not True and (
            message.get("id") is None or message.get("id") != state.group_id
        )
    content = message["content"]
    results = isinstance(content, list) and any(b.get("type") == "tool_result" for b in content)
    return not results and not record.get("isCompactSummary")


def _place_queued(state: _State) -> None:
    queued, state.queued = state.queued, []
    for text, timestamp, where in queued:
        state.out.add({"role": "user", "content": text}, where=where, timestamp=timestamp)
    if queued:
        state.group_id = state.group_index = None


def _held_from(state: _State) -> int | None:
    """The first message the records to come may still change: the API message being
    grouped, and what follows a boundary waiting for its summary."""
    held = [] if state.group_index is None else [state.group_index]
    if state.boundary is not None:
        held.append(state.boundary.first_kept_index)
    if state.preserved is not None:
        held.append(state.preserved[1])
    return min(held, default=None)


def _is_conversation(out: TranscriptBuilder, number: int, record: dict[str, Any]) -> bool:
    """User and assistant records and compact boundaries; checks their shape."""
    kind = record.get("type")
    if kind == "system":
        return record.get("subtype") == "compact_boundary"
    if kind not in ("user", "assistant"):
        return False
    message = record.get("message")
    where = f"line {number}"
    if not isinstance(message, dict):
        raise out.error(where, f"a {kind} record needs a 'message' object")
    content = message.get("content")
    if not isinstance(content, str | list):
        raise out.error(where, f"{kind} record: message 'content' must be a string or a list")
    if isinstance(content, list) and not all(isinstance(block, dict) for block in content):
        raise out.error(where, f"{kind} record: every content block must be an object")
    return True


# -- records ------------------------------------------------------------------------------


def _boundary(state: _State, where: str, record: dict[str, Any]) -> None:
    _flush_boundary(state)
    meta = record.get("compactMetadata")
    meta = meta if isinstance(meta, dict) else {}
    pre = meta.get("preTokens")
    start = _preserved_start(state, record)
    state.boundary = _Boundary(
        where=where,
        first_kept_index=start,
        trigger=_TRIGGERS.get(str(meta.get("trigger")), CompactTrigger.AUTO),
        tokens_before=pre if isinstance(pre, int) and not isinstance(pre, bool) else None,
        timestamp=parse_timestamp(record.get("timestamp")),
    )
    state.epoch += 1
    for call in state.calls.values():
        if call.index >= start:
            call.epoch = state.epoch  # preserved: its result may still come
    state.group_id = state.group_index = None


def _preserved_head(record: dict[str, Any]) -> str | None:
    """The uuid of the first record a compact boundary keeps (newer Claude Code)."""
    meta = record.get("compactMetadata") if record.get("type") == "system" else None
    segment = meta.get("preservedSegment") if isinstance(meta, dict) else None
    head = segment.get("headUuid") if isinstance(segment, dict) else None
    return head if isinstance(head, str) and head else None


def _preserved_start(state: _State, record: dict[str, Any]) -> int:
    """Where the boundary cuts: before the segment it preserved, when that segment is
    the messages just before it, starts after the previous boundary and answers no call
    made before it; else after everything so far."""
    preserved, state.preserved = state.preserved, None
    end = state.out.count
    if preserved is None or preserved[0] != _preserved_head(record):
        return end
    start = preserved[1]
    floor = state.out.released
    if not floor <= start < end or start == 0:
        return end
    for index in range(start, end):
        for result in _FORMAT.tool_results(state.out.entry(index).message):
            call = state.calls.get(result.tool_use_id)
            if call is None or call.index < start:
                return end
    return start


def _flush_boundary(state: _State) -> None:
    """Record the pending boundary, now that its summary (if any) has been read."""
    pending, state.boundary = state.boundary, None
    if pending is None:
        return
    summary = pending.summary
    if summary is None:
        summary = "[Conversation compacted: the transcript holds no summary of what came before]"
    if pending.first_kept_index == 0:
        # Nothing before it to summarise (a transcript resumed from a compacted one): the
        # summary, if there is one, is simply the first thing the model saw.
        if pending.summary is not None:
            state.out.add(
                {"role": "user", "content": summary},
                where=pending.where,
                timestamp=pending.timestamp,
            )
        return
    state.out.add_boundary(
        ImportedBoundary(
            first_kept_index=pending.first_kept_index,
            summary_text=summary,
            trigger=pending.trigger,
            tokens_before=pending.tokens_before,
            timestamp=pending.timestamp,
        ),
        where=pending.where,
    )


def _assistant(state: _State, where: str, record: dict[str, Any]) -> None:
    if record.get("isApiErrorMessage"):
        return  # Claude Code's own error notice, never sent to the model
    _flush_boundary(state)
    message = record["message"]
    message_id = message.get("id") if isinstance(message.get("id"), str) else None
    blocks = [b for b in _blocks(message["content"]) if _keep_assistant_block(state, b)]
    same = message_id is not None and message_id == state.group_id
    earlier: list[dict[str, Any]] = []
    if same and state.group_index is not None:
        earlier = state.out.entry(state.group_index).message["content"]
    blocks = _fold_server_results(state, blocks, earlier)
    _check(state, where, "assistant", blocks)
    if not same:
        state.group_id, state.group_index = message_id, None
    try:
        ledger = claude_code_usage(message)
    except InvalidInputError as exc:
        raise state.out.error(where, str(exc)) from None
    if not blocks:
        if state.group_index is not None and ledger is not None:
            # The API message's usage is repeated on each of its records, the output count
            # growing as it streamed: the last record's is the call's.
            state.out.entry(state.group_index).ledger = ledger
        return
    index = _add_assistant(state, where, record, blocks, ledger)
    if message_id is None:
        state.group_index = None
    for block in blocks:
        if block.get("type") == "tool_use":
            tool_input = block.get("input")
            path = tool_input.get("file_path") if isinstance(tool_input, dict) else None
            read = str(block.get("name")) in READ_TOOLS and isinstance(path, str) and path
            state.calls[block["id"]] = _Call(index, path if read else None, state.epoch)


def _add_assistant(
    state: _State,
    where: str,
    record: dict[str, Any],
    blocks: list[dict[str, Any]],
    ledger: CallUsage | None,
) -> int:
    """Add an assistant record's blocks: a new message, or more of the API message being
    grouped (its usage and ledger completed); returns the message's index."""
    message = record["message"]
    writes = _write_paths(blocks)
    if state.group_index is None:
        state.group_index = state.out.add(
            {"role": "assistant", "content": blocks},
            where=where,
            timestamp=parse_timestamp(record.get("timestamp")),
            usage=_usage(message.get("usage")),
            write_paths=writes,
            ledger=ledger,
        )
        return state.group_index
    entry = state.out.entry(state.group_index)
    entry.message["content"].extend(blocks)
    entry.write_paths.extend(p for p in writes if p not in entry.write_paths)
    if entry.usage is None:
        entry.usage = _usage(message.get("usage"))
    if ledger is not None:
        entry.ledger = ledger
    return state.group_index


def _user(state: _State, where: str, record: dict[str, Any]) -> None:
    content = record["message"]["content"]
    timestamp = parse_timestamp(record.get("timestamp"))
    if record.get("isCompactSummary") and state.boundary is not None:
        state.boundary.summary = _text(content)
        state.boundary.timestamp = state.boundary.timestamp or timestamp
        _flush_boundary(state)
        return
    # A pending boundary stays open: its summary may follow other user records (hooks).
    if isinstance(content, str):
        if content.strip():
            state.out.add({"role": "user", "content": content}, where=where, timestamp=timestamp)
        return
    kept: list[dict[str, Any]] = []
    reads: list[str | None] = []
    for block in content:
        kind = block.get("type")
        if kind == "tool_result" and isinstance(block.get("tool_use_id"), str):
            call = _result_call(state, block)
            if call is None:
                continue
            reads.append(_read_path(call, block))
        elif kind == "text" and not str(block.get("text", "")).strip():
            continue
        kept.append(block)
    if not kept:
        return
    kept = state.out.note_media(where, {"role": "user", "content": kept})["content"]
    _check(state, where, "user", kept)
    # A read path belongs to a message that carries exactly one result: that read's.
    read_path = reads[0] if len(reads) == 1 and len(kept) == 1 else None
    state.out.add(
        {"role": "user", "content": kept}, where=where, timestamp=timestamp, read_path=read_path
    )


# -- blocks -------------------------------------------------------------------------------


def _blocks(content: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return list(content)


def _keep_assistant_block(state: _State, block: dict[str, Any]) -> bool:
    kind = block.get("type")
    if kind == "text":
        return bool(str(block.get("text", "")).strip())
    if kind == "tool_use":
        # A repeated block (same id) is the same call written twice; a block without a
        # string id is kept so that the shape check refuses it, naming the line.
        call_id = block.get("id")
        return not isinstance(call_id, str) or call_id not in state.calls
    if kind == "thinking":
        # The API takes a thinking block back only with its signature.
        return (
            isinstance(block.get("thinking"), str)
            and isinstance(block.get("signature"), str)
            and bool(block["signature"])
            and _valid(block)
        )
    if kind == "redacted_thinking":
        return isinstance(block.get("data"), str) and _valid(block)
    return True


def _fold_server_results(
    state: _State, blocks: list[dict[str, Any]], earlier: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """``blocks`` without the server tool results the Messages API does not take back (a
    beta tool's, such as the ``advisor``'s encrypted advice; ``allow_block_types=`` keeps
    them). The ``server_tool_use`` block of each, in ``blocks`` or in ``earlier`` (the
    blocks already kept of the same API message), becomes a short text note: left alone, the
    call would stand unanswered, which the API refuses."""
    allowed = allowed_block_types("anthropic", "assistant", state.extension)
    kept: list[dict[str, Any]] = []
    for block in blocks:
        kind = block.get("type")
        if not (isinstance(kind, str) and kind.endswith("_tool_result")) or kind in allowed:
            kept.append(block)
            continue
        for owner in (kept, earlier):
            for position, call in enumerate(owner):
                if call.get("type") == "server_tool_use" and call.get("id") == block.get(
                    "tool_use_id"
                ):
                    name = call.get("name") if isinstance(call.get("name"), str) else "server tool"
                    note = f"[{name} consulted; its result ({kind}) is not kept]"
                    owner[position] = {"type": "text", "text": note}
    return kept


def _check(state: _State, where: str, role: str, blocks: list[dict[str, Any]]) -> None:
    """Refuse a malformed block at its own line (before it is merged into a message)."""
    try:
        _FORMAT.validate({"role": role, "content": blocks})
    except InvalidMessageError as exc:
        raise state.out.error(where, f"{role} record: {exc}") from None


def _valid(block: dict[str, Any]) -> bool:
    try:
        _FORMAT.validate({"role": "assistant", "content": [block]})
    except InvalidMessageError:
        return False
    return True


def _result_call(state: _State, block: dict[str, Any]) -> _Call | None:
    """The call a tool_result answers, when the store will accept the pair; marks it."""
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str):
        return None
    call = state.calls.get(call_id)
    # Unknown: made in a dropped sidechain; other epoch: compacted away before the result.
    if call is None or call_id in state.answered or call.epoch != state.epoch:
        return None
    state.answered.add(call_id)
    return call


def _read_path(call: _Call, block: dict[str, Any]) -> str | None:
    return None if block.get("is_error") is True else call.read_path


def _write_paths(blocks: list[dict[str, Any]]) -> list[str]:
    paths: list[str] = []
    for block in blocks:
        if block.get("type") != "tool_use" or str(block.get("name")) not in WRITE_TOOLS:
            continue
        tool_input = block.get("input")
        if not isinstance(tool_input, dict):
            continue
        path = tool_input.get("file_path") or tool_input.get("notebook_path")
        if isinstance(path, str) and path and path not in paths:
            paths.append(path)
    return paths


def _usage(usage: Any) -> int | None:
    """The prompt size of the call: uncached, cache-write and cache-read input tokens."""
    if not isinstance(usage, dict):
        return None
    total = 0
    for key in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"):
        value = usage.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            total += value
    # Synthetic messages (model "<synthetic>") report zero: no model call was made.
    return total or None


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(
        block["text"]
        for block in content
        if isinstance(block, dict)
        and block.get("type") == "text"
        and isinstance(block.get("text"), str)
    )
