"""The report's cost section: its totals, the cost per call and cumulative, each call's
prompt by how it was billed, and the cache each compaction made the provider write again,
all equal to the ledger in the database (``Session.cost()`` and ``model_calls``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select

from compactstore import CompactStore
from compactstore.db.schema import model_calls
from compactstore.report import write_report
from compactstore.report.svg import usd
from tests.helpers import Chat, new_session, plain, words
from tests.test_report import Page

pytest.importorskip("jinja2", reason="the report needs the 'report' extra (Jinja2)")

MODEL = "claude-sonnet-4-5"  # $3 / $15 per million, cache read 0.1x, writes 1.25x and 2x


def a_billed_session(store: CompactStore, sid: str = "billed") -> Chat:
    """Calls that read the cache and write what they add, one without a price, and a full
    compaction after which the next call writes the whole (shorter) prompt again."""
    chat = new_session(store, sid=sid, context_window=40_000, config=plain())
    chat.request("Fix the flaky payment tests.")
    prompt = 0
    for step in range(12):
        chat.tool(words(3_000, f"r{step}"), args={"path": f"f{step}.py"})
        grown = chat.sess.token_usage() - prompt
        chat.sess.record_usage(
            0 if step else grown,
            cache_read_tokens=prompt if step else 0,
            cache_write_5m_tokens=grown if step else 0,
            output_tokens=40 + step,
            model=MODEL if step != 5 else "a-model-without-a-price",
            now=chat.tick(),
        )
        prompt += grown
    chat.sess.compact(now=chat.tick())
    after = chat.sess.token_usage()
    chat.say("Compacted; carrying on.")
    chat.sess.record_usage(
        0, cache_write_1h_tokens=after, output_tokens=30, model=MODEL, now=chat.tick()
    )
    return chat


@pytest.mark.slow
def test_the_cost_section_shows_the_ledger(store: CompactStore, tmp_path: Path) -> None:
    chat = a_billed_session(store)
    cost = chat.sess.cost()
    page = Page(write_report(store, "billed", tmp_path / "b.html").read_text(encoding="utf-8"))

    text = {f: t for _, f, t in page.fields}
    assert text["cost_usd"] == usd(cost.cost_usd) and cost.cost_usd is not None
    assert page.field("billed_calls") == cost.calls == 13
    assert page.field("unpriced_calls") == cost.unpriced_calls == 1
    for name in ("input_tokens", "cache_read_tokens", "cache_write_tokens", "output_tokens"):
        assert page.field(name) == getattr(cost, name), name
    assert page.field("cache_rewrite_tokens") == cost.cache_rewrite_tokens > 0
    assert text["cache_rewrite_cost_usd"] == usd(cost.cache_rewrite_cost_usd)

    # The script's numbers: one row per call with its bill and the running total.
    with store.engine.connect() as connection:
        rows = connection.execute(
            select(
                model_calls.c.seq,
                model_calls.c.input_tokens,
                model_calls.c.cache_read_tokens,
                model_calls.c.cache_write_5m_tokens + model_calls.c.cache_write_1h_tokens,
                model_calls.c.output_tokens,
                model_calls.c.cost_usd,
            )
            .where(model_calls.c.session_id == "billed")
            .order_by(model_calls.c.id)
        ).all()
    billed = page.data()["billed"]
    assert [row[:6] for row in billed] == [list(row) for row in rows]
    assert billed[-1][6] == pytest.approx(cost.cost_usd, abs=1e-6)
    running = [row[6] for row in billed]
    assert running == sorted(running)

    # A bar per priced call, stacked bars per call, the cumulative line.
    classes = [a.get("class") or "" for t, a in page.tags if t in ("rect", "path", "circle")]
    assert classes.count("cost-bar") == cost.calls - cost.unpriced_calls
    assert sum(c.startswith("kind k-read") for c in classes) == sum(1 for r in rows if r[2])
    assert classes.count("cumulative") == 1

    # The compaction's cache rewrite: a marker linking to its card, a row, and on the card.
    rewrites = [r for r in cost.cache_rewrites if r.tokens]
    (full,) = [c for c in chat.sess.compactions() if c.strategy == "full"]
    assert [r.compaction_id for r in rewrites] == [full.id]
    marked = [
        page.tags[i - 1][1].get("href")
        for i, (t, a) in enumerate(page.tags)
        if t == "circle" and "rewrite" in (a.get("class") or "")
    ]
    assert marked == [f"#c{full.id}"]
    assert page.field("rewrite_tokens", str(full.id)) == rewrites[0].tokens
    assert [c for c, f, _ in page.fields if f == "rewrite"] == [str(full.id)]
    assert page.field("rewrite", str(full.id)) == rewrites[0].tokens


def test_a_session_without_model_calls_says_so(store: CompactStore, tmp_path: Path) -> None:
    chat = new_session(store, sid="plain", config=plain())
    chat.request("Hello")
    written = write_report(store, "plain", tmp_path / "p.html").read_text(encoding="utf-8")
    page = Page(written)
    assert page.data()["billed"] == []
    ids = [a.get("id") for _, a in page.tags]
    assert "cost" in ids and "cost-chart" not in ids and "cache-chart" not in ids
    assert "No model call recorded what it was billed for" in written
