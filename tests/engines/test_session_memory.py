"""Stage 6a, session-memory compact: the summary is stored memory (up to 6,000
tokens, user intent first, then the newest) plus counts; a verbatim tail is kept from the
newest message backwards — at least 5 messages and 10,000 tokens, at most 40,000 tokens once
those minimums are met; it fails (and full compact runs) when it would keep >= 95%.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from compactstore import (
    CompactStore,
    CompactStrategy,
    CompactTrigger,
    MemoryEntry,
)
from tests.helpers import (
    T0,
    Chat,
    assistant,
    estimate,
    new_session,
    opened,
    pair_problems,
    plain,
    text_of,
    user,
    words,
)

ONLY_AUTO = {"enable_tool_budget": False, "enable_microcompact": False}


def converse(chat: Chat, sizes: Sequence[int]) -> None:
    """A request, then alternating assistant/user text messages of the given char sizes."""
    chat.request("Rewrite the parser so it streams")
    for i, size in enumerate(sizes):
        role = "assistant" if i % 2 == 0 else "user"
        chat.add({"role": role, "content": words(size, f"m{i}")})


def tail_of(chat: Chat) -> list[tuple[int, int]]:
    """(seq, tokens) of the verbatim tail the last boundary kept."""
    return [(item.seq, item.tokens) for item in chat.sess.context().kept if item.seq is not None]


@pytest.mark.slow_on_postgres
def test_at_the_defaults_the_tail_has_5_messages_10k_tokens_and_at_most_40k(
    store: CompactStore,
) -> None:
    chat = new_session(store, "anthropic", context_window=200_000)
    converse(chat, [7_000, 3_000, 11_000, 1_200] * 31)  # 172,050 tokens of conversation
    chat.sess.remember("fact", "The lexer lives in lexer.py", now=T0 + 1)
    chat.sess.remember("user_intent", "Ship a streaming parser", now=T0 + 2)
    chat.sess.remember("decision", "Keep the public API unchanged", now=T0 + 3)
    chat.sess.remember("user_intent", "No new dependencies", now=T0 + 4)
    before = chat.sess.token_usage()
    assert before >= 170_000

    result = chat.sess.process_request(now=T0 + 10_000, **ONLY_AUTO)

    assert result.effective
    assert result.strategy == CompactStrategy.SESSION_MEMORY
    assert result.trigger == CompactTrigger.AUTO
    assert [s.strategy for s in result.steps] == [CompactStrategy.SESSION_MEMORY]
    tail = tail_of(chat)
    tail_tokens = sum(tokens for _, tokens in tail)
    assert len(tail) >= 5 and tail_tokens >= 10_000
    assert tail_tokens <= 40_000
    log = chat.sess.messages()
    first_kept = tail[0][0]
    assert [seq for seq, _ in tail] == list(range(first_kept, len(log)))
    older = estimate(text_of(log[first_kept - 1]))
    assert tail_tokens + older > 40_000, "the tail grows up to 40,000 tokens"
    assert result.boundary is not None
    assert result.boundary.preserved_segment == (first_kept, len(log) - 1)
    assert chat.sess.token_usage() < 170_000
    # The summary carries the memory, user intent first, then the newest entries.
    summary = result.summary_text
    order = [
        summary.index(text)
        for text in (
            "Ship a streaming parser",
            "No new dependencies",
            "Keep the public API unchanged",
            "The lexer lives in lexer.py",
        )
    ]
    assert order == sorted(order)
    assert any(text_of(m) == summary or summary in text_of(m) for m in chat.sess.active_context())


# (message chars, min tail messages, min tail tokens, max tail tokens, expected tail length)
TAIL_CASES = [
    (4_000, 5, 1_000, 2_000, 5),  # five messages are kept even past the token cap
    (1_000, 5, 3_000, 3_000, 12),  # the token minimum needs more than five messages
    (1_000, 5, 1_000, 4_000, 16),  # once the minimums are met, the tail grows up to the cap
]


@pytest.mark.slow_on_postgres
def test_the_tail_bounds_scale_with_the_config(store: CompactStore) -> None:
    for case, (chars, min_messages, min_tokens, max_tokens, expected) in enumerate(TAIL_CASES):
        config = plain(
            session_memory_min_tail_messages=min_messages,
            session_memory_min_tail_tokens=min_tokens,
            session_memory_max_tail_tokens=max_tokens,
        )
        chat = new_session(store, "minicode", context_window=10_000, config=config, sid=f"c{case}")
        converse(chat, [chars] * (40_000 // chars))
        chat.sess.remember("user_intent", "Stream the parser")

        result = chat.sess.process_request(now=T0 + 100, **ONLY_AUTO)

        assert result.strategy == CompactStrategy.SESSION_MEMORY, case
        tail = tail_of(chat)
        assert len(tail) == expected, case
        assert tail[-1][0] == len(chat.sess.messages()) - 1


@pytest.mark.slow_on_postgres
def test_without_memory_or_when_it_would_keep_95_percent_full_compact_runs_instead(
    store: CompactStore,
) -> None:
    chat = new_session(store, "openai", context_window=10_000, sid="no-memory")
    converse(chat, [1_000] * 36)

    result = chat.sess.process_request(now=T0 + 100, **ONLY_AUTO)

    assert result.strategy == CompactStrategy.FULL
    assert [s.strategy for s in result.steps] == [CompactStrategy.FULL]

    chat = new_session(store, "anthropic", context_window=50_000, sid="ninety-five")
    converse(chat, [7_000] * 25)  # 43,750 tokens: a 40,000-token tail keeps almost all
    chat.sess.remember("user_intent", words(14_000, "intent"))  # ~3,500 tokens of memory
    before = chat.sess.token_usage()

    result = chat.sess.process_request(now=T0 + 100, **ONLY_AUTO)

    memory_step, full_step = result.steps
    assert memory_step.strategy == CompactStrategy.SESSION_MEMORY
    assert not memory_step.success and memory_step.tokens_freed == 0
    assert full_step.strategy == CompactStrategy.FULL and full_step.success
    assert result.strategy == CompactStrategy.FULL and result.effective
    assert result.boundary is not None and result.boundary.strategy == CompactStrategy.FULL
    assert "intent lorem" not in result.summary_text, "the failed memory summary was dropped"
    assert chat.sess.token_usage() < 0.95 * before
    assert len(chat.sess.compactions()) == 1


def test_the_memory_in_the_summary_stays_within_6000_tokens(store: CompactStore) -> None:
    config = plain(session_memory_min_tail_tokens=1_000, session_memory_max_tail_tokens=4_000)
    chat = new_session(store, "anthropic", context_window=40_000, config=config)
    converse(chat, [4_000] * 36)  # 36,000 tokens
    entries = {
        "first intent": ("user_intent", T0 + 1),
        "oldest fact": ("fact", T0 + 2),
        "middle fact": ("fact", T0 + 3),
        "newest decision": ("decision", T0 + 4),
    }
    for label, (kind, when) in entries.items():
        chat.sess.remember(kind, f"{label}: " + words(10_000, label.split()[0]), now=when)

    result = chat.sess.process_request(now=T0 + 100, **ONLY_AUTO)

    assert result.strategy == CompactStrategy.SESSION_MEMORY
    included = [label for label in entries if f"{label}: " in result.summary_text]
    assert included == ["first intent", "newest decision"]
    memory_tokens = sum(e.tokens for e in chat.sess.memories() if e.text in result.summary_text)
    assert memory_tokens <= 6_000


def test_a_custom_memory_provider_is_used(db_url: str) -> None:
    seen: list[tuple[str, list[MemoryEntry], int]] = []

    def provider(session_id: str, entries: Sequence[MemoryEntry], max_tokens: int) -> str:
        seen.append((session_id, list(entries), max_tokens))
        return "PROVIDED: the team prefers small pull requests"

    with opened(db_url, memory_provider=provider) as store:
        config = plain(session_memory_min_tail_tokens=1_000, session_memory_max_tail_tokens=3_000)
        chat = new_session(store, "minicode", context_window=10_000, sid="agent-7", config=config)
        converse(chat, [1_000] * 36)
        chat.sess.remember("convention", "stored entry text")

        result = chat.sess.process_request(now=T0 + 100, **ONLY_AUTO)

    assert result.strategy == CompactStrategy.SESSION_MEMORY
    assert "PROVIDED: the team prefers small pull requests" in result.summary_text
    assert "stored entry text" not in result.summary_text
    assert seen, "the provider was called"
    session_id, given, budget = seen[-1]
    # session_memory_max_tokens (6,000), but no more than the summary's share of the window:
    # a fifth of 10,000 tokens at factor 1.0.
    assert session_id == "agent-7" and budget == 2_000
    assert [e.text for e in given] == ["stored entry text"]


@pytest.mark.slow_on_postgres
def test_a_tool_pair_at_the_tail_start_does_not_push_the_tail_past_40000_tokens(
    store: CompactStore,
) -> None:
    chat = new_session(store, "anthropic", context_window=200_000)
    converse(chat, [7_000] * 80)  # 140,000 tokens of older talk
    # A call carrying ~2,000 tokens of reasoning, then its 10,000-token result...
    _, (tool_use_id,) = chat.calls([("read_file", {"path": "dump.sql"})], text=words(8_000, "why"))
    chat.result(tool_use_id, words(40_000, "dump"))
    # ...then 30,000 tokens of talk: the 40,000-token tail starts exactly at the result.
    chat.extend([(assistant if i % 2 else user)(words(12_000, f"recent{i}")) for i in range(10)])
    chat.sess.remember("user_intent", "Restore the database")

    result = chat.sess.process_request(now=T0 + 100, **ONLY_AUTO)

    assert result.strategy == CompactStrategy.SESSION_MEMORY
    tail = tail_of(chat)
    assert len(tail) >= 5 and sum(tokens for _, tokens in tail) <= 40_000
    assert pair_problems("anthropic", chat.sess.active_context()) == []
