"""A Responses ``image_generation_call`` item holds the generated image as base64 in its
``result``: it counts as an image by its size, passes through to the model
verbatim, and its base64 never reaches a summarizer or recall. SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from compactstore import CompactionConfig, CompactStore
from compactstore._context.tokens import estimate_tokens
from compactstore.formats.base import json_text
from compactstore.formats.sdk_types import sdk_problems
from tests.conftest import module_database
from tests.test_media import PIXEL_TOKENS, PNG_B64, T0

database = module_database("generated")

GENERATED = {
    "type": "image_generation_call",
    "id": "ig_1",
    "result": PNG_B64,  # an 80 kB 1000x800 PNG
    "status": "completed",
}


@pytest.fixture
def store(database: str) -> Any:
    opened = CompactStore.open(database)
    yield opened
    opened.close()


def _session(store: CompactStore, **kwargs: Any) -> Any:
    sess = store.session(
        f"gen-{random.Random().getrandbits(32)}",
        format="responses",
        config=CompactionConfig(token_factor=1.0),
        now=T0,
        **kwargs,
    )
    sess.append({"type": "message", "role": "user", "content": "draw the login page"}, timestamp=T0)
    return sess


def test_a_generated_image_counts_its_pixels_not_its_base64(store: CompactStore) -> None:
    sess = _session(store)
    seq = sess.append(GENERATED, timestamp=T0 + 1)
    item = next(i for i in sess.context().items if i.seq == seq)
    rest = {key: value for key, value in GENERATED.items() if key != "result"}
    assert item.tokens == PIXEL_TOKENS + estimate_tokens(json_text(rest))  # not ~27,000
    # Not generated yet (result null): the item's JSON, as before.
    pending = sess.append({**GENERATED, "id": "ig_2", "result": None}, timestamp=T0 + 2)
    assert sess.context().items[-1].seq == pending
    assert sess.context().items[-1].tokens < 30
    # The model gets the item verbatim.
    params = sess.request_params()
    assert params["input"][1] == GENERATED
    pytest.importorskip("openai")
    assert sdk_problems("responses", params["input"]) == []


def test_a_summarizer_and_recall_never_get_the_base64(store: CompactStore) -> None:
    seen: list[str] = []

    def summarizer(messages: list[dict[str, Any]], previous: Any, instructions: Any) -> str:
        seen.append(json.dumps(messages))
        return "Drew the login page."

    sess = _session(store, summarizer=summarizer)
    seq = sess.append(GENERATED, timestamp=T0 + 1)
    for n in range(4):
        sess.append(
            {"type": "message", "role": "user", "content": f"again {n}"}, timestamp=T0 + 2 + n
        )
        sess.append(
            {"type": "message", "role": "assistant", "content": f"done {n}"}, timestamp=T0 + 2 + n
        )
    result = sess.compact(now=T0 + 10)
    assert result.success and seq in result.removed_seqs and seen
    assert PNG_B64[:40] not in seen[0]
    assert '"result": "[image left out: image/png 1000x800]"' in seen[0]
    recalled = sess.recall({"from_seq": seq, "to_seq": seq})
    assert "[generated image: image/png 1000x800; not shown as text]" in recalled
    assert PNG_B64[:40] not in recalled
    # The log keeps the image.
    assert sess.messages()[seq] == GENERATED
