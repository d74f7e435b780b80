"""Per-format, per-role content block lists.

Each format lists the block (part) types each role may carry; the lists agree with the pinned
SDKs' unions; the live API refuses any other type naming the allowed ones, importers turn it
into a short text note and warn, and ``allow_block_types=`` extends the lists. Server-side
tool blocks are not client tool calls: they never get a synthetic result.
"""

from __future__ import annotations

import asyncio
import json
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typing_extensions import is_typeddict

from compactstore import (
    CompactStore,
    CompactStoreWarning,
    InvalidInputError,
    InvalidMessageError,
)
from compactstore._importers import import_file, read_transcript
from compactstore.formats.block_types import (
    BLOCK_TYPES,
    EXCLUDED_BLOCK_TYPES,
    SERVER_TOOL_BLOCKS,
    check_block_types,
)
from tests.conftest import Snapshot, module_database
from tests.helpers import pair_problems, validate_with_sdk

anthropic_types = pytest.importorskip("anthropic.types", reason="the anthropic extra is missing")
openai_chat = pytest.importorskip("openai.types.chat", reason="the openai extra is missing")
openai_responses = pytest.importorskip("openai.types.responses", reason="the openai extra")

Message = dict[str, Any]

database = module_database("blocks")


@pytest.fixture
def store(database: str) -> Iterator[CompactStore]:
    with CompactStore.open(database) as opened:
        yield opened


# -- the lists against the pinned SDK unions --------------------------------------------------


def _strip(hint: Any) -> Any:
    while getattr(typing.get_origin(hint), "_name", None) in ("Required", "NotRequired"):
        hint = typing.get_args(hint)[0]
    return hint


def _members(hint: Any) -> list[Any]:
    """The classes a (possibly nested, Optional, Iterable) annotation can hold."""
    hint = _strip(hint)
    if typing.get_origin(hint) is typing.Literal:
        return []
    if typing.get_origin(hint) is not None:
        return [m for arg in typing.get_args(hint) for m in _members(arg)]
    return [hint] if isinstance(hint, type) and is_typeddict(hint) else []


def _type_literals(cls: Any) -> set[str]:
    hint = typing.get_type_hints(cls, include_extras=True).get("type")
    if hint is None:
        return set()
    hint = _strip(hint)
    options = typing.get_args(hint) if typing.get_origin(hint) is typing.Union else (hint,)
    return {v for o in options if o is not type(None) for v in typing.get_args(_strip(o))}


def _union(owner: Any, key: str) -> set[str]:
    """The block types the SDK type ``owner`` allows in its list ``key``."""
    hint = typing.get_type_hints(owner, include_extras=True)[key]
    return {t for member in _members(hint) for t in _type_literals(member)}


def _role(member: Any) -> str:
    hint = _strip(typing.get_type_hints(member, include_extras=True)["role"])
    (role,) = typing.get_args(hint)
    return str(role)


def _sdk_unions() -> dict[str, dict[str, set[str]]]:
    """format -> list (role, or the nested list) -> the pinned SDK's union for it."""
    anthropic: dict[str, set[str]] = {
        _role(m): _union(m, "content") for m in typing.get_args(anthropic_types.MessageParam)
    }
    anthropic["tool_result"] = _union(anthropic_types.ToolResultBlockParam, "content")
    openai: dict[str, set[str]] = {
        _role(m): _union(m, "content")
        for m in typing.get_args(openai_chat.ChatCompletionMessageParam)
        if m.__name__ != "ChatCompletionFunctionMessageParam"  # refused: no content parts
    }
    responses: dict[str, set[str]] = {}
    for member in typing.get_args(openai_responses.ResponseInputItemParam):
        hints = typing.get_type_hints(member, include_extras=True)
        item = _type_literals(member)
        if "message" in item:
            for role in typing.get_args(_strip(hints["role"])):
                responses.setdefault(role, set()).update(_union(member, "content"))
        for kind in item & {"function_call_output", "custom_tool_call_output"}:
            responses[kind] = _union(member, "output")
    return {"anthropic": anthropic, "openai": openai, "responses": responses}


@pytest.mark.parametrize("format_name", ["anthropic", "openai", "responses"])
def test_every_listed_type_is_in_the_sdk_union_and_every_member_is_listed(
    format_name: str,
) -> None:
    unions = _sdk_unions()[format_name]
    listed = BLOCK_TYPES[format_name]
    assert set(listed) == set(unions), "every role of the SDK has a list, and no other"
    for role, types in listed.items():
        assert types <= unions[role], f"{role}: not in the SDK: {sorted(types - unions[role])}"
    everything = set().union(*unions.values())
    covered = set().union(*listed.values()) | set(EXCLUDED_BLOCK_TYPES[format_name])
    assert everything - covered == set(), "union members neither listed nor excluded"
    assert set(EXCLUDED_BLOCK_TYPES[format_name]) <= everything  # no stale exclusion


def test_anthropic_lists_say_what_the_identical_unions_do_not() -> None:
    unions = _sdk_unions()["anthropic"]
    assert unions["user"] == unions["assistant"]  # why the lists exist
    assert "tool_use" not in BLOCK_TYPES["anthropic"]["user"]
    assert "tool_result" not in BLOCK_TYPES["anthropic"]["assistant"]
    assert BLOCK_TYPES["anthropic"]["assistant"] >= SERVER_TOOL_BLOCKS
    assert "image" not in BLOCK_TYPES["anthropic"]["assistant"]


# -- the live API refuses other types -------------------------------------------------------

BANANA = {"type": "banana", "text": "peel"}

REFUSED: list[tuple[str, Message, str]] = [
    (
        "anthropic",
        {"role": "user", "content": [{"type": "text", "text": "hi"}, BANANA]},
        "content[1]: block type 'banana' is not allowed in user messages of format anthropic "
        "(allowed: container_upload, document, image, search_result, text, tool_result; "
        "CompactStore.open(allow_block_types=...) extends the list)",
    ),
    (
        "anthropic",
        {"role": "assistant", "content": [{"type": "image", "source": {}}]},
        "content[0]: block type 'image' is not allowed in assistant messages of format "
        "anthropic (allowed: bash_code_execution_tool_result",
    ),
    (
        "openai",
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "x"}]},
        "content[0]: block type 'tool_result' is not allowed in user messages of format openai "
        "(allowed: file, image_url, input_audio, text;",
    ),
    (
        "openai",
        {"role": "system", "content": [{"type": "image_url", "image_url": {"url": "u"}}]},
        "block type 'image_url' is not allowed in system messages of format openai (allowed: text;",
    ),
    (
        "responses",
        {"type": "message", "role": "assistant", "content": [{"type": "input_text", "text": "x"}]},
        "content[0]: block type 'input_text' is not allowed in assistant messages of format "
        "responses (allowed: output_text, refusal;",
    ),
    (
        "responses",
        {"role": "user", "content": [BANANA]},
        "block type 'banana' is not allowed in user messages of format responses "
        "(allowed: input_file, input_image, input_text;",
    ),
    (
        "minicode",
        {"role": "assistant", "content": [BANANA]},
        "block type 'banana' is not allowed in assistant messages of format minicode",
    ),
]


@pytest.mark.parametrize(("format_name", "message", "problem"), REFUSED)
def test_append_refuses_a_block_its_role_may_not_carry(
    store: CompactStore,
    sid: str,
    db_snapshot: Snapshot,
    format_name: str,
    message: Message,
    problem: str,
) -> None:
    sess = store.session(sid, format=format_name)
    sess.append({"role": "user", "content": "the request"})
    before = db_snapshot(store)
    with pytest.raises(InvalidMessageError) as refused:
        sess.append(message)
    assert problem in str(refused.value)
    with pytest.raises(InvalidMessageError, match=r"message 1: .*block type '"):
        sess.extend([{"role": "user", "content": "fine"}, message])
    assert db_snapshot(store) == before


def test_a_tool_result_holding_an_unknown_block_is_refused(store: CompactStore, sid: str) -> None:
    sess = store.session(sid, format="anthropic")
    sess.append({"role": "user", "content": "go"})
    sess.append(
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}],
        }
    )
    result = {"type": "tool_result", "tool_use_id": "t1", "content": [BANANA]}
    with pytest.raises(InvalidMessageError, match=r"content\[0\]\.content\[0\]: block type "):
        sess.append({"role": "user", "content": [result]})


def test_allow_block_types_extends_the_lists(database: str, sid: str) -> None:
    with CompactStore.open(database, allow_block_types=["banana"]) as store:
        sess = store.session(sid, format="anthropic")
        sess.append({"role": "user", "content": [{"type": "text", "text": "hi"}, BANANA]})
        sess.append({"role": "assistant", "content": [BANANA]})
        assert sess.active_context()[1]["content"] == [BANANA]
    # By role: only the roles named (and "*" for every role).
    with CompactStore.open(database, allow_block_types={"assistant": ["kiwi"]}) as store:
        sess = store.session(sid)
        sess.append({"role": "assistant", "content": [{"type": "kiwi"}]})
        with pytest.raises(InvalidMessageError, match="'kiwi' is not allowed in user messages"):
            sess.append({"role": "user", "content": [{"type": "kiwi"}]})
        # The extension is the opening store's: another store refuses it again.
        with pytest.raises(InvalidMessageError, match="'banana' is not allowed"):
            sess.append({"role": "user", "content": [BANANA]})


@pytest.mark.parametrize("bad", ["banana", [""], [3], {"user": "banana"}, {1: ["x"]}, 5])
def test_allow_block_types_is_checked_before_the_database_is_touched(
    tmp_path: Path, bad: Any
) -> None:
    with pytest.raises(InvalidInputError, match="allow_block_types"):
        CompactStore.open(tmp_path / "never.db", allow_block_types=bad)
    assert not (tmp_path / "never.db").exists()


def test_the_async_store_takes_allow_block_types(tmp_path: Path) -> None:
    pytest.importorskip("aiosqlite", reason="the async extra (aiosqlite) is not installed")
    pytest.importorskip("greenlet", reason="the async extra (sqlalchemy[asyncio]) is missing")
    from compactstore import AsyncCompactStore

    async def main() -> list[Message]:
        async with await AsyncCompactStore.open(
            tmp_path / "a.db", allow_block_types=["banana"]
        ) as store:
            sess = await store.session("s", format="anthropic")
            await sess.append({"role": "user", "content": [BANANA]})
            return await sess.active_context()

    assert asyncio.run(main()) == [{"role": "user", "content": [BANANA]}]


# -- importers note and warn ------------------------------------------------------------------


def test_importers_replace_an_unlisted_block_by_a_note_and_warn(
    tmp_path: Path, store: CompactStore, sid: str
) -> None:
    lines = [
        {"role": "user", "content": [{"type": "text", "text": "fix it"}, BANANA, BANANA]},
        {"role": "assistant", "content": [{"type": "text", "text": "ok"}, {"type": "image"}]},
    ]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    with pytest.warns(CompactStoreWarning) as warned:
        transcript = read_transcript(path, format="anthropic")
    texts = [str(w.message) for w in warned]
    assert len(texts) == 2  # once per type and file
    assert "t.jsonl line 1: 'banana' blocks are not allowed" in texts[0]
    assert "line 2: 'image' blocks" in texts[1]
    note = {"type": "text", "text": "[banana block left out]"}
    assert transcript.messages[0]["content"] == [lines[0]["content"][0], note, note]
    assert transcript.messages[1]["content"][1] == {
        "type": "text",
        "text": "[image block left out]",
    }
    with pytest.warns(CompactStoreWarning) as warned:
        sess = import_file(store, path, session_id=sid, format="anthropic")
    assert len(warned) == 2
    validate_with_sdk("anthropic", sess.active_context())


@pytest.mark.slow
def test_an_import_keeps_the_blocks_the_target_store_allows(tmp_path: Path) -> None:
    lines = [
        {"role": "user", "content": [{"type": "text", "text": "fix it"}, BANANA]},
        {"role": "assistant", "content": [{"type": "text", "text": "ok"}, {"type": "image"}]},
    ]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    with (
        CompactStore.open(tmp_path / "a.db", allow_block_types=["banana"]) as store,
        pytest.warns(CompactStoreWarning) as warned,
    ):
        sess = import_file(store, path, session_id="s", format="anthropic")
        logged = sess.messages()
    # Only the block the store does not allow is noted (and warned about).
    assert [str(w.message) for w in warned if "blocks are not allowed" in str(w.message)] == [
        "t.jsonl line 2: 'image' blocks are not allowed in anthropic messages of that role; "
        "replaced by a text note ('[image block left out]')"
    ]
    assert logged[0] == lines[0]
    assert logged[1]["content"][1] == {"type": "text", "text": "[image block left out]"}


# -- server-side tool blocks ------------------------------------------------------------------


def test_server_tool_blocks_never_get_a_synthetic_result(store: CompactStore, sid: str) -> None:
    sess = store.session(sid, format="anthropic")
    turn = {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Searching."},
            {
                "type": "server_tool_use",
                "id": "srvtoolu_1",
                "name": "web_search",
                "input": {"query": "compaction"},
            },
            {
                "type": "web_search_tool_result",
                "tool_use_id": "srvtoolu_1",
                "content": [
                    {
                        "type": "web_search_result",
                        "url": "https://example.com",
                        "title": "t",
                        "encrypted_content": "e",
                    }
                ],
            },
            {"type": "text", "text": "Found it."},
        ],
    }
    sess.extend([{"role": "user", "content": "look it up"}, turn])
    sess.append({"role": "user", "content": "thanks"})  # the conversation moved on
    context = sess.active_context()
    assert context[1] == turn  # verbatim: no tool_result block was added for srvtoolu_1
    assert len(context) == 3 and context[2] == {"role": "user", "content": "thanks"}
    assert pair_problems("anthropic", context) == []
    validate_with_sdk("anthropic", context)
    # A client tool_result cannot answer a server tool call.
    with pytest.raises(InvalidMessageError, match="srvtoolu_1"):
        sess.append(
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "srvtoolu_1", "content": "x"}],
            }
        )


def test_check_block_types_is_usable_on_its_own() -> None:
    check_block_types("openai", {"role": "assistant", "content": [{"type": "refusal"}]})
    with pytest.raises(InvalidMessageError, match="'refusal' is not allowed in user messages"):
        check_block_types("openai", {"role": "user", "content": [{"type": "refusal"}]})
