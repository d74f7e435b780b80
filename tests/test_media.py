"""Images and documents in tool results (the documentation Media), on SQLite and PostgreSQL.

An 80 kB PNG appended as an anthropic image block counts its pixel figure, not its base64;
it reaches the model as an image block the SDK types accept; it is never previewed as
text; microcompact and ``max_media_in_context`` persist it as a blob behind a note, and
``get_blob`` / ``compactstore blob -o`` give it back exactly. A format that cannot carry
media refuses it and stores nothing.
"""

from __future__ import annotations

import base64
import json
import random
import struct
import zlib
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from compactstore import CompactionConfig, CompactStore, CompactStoreWarning, InvalidInputError
from compactstore._cli import cli
from compactstore._context.media import (
    image_size,
    media_blocks,
    media_note,
    pdf_pages,
    user_media,
    without_media,
)
from compactstore._context.tokens import (
    DOCUMENT_PAGE_TOKENS,
    IMAGE_MAX_TOKENS,
    estimate_tokens,
    image_tokens,
    message_tokens,
)
from compactstore._engines import microcompact, tool_budget
from compactstore._engines.base import EngineInputs
from compactstore._importers import read_transcript
from compactstore.formats import get_format
from compactstore.formats.sdk_types import sdk_problems
from tests.conftest import Snapshot, module_database
from tests.engines.builder import ContextBuilder
from tests.helpers import claude_code_record

T0 = 1_700_000_000.0

database = module_database("media")


def png(width: int, height: int, noise: int = 0) -> bytes:
    """A valid PNG whose first ``noise`` bytes of pixels are random (incompressible), so
    the file is about ``noise`` bytes long."""
    raw = bytearray()
    pixels = random.Random(width * height).randbytes(noise)
    row = width * 3
    for y in range(height):
        line = pixels[y * row : (y + 1) * row]
        raw += b"\x00" + line + bytes(row - len(line))

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(bytes(raw), 9))
        + chunk(b"IEND", b"")
    )


PNG = png(1000, 800, noise=77_000)  # an 80 kB screenshot: 1000 x 800 pixels
PNG_B64 = base64.b64encode(PNG).decode()
PIXEL_TOKENS = -(-1000 * 800 // 750)  # 1,067


def image_block(data: str = PNG_B64, media_type: str = "image/png") -> dict[str, Any]:
    return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}


def screenshot_turn(sess: Any, call_id: str, *, at: float, text: str = "the login page") -> int:
    sess.append(
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": call_id, "name": "screenshot", "input": {}}],
        },
        timestamp=at,
    )
    return int(
        sess.append_tool_result(
            call_id,
            [{"type": "text", "text": text}, image_block()],
            tool_name="screenshot",
            timestamp=at,
        )
    )


def item(sess: Any, seq: int) -> Any:
    return next(i for i in sess.context().items if i.seq == seq)


@pytest.fixture
def store(database: str) -> Any:
    opened = CompactStore.open(database)
    yield opened
    opened.close()


def new_session(store: CompactStore, name: str, fmt: str = "anthropic", **config: Any) -> Any:
    sess = store.session(
        f"{name}-{random.Random().getrandbits(32)}",
        format=fmt,
        config=CompactionConfig(token_factor=1.0, **config),
        now=T0,
    )
    sess.append({"role": "user", "content": "Check the login page"}, timestamp=T0)
    return sess


# -- sizes and figures (pure) -----------------------------------------------------------------


def test_the_png_is_80_kb_and_its_size_is_read_from_the_header() -> None:
    assert 79_000 <= len(PNG) <= 81_000
    assert image_size(PNG) == (1000, 800)
    assert image_tokens(1000, 800) == PIXEL_TOKENS == 1_067
    assert image_tokens(4000, 3000) == IMAGE_MAX_TOKENS  # scaled down by the API: the cap
    assert image_tokens(None, None) == IMAGE_MAX_TOKENS


def test_headers_of_every_image_type() -> None:
    gif = b"GIF89a" + struct.pack("<HH", 320, 200) + b"\x00" * 8
    jpeg = (
        b"\xff\xd8"
        + b"\xff\xe1"
        + struct.pack(">H", 18)
        + b"Exif\x00\x00"
        + b"\x00" * 10  # an APP1 segment first
        + b"\xff\xc0"
        + struct.pack(">HBHH", 17, 8, 480, 640)
        + b"\x03"
    )
    vp8x = b"RIFF\x00\x00\x00\x00WEBPVP8X" + b"\x00" * 8 + (1919).to_bytes(3, "little")
    vp8x += (1079).to_bytes(3, "little")
    vp8 = b"RIFF\x00\x00\x00\x00WEBPVP8 " + b"\x00" * 7 + b"\x9d\x01\x2a"
    vp8 += struct.pack("<HH", 64, 48)
    vp8l = b"RIFF\x00\x00\x00\x00WEBPVP8L" + b"\x00" * 4 + b"\x2f"
    bits = (100 - 1) | (50 - 1) << 14
    vp8l += bits.to_bytes(4, "little")
    assert image_size(gif) == (320, 200)
    assert image_size(jpeg) == (640, 480)
    assert image_size(vp8x) == (1920, 1080)
    assert image_size(vp8) == (64, 48)
    assert image_size(vp8l) == (100, 50)
    assert image_size(b"\xff\xd8\xff\xda\x00\x02") is None  # scan data before any frame
    assert image_size(b"not an image") is None


def test_pdf_pages_and_document_figure() -> None:
    pdf = b"%PDF-1.4\n1 0 obj <</Type /Pages /Count 2>>\n2 0 obj <</Type /Page>>\n"
    pdf += b"3 0 obj <</Type/Page /Parent 1 0 R>>\n%%EOF"
    assert pdf_pages(pdf) == 2
    assert pdf_pages(b"%PDF-1.7 objects in streams only") is None
    fmt = get_format("anthropic")
    message = {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": "t1",
                "content": [
                    {
                        "type": "document",
                        "source": {
                            "type": "base64",
                            "media_type": "application/pdf",
                            "data": base64.b64encode(pdf).decode(),
                        },
                    }
                ],
            }
        ],
    }
    fmt.validate(message)
    assert message_tokens(fmt, message, estimate_tokens) == 2 * DOCUMENT_PAGE_TOKENS


def test_a_summarizer_copy_has_notes_instead_of_media() -> None:
    message = {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "t", "content": [image_block()]}],
    }
    stripped = without_media(message)
    assert PNG_B64[:50] not in json.dumps(stripped)
    assert stripped["content"][0]["content"] == [
        {"type": "text", "text": "[image left out: image/png 1000x800]"}
    ]
    note = media_note([image_block()], tool_name="shot", blob_id=7, limit=500)
    assert "blob 7" in note and "image/png 1000x800" in note and len(note) <= 500


# -- the engines, as pure functions -------------------------------------------------------------


def _media_context(count: int, **config: Any) -> Any:
    builder = ContextBuilder(config=CompactionConfig(token_factor=1.0, **config)).request("go")
    fmt = get_format("anthropic")
    for n in range(count):
        call = f"toolu_{n}"
        builder.add(
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": call, "name": "shot", "input": {}}],
            }
        )
        builder.add(
            fmt.tool_result_message(call, [image_block()], tool_name="shot", is_error=False)
        )
    return builder.build()


def test_tool_budget_persists_the_oldest_media_over_the_cap_and_never_previews_base64() -> None:
    context = _media_context(3, max_media_in_context=1, tool_result_max_chars=100)
    assert all(i.tokens == PIXEL_TOKENS for i in context.kept if i.results)
    stage = tool_budget.run(context, EngineInputs(now=T0, next_blob_id=4))
    assert [blob.id for blob in stage.blobs] == [4, 5]
    assert all(blob.media for blob in stage.blobs)
    assert json.loads(stage.blobs[0].content) == [image_block()]
    kept = stage.context.kept
    notes = [i.message["content"][0]["content"] for i in kept if i.state == "persisted"]
    assert len(notes) == 2 and all(isinstance(n, str) and "blob" in n for n in notes)
    assert PNG_B64[:50] not in json.dumps([i.message for i in kept][:-1])
    assert kept[-1].message["content"][0]["content"] == [image_block()]  # the newest stays
    # Under the cap, a result of any size with media is left alone (no character budget).
    assert not tool_budget.run(
        _media_context(3, tool_result_max_chars=100), EngineInputs(now=T0)
    ).attempted


def test_microcompact_persists_media_instead_of_clearing_it() -> None:
    context = _media_context(3, microcompact_keep_recent=1)
    stage = microcompact.run(context, EngineInputs(now=T0 + 7_200, next_blob_id=1))
    assert stage.effective and [blob.id for blob in stage.blobs] == [1, 2]
    assert [e.state for e in stage.edits] == ["persisted", "persisted"]
    assert stage.tokens_freed > PIXEL_TOKENS


# -- through the public API, on both backends --------------------------------------------------


def test_an_80_kb_png_counts_its_pixels_and_reaches_the_model_as_an_image(
    store: CompactStore,
) -> None:
    pytest.importorskip("anthropic")
    sess = new_session(store, "png")
    seq = screenshot_turn(sess, "toolu_1", at=T0 + 1)
    tokens = item(sess, seq).tokens
    assert tokens == PIXEL_TOKENS + estimate_tokens("the login page")  # not ~28,000
    assert tokens < IMAGE_MAX_TOKENS
    result = sess.process_request(now=T0 + 2)
    assert not result.success  # exempt from the character budget: nothing to do
    context = sess.active_context()
    assert context[-1]["content"][0]["content"][1] == image_block()
    assert sdk_problems("anthropic", context) == []
    assert sdk_problems("anthropic", sess.request_params()["messages"]) == []


def test_media_over_max_media_in_context_is_persisted_and_get_blob_is_byte_exact(
    store: CompactStore, tmp_path: Path, database: str
) -> None:
    sess = new_session(store, "cap", max_media_in_context=2)
    seqs = [screenshot_turn(sess, f"toolu_{n}", at=T0 + n) for n in range(3)]
    before = sess.token_usage()
    result = sess.process_request(now=T0 + 10)
    assert result.success and result.strategy == "tool_budget"
    assert "media" in result.steps[0].detail
    assert sess.token_usage() < before - PIXEL_TOKENS + 200
    context = sess.active_context()
    note = context[2]["content"][0]["content"]
    assert isinstance(note, str) and note.startswith("[Tool result media persisted")
    assert "blob 1" in note and "the login page" in note
    assert [m["content"][0]["content"][1]["type"] for m in context[4::2]] == ["image", "image"]
    content = [{"type": "text", "text": "the login page"}, image_block()]
    original = json.dumps(content, separators=(",", ":"), ensure_ascii=False)
    assert sess.get_blob(1) == original
    assert json.loads(sess.get_blob(1)) == content
    assert item(sess, seqs[0]).state == "persisted"
    # Recall gives the model the text and a line per image, never the base64.
    recalled = sess.recall({"blob_id": 1})
    assert "the login page\n[image: image/png 1000x800; not shown as text]" in recalled
    assert PNG_B64[:40] not in recalled

    # `blob -o` writes the JSON when the blob holds more than one image...
    as_text = tmp_path / "blob1.json"
    run = CliRunner().invoke(cli, ["blob", sess.id, "1", "-o", str(as_text), "--db", database])
    assert run.exit_code == 0 and as_text.read_text() == original

    # ...and the image file when the blob is one image.
    single = new_session(store, "single", max_media_in_context=0)
    single.append(
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "toolu_9", "name": "screenshot", "input": {}}],
        },
        timestamp=T0 + 20,
    )
    single.append_tool_result("toolu_9", [image_block()], tool_name="screenshot", timestamp=T0)
    assert single.process_request(now=T0 + 21).success
    target = tmp_path / "shot.png"
    run = CliRunner().invoke(cli, ["blob", single.id, "1", "-o", str(target), "--db", database])
    assert run.exit_code == 0, run.stderr
    assert target.read_bytes() == PNG
    assert run.stdout == f"wrote {len(PNG):,} bytes (image/png, decoded) to {target}\n"


def test_microcompact_persists_media_as_a_blob(store: CompactStore) -> None:
    sess = new_session(store, "micro", microcompact_keep_recent=1)
    for n in range(3):
        screenshot_turn(sess, f"toolu_{n}", at=T0 + n)
    result = sess.process_request(now=T0 + 3_700)
    assert result.strategy == "microcompact"
    context = sess.active_context()
    notes = [m["content"][0]["content"] for m in context[2:6:2]]
    assert all(isinstance(n, str) and "blob" in n for n in notes)
    assert json.loads(sess.get_blob(2)) == [
        {"type": "text", "text": "the login page"},
        image_block(),
    ]
    assert context[-1]["content"][0]["content"][1] == image_block()


def test_a_summarizer_never_receives_base64(store: CompactStore) -> None:
    seen: list[str] = []

    def summarizer(messages: list[dict[str, Any]], previous: Any, instructions: Any) -> str:
        seen.append(json.dumps(messages))
        return "Looked at the login page twice."

    sess = store.session(
        f"summ-{random.Random().getrandbits(32)}",
        format="anthropic",
        config=CompactionConfig(token_factor=1.0),
        summarizer=summarizer,
        now=T0,
    )
    sess.append({"role": "user", "content": "Check the login page"}, timestamp=T0)
    for n in range(6):
        screenshot_turn(sess, f"toolu_{n}", at=T0 + n)
    result = sess.compact(now=T0 + 10)
    assert result.success and seen
    assert PNG_B64[:40] not in seen[0] and "[image left out: image/png 1000x800]" in seen[0]
    assert PNG_B64[:40] not in (result.summary_text or "")


def test_openai_refuses_media_in_a_tool_result_and_stores_nothing(
    store: CompactStore, db_snapshot: Snapshot
) -> None:
    sess = store.session(f"oa-{random.Random().getrandbits(32)}", format="openai", now=T0)
    sess.append({"role": "user", "content": "look"}, timestamp=T0)
    sess.append(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "shot", "arguments": "{}"}}
            ],
        },
        timestamp=T0,
    )
    before = db_snapshot(store)
    part = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG_B64}"}}
    with pytest.raises(InvalidInputError, match="takes text only") as caught:
        sess.append_tool_result("c1", [{"type": "text", "text": "x"}, part], tool_name="shot")
    assert "'anthropic' or 'responses'" in str(caught.value)
    assert db_snapshot(store) == before
    # A list of text parts is a valid Chat Completions tool message.
    sess.append_tool_result("c1", [{"type": "text", "text": "ok"}], tool_name="shot")
    assert sess.active_context()[-1]["content"] == [{"type": "text", "text": "ok"}]


def test_bad_media_is_refused_with_a_clear_error(
    store: CompactStore, db_snapshot: Snapshot
) -> None:
    sess = new_session(store, "bad")
    sess.append(
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t", "name": "s", "input": {}}],
        }
    )
    minicode = store.session(f"mc-{random.Random().getrandbits(32)}", format="minicode", now=T0)
    before = db_snapshot(store)
    cases = [
        ([image_block(media_type="image/jpeg")], "image data is image/png but the block declares"),
        ([image_block(data="not base64!")], "not valid base64"),
        ([{"type": "image", "source": {"type": "url"}}], "needs a non-empty string 'url'"),
        ([{"type": "input_image", "image_url": "x"}], "not allowed in a anthropic tool result"),
        ([], "empty list"),
    ]
    for content, problem in cases:
        with pytest.raises(InvalidInputError, match=problem):
            sess.append_tool_result("t", content, tool_name="s")
    with pytest.raises(InvalidInputError, match="format minicode"):
        minicode.append_tool_result("t", [image_block()], tool_name="s")
    assert db_snapshot(store) == before


def test_responses_input_image_works(store: CompactStore) -> None:
    pytest.importorskip("openai")
    sess = store.session(
        f"resp-{random.Random().getrandbits(32)}",
        format="responses",
        config=CompactionConfig(token_factor=1.0, max_media_in_context=1),
        now=T0,
    )
    sess.append({"role": "user", "content": "look"}, timestamp=T0)
    url = f"data:image/png;base64,{PNG_B64}"
    for n in range(2):
        sess.append(
            {"type": "function_call", "call_id": f"c{n}", "name": "shot", "arguments": "{}"},
            timestamp=T0 + n,
        )
        seq = sess.append_tool_result(
            f"c{n}",
            [
                {"type": "input_text", "text": "the page"},
                {"type": "input_image", "image_url": url, "detail": "auto"},
            ],
            tool_name="shot",
            timestamp=T0 + n,
        )
    assert item(sess, seq).tokens == PIXEL_TOKENS + estimate_tokens("the page")
    assert sess.process_request(now=T0 + 5).success
    params = sess.request_params()
    assert sdk_problems("responses", params["input"]) == []
    assert params["input"][-1]["output"][1]["image_url"] == url
    assert "blob 1" in params["input"][2]["output"]
    assert json.loads(sess.get_blob(1))[1]["image_url"] == url


# -- imports -------------------------------------------------------------------------------------


def test_claude_code_import_keeps_image_blocks_in_tool_results(tmp_path: Path) -> None:
    call = {"type": "tool_use", "id": "t1", "name": "Read", "input": {"file_path": "/s.png"}}
    result = {"type": "tool_result", "tool_use_id": "t1", "content": [image_block()]}
    lines = [
        claude_code_record("user", "what is on screen?", uuid="u1"),
        claude_code_record("assistant", [call], uuid="a1", message_id="m-a1"),
        claude_code_record("user", [result], uuid="u2"),
    ]
    path = tmp_path / "cc.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    transcript = read_transcript(path)
    assert transcript.messages[-1] == {"role": "user", "content": [result]}
    fmt = get_format("anthropic")
    assert message_tokens(fmt, transcript.messages[-1], estimate_tokens) == PIXEL_TOKENS


def test_an_import_notes_an_image_the_provider_would_refuse(tmp_path: Path) -> None:
    """A PNG labelled image/jpeg (the API refuses it): the import keeps the rest and says
    what was left out, with one warning."""
    bad = image_block(media_type="image/jpeg")
    call = {"type": "tool_use", "id": "t1", "name": "Read", "input": {"file_path": "/s.jpg"}}
    result = {"type": "tool_result", "tool_use_id": "t1", "content": [bad, image_block()]}
    lines = [
        claude_code_record("user", "what is on screen?", uuid="u1"),
        claude_code_record("assistant", [call], uuid="a1", message_id="m-a1"),
        claude_code_record("user", [result], uuid="u2"),
    ]
    path = tmp_path / "cc.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    with pytest.warns(CompactStoreWarning, match="replaced by a text note") as caught:
        transcript = read_transcript(path)
    assert len(caught) == 1
    content = transcript.messages[-1]["content"][0]["content"]
    assert content[0]["type"] == "text"
    assert "image data is image/png but the block declares image/jpeg" in content[0]["text"]
    assert content[1] == image_block()


@pytest.mark.parametrize("kind", [[], {}, ["image"], 3, None])
def test_a_block_whose_type_is_not_a_string_is_never_media(kind: Any, tmp_path: Path) -> None:
    message = {"role": "user", "content": [{"type": kind, "source": {}}], "type": kind}
    assert list(media_blocks(message)) == [] and user_media(message) == []
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(message) + "\n")
    # Refused naming the line, as any malformed message (not a TypeError from a set lookup).
    with pytest.raises(InvalidInputError, match="line 1"):
        read_transcript(path, format="anthropic")
