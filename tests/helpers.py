"""Conversation builders and independent checks shared by the engine, pipeline and property
tests.

The builders spell messages exactly as the documentation describes each format (anthropic, openai,
minicode). The checks read messages themselves — they never ask compactstore how to parse
a message — so a bug in a format adapter cannot hide a bug in the engines.
"""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from compactstore import CompactionConfig, CompactionResult, CompactStore, Session
from compactstore.formats.sdk_types import SDK_FORMATS, check_sdk_types

FORMATS = ("anthropic", "openai", "minicode")
T0 = 1_700_000_000.0  # session creation time used by every test (epoch seconds)
CLEARED = "[Old tool result content cleared by time-based microcompact]"

Message = dict[str, Any]


# The tables of the documentation, which every database must have.
TABLES = {
    "sessions",
    "messages",
    "tool_calls",
    "compactions",
    "compact_boundaries",
    "message_edits",
    "tool_result_blobs",
    "read_dedup_entries",
    "breaker_state",
    "memory_entries",
    "model_calls",
    "compaction_configs",
}


# -- message builders -------------------------------------------------------------------------


def user(text: str) -> Message:
    return {"role": "user", "content": text}


def system(text: str) -> Message:
    """A system message (openai and minicode only: anthropic takes the system prompt apart)."""
    return {"role": "system", "content": text}


def assistant(text: str) -> Message:
    return {"role": "assistant", "content": text}


def call_id(fmt: str, n: int) -> str:
    return f"call_{n:05d}" if fmt == "openai" else f"toolu_{n:05d}"


def calls_message(
    fmt: str, calls: Sequence[tuple[str, str, dict[str, Any]]], text: str | None = None
) -> Message:
    """An assistant message making the given (id, name, input) tool calls."""
    if fmt == "openai":
        return {
            "role": "assistant",
            "content": text,
            "tool_calls": [
                {
                    "id": cid,
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(args, sort_keys=True)},
                }
                for cid, name, args in calls
            ],
        }
    blocks: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    blocks += [
        {"type": "tool_use", "id": cid, "name": name, "input": args} for cid, name, args in calls
    ]
    return {"role": "assistant", "content": blocks}


def call_message(fmt: str, *ids: str, name: str = "read_file") -> Message:
    """An assistant message making one tool call per id, each reading ``<id>.py``."""
    return calls_message(fmt, [(cid, name, {"path": f"{cid}.py"}) for cid in ids])


def result_message(
    fmt: str, tool_use_id: str, content: str, *, name: str = "read_file", is_error: bool = False
) -> Message:
    """A message carrying one tool result (what append_tool_result stores)."""
    if fmt == "anthropic":
        return {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": tool_use_id,
                    "content": content,
                    "is_error": is_error,
                }
            ],
        }
    if fmt == "openai":
        # The API has no error flag: an error is marked by an "Error: " prefix.
        text = f"Error: {content}" if is_error else content
        return {"role": "tool", "tool_call_id": tool_use_id, "content": text}
    return {
        "role": "tool_result",
        "content": content,
        "toolName": name,
        "toolUseId": tool_use_id,
        "isError": is_error,
    }


# -- reading messages (independent of compactstore's adapters) --------------------------------


def _blocks(message: Message) -> list[dict[str, Any]]:
    content = message.get("content")
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def call_ids(fmt: str, message: Message) -> list[str]:
    """Ids of the tool calls an assistant message makes."""
    if message.get("role") != "assistant":
        return []
    if fmt == "openai":
        return [c["id"] for c in message.get("tool_calls") or []]
    return [b["id"] for b in _blocks(message) if b.get("type") == "tool_use"]


def results(fmt: str, message: Message) -> dict[str, str]:
    """Tool-use id -> result text of the tool results a message carries."""
    if fmt == "anthropic":
        if message.get("role") != "user":
            return {}
        out = {}
        for block in _blocks(message):
            if block.get("type") == "tool_result":
                content = block.get("content", "")
                if isinstance(content, list):
                    content = "\n".join(str(b.get("text", "")) for b in content)
                out[block["tool_use_id"]] = content
        return out
    if fmt == "openai":
        if message.get("role") != "tool":
            return {}
        return {message["tool_call_id"]: message["content"]}
    if message.get("role") != "tool_result":
        return {}
    return {message["toolUseId"]: message["content"]}


def text_of(message: Message) -> str:
    """The prose of a message: string content or its text blocks."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            b["text"] for b in content if isinstance(b, dict) and b.get("type") == "text"
        )
    return ""


def result_map(fmt: str, messages: Iterable[Message]) -> dict[str, str]:
    """Every tool result in a list of messages, by tool-use id."""
    out: dict[str, str] = {}
    for message in messages:
        out.update(results(fmt, message))
    return out


def pair_problems(fmt: str, messages: Sequence[Message]) -> list[str]:
    """What would make an API refuse these messages for pairing reasons.

    Calls are keyed by (id, message index): a result answers the newest unanswered call of
    its id before it, and must find one; in openai an id may be used again once its earlier
    call has its result, in the other formats never; every call except those of the last
    assistant message must have a result.
    """
    problems: list[str] = []
    open_calls: dict[str, int] = {}  # id -> index of its unanswered call
    used: set[str] = set()
    last_assistant = max(
        (i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=-1
    )
    for index, message in enumerate(messages):
        for tool_use_id in results(fmt, message):
            if tool_use_id in open_calls:
                del open_calls[tool_use_id]
            elif tool_use_id in used:
                problems.append(f"message {index}: second result for {tool_use_id}")
            else:
                problems.append(f"message {index}: result {tool_use_id} has no earlier call")
        for cid in call_ids(fmt, message):
            if cid in open_calls or (cid in used and fmt != "openai"):
                problems.append(f"message {index}: call {cid} appears twice")
            open_calls[cid] = index
            used.add(cid)
    for cid, index in open_calls.items():
        if index != last_assistant:
            problems.append(f"call {cid} (message {index}) has no result")
    return problems


def validate_with_sdk(fmt: str, messages: list[Message]) -> None:
    """Raise unless the official SDK's request type accepts the messages strictly (anthropic,
    openai, responses): the library's shared helper, no undeclared key, no stray None."""
    if fmt in SDK_FORMATS:
        check_sdk_types(fmt, messages)


def estimate(text: str) -> int:
    """for ASCII text: ceil(characters / 4)."""
    assert text.isascii()
    return math.ceil(len(text) / 4)


def words(n_chars: int, seed: str = "w") -> str:
    """ASCII prose of exactly n_chars characters (so exactly ceil(n/4) tokens)."""
    base = f"{seed} lorem ipsum dolor sit amet consectetur "
    return (base * (n_chars // len(base) + 1))[:n_chars]


# -- a conversation driver ---------------------------------------------------------------------


@dataclass
class Chat:
    """Appends a conversation to a session with a deterministic clock and tool-use ids."""

    sess: Session
    fmt: str
    clock: float = T0
    next_id: int = 0
    pins: list[Message] = field(default_factory=list)

    def tick(self, seconds: float = 1.0) -> float:
        self.clock += seconds
        return self.clock

    def add(self, message: Message, *, pinned: bool = False, dt: float = 1.0) -> int:
        seq = self.sess.append(message, timestamp=self.tick(dt), pinned=pinned)
        if pinned:
            self.pins.append(message)
        return seq

    def extend(self, messages: Sequence[Message]) -> list[int]:
        """Append plain messages in one transaction (no pins, no tool results)."""
        stamps = [self.tick() for _ in messages]
        return self.sess.extend(list(messages), timestamps=stamps)

    def chatter(self, count: int, tag: str = "f", chars: int = 200) -> list[int]:
        """``count`` alternating assistant / user text messages of ``chars`` characters."""
        return self.extend(
            [
                assistant(words(chars, f"{tag}{i}"))
                if i % 2 == 0
                else user(f"{tag}-question {i}: " + words(chars, f"{tag}{i}"))
                for i in range(count)
            ]
        )

    def system(self, text: str) -> int:
        """A leading system message (a pin in openai and minicode)."""
        seq = self.add(system(text))
        self.pins.append(system(text))
        return seq

    def request(self, text: str) -> int:
        """The first user message: the original request, always pinned."""
        seq = self.add(user(text))
        self.pins.append(user(text))
        return seq

    def user(self, text: str, *, pinned: bool = False) -> int:
        return self.add(user(text), pinned=pinned)

    def say(self, text: str) -> int:
        return self.add(assistant(text))

    def new_id(self) -> str:
        self.next_id += 1
        return call_id(self.fmt, self.next_id)

    def calls(
        self, specs: Sequence[tuple[str, dict[str, Any]]], text: str | None = None
    ) -> tuple[int, list[str]]:
        """An assistant message making one call per (name, input); returns (seq, ids)."""
        ids = [self.new_id() for _ in specs]
        message = calls_message(
            self.fmt,
            [(cid, name, args) for cid, (name, args) in zip(ids, specs, strict=True)],
            text,
        )
        return self.add(message), ids

    def result(
        self,
        tool_use_id: str,
        content: str,
        *,
        name: str = "read_file",
        file_path: str | None = None,
        is_error: bool = False,
    ) -> int:
        return self.sess.append_tool_result(
            tool_use_id,
            content,
            tool_name=name,
            file_path=file_path,
            is_error=is_error,
            timestamp=self.tick(),
        )

    def tool_turns(
        self, turns: Sequence[tuple[str, dict[str, Any], str, bool]]
    ) -> list[tuple[int, int, str]]:
        """(name, input, result content, is_error) turns appended in one transaction.

        Each turn is a call message followed by its result message; returns
        (call seq, result seq, id) per turn.
        """
        messages: list[Message] = []
        ids: list[str] = []
        for name, args, content, is_error in turns:
            tool_use_id = self.new_id()
            ids.append(tool_use_id)
            messages.append(calls_message(self.fmt, [(tool_use_id, name, args)]))
            messages.append(
                result_message(self.fmt, tool_use_id, content, name=name, is_error=is_error)
            )
        seqs = self.extend(messages)
        return [(seqs[2 * i], seqs[2 * i + 1], ids[i]) for i in range(len(turns))]

    def tool(
        self,
        content: str,
        *,
        name: str = "read_file",
        args: dict[str, Any] | None = None,
        is_error: bool = False,
    ) -> tuple[int, int, str]:
        """One tool call and its result; returns (call seq, result seq, id)."""
        seq, (tool_use_id,) = self.calls([(name, args if args is not None else {"q": "x"})])
        rseq = self.result(tool_use_id, content, name=name, is_error=is_error)
        return seq, rseq, tool_use_id


# -- conversations that give every stage something to do ---------------------------------------

HOUR = 3_600


def busy_log(chat: Chat) -> None:
    """Big results (for the budget), 8 small ones (for microcompact), and lots of talk."""
    if chat.fmt != "anthropic":
        chat.system("You are a build engineer.")
    chat.request("Get the nightly build green again")
    chat.tool_turns(
        [
            ("read_file", {"file_path": f"ci/step{i}.yml"}, words(800, f"s{i}"), False)
            for i in range(8)
        ]
        + [("bash", {"command": f"make {t}"}, words(5_000, t), False) for t in ("lint", "test")]
    )
    chat.chatter(40, chars=1_600)  # 40 x ~400 tokens


def every_stage(chat: Chat) -> Iterator[CompactionResult | None]:
    """Run each kind of compaction in turn, adding conversation where a stage needs it."""
    sess = chat.sess
    yield sess.process_request(now=T0 + 10, enable_microcompact=False, enable_auto_compact=False)
    yield sess.process_request(now=T0 + HOUR, enable_auto_compact=False)
    yield sess.process_request(now=T0 + HOUR + 1)  # no memory yet: full compact
    sess.remember("user_intent", "A green nightly build")
    chat.chatter(60, tag="more", chars=1_600)
    yield sess.process_request(now=T0 + HOUR + 2)  # session memory
    for attempt in (1, 2, 3):
        chat.chatter(150 if attempt == 1 else 60, tag=f"r{attempt}", chars=1_600)
        yield sess.reactive_recover("prompt is too long", now=T0 + HOUR + 2 + attempt)
    chat.chatter(30, tag="late", chars=400)
    yield sess.compact(now=T0 + HOUR + 10)
    chat.chatter(10, tag="last", chars=400)
    yield sess.compact(up_to_seq=len(sess.messages()) - 4, now=T0 + HOUR + 11)


def plain(**kwargs: Any) -> CompactionConfig:
    """A config with the article's plain estimate (token_factor 1.0, not the calibrated
    default), so a test's token arithmetic is exact: usage = sum of ceil(chars / 4).
    Calibration itself is test_store.py's subject."""
    return CompactionConfig(token_factor=1.0, **kwargs)


def new_session(
    store: CompactStore, fmt: str = "anthropic", *, sid: str = "s", **kwargs: Any
) -> Chat:
    """A session created at T0 (plain token estimate unless a config is given)."""
    kwargs.setdefault("context_window", 200_000)
    kwargs.setdefault("config", plain())
    sess = store.session(sid, format=fmt, now=T0, **kwargs)
    return Chat(sess, fmt)


@contextmanager
def opened(db: str | Path, **kwargs: Any) -> Iterator[CompactStore]:
    """CompactStore.open(...) closed on exit."""
    store = CompactStore.open(str(db), **kwargs)
    try:
        yield store
    finally:
        store.close()


@contextmanager
def scratch_store(**kwargs: Any) -> Iterator[CompactStore]:
    """A store on a fresh temporary SQLite file (hypothesis examples, twin stores)."""
    with tempfile.TemporaryDirectory() as tmp, opened(Path(tmp) / "scratch.db", **kwargs) as s:
        yield s


def context_seqs(sess: Session) -> list[int]:
    """Log seqs of the messages in the active context (summaries and synthetic left out)."""
    return [item.seq for item in sess.context().items if item.seq is not None]


def check_recorded(sess: Session, result: CompactionResult) -> None:
    """A recorded compaction's numbers agree with the context it left."""
    assert result.id is not None
    stored = sess.compactions()[-1]
    assert stored.id == result.id
    assert stored.steps, "a recorded compaction lists its steps"
    assert stored.tokens_after == result.tokens_after == sess.token_usage()
    assert stored.tokens_freed == stored.tokens_before - stored.tokens_after
    seqs = set(context_seqs(sess))
    assert not seqs & set(stored.removed_seqs), "removed seqs left the active context"
    if stored.boundary is not None:
        assert stored.boundary.messages_removed == len(stored.removed_seqs)
        assert stored.boundary.tokens_after == stored.tokens_after
        segment = stored.boundary.preserved_segment
        if segment is not None:
            first, last = segment
            assert set(range(first, last + 1)) <= seqs
        else:
            assert not [i for i in sess.context().kept if i.seq is not None]
    for blob_id in stored.blob_ids:
        assert sess.get_blob(blob_id)  # every blob created is readable


def cli_summarizer(messages: list[Message], previous: str | None, instructions: str | None) -> str:
    """A summarizer the CLI tests name as ``tests.helpers:cli_summarizer``."""
    return "resummarized by the CLI test"


def per_seq(sess: Session) -> list[Message]:
    """The active context one message per seq (``context().items``) as plain dicts: what
    ``active_context()`` is before its wire view merges anthropic tool results."""
    return sess.context().messages()


def migrate_to(url: str, target: str, *, down: bool) -> None:
    """Alembic to revision ``target`` on its own connection, as `compactstore db upgrade`
    runs it (``down``: a downgrade)."""
    from alembic import command
    from sqlalchemy import create_engine

    from compactstore.db.migrate import alembic_config

    engine = create_engine(url if "://" in url else f"sqlite:///{url}")
    try:
        with engine.begin() as connection:
            config = alembic_config()
            config.attributes["connection"] = connection
            (command.downgrade if down else command.upgrade)(config, target)
    finally:
        engine.dispose()


def claude_code_record(
    kind: str, content: Any, *, uuid: str, message_id: str | None = None, **extra: Any
) -> dict[str, Any]:
    """One line of a Claude Code transcript: a ``user`` or ``assistant`` record."""
    message: dict[str, Any] = {"role": kind, "content": content}
    if message_id is not None:
        message["id"] = message_id
    return {
        "type": kind,
        "uuid": uuid,
        "sessionId": "s",
        "isSidechain": False,
        "timestamp": "2026-01-01T00:00:00.000Z",
        "message": message,
        **extra,
    }
