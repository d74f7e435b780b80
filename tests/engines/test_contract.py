"""Rules that hold across every stage, checked for each stage in each format:
deterministic, never splits a tool pair, never grows usage, records what it did.

Each stage runs on the same kind of log — pins, parallel calls, a crash-orphaned call, an
error, large results — in the store under test and in a fresh SQLite twin; both must come
out byte-identical.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from compactstore import (
    CompactionResult,
    CompactStore,
    CompactStrategy,
    CompactTrigger,
)
from tests.helpers import (
    FORMATS,
    T0,
    Chat,
    assistant,
    call_ids,
    calls_message,
    check_recorded,
    context_seqs,
    new_session,
    opened,
    pair_problems,
    per_seq,
    plain,
    result_map,
    system,
    user,
    validate_with_sdk,
    words,
)

ONLY_AUTO = {"enable_tool_budget": False, "enable_microcompact": False}
# A low threshold makes auto-compact fire on a ~9,000-token log in a 20,000-token window.
AUTO = {"context_window": 20_000, "config": plain(auto_compact_threshold=0.3)}
MEMORY_AUTO = {
    "context_window": 20_000,
    "config": plain(
        auto_compact_threshold=0.3,
        session_memory_min_tail_tokens=500,
        session_memory_max_tail_tokens=2_000,
    ),
}


@dataclass(frozen=True)
class Stage:
    session: dict[str, Any]
    run: Callable[[Chat, dict[str, int]], CompactionResult | None]
    strategy: CompactStrategy | tuple[CompactStrategy, ...]
    trigger: CompactTrigger
    memory: bool = False


STAGES: dict[str, Stage] = {
    "tool_budget": Stage(
        {},
        # 600 s after the last message the cache is cold: microcompact would run too.
        lambda chat, _: chat.sess.process_request(now=T0 + 600, enable_microcompact=False),
        CompactStrategy.TOOL_BUDGET,
        CompactTrigger.AUTO,
    ),
    "microcompact": Stage(
        {},
        lambda chat, _: chat.sess.process_request(now=T0 + 3_600, enable_tool_budget=False),
        CompactStrategy.MICROCOMPACT,
        CompactTrigger.MICROCOMPACT_TIME,
    ),
    "auto_session_memory": Stage(
        MEMORY_AUTO,
        lambda chat, _: chat.sess.process_request(now=T0 + 600, **ONLY_AUTO),
        CompactStrategy.SESSION_MEMORY,
        CompactTrigger.AUTO,
        memory=True,
    ),
    "auto_full": Stage(
        AUTO,
        lambda chat, _: chat.sess.process_request(now=T0 + 600, **ONLY_AUTO),
        CompactStrategy.FULL,
        CompactTrigger.AUTO,
    ),
    "reactive": Stage(
        {"context_window": 1_000},
        lambda chat, _: chat.sess.reactive_recover("prompt is too long", now=T0 + 600),
        # Attempt 1's full compact may already get below the limit; if not, it truncates.
        (CompactStrategy.FULL, CompactStrategy.REACTIVE),
        CompactTrigger.REACTIVE,
    ),
    "manual": Stage(
        {},
        lambda chat, _: chat.sess.compact(now=T0 + 600),
        CompactStrategy.FULL,
        CompactTrigger.MANUAL,
    ),
    "partial": Stage(
        {},
        # Up to the assistant message of a parallel call: the cut must not split its pairs.
        lambda chat, marks: chat.sess.compact(up_to_seq=marks["parallel"], now=T0 + 600),
        CompactStrategy.PARTIAL,
        CompactTrigger.MANUAL,
    ),
}


def new_call(chat: Chat, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return calls_message(chat.fmt, [(chat.new_id(), name, args)])


def build_log(chat: Chat) -> dict[str, int]:
    """A log with every shape the rules care about; returns seqs worth pointing at."""
    marks: dict[str, int] = {}
    opening = [user("Fix the flaky integration test in tests/test_api.py and explain why")]
    if chat.fmt != "anthropic":
        opening.insert(0, system("You are a careful coding agent."))
    chat.extend([*opening, assistant(words(600, "plan"))])
    chat.pins.extend(opening)  # leading system messages and the first user message
    chat.tool_turns(
        [
            ("read_file", {"file_path": f"src/m{i}.py"}, words(800, f"src{i}"), False)
            for i in range(4)
        ]
        + [("bash", {"command": "pytest -x"}, words(5_000, "biglog"), False)]
    )
    chat.user("Note: never touch the migrations.", pinned=True)
    marks["parallel"], ids = chat.calls(
        [("read_file", {"file_path": "a.py"}), ("grep", {"pattern": "retry"})], text="Both at once"
    )
    chat.result(ids[0], words(700, "a"), name="read_file")
    chat.result(ids[1], "a.py:3: retry(3)", name="grep")
    chat.tool("connection refused", name="bash", args={"command": "curl api"}, is_error=True)
    orphan = new_call(chat, "bash", {"command": "sleep 100"})  # never answered
    marks["orphan"], _ = chat.extend([orphan, user("That command hung; I restarted you.")])
    chat.tool_turns(
        [("read_file", {"file_path": "tests/test_api.py"}, words(4_500, "big2"), False)]
        + [
            ("read_file", {"file_path": f"t{i}.py"}, words(600, f"late{i}"), False)
            for i in range(4)
        ]
    )
    chat.chatter(16, tag="talk", chars=1_200)
    return marks


def run_stage(store: CompactStore, name: str) -> dict[str, Any]:
    """Run one stage in every format in ``store``; check the rules; return what must repeat."""
    stage = STAGES[name]
    observed: dict[str, Any] = {}
    for fmt in FORMATS:
        chat = new_session(store, fmt, sid=f"{name}-{fmt}", **stage.session)
        marks = build_log(chat)
        if stage.memory:
            chat.sess.remember("user_intent", "Make the API test reliable", now=T0 + 1)
            chat.sess.remember("decision", "Use a fake clock in tests", now=T0 + 2)
        log = chat.sess.messages()
        before = chat.sess.active_context()
        usage = chat.sess.token_usage()
        assert pair_problems(fmt, before) == []

        result = stage.run(chat, marks)

        assert result is not None
        context = per_seq(chat.sess)  # one message per seq; the wire view is checked too
        validate_with_sdk(fmt, chat.sess.active_context())
        # It did what the stage does, and recorded exactly one row saying so.
        assert result.effective, (fmt, result.steps)
        allowed = stage.strategy if isinstance(stage.strategy, tuple) else (stage.strategy,)
        assert result.strategy in allowed and result.trigger == stage.trigger, fmt
        (row,) = chat.sess.compactions()
        assert row.steps and row.strategy == result.strategy
        check_recorded(chat.sess, result)
        # Never splits a tool pair; what is sent is valid for the API.
        assert pair_problems(fmt, context) == [], fmt
        validate_with_sdk(fmt, context)
        # Never grows usage.
        assert result.tokens_before == usage
        assert chat.sess.token_usage() == result.tokens_after < usage
        # Pins stay verbatim, in log order.
        assert [m for m in context if m in chat.pins] == chat.pins, fmt
        # What left the context is exactly what was recorded as removed.
        gone = set(range(len(log))) - set(context_seqs(chat.sess))
        assert gone == set(row.removed_seqs), fmt
        # Every result whose content changed is recorded as cleared, and only those.
        original = result_map(fmt, log)
        shown = result_map(fmt, context)
        changed = {i for i, text in shown.items() if i in original and text != original[i]}
        kept_ids = {i for i in row.cleared_tool_use_ids if i in shown}
        assert changed == kept_ids, fmt
        # Each blob holds the original content of a result it replaced.
        replaced = {original[i] for i in row.cleared_tool_use_ids}
        assert len(row.blob_ids) <= len(row.cleared_tool_use_ids)
        for blob_id in row.blob_ids:
            assert chat.sess.get_blob(blob_id) in replaced, fmt
        # The crash-orphaned call, while in the context, carries a synthetic result.
        if any(m == log[marks["orphan"]] for m in context):
            (orphan_id,) = call_ids(fmt, log[marks["orphan"]])
            assert orphan_id in shown and orphan_id not in original, fmt
        if name == "partial":
            assert max(row.removed_seqs) < marks["parallel"], "the cut moved before the pair"
        observed[fmt] = {
            "result": result.model_dump(exclude={"messages"}),
            "messages": result.messages,
            "context": context,
            "compactions": [c.model_dump() for c in chat.sess.compactions()],
            "boundaries": [b.model_dump() for b in chat.sess.boundaries()],
            "before": before,
        }
        assert result.messages == context
    return observed


@pytest.mark.slow
@pytest.mark.parametrize("name", list(STAGES))
def test_every_stage_in_every_format_keeps_the_rules_and_is_deterministic(
    store: CompactStore, tmp_path: Path, name: str
) -> None:
    observed = run_stage(store, name)

    with opened(tmp_path / "twin.db") as twin:
        again = run_stage(twin, name)

    for fmt in FORMATS:
        assert again[fmt] == observed[fmt], f"{name} in {fmt} is not deterministic"
