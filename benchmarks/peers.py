"""Stores under benchmark, behind one small interface.

Every adapter persists the new messages of a step and returns the context for the next
model call:

    adapter.open(path)                      # a new store file
    native = adapter.prepare(step)          # untimed conversion into the store's own types
    context = adapter.step(native)          # timed: persist + build the next context
    context = adapter.resume(path)          # a fresh object reopening the file
    adapter.close()

``floor``, ``openai_agents`` and ``langgraph`` return the plain trimmed context: the system
message plus the longest suffix of the history that fits BUDGET estimated tokens
(``ceil(len(json.dumps(message)) / 4)``), never starting on a tool result. ``compactstore``
returns its compacted context, checked for validity instead of equality.

Peer packages are imported only when their adapter is opened; a missing package raises
:class:`Unavailable` with the pip line that installs it.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, cast

if TYPE_CHECKING:  # the bench extra; imported for real only where a peer runs
    from langchain_core.runnables import RunnableConfig

from benchmarks.scenario import Step, estimate, is_tool_result

__all__ = [
    "ADAPTERS",
    "BUDGET",
    "Adapter",
    "Unavailable",
    "reference_context",
]

BUDGET = 170_000
SESSION = "bench"

# The peers' pinned versions (the `bench` extra): what the published peer results used.
PEER_REQUIREMENTS = {
    "openai_agents": ["openai-agents==0.24.0"],
    "langgraph": [
        "langgraph==1.2.24",
        "langgraph-checkpoint-sqlite==3.1.2",
        "langchain-core==1.8.3",
    ],
}


class Unavailable(RuntimeError):
    """The adapter's package is not installed in this interpreter."""


def reference_context(
    messages: Sequence[Any],
    tokens: Callable[[int], int],
    is_result: Callable[[Any], bool] = is_tool_result,
    budget: int = BUDGET,
) -> list[Any]:
    """messages[0] (the system prompt) plus the longest suffix of the rest that fits the
    budget with it, minus leading tool results (their calls were cut off)."""
    if not messages:
        return []
    room = budget - tokens(0)
    start = len(messages)
    while start > 1 and tokens(start - 1) <= room:
        room -= tokens(start - 1)
        start -= 1
    while start < len(messages) and is_result(messages[start]):
        start += 1
    return [messages[0], *messages[start:]]


class Adapter:
    """Base class: see the module docstring."""

    name: ClassVar[str] = "base"
    durability: ClassVar[str] = ""
    modules: ClassVar[tuple[str, ...]] = ()  # imported before the memory baseline

    def __init__(self) -> None:
        # Phase durations (ns) of the last step, named by the adapter.
        self.phases: dict[str, int] = {}

    def preload(self) -> None:
        import importlib

        for module in self.modules:
            try:
                importlib.import_module(module)
            except ImportError as exc:
                pins = " ".join(PEER_REQUIREMENTS.get(self.name, []))
                raise Unavailable(
                    f"{self.name}: {exc}; install the bench extra (pip install {pins})"
                ) from None

    def open(self, path: str) -> None:
        raise NotImplementedError

    def prepare(self, step: Step) -> Any:
        return step

    def step(self, native: Any) -> list[Any]:
        raise NotImplementedError

    def resume(self, path: str) -> list[Any]:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def canonical(self, context: list[Any]) -> list[dict[str, Any]]:
        """The context as Anthropic dicts (for checks and hashes)."""
        return context

    def check(self, context: list[Any], reference: list[dict[str, Any]]) -> bool:
        return self.canonical(context) == reference

    def files(self, path: str) -> list[str]:
        return [p for p in (path, path + "-wal", path + "-shm") if os.path.exists(p)]

    def summary(self, path: str) -> dict[str, Any]:
        """Anything worth reporting about the closed store (compactions, rows, ...)."""
        return {}


class FloorAdapter(Adapter):
    """Raw sqlite3: WAL, synchronous=NORMAL, one table and one unique index. INSERT + COMMIT,
    then the system row and a reverse index scan down to the budget, json.loads per kept row.
    No compaction: the floor of what persisting and returning the context costs."""

    name = "floor"
    durability = "WAL, synchronous=NORMAL (survives a process crash)"

    def open(self, path: str) -> None:
        self.db = sqlite3.connect(path, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS messages (session TEXT NOT NULL, seq INTEGER NOT NULL, "
            "role TEXT NOT NULL, payload TEXT NOT NULL, tokens INTEGER NOT NULL, "
            "created_at REAL NOT NULL)"
        )
        self.db.execute(
            "CREATE UNIQUE INDEX IF NOT EXISTS messages_by_seq ON messages(session, seq)"
        )
        (last,) = self.db.execute(
            "SELECT max(seq) FROM messages WHERE session = ?", (SESSION,)
        ).fetchone()
        self.next_seq = 0 if last is None else last + 1

    def step(self, native: Step) -> list[Any]:
        began = time.perf_counter_ns()
        rows = []
        for message, stamp in zip(native.messages, native.timestamps, strict=True):
            payload = json.dumps(message)
            role = "tool_result" if is_tool_result(message) else message["role"]
            rows.append((SESSION, self.next_seq, role, payload, -(-len(payload) // 4), stamp))
            self.next_seq += 1
        self.db.execute("BEGIN")
        self.db.executemany("INSERT INTO messages VALUES (?, ?, ?, ?, ?, ?)", rows)
        self.db.execute("COMMIT")
        persisted = time.perf_counter_ns()
        context = self._context()
        self.phases = {"persist": persisted - began, "context": time.perf_counter_ns() - persisted}
        return context

    def _context(self) -> list[Any]:
        system = self.db.execute(
            "SELECT payload, tokens FROM messages WHERE session = ? AND seq = 0", (SESSION,)
        ).fetchone()
        if system is None:
            return []
        room = BUDGET - system[1]
        kept: list[tuple[str, str]] = []
        for role, payload, tokens in self.db.execute(
            "SELECT role, payload, tokens FROM messages WHERE session = ? AND seq > 0 "
            "ORDER BY seq DESC",
            (SESSION,),
        ):
            if tokens > room:
                break
            room -= tokens
            kept.append((role, payload))
        while kept and kept[-1][0] == "tool_result":
            kept.pop()
        loads = json.loads
        return [loads(system[0]), *(loads(payload) for _, payload in reversed(kept))]

    def resume(self, path: str) -> list[Any]:
        self.open(path)
        return self._context()

    def close(self) -> None:
        self.db.close()


class CompactstoreAdapter(Adapter):
    """compactstore's public API: ``extend(messages, timestamps=...)`` per step (one
    transaction), ``process_request(now=<newest timestamp>)``, ``active_context()``.

    With ``dedup = True`` (adapter ``compactstore_dedup``) a Read's result goes through
    ``append_tool_result(..., file_path=...)`` instead, so unchanged re-reads are stored as
    stubs, and a Write calls ``invalidate(path)``: up to three transactions per step."""

    name = "compactstore"
    durability = "compactstore defaults on SQLite: WAL, synchronous=NORMAL"
    modules = ("compactstore",)
    window = 200_000
    dedup = False

    def open(self, path: str) -> None:
        from compactstore import CompactStore

        self.store = CompactStore.open(path)
        self.sess: Any = None
        self.compactions: dict[str, int] = {}
        self.compaction_steps: list[int] = []
        self.steps_done = 0

    def step(self, native: Step) -> list[Any]:
        began = time.perf_counter_ns()
        if self.sess is None:
            # The session's clock (microcompact interval) starts at the scenario's time.
            self.sess = self.store.session(
                SESSION, context_window=self.window, format="anthropic", now=native.timestamps[0]
            )
        sess = self.sess
        tool = native.tool
        if self.dedup and tool is not None and tool.file_path is not None:
            sess.extend(native.messages[:1], timestamps=native.timestamps[:1])
            sess.append_tool_result(
                tool.tool_use_id,
                tool.content,
                tool_name=tool.name,
                file_path=tool.file_path,
                is_error=tool.is_error,
                timestamp=native.timestamps[1],
            )
            if len(native.messages) > 2:
                sess.extend(native.messages[2:], timestamps=native.timestamps[2:])
        else:
            sess.extend(native.messages, timestamps=native.timestamps)
            if self.dedup and tool is not None and tool.writes is not None:
                sess.invalidate(tool.writes)
        appended = time.perf_counter_ns()
        result = sess.process_request(now=native.timestamps[-1])
        processed = time.perf_counter_ns()
        context: list[dict[str, Any]] = sess.active_context()
        done = time.perf_counter_ns()
        self.phases = {
            "append": appended - began,
            "process_request": processed - appended,
            "active_context": done - processed,
        }
        if result.success and result.strategy is not None:
            key = str(result.strategy.value)
            self.compactions[key] = self.compactions.get(key, 0) + 1
            self.compaction_steps.append(self.steps_done)
        self.steps_done += 1
        return context

    def resume(self, path: str) -> list[Any]:
        from compactstore import CompactStore

        self.store = CompactStore.open(path)
        self.sess = self.store.get_session(SESSION)
        return list(self.sess.active_context())

    def close(self) -> None:
        self.store.close()

    def check(self, context: list[Any], reference: list[dict[str, Any]]) -> bool:
        """Valid rather than equal: system prompt first, the newest message (or, for a tool
        result, its call id) last, every tool result after its call and every call answered
        but the newest, and under the window by the shared estimate."""
        if not context or not reference or context[0] != reference[0]:
            return False
        if sum(estimate(m) for m in context) > self.window:
            return False
        newest, last = reference[-1], context[-1]
        if is_tool_result(newest):
            ids = [b.get("tool_use_id") for b in last.get("content", []) if isinstance(b, dict)]
            if not is_tool_result(last) or ids != [newest["content"][0]["tool_use_id"]]:
                return False
        elif last != newest:
            return False
        open_calls: list[str] = []
        for message in context:
            content = message.get("content")
            for block in content if isinstance(content, list) else []:
                if block.get("type") == "tool_result":
                    if block.get("tool_use_id") not in open_calls:
                        return False
                    open_calls.remove(block["tool_use_id"])
                elif block.get("type") == "tool_use":
                    open_calls.append(block["id"])
        return not open_calls or (len(open_calls) == 1 and context[-1].get("role") == "assistant")

    def summary(self, path: str) -> dict[str, Any]:
        out: dict[str, Any] = {
            "compactions_by_strategy": self.compactions,
            "compaction_step_indexes": self.compaction_steps,
        }
        try:
            db = sqlite3.connect(path)
            try:
                for table in ("messages", "compactions", "compact_boundaries", "message_edits"):
                    out[f"rows_{table}"] = db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
                out["blob_bytes"] = db.execute(
                    "SELECT coalesce(sum(size), 0) FROM tool_result_blobs"
                ).fetchone()[0]
                out["payload_bytes"] = db.execute(
                    "SELECT coalesce(sum(length(payload)), 0) FROM messages"
                ).fetchone()[0]
            finally:
                db.close()
        except sqlite3.Error as exc:  # a report detail must never lose the measurement
            out["inspect_error"] = repr(exc)
        return out


class CompactstoreDedupAdapter(CompactstoreAdapter):
    name = "compactstore_dedup"
    dedup = True


class OpenAIAgentsAdapter(Adapter):
    """agents.SQLiteSession on a file: add_items(new), get_items() (the whole history),
    then the reference trim in Python with token estimates cached per item index."""

    name = "openai_agents"
    durability = "WAL, SQLite's default synchronous=FULL (fsync per commit)"
    modules = ("agents",)

    def open(self, path: str) -> None:
        from agents import SQLiteSession

        self.loop = asyncio.new_event_loop()
        self.session = SQLiteSession(SESSION, path)
        self.tokens: list[int] = []

    def step(self, native: Step) -> list[Any]:
        run = self.loop.run_until_complete
        began = time.perf_counter_ns()
        given: list[Any] = list(native.messages)
        run(self.session.add_items(given))
        persisted = time.perf_counter_ns()
        items = cast("list[dict[str, Any]]", run(self.session.get_items()))
        while len(self.tokens) < len(items):
            self.tokens.append(estimate(items[len(self.tokens)]))
        context = reference_context(items, self.tokens.__getitem__)
        self.phases = {"persist": persisted - began, "context": time.perf_counter_ns() - persisted}
        return context

    def resume(self, path: str) -> list[Any]:
        self.open(path)
        items = cast("list[dict[str, Any]]", self.loop.run_until_complete(self.session.get_items()))
        return reference_context(items, lambda i: estimate(items[i]))

    def close(self) -> None:
        self.session.close()
        self.loop.close()


def _to_langchain(message: dict[str, Any], message_id: str) -> Any:
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

    role, content = message["role"], message["content"]
    if role == "system":
        return SystemMessage(content=content, id=message_id)
    if role == "assistant":
        calls = [
            {"id": b["id"], "name": b["name"], "args": b["input"], "type": "tool_call"}
            for b in content
            if b.get("type") == "tool_use"
        ]
        return AIMessage(content=content, tool_calls=calls, id=message_id)
    if is_tool_result(message):
        (block,) = content
        return ToolMessage(
            content=block["content"],
            tool_call_id=block["tool_use_id"],
            status="error" if block.get("is_error") else "success",
            id=message_id,
        )
    return HumanMessage(content=content, id=message_id)


def _from_langchain(message: Any) -> dict[str, Any]:
    """Inverse of _to_langchain (same keys in the same order, so the same estimate)."""
    if message.type == "system":
        return {"role": "system", "content": message.content}
    if message.type == "ai":
        return {"role": "assistant", "content": message.content}
    if message.type == "tool":
        block: dict[str, Any] = {"type": "tool_result", "tool_use_id": message.tool_call_id}
        block["content"] = message.content
        if message.status == "error":
            block["is_error"] = True
        return {"role": "user", "content": [block]}
    return {"role": "user", "content": message.content}


class LangGraphAdapter(Adapter):
    """A one-node StateGraph whose ``messages`` channel uses add_messages, compiled with
    SqliteSaver on a file. A step is ``graph.invoke({"messages": new}, durability="sync")``
    then ``trim_messages(strategy="last", include_system=True, start_on=("human", "ai"))``
    with a per-message counter (the shared estimate, memoised by message id). Converting
    Anthropic dicts into langchain messages happens in prepare(), untimed."""

    name = "langgraph"
    durability = "SqliteSaver: WAL, default synchronous=FULL, a commit per checkpoint write"
    modules = ("langgraph.graph", "langgraph.checkpoint.sqlite", "langchain_core.messages")

    def _build(self, path: str) -> None:
        from typing import Annotated, TypedDict

        from langchain_core.messages import BaseMessage
        from langgraph.checkpoint.sqlite import SqliteSaver
        from langgraph.graph import END, START, StateGraph
        from langgraph.graph.message import add_messages

        # Functional form: real objects, not the strings `from __future__ import annotations`
        # would leave in a class body, which LangGraph could not resolve in this scope.
        state = TypedDict("state", {"messages": Annotated[list[Any], add_messages]})  # noqa: UP013
        graph = StateGraph(state)
        graph.add_node("agent", lambda _state: {})  # the model call would be here
        graph.add_edge(START, "agent")
        graph.add_edge("agent", END)
        self.db = sqlite3.connect(path, check_same_thread=False)
        self.graph = graph.compile(checkpointer=SqliteSaver(self.db))
        self.config: RunnableConfig = {"configurable": {"thread_id": SESSION}}
        memo: dict[str, int] = {}

        def count(message: Any) -> int:
            tokens = memo.get(message.id)
            if tokens is None:
                tokens = memo[message.id] = estimate(_from_langchain(message))
            return tokens

        # trim_messages treats a callable whose first parameter is annotated BaseMessage as
        # a per-message counter (otherwise it calls it on whole lists, repeatedly).
        count.__annotations__ = {"message": BaseMessage, "return": int}
        self.count = count

    def _trim(self, messages: list[Any]) -> list[Any]:
        from langchain_core.messages import trim_messages

        return list(
            trim_messages(
                messages,
                strategy="last",
                max_tokens=BUDGET,
                token_counter=self.count,
                include_system=True,
                start_on=("human", "ai"),
            )
        )

    def open(self, path: str) -> None:
        self._build(path)
        self.next_id = 0

    def prepare(self, step: Step) -> list[Any]:
        out = []
        for message in step.messages:
            out.append(_to_langchain(message, f"m{self.next_id:07d}"))
            self.next_id += 1
        return out

    def step(self, native: list[Any]) -> list[Any]:
        began = time.perf_counter_ns()
        state = self.graph.invoke({"messages": native}, self.config, durability="sync")
        persisted = time.perf_counter_ns()
        context = self._trim(state["messages"])
        self.phases = {"invoke": persisted - began, "trim": time.perf_counter_ns() - persisted}
        return context

    def resume(self, path: str) -> list[Any]:
        self._build(path)
        return self._trim(self.graph.get_state(self.config).values["messages"])

    def close(self) -> None:
        self.db.close()

    def canonical(self, context: list[Any]) -> list[dict[str, Any]]:
        return [_from_langchain(m) for m in context]

    def summary(self, path: str) -> dict[str, Any]:
        db = sqlite3.connect(path)
        try:
            rows, blob, biggest = db.execute(
                "SELECT count(*), sum(length(checkpoint)), max(length(checkpoint)) FROM checkpoints"
            ).fetchone()
            return {"checkpoints": rows, "checkpoint_bytes": blob, "largest_checkpoint": biggest}
        finally:
            db.close()


ADAPTERS: dict[str, type[Adapter]] = {
    cls.name: cls
    for cls in (
        FloorAdapter,
        CompactstoreAdapter,
        CompactstoreDedupAdapter,
        OpenAIAgentsAdapter,
        LangGraphAdapter,
    )
}
