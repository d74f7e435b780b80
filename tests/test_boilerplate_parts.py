"""Structure first: a part of a user message that is wholly tagged blocks is client content,
whatever the tag's name, and is never the request; a part a person typed is kept, tags in
it included. Properties over generated multi-part messages, through the classifier and
through a session (the pin and the summary's "Original request")."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compactstore._context.boilerplate import (
    DEFAULT_BOILERPLATE_PATTERNS,
    is_boilerplate,
    is_tagged_block,
    request_text,
)
from tests.helpers import T0, assistant, plain, scratch_store

P = DEFAULT_BOILERPLATE_PATTERNS

# XML-like tag names, known or not: some_new_client_tag, app-context, ns:tag, x.y
TAG_NAMES = st.from_regex(r"\A[A-Za-z][A-Za-z0-9_.:-]{0,24}\Z")
# What sits inside a client block: any text without angle brackets, over several lines.
INNER = st.text(st.characters(exclude_characters="<>", codec="utf-8"), max_size=80)
WORDS = st.lists(st.from_regex(r"\A[a-z]{1,9}\Z"), min_size=1, max_size=12)


@st.composite
def tagged_blocks(draw: st.DrawFn) -> str:
    """One part a client writes: one or more tagged blocks, each maybe with attributes, a
    second word in the name (``<permissions instructions>``) or a nested block."""
    blocks = []
    for _ in range(draw(st.integers(1, 3))):
        name = draw(TAG_NAMES)
        suffix = draw(st.sampled_from(["", ' type="x"', " instructions"]))
        close = f"</{name}{suffix if suffix == ' instructions' else ''}>"
        inner = draw(INNER)
        if draw(st.booleans()):
            inner = f"\n  <{name}>{draw(INNER)}</{name}>\n{inner}"
        blocks.append(f"<{name}{suffix}>{inner}{close}")
    return draw(st.sampled_from(["\n", "", "\n\n"])).join(blocks)


@st.composite
def typed_text(draw: st.DrawFn) -> str:
    """A sentence a person typed, sometimes mentioning a tag inside it."""
    words = draw(WORDS)
    sentence = " ".join(words).capitalize()
    if draw(st.booleans()):
        name = draw(TAG_NAMES)
        sentence += f" in <{name}>{words[0]}</{name}> please"
    return sentence


@st.composite
def client_and_typed(draw: st.DrawFn) -> tuple[list[str], str]:
    """The parts of one user message: client parts before (and maybe after) the typed one."""
    typed = draw(typed_text())
    before = draw(st.lists(tagged_blocks(), min_size=1, max_size=3))
    after = draw(st.lists(tagged_blocks(), max_size=2))
    return [*before, typed, *after], typed


@pytest.mark.slow
@given(client_and_typed())
def test_the_request_of_a_multi_part_message_is_the_typed_part(
    message: tuple[list[str], str],
) -> None:
    parts, typed = message
    asked = request_text(parts, P)
    assert asked == typed
    assert not is_tagged_block(asked) and not asked.startswith("<")
    assert not is_boilerplate(parts, P)


@pytest.mark.slow
@given(st.lists(tagged_blocks(), min_size=1, max_size=4))
def test_a_message_of_client_parts_only_is_boilerplate(parts: list[str]) -> None:
    assert all(is_tagged_block(part) for part in parts)
    assert is_boilerplate(parts, P)
    assert request_text(parts, P) == ""


@pytest.mark.parametrize(
    "text",
    [
        "Please fix this:\n<div>a</div>",
        "<b>bold</b> is what I want here",
        "<a>x</a> and <b>y</b>",
        "<unclosed>\nstill typing",
        "<https://example.com/a> is down",
        "a < b and c > d",
    ],
)
def test_a_part_with_anything_outside_its_tags_is_not_a_tagged_block(text: str) -> None:
    assert not is_tagged_block(text)


def test_an_unknown_tagged_part_before_the_request_is_left_out() -> None:
    parts = ["<some_new_client_tag>\nmode: fast\n</some_new_client_tag>", "Fix the login bug"]
    assert request_text(parts, P) == "Fix the login bug"
    # Joined into one text, the structure is gone: the tag is a person's for all we know.
    assert request_text("\n".join(parts), P).startswith("<some_new_client_tag>")


def _message(fmt: str, parts: list[str]) -> dict[str, Any]:
    kind = "input_text" if fmt == "responses" else "text"
    content = [{"type": kind, "text": part} for part in parts]
    if fmt == "responses":
        return {"type": "message", "role": "user", "content": content}
    return {"role": "user", "content": content}


def _reply(fmt: str, text: str) -> dict[str, Any]:
    if fmt == "responses":
        return {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": text}],
        }
    return assistant(text)


@pytest.mark.slow
@settings(max_examples=15)
@given(
    st.sampled_from(["anthropic", "openai", "responses"]),
    client_and_typed(),
    st.lists(tagged_blocks(), min_size=1, max_size=2),
)
def test_a_session_pins_and_quotes_the_typed_part(
    fmt: str, message: tuple[list[str], str], client_only: list[str]
) -> None:
    """Through a session on a real SQLite file: a message of client parts only is not the
    request; in the next, the typed part is what the summary quotes as the request."""
    parts, typed = message
    with scratch_store() as store:
        sess = store.session("s", format=fmt, config=plain(), now=T0)
        sess.extend([_message(fmt, client_only), _message(fmt, parts)])
        for i in range(8):
            sess.append(_reply(fmt, f"step {i} " + "x" * 400))
            sess.append(_message(fmt, [f"go on {i} " + "y" * 400]))
        result = sess.compact(now=T0 + 10)
        pins = [item.seq for item in sess.context().head if item.state == "pinned"]
        assert pins == [0, 1]
        request = result.summary_text.split("## Original request\n", 1)[1].split("\n\n")[0]
        assert request == typed
