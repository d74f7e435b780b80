"""Active contexts built in memory, for testing the engines as the pure functions they are:
no database, no clock, milliseconds per test."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from compactstore._context.active import ActiveContext, ContextMessage, MessageState
from compactstore._context.pairs import pairing_problems
from compactstore._context.tokens import estimate_tokens, message_tokens
from compactstore.formats import get_format
from compactstore.models import CompactionConfig
from tests.helpers import assistant, call_id, calls_message, result_message, user, words


@dataclass
class ContextBuilder:
    """Messages appended as seqs 0, 1, 2, ...; ``build()`` gives the context they form."""

    fmt: str = "anthropic"
    context_window: int = 200_000
    config: CompactionConfig = field(default_factory=lambda: CompactionConfig(token_factor=1.0))
    items: list[ContextMessage] = field(default_factory=list)
    calls: int = 0
    clock: float = 1_700_000_000.0
    request_seq: int | None = None

    def add(self, message: dict[str, Any], state: MessageState = "original") -> int:
        adapter = get_format(self.fmt)
        seq = len(self.items)
        self.clock += 1
        self.items.append(
            ContextMessage.build(
                adapter,
                message,
                tokens=message_tokens(adapter, message, estimate_tokens),
                seq=seq,
                state=state,
                created_at=self.clock,
            )
        )
        return seq

    def request(self, text: str) -> ContextBuilder:
        """The user's request: pinned, as the store pins it at insert."""
        self.request_seq = self.add(user(text), "pinned")
        return self

    def chatter(self, count: int, chars: int = 400) -> ContextBuilder:
        for i in range(count):
            self.add(
                assistant(words(chars, f"a{i}")) if i % 2 == 0 else user(words(chars, f"u{i}"))
            )
        return self

    def tool(self, name: str, args: dict[str, Any], output: str) -> ContextBuilder:
        self.calls += 1
        cid = call_id(self.fmt, self.calls)
        self.add(calls_message(self.fmt, [(cid, name, args)]))
        self.add(result_message(self.fmt, cid, output, name=name))
        return self

    def build(self) -> ActiveContext:
        return ActiveContext(
            session_id="built",
            fmt=get_format(self.fmt),
            context_window=self.context_window,
            config=self.config,
            count_tokens=estimate_tokens,
            head=(),
            kept=tuple(self.items),
            last_seq=len(self.items) - 1,
            real_request_seq=self.request_seq,
        )


def valid(context: ActiveContext) -> bool:
    """Every tool result follows its call and every call (but the newest turn's) is answered."""
    return pairing_problems(context.items) == []
