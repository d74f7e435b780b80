"""The in-process context cache (store.py ``_ContextCache``): it only ever saves work.

What a caller gets back is theirs to change: changing it never changes what the store
returns next, nor what it stored. And a context the cache holds is exactly the one a new
process rebuilds from the rows alone.
"""

from __future__ import annotations

import copy
import inspect
import json
import sys
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from compactstore import CompactStore, CompactStrategy
from compactstore._context.active import ActiveContext, ContextMessage, json_copy
from compactstore._core.cache import ContextCache
from compactstore.db import repository as repo
from compactstore.formats import get_format
from tests.helpers import (
    FORMATS,
    T0,
    Chat,
    busy_log,
    every_stage,
    new_session,
    per_seq,
    plain,
    words,
)

HOUR = 3_600

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=30,
)


def containers(value: Any) -> Iterator[Any]:
    if isinstance(value, dict | list):
        yield value
        for item in value.values() if isinstance(value, dict) else value:
            yield from containers(item)


@pytest.mark.slow
@given(json_values)
def test_json_copy_equals_a_json_round_trip_and_shares_no_container(value: Any) -> None:
    copied = json_copy(value)
    assert copied == json.loads(json.dumps(value))
    assert json.dumps(copied) == json.dumps(value)  # key order too
    assert not {id(c) for c in containers(copied)} & {id(c) for c in containers(value)}


@pytest.mark.slow
def test_a_message_nested_deeper_than_python_recursion_allows_is_copied_by_decoding() -> None:
    value: Any = "leaf"
    for level in range(400):
        value = [value] if level % 2 else {"k": value}
    block = {"type": "tool_use", "id": "toolu_deep", "name": "probe", "input": {"v": value}}
    message = {"role": "assistant", "content": [block]}
    item = ContextMessage.build(get_format("anthropic"), message, tokens=1, seq=0, state="original")
    limit = sys.getrecursionlimit()
    # Room for the C decoder's 400 levels, not for the Python copy's frames.
    sys.setrecursionlimit(len(inspect.stack()) + 450)
    try:
        copied = item.copy_message()
    finally:
        sys.setrecursionlimit(limit)
    assert copied == message and copied is not message


def tool_log(chat: Chat) -> None:
    """A request, then tool turns with nested inputs and a mix of small and large results."""
    if chat.fmt != "anthropic":
        chat.system("You are a careful engineer.")
    chat.request("Fix the flaky payment test")
    chat.chatter(6, "talk")
    chat.tool_turns(
        [
            (
                "read_file",
                {"file_path": f"src/pay{i}.py", "options": {"lines": [1, 2, 3]}},
                words(6_000 if i % 3 == 0 else 300, f"r{i}"),
                False,
            )
            for i in range(9)
        ]
    )
    chat.user("Now run the tests please")


def vandalise(messages: list[dict[str, Any]]) -> None:
    """Change everything a careless caller might: nested blocks, inputs, keys, the list."""
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            for block in content:
                if isinstance(block, dict):
                    block["content"] = "changed"
                    block["text"] = "changed"
                    if isinstance(block.get("input"), dict):
                        block["input"]["file_path"] = "/etc/passwd"
                        block["input"].setdefault("options", {})["lines"] = []
            content.append({"type": "text", "text": "appended"})
        for call in message.get("tool_calls") or []:
            call["function"]["arguments"] = "{}"
        message["content"] = "changed"
        message["extra"] = True
    messages.reverse()
    messages.append({"role": "user", "content": "appended"})


def test_changing_the_returned_context_changes_nothing_in_the_store(store: CompactStore) -> None:
    for fmt in FORMATS:
        chat = new_session(store, fmt, sid=f"mutate-{fmt}")
        tool_log(chat)
        sess = chat.sess
        expected = per_seq(sess)
        log = sess.messages()

        vandalise(sess.active_context())
        vandalise(sess.messages())
        assert per_seq(sess) == expected, fmt
        assert sess.messages() == log, fmt

        result = sess.process_request(now=T0 + HOUR)  # persists big results, clears old ones
        assert result.effective
        after = copy.deepcopy(result.messages)
        assert per_seq(sess) == after, fmt
        vandalise(result.messages)
        vandalise(sess.active_context())
        assert per_seq(sess) == after, fmt
        assert per_seq(store.get_session(sess.id)) == after, fmt


@pytest.mark.slow
def test_a_summarizer_that_changes_its_messages_does_not_change_the_context(
    db_url: str, reopen: Callable[[], CompactStore]
) -> None:
    def summarizer(
        messages: list[dict[str, Any]], previous_summary: str | None, instructions: str | None
    ) -> str:
        vandalise(messages)
        return words(400_000, "verbose")  # longer than what it replaces: the compact fails

    with CompactStore.open(db_url, summarizer=summarizer) as store:
        chat = new_session(store, "anthropic")
        tool_log(chat)
        before = chat.sess.active_context()
        result = chat.sess.compact(now=T0 + 60)
        assert not result.effective
        assert chat.sess.active_context() == before
        assert reopen().get_session(chat.sess.id).active_context() == before


def facts(context: ActiveContext) -> dict[str, Any]:
    """Everything an engine or a caller reads from an active context, comparably."""
    return {
        "boundary": context.boundary,
        "last_seq": context.last_seq,
        "usage_offset": context.usage_offset,
        "token_factor": context.token_factor,
        "config": context.config,
        "usage": context.usage,
        "items": [
            (
                item.seq,
                item.state,
                item.kind,
                item.tokens,
                item.payload,
                item.message,
                item.calls,
                item.results,
                item.created_at,
                item.edited_ids,
            )
            for item in context.items
        ],
    }


def versions(store: CompactStore, session_id: str) -> tuple[int, int] | None:
    return store.read(lambda connection: repo.session_versions(connection, session_id))


@pytest.mark.slow
def test_the_context_a_compaction_leaves_in_the_cache_is_what_a_new_process_rebuilds(
    store: CompactStore, reopen: Callable[[], CompactStore]
) -> None:
    for fmt in FORMATS:
        config = plain(session_memory_min_tail_tokens=2_000, session_memory_max_tail_tokens=6_000)
        chat = new_session(store, fmt, sid=f"seed-{fmt}", context_window=18_000, config=config)
        busy_log(chat)
        chat.user("Pinned: the release branch is frozen.", pinned=True)
        # A call whose result never came (the agent crashed), answered by a synthetic result.
        chat.calls([("bash", {"command": "make deploy"})])
        chat.chatter(10, tag="after-crash", chars=400)
        sess = chat.sess
        seen: list[CompactStrategy | None] = []

        for result in every_stage(chat):
            assert result is not None and result.effective, (fmt, seen)
            seen.append(result.strategy)
            cached = store.cache.get(sess.id)
            assert cached is not None, (fmt, seen)
            assert (cached.version, cached.context_version) == versions(store, sess.id)
            fresh = reopen().get_session(sess.id)
            assert facts(cached.answered) == facts(fresh.context()), (fmt, seen)
            assert result.messages == per_seq(fresh), (fmt, seen)
            # Appending to the context the compaction left extends it as a fresh load would.
            chat.tool("a result after the compaction")
            assert facts(sess.context()) == facts(fresh.context()), (fmt, seen)
        assert len(seen) == 9


def test_a_stage_that_acted_but_freed_nothing_leaves_no_context_in_the_cache(
    store: CompactStore, reopen: Callable[[], CompactStore]
) -> None:
    chat = new_session(store, "anthropic")
    chat.request("Check the services")
    # Results shorter than the microcompact placeholder: clearing them frees nothing.
    chat.tool_turns([("bash", {"command": f"check {i}"}, "ok", False) for i in range(8)])
    sess = chat.sess

    result = sess.process_request(now=T0 + HOUR)

    assert result.id is not None and not result.effective
    cached = store.cache.get(sess.id)
    assert cached is None or (cached.version, cached.context_version) != versions(store, sess.id)
    assert facts(sess.context()) == facts(reopen().get_session(sess.id).context())
    assert result.messages == per_seq(sess), "the result must show the context as stored"


def derived(context: ActiveContext) -> tuple[Any, ...]:
    return (
        context.raw_tokens,
        context.usage,
        context.unanswered,
        context.open_results,
        context.open_media_blocks,
        context.newest_assistant_at,
        context.items,
        context.wire,
        facts(context.answered()),
    )


def step_by_step(chat: Chat) -> Iterator[str]:
    """Appends and compactions of every kind a context goes through; yields after each."""
    sess = chat.sess
    chat.tool(words(5_000, "big"))
    yield "a result over the budget"
    chat.calls([("bash", {"command": "make"})])
    yield "a pending call (it may still be running)"
    chat.user("Still there?")
    yield "the pending call is crash-orphaned"
    chat.tool("short")
    yield "a short result"
    sess.process_request(now=T0 + HOUR)
    yield "persisted and cleared"
    _, ids = chat.calls([("read_file", {"file_path": "a.py"}), ("grep", {"q": "x"})])
    yield "two calls"
    chat.result(ids[0], words(300, "a"))
    yield "one of them answered"
    chat.user("Pinned: ship it on Friday.", pinned=True)
    yield "a pin, and the other call orphaned"
    sess.process_request(now=T0 + 2 * HOUR)
    yield "cleared again"
    chat.chatter(4, tag="end")
    yield "talk"
    chat.tool(words(6_000, "late"))
    yield "a result over the budget, appended to a context that derived its longest"


@pytest.mark.slow
def test_a_context_extended_step_by_step_derives_what_a_fresh_one_does(
    store: CompactStore,
) -> None:
    for fmt in FORMATS:
        chat = new_session(store, fmt, sid=f"extended-{fmt}", context_window=30_000)
        busy_log(chat)
        for step in step_by_step(chat):
            chat.sess.context()  # brings the cached context up to date
            cached = store.cache.get(chat.sess.id)
            assert cached is not None
            for context in (cached.base, cached.answered):
                # What the cached one derives (carried over from the context it extends)
                # equals what a copy derives from scratch.
                assert derived(context) == derived(replace(context)), (fmt, step)


class Handle:
    """Stands for a Session handle: the cache only needs something that can die."""


@given(
    st.integers(min_value=1, max_value=3),
    st.lists(
        st.tuples(st.sampled_from(["open", "close", "put"]), st.integers(min_value=0, max_value=5)),
        max_size=40,
    ),
)
def test_the_cache_keeps_every_session_with_a_live_handle_and_bounds_the_idle_ones(
    bound: int, operations: list[tuple[str, int]]
) -> None:
    cache = ContextCache(bound)
    handles: list[tuple[str, Handle]] = []
    entry: Any = object()  # the cache never looks inside an entry
    pinned_in: set[str] = set()  # sessions cached while a handle of theirs lived
    for operation, k in operations:
        sid = f"s{k}"
        if operation == "open":
            handles.append((sid, Handle()))  # no other reference: closing it ends it
            cache.pin(handles[-1][1], sid)
            if sid in cache._entries:
                pinned_in.add(sid)
        elif operation == "close" and handles:
            del handles[k % len(handles)]  # the handle dies: CPython finalizes it at once
        elif operation == "put":
            cache.put(sid, entry)
            assert next(reversed(cache._entries)) == sid  # never the one evicted
        held = {sid for sid, _ in handles}
        pinned_in = (pinned_in | ({sid} if operation == "put" else set())) & held
        entries = set(cache._entries)
        assert pinned_in <= entries, "a session with a live handle lost its context"
        assert len(entries - held) <= bound, "more idle sessions cached than the bound"
