"""Messages are stored verbatim: a long conversation with tool calls, appended
message by message, comes back from active_context() exactly as it went in — order, key
order and values — on both backends and after reopening the store, and for anthropic and
openai the result is a request the official SDKs accept.
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Callable
from typing import Any

import pytest

from compactstore import CompactStore, Session
from compactstore.formats.sdk_types import SDK_FORMATS, check_sdk_types

Message = dict[str, Any]
TURNS = 50

# Text that has tripped up storage layers: quotes, escapes, NUL, non-BMP, RTL, CJK.
TEXTS = [
    "Fix the flaky test in tests/test_auth.py",
    "He said \"quote\" and \\backslash\\ and 'single'",
    "multi\nline\r\nwith\ttabs",
    "naïve café — ‘curly’ “quotes” …",
    "日本語のテキストと한국어 and 中文",
    "emoji 🙂🚀 and a non-BMP 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "NUL in the middle: a\x00b",
    "עברית وعربي mixed with English",
    "   leading and trailing spaces   ",
    "",
    "SELECT * FROM messages; -- not SQL, just text",
    '{"looks": "like json"}',
]


def _value(rng: random.Random, depth: int = 0) -> Any:
    """A JSON value with awkward numbers, unsorted keys and nesting."""
    choice = rng.randrange(9 if depth < 2 else 6)
    if choice == 0:
        return rng.choice([0.1, 1e-7, 1.5e300, -0.0, 2.5, 3.141592653589793])
    if choice == 1:
        return rng.choice([0, -1, 2**53 + 1, 10**18, 42])
    if choice == 2:
        return rng.choice([True, False, None])
    if choice in (3, 4, 5):
        return rng.choice(TEXTS)
    if choice == 6:
        return [_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    keys = rng.sample(["zeta", "alpha", "Mid", "_private", "ключ", "9", "a b"], rng.randrange(1, 5))
    return {key: _value(rng, depth + 1) for key in keys}


def _input(rng: random.Random, turn: int, index: int) -> dict[str, Any]:
    # Keys deliberately not in sorted order: key order must survive.
    return {"path": f"src/module_{turn}_{index}.py", "options": _value(rng, 1), "limit": turn}


class Conversation:
    """Appends a generated conversation to a session and keeps the messages it expects back."""

    def __init__(self, sess: Session, seed: int) -> None:
        self.sess = sess
        self.fmt = sess.format
        self.rng = random.Random(seed)
        self.expected: list[Message] = []
        self.next_id = 0
        self.parallel_turns = 0
        self.calls = 0

    # -- appending --------------------------------------------------------------------------

    def append(self, message: Message, **kwargs: Any) -> None:
        self.expected.append(copy.deepcopy(message))
        seq = self.sess.append(message, timestamp=float(len(self.expected)), **kwargs)
        assert seq == len(self.expected) - 1

    def tool_result(
        self, call_id: str, name: str, content: str, *, is_error: bool, expected: Message
    ) -> None:
        self.expected.append(expected)
        seq = self.sess.append_tool_result(
            call_id,
            content,
            tool_name=name,
            is_error=is_error,
            timestamp=float(len(self.expected)),
        )
        assert seq == len(self.expected) - 1

    # -- building ---------------------------------------------------------------------------

    def new_id(self) -> str:
        self.next_id += 1
        prefix = {"anthropic": "toolu_", "openai": "call_", "minicode": "tu_"}[self.fmt]
        return f"{prefix}{self.next_id:04d}_{self.rng.getrandbits(32):08x}"

    def user(self, turn: int) -> Message:
        text = f"turn {turn}: {self.rng.choice(TEXTS)}"
        if turn % 7 == 3:
            parts = [
                {"type": "text", "text": text},
                {"type": "text", "text": self.rng.choice(TEXTS)},
            ]
            return {"role": "user", "content": parts}
        return {"role": "user", "content": text}

    def assistant_calls(self, calls: list[tuple[str, str, dict[str, Any]]]) -> Message:
        text = self.rng.choice(["Let me look.", "", "Checking 日本語 files…"])
        if self.fmt == "openai":
            message: Message = {"role": "assistant", "content": text or None}
            message["tool_calls"] = [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)},
                }
                for call_id, name, args in calls
            ]
            return message
        blocks: list[Message] = [{"type": "text", "text": text}] if text else []
        blocks += [
            {"type": "tool_use", "id": call_id, "name": name, "input": args}
            for call_id, name, args in calls
        ]
        return {"role": "assistant", "content": blocks}

    def result_content(self, turn: int, index: int) -> str:
        lines = self.rng.randrange(1, 30)
        return "\n".join(f"{turn}:{index}:{i} {self.rng.choice(TEXTS)}" for i in range(lines))

    def turn(self, turn: int) -> None:
        self.append(self.user(turn))
        count = self.rng.choice([0, 1, 1, 2, 3]) if turn else 1
        if count == 0:
            self.append(
                {"role": "assistant", "content": f"Answer {turn}: {self.rng.choice(TEXTS)}"}
            )
            return
        calls = [
            (
                self.new_id(),
                self.rng.choice(["read_file", "bash", "grep"]),
                _input(self.rng, turn, i),
            )
            for i in range(count)
        ]
        self.calls += count
        self.parallel_turns += count > 1
        self.append(self.assistant_calls(calls))
        self.results(turn, calls)
        self.append({"role": "assistant", "content": [{"type": "text", "text": f"Done {turn}."}]})

    def results(self, turn: int, calls: list[tuple[str, str, dict[str, Any]]]) -> None:
        outcomes = [
            (call_id, name, self.result_content(turn, i), self.rng.random() < 0.2)
            for i, (call_id, name, _) in enumerate(calls)
        ]
        if self.fmt == "anthropic" and len(calls) > 1:
            # Parallel results travel together in the next user message.
            blocks: list[Message] = []
            for call_id, _, content, is_error in outcomes:
                block: Message = {"type": "tool_result", "tool_use_id": call_id}
                if is_error:
                    block.update(content=content, is_error=True)
                else:
                    block["content"] = [{"type": "text", "text": content}]
                blocks.append(block)
            self.append({"role": "user", "content": blocks})
            return
        for index, (call_id, name, content, is_error) in enumerate(outcomes):
            if self.fmt == "openai":
                if index % 2:  # content parts, appended as a message
                    self.append(
                        {
                            "role": "tool",
                            "tool_call_id": call_id,
                            "content": [{"type": "text", "text": content}],
                        }
                    )
                else:
                    expected: Message = {
                        "role": "tool",
                        "tool_call_id": call_id,
                        "content": content,
                    }
                    self.tool_result(call_id, name, content, is_error=False, expected=expected)
            elif self.fmt == "anthropic":
                expected = {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": call_id,
                            "content": content,
                            "is_error": is_error,
                        }
                    ],
                }
                self.tool_result(call_id, name, content, is_error=is_error, expected=expected)
            elif index % 2:  # minicode, written by the agent itself (isError left out)
                self.append(
                    {
                        "role": "tool_result",
                        "content": content,
                        "toolName": name,
                        "toolUseId": call_id,
                    }
                )
            else:
                expected = {
                    "role": "tool_result",
                    "content": content,
                    "toolName": name,
                    "toolUseId": call_id,
                    "isError": is_error,
                }
                self.tool_result(call_id, name, content, is_error=is_error, expected=expected)


def _same(got: list[Message], expected: list[Message]) -> None:
    assert len(got) == len(expected)
    for index, (a, b) in enumerate(zip(got, expected, strict=True)):
        assert a == b, f"message {index} differs"
    # Key order and value types too (1 vs 1.0 vs True, -0.0), not just equality.
    assert json.dumps(got, ensure_ascii=False) == json.dumps(expected, ensure_ascii=False)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["anthropic", "openai", "minicode"])
def test_a_fifty_turn_conversation_comes_back_verbatim(
    store: CompactStore, reopen: Callable[[], CompactStore], fmt: str
) -> None:
    sess = store.session(f"roundtrip-{fmt}", format=fmt, now=0.0)
    conversation = Conversation(sess, seed={"anthropic": 1, "openai": 2, "minicode": 3}[fmt])
    if fmt != "anthropic":
        conversation.append({"role": "system", "content": "You are a careful coding agent."})
    for turn in range(TURNS):
        conversation.turn(turn)
    expected = conversation.expected
    # The generator really produced what this test is about.
    assert conversation.calls >= TURNS
    assert conversation.parallel_turns >= 5

    _same(sess.active_context(), expected)
    _same(sess.messages(), expected)
    assert {item.state for item in sess.context().items} <= {"original", "pinned"}
    if fmt in SDK_FORMATS:
        check_sdk_types(fmt, sess.active_context())

    again = reopen().session(sess.id)
    assert again.format == fmt
    _same(again.active_context(), expected)
    _same(again.messages(), expected)
