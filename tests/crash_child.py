"""Child process of the crash-safety harness (tests/test_crash.py): drives sessions until killed.

Usage::

    python -m tests.crash_child DB_URL SEED ACK_FILE CLOCK    (from the repository root)

It opens the store, prints ``ready`` on stdout, then runs a random mix of appends,
append_tool_result, extend, process_request, reactive_recover, compact, rollback,
record_usage, remember and reset_breaker on three sessions (one per message format) with a
small context window, so compactions really happen, forever: the parent kills it with
SIGKILL at a random moment. ``now=`` and timestamps grow from CLOCK, one step per call.

After every call that returned, one JSON line is appended to ACK_FILE (flushed and
fsynced before the next call) saying what the call stored: for messages the seq and the
sha256 of the message (canonical JSON, and the exact stored text), for compactions the
compaction and boundary ids, for rollbacks the boundaries rolled back. The parent checks
that every acknowledged fact survived the kill. A call that raises something unexpected
is a library bug, not a crash: it is recorded as an ``error`` line and driving goes on.
Nothing but ``ready PID`` (and ``died`` if the loop itself fails) is written to stdout.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sys
import traceback
from typing import Any

from compactstore import (
    CompactionConfig,
    CompactionResult,
    CompactStore,
    CompactStoreError,
    InvalidMessageError,
    NotFoundError,
    Session,
)
from compactstore.formats.base import storage_json
from tests.helpers import call_ids, calls_message, pair_problems, result_message, results

FORMATS = ("anthropic", "openai", "minicode")
CONTEXT_WINDOW = 6_000
# Small thresholds so every stage fires within a few dozen calls.
CONFIG = CompactionConfig(
    tool_result_max_chars=1_500,
    microcompact_interval_seconds=900.0,
    microcompact_keep_recent=3,
    session_memory_min_tail_tokens=300,
    session_memory_max_tail_tokens=1_500,
    session_memory_max_tokens=400,
    full_compact_max_tail_messages=12,
)
WORDS = (
    *("alpha", "beta", "gamma", "delta", "compile", "test", "failure", "refactor", "module"),
    *("parser", "index", "cache", "retry", "schema", "migrate", "commit", "rollback"),
    *("boundary", "summary", "tool", "result", "日本語", "한국어", "中文"),
)


def session_id(fmt: str) -> str:
    return f"crash-{fmt}"


def canonical(message: Any) -> str:
    """sha256 of the message as canonical JSON (key order and spacing do not matter)."""
    text = json.dumps(message, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def raw(message: Any) -> str:
    """sha256 of the exact text compactstore stores for the message."""
    return hashlib.sha256(storage_json(message).encode("utf-8")).hexdigest()


class Driver:
    def __init__(self, store: CompactStore, seed: int, ack_path: str, clock: float) -> None:
        self.store = store
        self.rng = random.Random(seed)
        self.seed = seed
        self.clock = clock
        self.ids = 0
        self.ack_fd = os.open(ack_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self.sessions: dict[str, Session] = {}
        # Calls of the newest assistant message still waiting for their result, per format.
        self.pending: dict[str, list[tuple[str, str]]] = {}
        for fmt in FORMATS:
            sess = store.session(
                session_id(fmt), format=fmt, context_window=CONTEXT_WINDOW, config=CONFIG, now=clock
            )
            self.sessions[fmt] = sess
            self.pending[fmt] = self._pending_calls(fmt, sess)

    # -- bookkeeping ----------------------------------------------------------------------

    def _pending_calls(self, fmt: str, sess: Session) -> list[tuple[str, str]]:
        log = sess.messages()
        answered: set[str] = set()
        for message in reversed(log):
            ids = call_ids(fmt, message)
            if ids:
                return [(cid, "read_file") for cid in ids if cid not in answered]
            if not list(results(fmt, message)):
                return []  # the conversation moved on: earlier calls are abandoned
            answered.update(list(results(fmt, message)))
        return []

    def ack(self, **fields: Any) -> None:
        line = json.dumps(fields, sort_keys=True) + "\n"
        os.write(self.ack_fd, line.encode("utf-8"))
        os.fsync(self.ack_fd)

    def tick(self) -> float:
        self.clock += self.rng.choice((1.0, 5.0, 30.0, 120.0, 700.0))
        return self.clock

    def text(self, low: int, high: int) -> str:
        n = self.rng.randint(low, high)
        return " ".join(self.rng.choice(WORDS) for _ in range(n))

    def new_id(self, fmt: str) -> str:
        self.ids += 1
        prefix = "call" if fmt == "openai" else "toolu"
        return f"{prefix}_{self.seed}_{self.ids}"

    # -- operations -----------------------------------------------------------------------

    def append(self, fmt: str, message: dict[str, Any], pinned: bool = False) -> None:
        sess = self.sessions[fmt]
        seq = sess.append(message, timestamp=self.tick(), pinned=pinned)
        self.ack(op="append", sid=sess.id, seq=seq, canon=canonical(message), raw=raw(message))

    def answer(self, fmt: str, file_path: str | None = None) -> None:
        """Answer the pending calls one append_tool_result at a time."""
        sess = self.sessions[fmt]
        while self.pending[fmt]:
            tool_use_id, name = self.pending[fmt][0]
            # One result in five is over the tool-result budget.
            big = self.rng.random() < 0.2
            content = self.text(300, 900) if big else self.text(5, 120)
            try:
                seq = sess.append_tool_result(
                    tool_use_id,
                    content,
                    tool_name=name,
                    file_path=file_path,
                    timestamp=self.tick(),
                )
            except InvalidMessageError:
                # A compaction may have summarised the call away: its result cannot pair.
                self.pending[fmt].pop(0)
                continue
            self.pending[fmt].pop(0)
            expected = result_message(fmt, tool_use_id, content, name=name)
            self.ack(
                op="tool_result",
                sid=sess.id,
                seq=seq,
                tool_use_id=tool_use_id,
                canon=canonical(expected),
                raw=raw(expected),
                read=file_path is not None,
            )

    def tool_turn(self, fmt: str) -> None:
        count = 1 if self.rng.random() < 0.7 else 2
        calls = [
            (self.new_id(fmt), "read_file", {"path": f"src/m{self.rng.randint(0, 9)}.py"})
            for _ in range(count)
        ]
        self.append(fmt, calls_message(fmt, calls))
        self.pending[fmt] = [(cid, name) for cid, name, _ in calls]
        if self.rng.random() < 0.9:
            path = f"src/m{self.rng.randint(0, 3)}.py" if self.rng.random() < 0.3 else None
            self.answer(fmt, path)

    def batch(self, fmt: str) -> None:
        sess = self.sessions[fmt]
        cid = self.new_id(fmt)
        messages = [
            calls_message(fmt, [(cid, "grep", {"pattern": self.rng.choice(WORDS)})]),
            result_message(fmt, cid, self.text(5, 400), name="grep"),
            {"role": "assistant", "content": self.text(3, 40)},
        ]
        stamps: list[float | None] = [self.tick() for _ in messages]
        seqs = sess.extend(messages, timestamps=stamps)
        for seq, message in zip(seqs, messages, strict=True):
            self.ack(op="append", sid=sess.id, seq=seq, canon=canonical(message), raw=raw(message))

    def compaction(self, fmt: str, kind: str) -> None:
        sess = self.sessions[fmt]
        now = self.tick()
        result: CompactionResult | None
        if kind == "process":
            result = sess.process_request(now=now)
        elif kind == "recover":
            result = sess.reactive_recover("prompt is too long: 210000 tokens > 200000", now=now)
            if result is None:
                self.ack(op=kind, sid=sess.id, id=None, boundary=None)
                sess.reset_breaker()
                return
        else:
            up_to = None
            if self.rng.random() < 0.3:
                context = sess.context()
                kept = [item.seq for item in context.kept if item.seq is not None]
                if len(kept) > 4:
                    up_to = kept[len(kept) // 2]
            try:
                result = sess.compact(now=now, up_to_seq=up_to)
            except CompactStoreError:
                return
        boundary = result.boundary.id if result.boundary is not None else None
        self.ack(op=kind, sid=sess.id, id=result.id, boundary=boundary)

    def rollback(self, fmt: str) -> None:
        sess = self.sessions[fmt]
        try:
            undone = sess.rollback(now=self.tick())
        except NotFoundError:
            return
        self.ack(op="rollback", sid=sess.id, boundaries=[b.id for b in undone])

    def step(self) -> None:
        fmt = self.rng.choice(FORMATS)
        sess = self.sessions[fmt]
        op = self.rng.choices(
            (
                "say",
                "ask",
                "pin",
                "tool",
                "batch",
                "process",
                "recover",
                "compact",
                "rollback",
                "usage",
                "remember",
                "reset",
                "invalidate",
            ),
            weights=(14, 10, 2, 25, 8, 22, 3, 4, 4, 3, 2, 1, 2),
        )[0]
        if self.pending[fmt] and op not in ("process", "recover", "compact", "rollback"):
            if self.rng.random() < 0.85:
                self.answer(fmt)
            self.pending[fmt] = []  # abandoned calls get a synthetic result in the context
        if op == "say":
            self.append(fmt, {"role": "assistant", "content": self.text(3, 150)})
        elif op in ("ask", "pin"):
            message = {"role": "user", "content": "question: " + self.text(3, 80)}
            self.append(fmt, message, pinned=op == "pin")
        elif op == "tool":
            self.tool_turn(fmt)
        elif op == "batch":
            self.batch(fmt)
        elif op in ("process", "recover", "compact"):
            self.compaction(fmt, op)
        elif op == "rollback":
            self.rollback(fmt)
        elif op == "usage":
            sess.record_usage(max(0, sess.token_usage() + self.rng.randint(-200, 600)))
            self.ack(op="usage", sid=sess.id)
        elif op == "remember":
            entry = sess.remember("decision", self.text(3, 30), now=self.tick())
            self.ack(op="remember", sid=sess.id, id=entry)
        elif op == "reset":
            sess.reset_breaker()
            self.ack(op="reset", sid=sess.id)
        else:
            sess.invalidate(f"src/m{self.rng.randint(0, 3)}.py")
            self.ack(op="invalidate", sid=sess.id)


# -- the checks a fresh process runs after every kill ------------------------------------------


def read_acks(ack_path: str) -> list[dict[str, Any]]:
    """Acknowledged calls; a last line cut short was never acknowledged."""
    try:
        with open(ack_path, encoding="utf-8") as handle:
            data = handle.read()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in data.split("\n")[:-1] if line]


def _sdk_check(fmt: str, messages: list[dict[str, Any]]) -> str | None:
    """None when the official SDK's request type accepts the messages (anthropic, openai)."""
    if fmt == "minicode":
        return None
    from compactstore.formats.sdk_types import sdk_problems

    problems = sdk_problems(fmt, messages)
    if problems:
        return f"{fmt} SDK refuses the active context: {'; '.join(problems)[:300]}"
    return None


def check_rows(store: CompactStore) -> list[str]:
    """Row-level consistency: nothing half-recorded, counters agree with the rows."""
    from sqlalchemy import select

    from compactstore.db import schema

    problems: list[str] = []
    with store.engine.connect() as c:

        def rows(table: Any) -> list[Any]:
            return list(c.execute(select(table)).all())

        sessions = {r.id: r for r in rows(schema.sessions)}
        msgs: dict[str, dict[int, Any]] = {sid: {} for sid in sessions}
        for r in rows(schema.messages):
            msgs.setdefault(r.session_id, {})[r.seq] = r
        boundaries = {r.id: r for r in rows(schema.compact_boundaries)}
        compactions = {r.id: r for r in rows(schema.compactions)}
        edits = rows(schema.message_edits)
        blobs = rows(schema.tool_result_blobs)
        breakers = {r.session_id: r for r in rows(schema.breaker_state)}
        calls = rows(schema.tool_calls)
        dedup = rows(schema.read_dedup_entries)
        memories = rows(schema.memory_entries)

    for sid, s in sessions.items():
        seqs = sorted(msgs.get(sid, {}))
        if seqs != list(range(len(seqs))):
            problems.append(f"{sid}: seqs are not 0..n-1 without gaps or repeats")
        if s.last_seq != len(seqs) - 1:
            problems.append(f"{sid}: sessions.last_seq {s.last_seq} but {len(seqs)} messages")
        if (
            s.request_seq is not None
            and getattr(msgs[sid].get(s.request_seq), "pinned", None) != "request"
        ):
            problems.append(f"{sid}: request_seq {s.request_seq} is not a pinned request")
        b = breakers.get(sid)
        if b is None:
            problems.append(f"{sid}: no breaker_state row")
            continue
        config = CompactionConfig.model_validate_json(s.config)
        if b.consecutive_failures < 0 or b.reactive_attempts < 0:
            problems.append(f"{sid}: negative breaker counters")
        if bool(b.tripped) != (b.consecutive_failures >= config.breaker_max_failures):
            problems.append(
                f"{sid}: tripped={b.tripped} with {b.consecutive_failures} consecutive failures"
            )
        if b.reactive_attempts > len(config.reactive_keep_fractions) + 1:
            problems.append(f"{sid}: reactive_attempts {b.reactive_attempts} out of range")
    for r in calls:
        if r.call_seq not in msgs.get(r.session_id, {}):
            problems.append(f"tool call {r.tool_use_id}: call_seq {r.call_seq} is not a message")
        if r.result_seq is not None and (
            r.result_seq not in msgs.get(r.session_id, {}) or r.result_seq <= r.call_seq
        ):
            problems.append(f"tool call {r.tool_use_id}: bad result_seq {r.result_seq}")
    edits_of: dict[int, list[Any]] = {}
    for e in edits:
        edits_of.setdefault(e.compaction_id, []).append(e)
    blobs_of: dict[int, list[int]] = {}
    for x in blobs:
        blobs_of.setdefault(x.compaction_id, []).append(x.id)
    by_boundary: dict[int, list[Any]] = {}
    for r in compactions.values():
        if r.boundary_id is not None:
            by_boundary.setdefault(r.boundary_id, []).append(r)
            bnd = boundaries.get(r.boundary_id)
            if bnd is None or bnd.session_id != r.session_id:
                problems.append(f"compaction {r.id}: boundary {r.boundary_id} not in its session")
            elif bnd.messages_removed != len(json.loads(r.removed_seqs)):
                problems.append(f"compaction {r.id}: removed_seqs disagree with its boundary")
        if r.tokens_freed != r.tokens_before - r.tokens_after:
            problems.append(f"compaction {r.id}: tokens_freed != before - after")
        own_blobs = sorted(blobs_of.get(r.id, []))
        if sorted(json.loads(r.blob_ids)) != own_blobs:
            problems.append(f"compaction {r.id}: blob_ids {r.blob_ids} but blob rows {own_blobs}")
        own_edits = edits_of.get(r.id, [])
        edited = {i for e in own_edits for i in json.loads(e.tool_use_ids)}
        if {pair[0] for pair in json.loads(r.cleared_tool_calls)} != edited:
            problems.append(f"compaction {r.id}: cleared_tool_calls disagree with its edits")
        if r.success and r.boundary_id is None and not own_edits:
            problems.append(f"compaction {r.id}: successful, but no boundary and no edits")
    for bid, bnd in boundaries.items():
        own = by_boundary.get(bid, [])
        if len(own) != 1:
            problems.append(f"boundary {bid}: {len(own)} compactions rows (expected 1)")
            continue
        if (bnd.rolled_back_at is None) != (own[0].rolled_back_at is None):
            problems.append(f"boundary {bid}: rolled back apart from its compaction {own[0].id}")
        if bnd.parent_id is not None:
            parent = boundaries.get(bnd.parent_id)
            if parent is None or parent.session_id != bnd.session_id or parent.id >= bid:
                problems.append(f"boundary {bid}: bad parent {bnd.parent_id}")
        if bnd.first_kept_seq > sessions[bnd.session_id].last_seq + 1:
            problems.append(f"boundary {bid}: first kept seq past the log")
    for e in edits:
        comp = compactions.get(e.compaction_id)
        if comp is None or comp.session_id != e.session_id:
            problems.append(f"edit {e.id}: compaction {e.compaction_id} not in its session")
        if e.seq not in msgs.get(e.session_id, {}):
            problems.append(f"edit {e.id}: seq {e.seq} is not a message")
        if e.kind not in ("persisted", "cleared"):
            problems.append(f"edit {e.id}: unknown kind {e.kind!r}")
    for x in blobs:
        comp = compactions.get(x.compaction_id)
        if comp is None or comp.session_id != x.session_id:
            problems.append(f"blob {x.session_id}/{x.id}: compaction not in its session")
        if not any(
            e.seq == x.seq and e.kind == "persisted" for e in edits_of.get(x.compaction_id, [])
        ):
            problems.append(f"blob {x.session_id}/{x.id}: no persisted edit for seq {x.seq}")
        content = bytes(x.content)
        if hashlib.sha256(content).hexdigest() != x.sha256 or len(content) != x.size:
            problems.append(f"blob {x.session_id}/{x.id}: sha256 or size disagree with content")
    for d in dedup:
        if d.seq not in msgs.get(d.session_id, {}):
            problems.append(f"read dedup entry {d.file_path}: seq {d.seq} is not a message")
    for m in memories:
        if m.session_id not in sessions:
            problems.append(f"memory entry {m.id}: unknown session")
    for sid, by_seq in msgs.items():
        for seq, r in by_seq.items():
            if r.dedup_of_seq is not None and r.dedup_of_seq not in by_seq:
                problems.append(f"{sid} seq {seq}: dedup_of_seq {r.dedup_of_seq} missing")
    return problems


def check_acks(store: CompactStore, acks: list[dict[str, Any]]) -> list[str]:
    """Every acknowledged call's outcome is still in the database, byte-exact."""
    from sqlalchemy import select

    from compactstore.db import schema

    problems: list[str] = []
    with store.engine.connect() as c:
        payloads = {
            (r.session_id, r.seq): (r.payload, r.dedup_of_seq)
            for r in c.execute(
                select(
                    schema.messages.c.session_id,
                    schema.messages.c.seq,
                    schema.messages.c.payload,
                    schema.messages.c.dedup_of_seq,
                )
            )
        }
        compactions = {
            r.id: r
            for r in c.execute(
                select(
                    schema.compactions.c.id,
                    schema.compactions.c.session_id,
                    schema.compactions.c.boundary_id,
                )
            )
        }
        rolled = {
            r.id: r.rolled_back_at
            for r in c.execute(
                select(schema.compact_boundaries.c.id, schema.compact_boundaries.c.rolled_back_at)
            )
        }
        memory = {r.id for r in c.execute(select(schema.memory_entries.c.id))}
    for ack in acks:
        op, sid = ack["op"], ack.get("sid")
        if op in ("append", "tool_result"):
            found = payloads.get((sid, ack["seq"]))
            if found is None:
                problems.append(f"acknowledged {op} {sid}#{ack['seq']} is missing")
                continue
            payload, dedup_of = found
            message = json.loads(payload)
            if op == "tool_result" and ack["read"] and dedup_of is not None:
                assert isinstance(sid, str)
                fmt = sid.removeprefix("crash-")
                if list(results(fmt, message)) != [ack["tool_use_id"]]:
                    problems.append(f"acknowledged dedup stub {sid}#{ack['seq']} lost its id")
                continue
            if canonical(message) != ack["canon"]:
                problems.append(f"acknowledged {op} {sid}#{ack['seq']} changed content")
            elif op == "append" and hashlib.sha256(payload.encode()).hexdigest() != ack["raw"]:
                problems.append(f"acknowledged {op} {sid}#{ack['seq']} is not byte-exact")
        elif op in ("process", "recover", "compact") and ack["id"] is not None:
            comp = compactions.get(ack["id"])
            if comp is None or comp.session_id != sid:
                problems.append(f"acknowledged compaction {ack['id']} of {sid} is missing")
            elif comp.boundary_id != ack["boundary"]:
                problems.append(f"acknowledged compaction {ack['id']} lost its boundary")
        elif op == "rollback":
            for bid in ack["boundaries"]:
                if rolled.get(bid) is None:
                    problems.append(f"acknowledged rollback of boundary {bid} is not recorded")
        elif op == "remember" and ack["id"] not in memory:
            problems.append(f"acknowledged memory entry {ack['id']} is missing")
    return problems


def check(url: str, ack_path: str, now: float, skip_acks: int = 0) -> dict[str, Any]:
    """Every invariant of the crash harness; ``now`` is the clock for process_request."""
    from compactstore.db.engine import normalize_url, sqlite_path

    problems: list[str] = []
    path = sqlite_path(normalize_url(url))
    if path is not None and path.exists():
        import sqlite3

        raw_connection = sqlite3.connect(path)
        try:
            verdict = raw_connection.execute("PRAGMA integrity_check").fetchall()
            if verdict != [("ok",)]:
                problems.append(f"PRAGMA integrity_check: {verdict[:5]}")
            broken = raw_connection.execute("PRAGMA foreign_key_check").fetchall()
            if broken:
                problems.append(f"PRAGMA foreign_key_check: {broken[:5]}")
        finally:
            raw_connection.close()
    store = CompactStore.open(url)
    compactions = 0
    try:
        acks = read_acks(ack_path)
        problems += check_rows(store)
        problems += check_acks(store, acks[skip_acks:])
        for fmt in FORMATS:
            try:
                sess = store.get_session(session_id(fmt))
            except NotFoundError:
                continue  # killed before the session was created
            context = sess.active_context()
            problems += [f"{sess.id}: {p}" for p in pair_problems(fmt, context)]
            refused = _sdk_check(fmt, context)
            if refused:
                problems.append(refused)
            result = sess.process_request(now=now)
            problems += [
                f"{sess.id} after process_request: {p}"
                for p in pair_problems(fmt, [*result.messages])
            ]
            compactions += len(sess.compactions())
    except Exception:
        problems.append("the check raised:\n" + traceback.format_exc())
    finally:
        store.close()
    return {"problems": problems, "acks": len(read_acks(ack_path)), "compactions": compactions}


# -- process entry points ----------------------------------------------------------------------


def run(url: str, seed: int, ack_path: str, clock: float) -> int:
    """Open the store, say ready, and drive the sessions until killed."""
    store = CompactStore.open(url)
    driver = Driver(store, seed, ack_path, clock)
    sys.stdout.write(f"ready {os.getpid()}\n")
    sys.stdout.flush()
    try:
        while True:
            try:
                driver.step()
            except Exception as exc:
                # A library bug unrelated to crashing: record it and drive on.
                frames = traceback.extract_tb(exc.__traceback__)
                driver.ack(
                    op="error",
                    error=f"{type(exc).__name__}: {exc}"[:500],
                    where=f"{frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].name}",
                    call=next((f.name for f in frames if "/compactstore/" in f.filename), ""),
                )
                for fmt in FORMATS:
                    driver.pending[fmt] = []
    except BaseException:
        # Anything escaping is a finding: the parent reports it (a clean run ends by kill).
        detail = traceback.format_exc()
        sys.stderr.write(detail)
        sys.stdout.write("died " + json.dumps({"pid": os.getpid(), "error": detail}) + "\n")
        sys.stdout.flush()
        return 3


def zygote() -> int:
    """Import everything once, then fork a fresh process per command read from stdin.

    ``run URL SEED ACK CLOCK`` forks a driver (prints ``forked PID``; the driver prints
    ``ready PID``); ``check URL ACK NOW SKIP`` forks a checker, which prints
    ``checked {json}``. Forking from a process that never opened a connection gives each
    driver and checker a fresh process without paying the interpreter's start-up again.
    """
    import signal

    import sqlalchemy.dialects.postgresql  # noqa: F401 - imported once, before forking

    from compactstore.formats.sdk_types import sdk_problems

    for fmt in ("anthropic", "openai"):
        sdk_problems(fmt, [])  # imports the SDK and builds its type check once
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped automatically
    sys.stdout.write("zygote ready\n")
    sys.stdout.flush()
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            code = 0
            try:
                if words[0] == "run":
                    code = run(words[1], int(words[2]), words[3], float(words[4]))
                else:
                    found = check(words[1], words[2], float(words[3]), int(words[4]))
                    sys.stdout.write("checked " + json.dumps(found) + "\n")
                    sys.stdout.flush()
            finally:
                os._exit(code)
        sys.stdout.write(f"forked {pid}\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["zygote"]:
        raise SystemExit(zygote())
    if sys.argv[1:2] == ["check"]:
        print(json.dumps(check(sys.argv[2], sys.argv[3], float(sys.argv[4]))))
        raise SystemExit(0)
    raise SystemExit(run(sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])))
