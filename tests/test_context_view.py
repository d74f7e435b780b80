"""``Session.context_view()``: the read-only, shared read of the active context.

It holds exactly what ``active_context()`` returns, costs what is new rather than the size of
the context, and nothing a caller does to it — or to the copies ``active_context()`` hands
out — changes the store's cache or what any other caller sees.
"""

from __future__ import annotations

import copy
import json
import pickle
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given

from compactstore import CompactStore, Session
from compactstore._context.frozen import FrozenDict, FrozenList, freeze, thaw
from tests.helpers import FORMATS, T0, every_stage, new_session, plain, validate_with_sdk
from tests.test_cache import containers, json_values, tool_log, vandalise

HOUR = 3_600


def attempts(value: Any) -> list[Callable[[], object]]:
    """Every way Python code can change a JSON container in place."""
    if isinstance(value, dict):
        key = next(iter(value), "k")
        return [
            lambda: value.__setitem__("k", 1),
            lambda: value.__delitem__(key),
            lambda: value.update(k=1),
            lambda: value.setdefault("new", 1),
            lambda: value.pop(key),
            lambda: value.popitem(),
            value.clear,
            lambda: value.__ior__({"k": 1}),
        ]
    return [
        lambda: value.append(1),
        lambda: value.extend([1]),
        lambda: value.insert(0, 1),
        lambda: value.__setitem__(0, 1),
        lambda: value.__delitem__(0),
        lambda: value.pop(),
        lambda: value.remove(value[0] if value else 1),
        value.clear,
        value.sort,
        value.reverse,
        lambda: value.__iadd__([1]),
        lambda: value.__imul__(2),
    ]


def wire(sess: Session) -> str:
    return json.dumps(list(sess.context_view()))


def from_scratch(sess: Session) -> list[dict[str, Any]]:
    """The wire view built again from the whole context (what the incremental view and
    active_context(), which copies it, must equal)."""
    return sess.adapter.wire_view(sess.context().messages(), sess.config)


@pytest.mark.slow
def test_the_view_is_what_active_context_returns_through_every_stage(
    store: CompactStore, reopen: Callable[[], CompactStore]
) -> None:
    for fmt in FORMATS:
        config = plain(session_memory_min_tail_tokens=2_000, session_memory_max_tail_tokens=6_000)
        chat = new_session(store, fmt, sid=f"view-{fmt}", context_window=18_000, config=config)
        tool_log(chat)
        chat.calls([("bash", {"command": "make deploy"})])  # crash-orphaned: a synthetic result
        chat.chatter(4, tag="after-crash")
        sess = chat.sess
        for result in every_stage(chat):
            assert result is not None
            view = sess.context_view()
            assert isinstance(view, tuple)
            assert list(view) == from_scratch(sess) == sess.active_context(), fmt
            if result.id is not None:  # a recorded result shows the context it left
                # (the result lists one message per seq; the view is its wire view)
                assert list(view) == sess.adapter.wire_view(result.messages, sess.config), fmt
            assert wire(sess) == json.dumps(from_scratch(sess)), fmt  # key order too
            assert list(reopen().get_session(sess.id).context_view()) == list(view), fmt
            validate_with_sdk(fmt, list(view))  # type: ignore[arg-type]
            chat.tool("a result after the compaction")
            assert list(sess.context_view()) == from_scratch(sess), fmt


def test_nothing_in_the_view_can_be_changed_and_trying_changes_nothing(
    store: CompactStore,
) -> None:
    for fmt in FORMATS:
        chat = new_session(store, fmt, sid=f"frozen-{fmt}")
        tool_log(chat)
        sess = chat.sess
        sess.process_request(now=T0 + HOUR)  # persisted previews and cleared placeholders
        before, other = sess.active_context(), store.get_session(sess.id)
        tried = 0
        for message in sess.context_view():
            for container in containers(message):
                assert isinstance(container, FrozenDict | FrozenList)
                for attempt in attempts(container):
                    with pytest.raises(TypeError, match="read-only"):
                        attempt()
                    tried += 1
        assert tried > 100
        assert sess.active_context() == before, fmt
        assert list(other.context_view()) == before, fmt
        assert list(store.get_session(sess.id).context_view()) == before, fmt


def plain_dict(value: object) -> dict[str, Any]:
    """``value``, which must be a plain dict (not the frozen kind the view holds)."""
    assert type(value) is dict
    return value


def test_copies_are_the_callers_to_change(store: CompactStore) -> None:
    for fmt in FORMATS:
        chat = new_session(store, fmt, sid=f"copies-{fmt}")
        tool_log(chat)
        sess = chat.sess
        expected = sess.active_context()
        view = sess.context_view()

        vandalise(sess.active_context())
        deep = [plain_dict(copy.deepcopy(message)) for message in view]
        assert deep == expected
        vandalise(deep)
        shallow = copy.copy(view[-1])
        assert type(shallow) is dict
        shallow["role"] = "changed"

        assert sess.active_context() == expected, fmt
        assert list(sess.context_view()) == expected, fmt
        assert sess.context_view() is view, "nothing changed: the same shared tuple"


def test_a_step_that_only_appends_reuses_every_message_already_read(store: CompactStore) -> None:
    chat = new_session(store, "anthropic")
    tool_log(chat)
    sess = chat.sess
    sess.process_request(now=T0 + 10)
    first = sess.context_view()

    chat.tool("one more result")
    sess.process_request(now=T0 + 20)  # nothing to do
    second = sess.context_view()

    assert len(second) == len(first) + 2
    assert all(a is b for a, b in zip(first, second, strict=False)), "no message is copied"
    assert list(second) == sess.active_context()


def test_only_a_context_made_by_appending_shares_the_lineage_the_view_is_extended_on(
    store: CompactStore,
) -> None:
    chat = new_session(store, "anthropic", sid="lineage")
    tool_log(chat)
    sess = chat.sess
    before = sess.context()
    chat.tool("one more result")
    appended = sess.context()
    assert appended.lineage is before.lineage
    assert appended.wire[: len(before.wire)] == before.wire

    # An edit of a message inside the context (a placeholder) in the same step as an
    # append: a new lineage, so the view is built again rather than extended.
    edited = appended.with_kept(appended.kept[:-1]).extended(
        appended.kept[-1:],
        last_seq=appended.last_seq,
        usage_offset=appended.usage_offset,
        token_factor=appended.token_factor,
        config=appended.config,
    )
    assert edited.lineage is not appended.lineage
    result = sess.process_request(now=T0 + HOUR)  # clears and persists old results
    assert result.effective
    assert sess.context().lineage is not appended.lineage
    assert list(sess.context_view()) == from_scratch(sess)


@pytest.mark.slow
def test_a_crash_orphaned_call_does_not_make_every_later_step_rebuild_the_context(
    store: CompactStore, reopen: Callable[[], CompactStore]
) -> None:
    for fmt in FORMATS:
        chat = new_session(store, fmt, sid=f"orphan-{fmt}")
        tool_log(chat)
        chat.calls([("bash", {"command": "make deploy"})])
        chat.user("The agent crashed; carry on.")  # the call above is answered as interrupted
        sess = chat.sess
        before = sess.context_view()
        synthetic = [item for item in sess.context().items if item.state == "synthetic"]
        assert len(synthetic) == 1, fmt
        for n in range(3):
            chat.tool(f"result {n}")
            view = sess.context_view()
            assert all(a is b for a, b in zip(before, view, strict=False)), (fmt, n)
            assert len(view) == len(before) + 2, (fmt, n)
            assert list(view) == list(reopen().get_session(sess.id).context_view()), (fmt, n)
            before = view
        chat.calls([("grep", {"q": "x"})])
        chat.say("Another crash.")  # a second orphan: the context starts over, the same as fresh
        fresh = reopen().get_session(sess.id)
        assert list(sess.context_view()) == list(fresh.context_view()), fmt
        assert [i.state for i in sess.context().items].count("synthetic") == 2, fmt


def test_sessions_never_share_message_objects(store: CompactStore) -> None:
    one, two = (
        new_session(store, "anthropic", sid="one"),
        new_session(store, "anthropic", sid="two"),
    )
    for chat in (one, two):
        chat.request("Same request text")
    assert one.sess.context_view() == two.sess.context_view()
    assert one.sess.context_view()[0] is not two.sess.context_view()[0]


@pytest.mark.slow
@given(json_values)
def test_freeze_and_thaw_keep_the_json_value(value: Any) -> None:
    frozen = freeze(value)
    assert frozen == value and json.dumps(frozen) == json.dumps(value)
    assert freeze(frozen) is frozen or not isinstance(frozen, dict | list)
    thawed = thaw(frozen)
    assert thawed == value and json.dumps(thawed) == json.dumps(value)
    assert all(type(c) in (dict, list) for c in containers(thawed))
    assert not {id(c) for c in containers(thawed)} & {id(c) for c in containers(frozen)}
    assert pickle.loads(pickle.dumps(frozen)) == value


def test_call_names_of_some_results_are_those_of_all_results(store: CompactStore) -> None:
    for fmt in FORMATS:
        chat = new_session(store, fmt, sid=f"names-{fmt}")
        tool_log(chat)
        context = chat.sess.context()
        picks = [(i, r.tool_use_id) for i, item in enumerate(context.kept) for r in item.results]
        names: dict[str, str] = {}  # forward: the newest call of each id so far
        expected: dict[tuple[int, str], str] = {}
        for i, item in enumerate(context.kept):
            expected.update(((i, r.tool_use_id), names[r.tool_use_id]) for r in item.results)
            names.update((call.id, call.name) for call in item.calls)
        every = context.call_names(picks)
        assert every == expected and len(every) >= 9, fmt
        for some in (picks[:2], picks[-1:], picks, [(len(context.kept), "no-such-id")]):
            assert context.call_names(some) == {p: every[p] for p in some if p in every}, fmt


def test_after_appends_the_view_is_built_again_only_from_the_last_assistant_message(
    store: CompactStore,
) -> None:
    chat = new_session(store, "anthropic", sid="grow")
    chat.request("Port the parser")
    for n in range(3):
        chat.tool(f"output {n}", name="bash", args={"command": f"make {n}"})
    sess = chat.sess
    before = sess.context_view()

    chat.calls([("bash", {"command": "ls"}), ("bash", {"command": "pwd"})])
    first = sess.context_view()
    chat.chatter(1, tag="more")
    after = sess.context_view()

    assert list(after) == sess.active_context()
    assert list(first) == list(after[: len(first)])
    # What stood before the last assistant message is the very same objects, not rebuilt.
    assert all(a is b for a, b in zip(before, after, strict=False))
