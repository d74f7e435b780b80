"""Property-based tests: random conversations in every format, interleaved with
random process_request / reactive_recover / compact calls. After every step the active
context keeps every tool pair whole and in order, holds the pins and the original request
verbatim, is accepted by the official SDK types, and every recorded compaction's numbers
match the context it left.

SQLite only, a fresh file per example: function-scoped fixtures do not reset between
hypothesis examples.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compactstore import CompactionConfig, CompactionResult, Session, estimate_tokens
from tests.helpers import (
    FORMATS,
    Chat,
    call_ids,
    calls_message,
    new_session,
    pair_problems,
    per_seq,
    results,
    scratch_store,
    text_of,
    validate_with_sdk,
    words,
)

SIZES = st.sampled_from([40, 300, 1_200, 3_000, 4_500, 9_000])
GAPS = st.sampled_from([1, 200, 400, 3_600, 7_200])

# One conversation step: ("user"|"say"|"pin", chars), ("tools", [(chars, error, missing)]),
# ("process"|"reactive", seconds later), ("compact", None | position), ("remember", None).
EVENTS = st.one_of(
    st.tuples(st.sampled_from(["user", "say", "pin"]), SIZES),
    st.tuples(
        st.just("tools"),
        st.lists(st.tuples(SIZES, st.booleans(), st.integers(0, 5)), min_size=1, max_size=3),
    ),
    st.tuples(st.sampled_from(["process", "reactive"]), GAPS),
    st.tuples(st.just("compact"), st.none() | st.floats(0, 1)),
    st.tuples(st.just("remember"), st.none()),
)


@dataclass
class World:
    chat: Chat
    fmt: str
    overhead: int
    factor: float
    request: dict[str, Any]
    recorded: int = 0
    notes: list[str] = field(default_factory=list)
    # openai: call ids whose call was answered, used again by later calls (the documentation:
    # calls are keyed by (id, call seq)); None: every call gets a new id.
    free_ids: list[str] | None = None

    @property
    def sess(self) -> Session:
        return self.chat.sess


def independent_tokens(fmt: str, message: dict[str, Any]) -> int | None:
    """estimate of a message that is only prose or only tool results, else None."""
    found = results(fmt, message)
    if found and not text_of(message) and not call_ids(fmt, message):
        return estimate_tokens("\n".join(found.values()))
    if not found and not call_ids(fmt, message):
        return estimate_tokens(text_of(message))
    return None


def check_context(world: World) -> None:
    fmt, sess = world.fmt, world.sess
    context = sess.active_context()
    assert pair_problems(fmt, context) == [], world.notes
    # Pins are sent as they were appended: the wire view merges only what stood between
    # the tool results of one turn (the events never put a pin there).
    assert [m for m in context if m in world.chat.pins] == world.chat.pins, world.notes
    items = per_seq(sess)
    assert [m for m in items if m in world.chat.pins] == world.chat.pins, world.notes
    assert world.request in items
    validate_with_sdk(fmt, context)


def check_compaction(world: World, usage: int, result: CompactionResult | None) -> None:
    sess = world.sess
    after = sess.token_usage()
    assert after <= usage, f"a compaction grew usage: {world.notes}"
    if result is None:
        return
    assert result.tokens_after <= result.tokens_before == usage
    rows = sess.compactions()
    assert len(rows) - world.recorded == (0 if result.id is None else 1)
    world.recorded = len(rows)
    if result.id is None:
        return
    assert rows[-1].tokens_after == result.tokens_after == after, world.notes
    context = sess.context()
    items = context.items
    raw = sum(item.tokens for item in items)
    assert after == world.overhead + round(world.factor * raw), world.notes
    for item in items:
        expected = independent_tokens(world.fmt, item.message)
        if expected is not None and item.state != "pinned" and item.state != "original":
            assert item.tokens == expected, (item.state, world.notes)


def step(world: World, event: tuple[Any, Any]) -> None:
    chat, kind, arg = world.chat, event[0], event[1]
    world.notes.append(f"{kind}:{arg}")
    if kind in ("user", "pin"):
        text = f"{kind} #{len(world.notes)}: " + words(arg, kind)
        chat.user(text, pinned=kind == "pin")
    elif kind == "say":
        chat.say(f"reply #{len(world.notes)}: " + words(arg, "reply"))
    elif kind == "tools":
        specs = [
            ("read_file", {"file_path": f"f{size}_{n}.py"}) for n, (size, _, _) in enumerate(arg)
        ]
        if world.free_ids is None:
            _, ids = chat.calls(specs)
        else:
            free = world.free_ids
            ids = [free.pop(0) if free else chat.new_id() for _ in specs]
            chat.add(
                calls_message(world.fmt, [(i, n, a) for i, (n, a) in zip(ids, specs, strict=True)])
            )
        for tool_use_id, (size, error, missing) in zip(ids, arg, strict=True):
            if missing == 0:
                continue  # the agent crashed before storing this result
            chat.result(tool_use_id, words(size, f"out{size}"), is_error=error)
            if world.free_ids is not None:
                world.free_ids.append(tool_use_id)
    elif kind == "remember":
        world.sess.remember("decision", f"decision #{len(world.notes)}", now=chat.tick())
    else:
        usage = world.sess.token_usage()
        result: CompactionResult | None
        if kind == "process":
            result = world.sess.process_request(now=chat.tick(arg))
        elif kind == "reactive":
            result = world.sess.reactive_recover("prompt is too long", now=chat.tick(arg))
        else:
            seqs = [i.seq for i in world.sess.context().kept if i.seq is not None]
            if arg is not None and not seqs:
                return
            up_to = None if arg is None else seqs[min(len(seqs) - 1, int(arg * len(seqs)))]
            result = world.sess.compact(up_to_seq=up_to, now=chat.tick())
        check_compaction(world, usage, result)
    check_context(world)


@pytest.mark.slow
@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    database=None,  # leave no .hypothesis directory behind
)
@given(
    fmt=st.sampled_from(FORMATS),
    window=st.sampled_from([1_000, 2_000, 5_000, 20_000]),
    system_prompt=st.booleans(),
    cache_ttl=st.none() | st.just(300.0),
    small_tail=st.booleans(),
    overhead=st.sampled_from([0, 150]),
    factor=st.sampled_from([1.0, 1.6]),
    events=st.lists(EVENTS, min_size=5, max_size=40),
    reuse_ids=st.booleans(),
)
def test_random_conversations_keep_pairs_pins_and_honest_numbers(
    fmt: str,
    window: int,
    system_prompt: bool,
    cache_ttl: float | None,
    small_tail: bool,
    overhead: int,
    factor: float,
    events: list[tuple[Any, Any]],
    reuse_ids: bool,
) -> None:
    tail = {"session_memory_min_tail_tokens": 500, "session_memory_max_tail_tokens": 2_000}
    config = CompactionConfig(
        cache_ttl_seconds=cache_ttl,
        fixed_overhead_tokens=overhead,
        token_factor=factor,
        **(tail if small_tail else {}),
    )
    with scratch_store() as store:
        chat = new_session(store, fmt, context_window=window, config=config)
        if system_prompt and fmt != "anthropic":
            chat.system("You are a coding agent.")
        request_text = "Original request: " + words(2_500, "request")
        chat.request(request_text)
        world = World(chat, fmt, overhead, factor, {"role": "user", "content": request_text})
        if reuse_ids and fmt == "openai":
            world.free_ids = []
        check_context(world)
        for event in events:
            step(world, event)
        # Whatever happened, one last round of every kind of call keeps the rules.
        for event in (("process", 3_600), ("reactive", 1), ("compact", None)):
            step(world, event)
        assert world.recorded == len(world.sess.compactions())
