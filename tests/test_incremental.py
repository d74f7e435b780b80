"""The registry of incremental context values: for every one, extending the value of a run
of messages by more messages gives the value of the whole run, and a context extended by
appends derives what a context built whole derives."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from compactstore import CompactionConfig
from compactstore._context.active import ActiveContext, ContextMessage, MessageState
from compactstore._context.incremental import REGISTRY, Scope
from compactstore._context.tokens import estimate_tokens
from compactstore.formats import get_format

TEXT = st.text(alphabet="abc xyz", max_size=12)
IDS = st.sampled_from(["t1", "t2", "t3"])
STATES: st.SearchStrategy[MessageState] = st.sampled_from(
    ["original", "pinned", "summary", "persisted", "cleared", "synthetic"]
)


@st.composite
def anthropic_message(draw: st.DrawFn) -> dict[str, Any]:
    role = draw(st.sampled_from(["system", "user", "assistant"]))
    if role == "system" or draw(st.booleans()):
        return {"role": role, "content": draw(TEXT)}
    blocks: list[dict[str, Any]] = []
    if role == "assistant":
        if draw(st.booleans()):
            blocks.append({"type": "thinking", "thinking": draw(TEXT), "signature": "s"})
        blocks.append({"type": "text", "text": draw(TEXT)})
        for call in draw(st.lists(IDS, max_size=2, unique=True)):
            blocks.append({"type": "tool_use", "id": call, "name": "bash", "input": {}})
    else:
        for call in draw(st.lists(IDS, max_size=2, unique=True)):
            content: Any = draw(TEXT)
            if draw(st.booleans()):
                image = {"type": "base64", "media_type": "image/png", "data": "AAAA"}
                content = [{"type": "image", "source": image}]
            blocks.append({"type": "tool_result", "tool_use_id": call, "content": content})
        blocks.append({"type": "text", "text": draw(TEXT)})
    return {"role": role, "content": blocks}


@st.composite
def context_messages(draw: st.DrawFn) -> list[ContextMessage]:
    fmt = get_format("anthropic")
    found: list[ContextMessage] = []
    for message in draw(st.lists(anthropic_message(), max_size=8)):
        state = draw(STATES)
        found.append(
            ContextMessage.build(
                fmt,
                message,
                tokens=draw(st.integers(-2, 50)),
                seq=None if state in ("summary", "synthetic") else draw(st.integers(0, 99)),
                state=state,
                created_at=draw(st.none() | st.floats(0, 100)),
                edited_ids=frozenset(draw(st.lists(IDS, max_size=1))),
            )
        )
    return found


SCOPES = st.sampled_from(
    [
        Scope(get_format("anthropic"), CompactionConfig()),
        Scope(get_format("responses"), CompactionConfig(responses_store=True)),
    ]
)


@settings(max_examples=40, deadline=None)
@given(SCOPES, context_messages(), context_messages(), context_messages())
def test_every_registered_value_extended_by_appends_is_the_value_of_the_whole_run(
    scope: Scope, a: list[ContextMessage], b: list[ContextMessage], c: list[ContextMessage]
) -> None:
    for value in REGISTRY:
        whole = value.of(scope, a + b + c)
        stepped = value.advanced(scope, value.advanced(scope, value.of(scope, a), b), c)
        assert stepped == whole, value.name
        assert value.advanced(scope, value.of(scope, []), a + b + c) == whole, value.name


@settings(max_examples=20, deadline=None)
@given(context_messages(), context_messages(), st.booleans())
def test_a_context_extended_by_appends_derives_what_one_built_whole_derives(
    head: list[ContextMessage], added: list[ContextMessage], other_config: bool
) -> None:
    fmt = get_format("anthropic")
    kept = [m for m in head if m.state not in ("summary", "pinned")]
    context = ActiveContext(
        "s", fmt, 100_000, CompactionConfig(), estimate_tokens, head=(), kept=tuple(kept)
    )
    for value in REGISTRY:
        context.value(value)  # every value computed, so that extended() carries each one
    assert context.wire is not None
    config = CompactionConfig(preserved_thinking=False) if other_config else context.config
    longer = context.extended(added, last_seq=200, usage_offset=0, token_factor=None, config=config)
    fresh = ActiveContext(
        "s", fmt, 100_000, config, estimate_tokens, head=(), kept=tuple(kept + added)
    )
    for value in REGISTRY:
        assert longer.value(value) == fresh.value(value), value.name
    assert longer.wire == fresh.wire
    assert longer.usage == fresh.usage
    assert longer.lineage is context.lineage and fresh.lineage is not context.lineage
