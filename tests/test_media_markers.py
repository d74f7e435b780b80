"""`compactstore show` and the HTML report show a marker for each image or document
(``[image png 1000×800, 81 kB]``) instead of nothing or base64."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from compactstore import CompactionConfig, CompactStore
from compactstore._cli import cli
from tests.test_media import PNG_B64, T0, image_block, screenshot_turn

PNG_MARKER = "[image png 1000×800, 81 kB]"
PDF = b"%PDF-1.4\n1 0 obj << /Type /Page >> endobj\n2 0 obj << /Type /Page >> endobj\n%%EOF"
PDF_MARKER = f"[document pdf, 2 pages, {len(PDF)} B]"


@pytest.fixture
def db(tmp_path: Path) -> str:
    path = str(tmp_path / "markers.db")
    with CompactStore.open(path) as store:
        sess = store.session("s", format="anthropic", config=CompactionConfig(), now=T0)
        document = {
            "type": "document",
            "source": {
                "type": "base64",
                "media_type": "application/pdf",
                "data": base64.b64encode(PDF).decode(),
            },
        }
        sess.append(
            {"role": "user", "content": [{"type": "text", "text": "this spec"}, document]},
            timestamp=T0,
        )
        sess.append({"role": "assistant", "content": "reading"}, timestamp=T0)
        screenshot_turn(sess, "toolu_1", at=T0 + 1)
        sess.append(
            {"role": "user", "content": [{"type": "text", "text": "and this"}, image_block()]},
            timestamp=T0 + 2,
        )
        gen = store.session("g", format="responses", now=T0)
        gen.append({"type": "message", "role": "user", "content": "draw"}, timestamp=T0)
        gen.append(
            {"type": "image_generation_call", "id": "ig", "result": PNG_B64, "status": "completed"},
            timestamp=T0,
        )
    return path


def _show(db: str, *args: str) -> str:
    result = CliRunner().invoke(cli, ["show", *args, "--db", db])
    assert result.exit_code == 0, result.output
    assert PNG_B64[:40] not in result.output
    return result.output


@pytest.mark.slow
def test_show_prints_a_marker_per_image_and_document(db: str) -> None:
    rows = _show(db, "s").splitlines()
    assert rows[-5].endswith(f"pinned        {PDF_MARKER} this spec")
    assert rows[-2].endswith(f"original      {PNG_MARKER} the login page")  # a tool result
    assert rows[-1].endswith(f"original      {PNG_MARKER} and this")
    full = _show(db, "s", "--full")
    assert f"        {PNG_MARKER}\n        and this\n" in full
    shown = json.loads(_show(db, "s", "--json"))
    assert shown["messages"][-1]["text"] == f"{PNG_MARKER} and this"
    generated = _show(db, "g").splitlines()[-1]  # a generated image
    assert f"original      {PNG_MARKER} " in generated


@pytest.mark.slow
def test_the_report_lists_the_images_and_documents_in_the_context(db: str, tmp_path: Path) -> None:
    pytest.importorskip("jinja2")
    target = tmp_path / "s.html"
    result = CliRunner().invoke(cli, ["report", "s", "-o", str(target), "--db", db])
    assert result.exit_code == 0, result.output
    page = target.read_text(encoding="utf-8")
    assert PNG_B64[:40] not in page
    assert f'<li data-field="media">seq 0 (user): {PDF_MARKER}</li>' in page
    assert f'<li data-field="media">seq 3 (tool): {PNG_MARKER}</li>' in page
    assert f'<li data-field="media">seq 4 (user): {PNG_MARKER}</li>' in page
    assert re.search(
        rf"<title>seq 4 · user · [\d,]+ tokens · original · {re.escape(PNG_MARKER)}</title>", page
    )
