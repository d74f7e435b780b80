"""format="responses": OpenAI Responses input items, one item per seq."""

from __future__ import annotations

import typing
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai.types.responses import ResponseInputItemParam

from compactstore import CompactionConfig, CompactStore, InvalidMessageError, Session
from compactstore._context.pairs import legal_cuts
from compactstore.formats import get_format
from compactstore.formats.responses import ITEM_CLASSES, NO_STAND_IN, ResponsesFormat
from compactstore.formats.sdk_types import check_sdk_types, sdk_problems
from tests.helpers import T0, scratch_store, words

FMT = get_format("responses")
assert isinstance(FMT, ResponsesFormat)

# One valid item of every type of the pinned SDK's union (a call and its output share an id).
SAMPLES: dict[str, dict[str, Any]] = {
    "message": {"type": "message", "role": "user", "content": "hi"},
    "function_call": {"type": "function_call", "call_id": "fc", "name": "f", "arguments": "{}"},
    "function_call_output": {"type": "function_call_output", "call_id": "fc", "output": "ok"},
    "custom_tool_call": {"type": "custom_tool_call", "call_id": "ct", "name": "p", "input": "x"},
    "custom_tool_call_output": {"type": "custom_tool_call_output", "call_id": "ct", "output": "x"},
    "computer_call": {
        "type": "computer_call",
        "id": "cu_1",
        "call_id": "cc",
        "action": {"type": "screenshot"},
        "pending_safety_checks": [],
        "status": "completed",
    },
    "computer_call_output": {
        "type": "computer_call_output",
        "call_id": "cc",
        "output": {"type": "computer_screenshot", "image_url": "data:image/png;base64,AA=="},
    },
    "local_shell_call": {
        "type": "local_shell_call",
        "id": "ls_1",
        "call_id": "lc",
        "action": {"type": "exec", "command": ["ls"], "env": {}},
        "status": "completed",
    },
    "local_shell_call_output": {"type": "local_shell_call_output", "id": "lc", "output": "a.py"},
    "shell_call": {"type": "shell_call", "call_id": "sc", "action": {"commands": ["ls"]}},
    "shell_call_output": {
        "type": "shell_call_output",
        "call_id": "sc",
        "output": [{"stdout": "a.py", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}}],
    },
    "apply_patch_call": {
        "type": "apply_patch_call",
        "call_id": "ap",
        "status": "completed",
        "operation": {"type": "delete_file", "path": "a.py"},
    },
    "apply_patch_call_output": {
        "type": "apply_patch_call_output",
        "call_id": "ap",
        "status": "completed",
    },
    "mcp_approval_request": {
        "type": "mcp_approval_request",
        "id": "mr",
        "name": "deploy",
        "arguments": "{}",
        "server_label": "ops",
    },
    "mcp_approval_response": {
        "type": "mcp_approval_response",
        "approval_request_id": "mr",
        "approve": True,
    },
    "tool_search_call": {"type": "tool_search_call", "call_id": "ts", "arguments": {"q": "git"}},
    "tool_search_output": {"type": "tool_search_output", "call_id": "ts", "tools": []},
    "program": {"type": "program", "id": "pg_1", "call_id": "pg", "code": "1", "fingerprint": "f"},
    "program_output": {
        "type": "program_output",
        "id": "po_1",
        "call_id": "pg",
        "result": "1",
        "status": "completed",
    },
    "reasoning": {"type": "reasoning", "id": "rs", "summary": [], "encrypted_content": "gAAA"},
    "compaction": {"type": "compaction", "encrypted_content": "gAAA"},
    "web_search_call": {
        "type": "web_search_call",
        "id": "ws",
        "status": "completed",
        "action": {"type": "search", "query": "q"},
    },
    "file_search_call": {
        "type": "file_search_call",
        "id": "fs",
        "queries": ["q"],
        "status": "completed",
    },
    "image_generation_call": {
        "type": "image_generation_call",
        "id": "ig",
        "result": None,
        "status": "completed",
    },
    "code_interpreter_call": {
        "type": "code_interpreter_call",
        "id": "ci",
        "code": None,
        "container_id": "k",
        "outputs": None,
        "status": "completed",
    },
    "mcp_call": {
        "type": "mcp_call",
        "id": "mc",
        "name": "n",
        "arguments": "{}",
        "server_label": "ops",
    },
    "mcp_list_tools": {"type": "mcp_list_tools", "id": "ml", "server_label": "ops", "tools": []},
    "additional_tools": {"type": "additional_tools", "role": "developer", "tools": []},
    "configuration_update": {"type": "configuration_update"},
    "item_reference": {"type": "item_reference", "id": "msg_1"},
    "compaction_trigger": {"type": "compaction_trigger"},
}


def _union_types() -> dict[str, list[str]]:
    """Item type -> the SDK classes of the pinned union that carry it."""
    found: dict[str, list[str]] = {}
    for member in typing.get_args(ResponseInputItemParam):
        hint = typing.get_type_hints(member)["type"]
        while typing.get_origin(hint) is not typing.Literal:
            hint = next(a for a in typing.get_args(hint) if a is not type(None))
        for literal in typing.get_args(hint):
            found.setdefault(literal, []).append(member.__name__)
    return found


def test_every_union_member_is_in_exactly_one_class() -> None:
    union = _union_types()
    assert set(union) == set(ITEM_CLASSES), (
        f"in the SDK only: {sorted(set(union) - set(ITEM_CLASSES))}; "
        f"classified but not in the SDK: {sorted(set(ITEM_CLASSES) - set(union))}"
    )
    assert len(union) == len(ITEM_CLASSES)  # a dict: one class per type
    classes = {
        c: sorted(t for t, k in ITEM_CLASSES.items() if k == c) for c in ITEM_CLASSES.values()
    }
    assert classes["glue"] == ["reasoning"]
    assert classes["opaque"] == ["compaction"]
    assert classes["refused"] == ["compaction_trigger", "item_reference"]
    assert len(classes["call"]) == len(classes["output"]) == 9
    assert set(SAMPLES) == set(union)


@pytest.mark.parametrize("item_type", sorted(SAMPLES))
def test_every_sample_is_valid_for_the_sdk(item_type: str) -> None:
    check_sdk_types("responses", [SAMPLES[item_type]])


PAIRS = [
    ("function_call", "function_call_output", "fc"),
    ("custom_tool_call", "custom_tool_call_output", "ct"),
    ("computer_call", "computer_call_output", "cc"),
    ("local_shell_call", "local_shell_call_output", "lc"),
    ("shell_call", "shell_call_output", "sc"),
    ("apply_patch_call", "apply_patch_call_output", "ap"),
    ("mcp_approval_request", "mcp_approval_response", "mr"),
    ("tool_search_call", "tool_search_output", "ts"),
    ("program", "program_output", "pg"),
]


def _session(store: CompactStore, name: str = "r", **config: Any) -> Session:
    return store.session(
        name,
        format="responses",
        context_window=100_000,
        config=CompactionConfig(**config),
        now=T0,
    )


@pytest.mark.parametrize(("call_type", "output_type", "key"), PAIRS)
def test_each_pair_is_matched_by_its_key(
    store: CompactStore, call_type: str, output_type: str, key: str
) -> None:
    sess = _session(store)
    assert [c.id for c in FMT.tool_calls(SAMPLES[call_type])] == [key]
    assert [r.tool_use_id for r in FMT.tool_results(SAMPLES[output_type])] == [key]
    sess.extend([SAMPLES["message"], SAMPLES[call_type], SAMPLES[output_type]])
    context = sess.active_context()
    assert context == [SAMPLES["message"], SAMPLES[call_type], SAMPLES[output_type]]
    check_sdk_types("responses", context)
    # A second output for the same call is refused, as is an output with no call.
    with pytest.raises(InvalidMessageError, match="already has a result"):
        sess.append(SAMPLES[output_type])


def test_local_shell_output_may_carry_call_id_as_the_agents_sdk_stores_it() -> None:
    item = {"type": "local_shell_call_output", "id": "out_1", "call_id": "lc", "output": "x"}
    assert [r.tool_use_id for r in FMT.tool_results(item)] == ["lc"]


@pytest.mark.parametrize(("call_type", "output_type", "key"), PAIRS)
def test_an_orphan_call_gets_a_stand_in_or_is_dropped_with_its_reasoning(
    store: CompactStore, call_type: str, output_type: str, key: str
) -> None:
    sess = _session(store)
    reasoning = SAMPLES["reasoning"]
    sess.extend([SAMPLES["message"], reasoning, SAMPLES[call_type]])
    sess.append({"role": "user", "content": "the agent crashed; go on"})
    context = sess.active_context()
    check_sdk_types("responses", context)
    if call_type in NO_STAND_IN:
        assert context == [
            SAMPLES["message"],
            {"role": "user", "content": "the agent crashed; go on"},
        ]
        return
    assert context[:3] == [SAMPLES["message"], reasoning, SAMPLES[call_type]]
    stand_in = context[3]
    assert stand_in["type"] == output_type
    assert [r.tool_use_id for r in FMT.tool_results(stand_in)] == [key]
    if call_type == "local_shell_call":
        assert stand_in["id"] == SAMPLES[call_type]["call_id"]


def test_parallel_calls_of_one_turn_are_answered_after_all_of_them(store: CompactStore) -> None:
    sess = _session(store)
    sess.append({"role": "user", "content": "read both"})
    sess.append({"type": "reasoning", "id": "rs", "summary": [], "encrypted_content": "e"})
    sess.append({"type": "function_call", "call_id": "a", "name": "read", "arguments": "{}"})
    sess.append({"type": "function_call", "call_id": "b", "name": "read", "arguments": "{}"})
    # Both still running: no stand-in between the two calls.
    assert len(sess.active_context()) == 4
    sess.append_tool_result("a", "A", tool_name="read")
    sess.append_tool_result("b", "B", tool_name="read", is_error=True)
    context = sess.active_context()
    assert context[-2:] == [
        {"type": "function_call_output", "call_id": "a", "output": "A"},
        {"type": "function_call_output", "call_id": "b", "output": "Error: B"},
    ]
    check_sdk_types("responses", context)
    # A new turn after the outputs: answering an older call now is refused.
    sess.append({"type": "function_call", "call_id": "c", "name": "read", "arguments": "{}"})
    sess.append({"role": "assistant", "content": "done"})
    sess.append({"role": "user", "content": "thanks"})
    with pytest.raises(InvalidMessageError, match="moved on"):
        sess.append_tool_result("c", "late", tool_name="read")


def test_reasoning_is_glued_to_the_next_item() -> None:
    sess_items = [
        SAMPLES["message"],
        SAMPLES["reasoning"],
        SAMPLES["function_call"],
        SAMPLES["function_call_output"],
        SAMPLES["reasoning"],
        {"role": "assistant", "content": "done"},
    ]
    from compactstore._context.active import ContextMessage

    items = [
        ContextMessage.build(FMT, m, tokens=1, seq=i, state="original")
        for i, m in enumerate(sess_items)
    ]
    legal = legal_cuts(items)
    assert legal[2] is False  # between reasoning and its call
    assert legal[3] is False  # between the call and its output
    assert legal[5] is False  # between reasoning and the message
    assert legal[1] and legal[4] and legal[6]


def test_without_stored_responses_bare_reasoning_leaves_the_wire_view(store: CompactStore) -> None:
    bare = {"type": "reasoning", "id": "rs_2", "summary": [{"type": "summary_text", "text": "t"}]}
    sess = _session(store)
    sess.extend([SAMPLES["message"], bare, {"role": "assistant", "content": "hi"}])
    assert bare not in sess.active_context()
    assert bare in sess.messages()
    with pytest.raises(InvalidMessageError, match="responses_store=True"):
        sess.append(SAMPLES["item_reference"])
    stored = _session(store, "stored", responses_store=True)
    stored.extend([SAMPLES["message"], bare, {"role": "assistant", "content": "hi"}])
    stored.append(SAMPLES["item_reference"])
    assert stored.active_context()[1] == bare
    with pytest.raises(InvalidMessageError, match="compaction_trigger"):
        stored.append(SAMPLES["compaction_trigger"])


def test_unknown_items_are_refused_naming_the_known_ones(store: CompactStore) -> None:
    sess = _session(store)
    with pytest.raises(InvalidMessageError, match=r"unknown item type 'banana'.*function_call"):
        sess.append({"type": "banana"})
    with pytest.raises(InvalidMessageError, match="neither 'type' nor 'role'"):
        sess.append({"content": "x"})
    with pytest.raises(InvalidMessageError, match="call_id"):
        sess.append({"type": "function_call", "name": "f", "arguments": "{}"})
    assert sess.messages() == []


def test_hosted_and_opaque_items_pass_through_verbatim(store: CompactStore) -> None:
    sess = _session(store)
    items = [SAMPLES["message"], SAMPLES["compaction"]] + [
        SAMPLES[t] for t in sorted(SAMPLES) if ITEM_CLASSES[t] == "hosted"
    ]
    sess.extend(items)
    assert sess.active_context() == items
    check_sdk_types("responses", items)


def test_the_engines_work_on_responses_items(store: CompactStore) -> None:
    sess = _session(store, microcompact_keep_recent=1)
    sess.append({"role": "user", "content": "Refactor payments/ and keep the tests green"})
    for n in range(8):
        sess.append({"type": "reasoning", "id": f"rs{n}", "summary": [], "encrypted_content": "e"})
        sess.append(
            {
                "type": "function_call",
                "call_id": f"c{n}",
                "name": "read_file",
                "arguments": f'{{"path": "payments/m{n}.py"}}',
            }
        )
        sess.append_tool_result(
            f"c{n}",
            words(5_000 if n == 0 else 900, f"m{n}"),
            tool_name="read_file",
            file_path=f"payments/m{n}.py",
        )
    # Read dedup: the same content again is a stub pointing at the earlier read.
    sess.append(
        {"type": "function_call", "call_id": "again", "name": "read_file", "arguments": "{}"}
    )
    sess.append_tool_result(
        "again", words(900, "m7"), tool_name="read_file", file_path="payments/m7.py"
    )
    assert "payments/m7.py" in sess.active_context()[-1]["output"]
    assert len(sess.active_context()[-1]["output"]) < 300

    budget = sess.process_request(now=T0 + 10)
    assert budget.strategy is not None and budget.strategy.value == "tool_budget"
    assert sess.get_blob(budget.blob_ids[0]) == words(5_000, "m0")
    cleared = sess.process_request(now=T0 + 4_000)
    assert cleared.strategy is not None and cleared.strategy.value == "microcompact"
    full = sess.compact(now=T0 + 4_010)
    assert full.success and full.boundary is not None
    context = sess.active_context()
    summary = context[1]
    assert summary["type"] == "message" and summary["role"] == "user"
    assert "Refactor payments/" in summary["content"][0]["text"]
    check_sdk_types("responses", context)
    _check_glue_and_pairs(sess)


def _check_glue_and_pairs(sess: Session) -> None:
    """Every reasoning item sits right before the item that followed it in the log, and
    every output right after its call's turn (no output without its call)."""
    items = sess.context().items
    log = sess.messages()
    for index, item in enumerate(items):
        if item.glued and item.seq is not None:
            assert index + 1 < len(items), "a reasoning item ends the context"
            following = items[index + 1]
            assert following.seq == item.seq + 1, "reasoning separated from its next item"
            assert following.message == log[item.seq + 1]
    calls = {c.id for item in items for c in item.calls}
    for item in items:
        for result in item.results:
            assert result.tool_use_id in calls, f"output {result.tool_use_id} without its call"
    problems = sdk_problems("responses", sess.active_context())
    assert problems == []


# -- a property: across random compactions, pairs and glue hold ---------------------------

CALL_KINDS = st.sampled_from([p[0] for p in PAIRS])
TURN = st.tuples(
    st.booleans(),  # reasoning first
    st.lists(st.tuples(CALL_KINDS, st.sampled_from([50, 900, 5_000]), st.booleans()), max_size=3),
    st.sampled_from(["none", "say", "user"]),
)
ACTION = st.sampled_from(["none", "process", "compact", "partial", "reactive"])


@pytest.mark.slow
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(st.lists(st.tuples(TURN, ACTION), min_size=1, max_size=10))
def test_pairs_and_glue_survive_every_compaction(turns: list[Any]) -> None:
    with scratch_store() as store:
        sess = store.session(
            "p", format="responses", context_window=6_000, config=CompactionConfig(), now=T0
        )
        sess.append({"role": "user", "content": "the original request"})
        now = T0
        for n, ((reasoning, calls, after), action) in enumerate(turns):
            items: list[dict[str, Any]] = []
            if reasoning:
                items.append(
                    {"type": "reasoning", "id": f"rs{n}", "summary": [], "encrypted_content": "e"}
                )
            outputs: list[dict[str, Any]] = []
            for m, (kind, size, answered) in enumerate(calls):
                key = f"k{n}_{m}"
                call = _renamed(SAMPLES[kind], key)
                items.append(call)
                if answered:
                    output_type = next(p[1] for p in PAIRS if p[0] == kind)
                    output = _renamed(SAMPLES[output_type], key)
                    if "output" in output and isinstance(output["output"], str):
                        output["output"] = words(size, key)
                    outputs.append(output)
            if not calls:
                items.append({"role": "assistant", "content": words(200, f"say{n}")})
            sess.extend(items + outputs)
            if after == "say":
                sess.append({"role": "assistant", "content": words(300, f"said{n}")})
            elif after == "user":
                sess.append({"role": "user", "content": words(300, f"asked{n}")})
            now += 1_000
            if action == "process":
                sess.process_request(now=now)
            elif action == "compact":
                sess.compact(now=now)
            elif action == "partial":
                seqs = [i.seq for i in sess.context().kept if i.seq is not None]
                sess.compact(up_to_seq=seqs[len(seqs) // 2], now=now)
            elif action == "reactive":
                sess.reactive_recover("prompt is too long", now=now)
            _check_glue_and_pairs(sess)


def _renamed(item: dict[str, Any], key: str) -> dict[str, Any]:
    """A copy of a sample with its pair key (and item ids) made unique."""
    new = dict(item)
    for field in ("call_id", "approval_request_id"):
        if field in new:
            new[field] = key
    if new.get("type") in ("mcp_approval_request", "local_shell_call_output"):
        new["id"] = key
    elif "id" in new:
        new["id"] = f"{new['id']}_{key}"
    return new
