"""Images in user messages follow the rules of media in tool results (the documentation Media), on
SQLite and PostgreSQL: checked as the provider would, counted by their size, and counted
toward ``max_media_in_context``; over the cap the oldest leave the context (a user message's
media behind a note naming the blob, its text kept), get_blob and ``compactstore blob -o``
give them back exactly, and recall names them without base64. A pinned message's images
count but stay.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from compactstore import CompactionConfig, CompactStore, InvalidInputError
from compactstore._cli import cli
from compactstore._context.tokens import estimate_tokens
from compactstore._engines import tool_budget
from compactstore._engines.base import EngineInputs
from compactstore.formats.sdk_types import sdk_problems
from tests.conftest import Snapshot, module_database
from tests.engines.builder import ContextBuilder
from tests.test_media import PIXEL_TOKENS, PNG, PNG_B64, T0, image_block, screenshot_turn

database = module_database("user_media")

URL = f"data:image/png;base64,{PNG_B64}"
# One user message with a text block and an 80 kB screenshot, per format's dialect.
USER_IMAGE: dict[str, dict[str, Any]] = {
    "anthropic": {
        "role": "user",
        "content": [{"type": "text", "text": "this page"}, image_block()],
    },
    "openai": {
        "role": "user",
        "content": [
            {"type": "text", "text": "this page"},
            {"type": "image_url", "image_url": {"url": URL}},
        ],
    },
    "responses": {
        "type": "message",
        "role": "user",
        "content": [
            {"type": "input_text", "text": "this page"},
            {"type": "input_image", "image_url": URL, "detail": "auto"},
        ],
    },
}
REPLY: dict[str, dict[str, Any]] = {
    "anthropic": {"role": "assistant", "content": "looking"},
    "openai": {"role": "assistant", "content": "looking"},
    "responses": {"type": "message", "role": "assistant", "content": "looking"},
}


@pytest.fixture
def store(database: str) -> Any:
    opened = CompactStore.open(database)
    yield opened
    opened.close()


def _session(store: CompactStore, fmt: str, **config: Any) -> Any:
    return store.session(
        f"um-{fmt}-{random.Random().getrandbits(32)}",
        format=fmt,
        config=CompactionConfig(token_factor=1.0, **config),
        now=T0,
    )


def _with_image(fmt: str, text: str) -> dict[str, Any]:
    message: dict[str, Any] = json.loads(json.dumps(USER_IMAGE[fmt]))
    message["content"][0]["text"] = text
    return message


@pytest.mark.parametrize("fmt", ["anthropic", "openai", "responses"])
def test_a_user_image_is_checked_like_tool_result_media_and_bad_ones_store_nothing(
    store: CompactStore, db_snapshot: Snapshot, fmt: str
) -> None:
    sess = _session(store, fmt)
    seq = sess.append(USER_IMAGE[fmt], timestamp=T0)
    # Counted by its pixels, not its ~107,000 base64 characters.
    assert sess.context().items[-1].seq == seq
    assert sess.context().items[-1].tokens == PIXEL_TOKENS + estimate_tokens("this page")
    before = db_snapshot(store)
    jpeg_url = URL.replace("image/png", "image/jpeg")
    bad = {
        "anthropic": [
            (image_block(media_type="image/jpeg"), "image data is image/png but the block"),
            (image_block(data="not base64!"), "not valid base64"),
        ],
        "openai": [
            ({"type": "image_url", "image_url": {"url": jpeg_url}}, "is image/png but"),
            (
                {"type": "image_url", "image_url": {"url": "data:image/png,xyz"}},
                "without ';base64,'",
            ),
            ({"type": "image_url", "image_url": {"url": URL, "detail": "huge"}}, "'detail'"),
        ],
        "responses": [
            ({"type": "input_image", "image_url": jpeg_url}, "is image/png but"),
            ({"type": "input_file", "file_data": "not base64!"}, "not valid base64"),
        ],
    }[fmt]
    for block, problem in bad:
        message = json.loads(json.dumps(USER_IMAGE[fmt]))
        message["content"][1] = block
        with pytest.raises(InvalidInputError, match=r"content\[1\]: .*" + problem):
            sess.append(message, timestamp=T0 + 1)
    assert db_snapshot(store) == before


def test_user_images_count_toward_the_cap_and_the_oldest_leave_behind_a_note(
    store: CompactStore, database: str, tmp_path: Path
) -> None:
    pytest.importorskip("anthropic")
    sess = _session(store, "anthropic", max_media_in_context=2)
    # The first user message is pinned: its image counts toward the cap, but it stays.
    sess.append(_with_image("anthropic", "fix the login page"), timestamp=T0)
    sess.append(REPLY["anthropic"], timestamp=T0)
    old = sess.append(_with_image("anthropic", "here it is after my change"), timestamp=T0 + 1)
    sess.append(REPLY["anthropic"], timestamp=T0 + 1)
    screenshot_turn(sess, "toolu_1", at=T0 + 2)
    sess.append(_with_image("anthropic", "and now?"), timestamp=T0 + 3)
    assert sess.process_request(now=T0 + 4).success  # 4 images, cap 2: the 2 oldest movable go

    context = sess.active_context()
    assert context[0]["content"][1] == image_block()  # pinned
    assert context[2]["content"] == [
        {"type": "text", "text": "here it is after my change"},
        {
            "type": "text",
            "text": "[User message media persisted: 1 block (image/png 1000x800), blob 1; "
            "the model no longer sees it]",
        },
    ]
    assert "blob 2" in context[5]["content"][0]["content"]  # the tool result's screenshot
    assert context[-1]["content"][-1] == image_block()  # the newest stays
    assert sum(PNG_B64[:60] in json.dumps(m) for m in context) == 2
    assert sdk_problems("anthropic", sess.request_params()["messages"]) == []

    # The blob holds the image block exactly; blob -o writes the PNG; recall names it.
    assert json.loads(sess.get_blob(1)) == [image_block()]
    target = tmp_path / "user.png"
    run = CliRunner().invoke(cli, ["blob", sess.id, "1", "-o", str(target), "--db", database])
    assert run.exit_code == 0, run.output
    assert target.read_bytes() == PNG
    recalled = sess.recall({"blob_id": 1})
    assert f"media of the user message at seq {old}" in recalled
    assert "[image: image/png 1000x800; not shown as text]" in recalled
    assert PNG_B64[:40] not in recalled
    # The log keeps the original; the context's copy is an edit.
    assert sess.messages()[old] == _with_image("anthropic", "here it is after my change")
    # Under the cap now: nothing more to do.
    assert not sess.process_request(now=T0 + 5).success


@pytest.mark.parametrize("fmt", ["openai", "responses"])
def test_user_images_over_the_cap_in_openai_and_responses(store: CompactStore, fmt: str) -> None:
    pytest.importorskip("openai")
    sess = _session(store, fmt, max_media_in_context=1)
    first = {"role": "user", "content": "compare these"}
    sess.append(first if fmt == "openai" else {"type": "message", **first}, timestamp=T0)
    for n in range(3):
        sess.append(_with_image(fmt, f"shot {n}"), timestamp=T0 + n)
        sess.append(REPLY[fmt], timestamp=T0 + n)
    before = sess.token_usage()
    result = sess.process_request(now=T0 + 5)
    assert result.success and "2 user messages with media" in result.steps[0].detail
    assert sess.token_usage() <= before - 2 * PIXEL_TOKENS + 100
    wire = sess.request_params()["messages" if fmt == "openai" else "input"]
    assert sdk_problems(fmt, wire) == []
    text_type = "text" if fmt == "openai" else "input_text"
    assert wire[1]["content"][0] == {"type": text_type, "text": "shot 0"}
    assert wire[1]["content"][1]["type"] == text_type
    assert "blob 1" in wire[1]["content"][1]["text"]
    assert wire[5]["content"] == _with_image(fmt, "shot 2")["content"]  # the newest stays
    assert sum(URL[:80] in json.dumps(m) for m in wire) == 1


def test_the_engine_persists_the_oldest_media_of_results_and_user_messages_alike() -> None:
    builder = ContextBuilder(
        config=CompactionConfig(token_factor=1.0, max_media_in_context=1)
    ).request("go")
    builder.add(_with_image("anthropic", "one"))
    builder.add(REPLY["anthropic"])
    builder.add(_with_image("anthropic", "two"))
    context = builder.build()
    assert context.open_media_blocks == 2
    stage = tool_budget.run(context, EngineInputs(now=T0, next_blob_id=3))
    assert [(b.id, b.tool_use_id, b.media) for b in stage.blobs] == [(3, "", True)]
    assert stage.context.open_media_blocks == 1
    assert [e.state for e in stage.edits] == ["persisted"]
    assert stage.edits[0].tool_use_ids == ()
    assert stage.tokens_freed >= PIXEL_TOKENS - 40
    assert "1 user messages with media" in stage.detail
