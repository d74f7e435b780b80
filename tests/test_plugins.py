"""The caller's code the store runs (token counter, memory provider), and a session handle
that another handle's config change has overtaken."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

from compactstore import (
    CompactionConfig,
    CompactStore,
    InvalidMessageError,
    MemoryEntry,
    PluginError,
)
from tests.conftest import Snapshot
from tests.helpers import T0, assistant, new_session, opened, user, words


def _raises(text: str) -> int:
    raise RuntimeError("tokenizer files are missing")


@pytest.mark.parametrize(
    ("counter", "problem"),
    [
        (_raises, "raised RuntimeError: tokenizer files are missing"),
        (lambda text: -1, "returned -1"),
        (lambda text: "12", "returned '12'"),
        (lambda text: 2.5, "returned 2.5"),
        (lambda text: True, "returned True"),
    ],
)
def test_a_token_counter_that_fails_is_a_plugin_error_and_stores_nothing(
    store: CompactStore,
    db_snapshot: Snapshot,
    counter: Callable[[str], Any],
    problem: str,
) -> None:
    new_session(store, sid="plug")
    before = db_snapshot(store)
    url = store.engine.url.render_as_string(hide_password=False)
    with opened(url, token_counter=counter) as other:
        sess = other.session("plug")
        with pytest.raises(PluginError, match=problem):
            sess.append(user("hello"), timestamp=T0 + 1)
        with pytest.raises(PluginError, match=problem):
            sess.extend([user("a"), assistant("b")], timestamps=[T0 + 1, T0 + 2])
        with pytest.raises(PluginError, match=problem):
            sess.remember("fact", "the tests use pytest", now=T0 + 3)
    assert db_snapshot(store) == before


def test_a_memory_provider_that_raises_is_a_plugin_error_and_stores_nothing(
    store: CompactStore, db_snapshot: Snapshot
) -> None:
    # Over the auto-compact threshold: process_request may cut, so it asks for memory.
    chat = new_session(store, sid="mem", context_window=1_100)
    chat.request("Migrate the build to Bazel.")
    chat.chatter(10, chars=400)
    chat.sess.remember("decision", "keep the Makefile until CI passes", now=T0 + 50)
    assert chat.sess.token_usage() > 0.85 * 1_100
    before = db_snapshot(store)

    def provider(session_id: str, entries: Sequence[MemoryEntry], max_tokens: int) -> str:
        raise KeyError("memory service down")

    def wrong(session_id: str, entries: Sequence[MemoryEntry], max_tokens: int) -> str:
        return None  # type: ignore[return-value]

    url = store.engine.url.render_as_string(hide_password=False)
    for bad, problem in ((provider, "raised KeyError"), (wrong, "returned NoneType")):
        with opened(url, memory_provider=bad) as other:
            with pytest.raises(PluginError, match=problem):
                other.session("mem").compact(now=T0 + 100)
            with pytest.raises(PluginError, match=problem):
                other.session("mem").process_request(now=T0 + 100)
    assert db_snapshot(store) == before


def test_the_memory_provider_runs_only_for_a_call_that_may_cut(store: CompactStore) -> None:
    # Below the auto-compact threshold no cut can follow (the cheap stages only lower usage),
    # so a step of an agent costs no provider call.
    asked: list[str] = []

    def provider(session_id: str, entries: Sequence[MemoryEntry], max_tokens: int) -> str:
        asked.append(session_id)
        return ""

    url = store.engine.url.render_as_string(hide_password=False)
    with opened(url, memory_provider=provider) as other:
        for sid, window in (("roomy", 200_000), ("full", 1_100)):
            chat = new_session(other, sid=sid, context_window=window)
            chat.request("Migrate the build to Bazel.")
            chat.chatter(10, chars=400)
            chat.sess.process_request(now=T0 + 100)
    assert asked == ["full"]


def test_a_handle_follows_the_stored_config_another_handle_changed(store: CompactStore) -> None:
    chat = new_session(store, sid="cfg")
    old = chat.sess  # opened with the default limits and read dedup on
    _, (first,) = chat.calls([("read_file", {"path": "a.py"})])
    old.append_tool_result(
        first, words(300), tool_name="read_file", file_path="a.py", timestamp=T0 + 10
    )
    store.session("cfg", config=CompactionConfig(read_dedup_enabled=False, max_message_bytes=2_048))
    _, (second,) = chat.calls([("read_file", {"path": "a.py"})])
    seq = old.append_tool_result(
        second, words(300), tool_name="read_file", file_path="a.py", timestamp=T0 + 20
    )
    assert "Read deduplicated" not in str(old.messages()[seq])  # dedup is off now
    with pytest.raises(InvalidMessageError, match="over the limit of 2048"):
        old.append(user(words(4_000)), timestamp=T0 + 30)
    assert old.config.max_message_bytes == 2_048
