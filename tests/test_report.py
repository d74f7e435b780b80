"""`compactstore report`: the page shows the database's numbers, is
self-contained, and no transcript can make it run script or load anything."""

from __future__ import annotations

import base64
import hashlib
import html
import json
import re
import sys
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from compactstore import CompactStore, MissingExtraError
from compactstore.db.schema import model_calls
from compactstore.report import safe_filename, write_all, write_report
from tests.helpers import T0, Chat, busy_log, every_stage, new_session, plain, words

pytest.importorskip("jinja2", reason="the report needs the 'report' extra (Jinja2)")


class Page(HTMLParser):
    """Every element of a page with its attributes, the text inside each element with an
    id or a data-field, and the raw text of <script> and <style> elements."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.fields: list[tuple[str, str, str]] = []  # (data-compaction of the card, field, text)
        self.scripts: list[tuple[dict[str, str | None], str]] = []
        self.styles: list[str] = []
        self._open: list[tuple[str, dict[str, str | None]]] = []
        self._text: list[list[str]] = []
        self._compaction: list[str] = []
        self.feed(text)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        self.tags.append((tag, attributes))
        if tag in ("meta", "link", "br", "input", "img"):
            return
        self._open.append((tag, attributes))
        self._text.append([])
        self._compaction.append(attributes.get("data-compaction") or "")

    def handle_endtag(self, tag: str) -> None:
        if not self._open:
            return
        opened, attributes = self._open.pop()
        assert opened == tag, f"</{tag}> closes <{opened}>"
        text = "".join(self._text.pop())
        self._compaction.pop()
        for chunk in self._text:
            chunk.append(text)
        if tag == "script":
            self.scripts.append((attributes, text))
        elif tag == "style":
            self.styles.append(text)
        field = attributes.get("data-field")
        if field:
            owner = next((c for c in reversed(self._compaction) if c), "")
            self.fields.append((owner, field, text))

    def handle_data(self, data: str) -> None:
        if self._text:
            self._text[-1].append(data)

    def field(self, name: str, compaction: str = "") -> int:
        found = [t for c, f, t in self.fields if f == name and c == compaction]
        assert len(found) == 1, (name, compaction, found)
        return int(found[0].replace(",", ""))

    def data(self) -> dict[str, Any]:
        (block,) = [t for a, t in self.scripts if a.get("type") == "application/json"]
        loaded: dict[str, Any] = json.loads(block)
        return loaded


def a_busy_session(store: CompactStore, sid: str = "s") -> Chat:
    """Every kind of compaction, real counts after some calls, one rolled back."""
    chat = new_session(store, sid=sid, context_window=20_000, config=plain())
    busy_log(chat)
    for number, _ in enumerate(every_stage(chat)):
        chat.sess.record_usage(chat.sess.token_usage() + 50, now=chat.tick())
        if number == 2:
            chat.chatter(4, tag="between")
    chat.chatter(6, tag="after")
    chat.sess.rollback()
    return chat


@pytest.mark.slow
def test_the_page_shows_the_numbers_in_the_database(store: CompactStore, tmp_path: Path) -> None:
    chat = a_busy_session(store)
    sess = chat.sess
    page = Page(write_report(store, "s", tmp_path / "s.html").read_text(encoding="utf-8"))

    compactions = sess.compactions()
    assert len(compactions) >= 8
    assert page.field("compactions") == len(compactions)
    assert page.field("messages") == len(sess.messages())
    assert page.field("usage") == sess.token_usage()
    assert page.field("context_messages") == len(sess.context().items)
    breaker = sess.breaker()
    assert page.field("consecutive_failures") == breaker.consecutive_failures
    assert page.field("reactive_attempts") == breaker.reactive_attempts

    # One marker per compaction, rolled-back ones dimmed, each linking to its card or row.
    marked = [
        (page.tags[i - 1][1].get("href") or "", a.get("class") or "")
        for i, (t, a) in enumerate(page.tags)
        if t == "circle" and "marker" in (a.get("class") or "")
    ]
    assert sorted(href for href, _ in marked) == sorted(f"#c{c.id}" for c in compactions)
    rolled_back = [c for c in compactions if c.rolled_back_at is not None]
    assert rolled_back
    assert sorted(href for href, classes in marked if "rolled-back" in classes) == sorted(
        f"#c{c.id}" for c in rolled_back
    )

    # A card per compaction that cut or recovered, with its numbers; a row for the others.
    cards = {c for c, f, _ in page.fields if c and f == "tokens_before"}
    cut = {
        str(c.id)
        for c in compactions
        if c.boundary is not None or (c.trigger == "reactive" and c.success)
    }
    assert cards == cut and cut
    for compaction in compactions:
        key = str(compaction.id)
        if key not in cards:
            continue
        assert page.field("tokens_before", key) == compaction.tokens_before
        assert page.field("tokens_after", key) == compaction.tokens_after
        assert page.field("tokens_freed", key) == compaction.tokens_freed
        assert page.field("messages_removed", key) == len(compaction.removed_seqs)
    rows = {
        a.get("data-compaction") for t, a in page.tags if t == "tr" and a.get("data-compaction")
    }
    assert rows == {str(c.id) for c in compactions} - cut

    # The script's data is the model_calls table.
    with store.engine.connect() as connection:
        recorded = connection.execute(
            select(model_calls.c.seq, model_calls.c.usage, model_calls.c.real_tokens)
            .where(model_calls.c.session_id == "s")
            .order_by(model_calls.c.id)
        ).all()
    assert page.data()["calls"] == [list(row) for row in recorded]
    assert page.field("model_calls") == len(recorded) > 5


@pytest.mark.slow
def test_summaries_and_what_changed_in_them(store: CompactStore, tmp_path: Path) -> None:
    chat = new_session(store, context_window=20_000)
    chat.request("Port the importer to the new API")
    chat.tool("x" * 200, name="Read", args={"file_path": "src/old_importer.py"})
    chat.chatter(80, chars=1_600)
    first = chat.sess.process_request(now=T0 + 10)
    chat.tool("y" * 200, name="Read", args={"file_path": "src/new_api.py"})
    chat.chatter(80, tag="g", chars=1_600)
    second = chat.sess.process_request(now=T0 + 20)
    assert first.boundary is not None and second.boundary is not None
    text = write_report(store, "s", tmp_path / "s.html").read_text(encoding="utf-8")
    page = Page(text)
    assert "The first summary of the session." in text
    diff = [t for t, a in page.tags if t == "span" and a.get("class") in ("add", "del")]
    assert diff, "the second card shows what changed from the first summary"
    assert "src/new_api.py" in text


def test_the_failure_that_tripped_the_breaker_is_named(store: CompactStore, tmp_path: Path) -> None:
    chat = new_session(store, context_window=20_000)
    chat.request("Fix it " + words(70_000))  # a pinned request the window cannot hold
    for turn in range(5):
        chat.say(words(400, f"a{turn}"))
        chat.sess.process_request(now=T0 + turn)
    # Every call is a breaker failure: none gets usage below the threshold (a summary may
    # still free a few tokens).
    failures = chat.sess.compactions()
    assert len(failures) == 3 and chat.sess.breaker().tripped
    page = Page(write_report(store, "s", tmp_path / "s.html").read_text("utf-8"))
    assert page.field("consecutive_failures") == 3
    (tripped,) = [c for c, f, _ in page.fields if f == "tripped_by"]
    assert tripped == str(failures[-1].id)
    rows = {a.get("data-compaction") for t, a in page.tags if t == "tr"}
    failed = {str(c.id) for c in failures if not c.success}
    assert failed and failed <= rows  # failed attempts are one line each


@pytest.mark.slow
def test_imported_and_simulated_sessions(tmp_path: Path) -> None:
    messages = [{"role": "user", "content": "Fix the build"}]
    for i in range(40):
        messages.append({"role": "assistant", "content": f"step {i} " + words(3_000)})
        messages.append({"role": "user", "content": f"go on {i}"})
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps(m) for m in messages) + "\n", encoding="utf-8")
    from click.testing import CliRunner

    from compactstore._cli import cli

    db = tmp_path / "sim.db"
    out = CliRunner().invoke(cli, ["simulate", str(path), "--window", "8000", "--db", str(db)])
    assert out.exit_code == 0, out.output
    with CompactStore.open(db) as store:
        (info,) = store.sessions()
        page = Page(write_report(store, info.id, tmp_path / "sim.html").read_text("utf-8"))
        compactions = store.get_session(info.id).compactions()
        assert compactions
        assert page.field("compactions") == len(compactions)
        assert page.field("model_calls") == 40  # one per assistant message


def test_all_sessions_get_a_safe_file_each(store: CompactStore, tmp_path: Path) -> None:
    ids = ["../../escape", "a/b", "A/B", "..", "Plain", "plain", "index"]
    for sid in ids:
        chat = new_session(store, sid=sid)
        chat.request(f"request of {sid}")
    folder = tmp_path / "out"
    index = write_all(store, folder)
    assert index == folder / "index.html"
    written = sorted(p.name for p in folder.iterdir())
    assert len(written) == len(ids) + 1 and all("/" not in n for n in written)
    assert not (tmp_path / "escape").exists()
    names = {safe_filename(sid) for sid in ids}
    assert len(names) == len(ids)
    # A plain lower-case id is its own name; any other gets a hash of the whole id.
    assert safe_filename("plain") == "plain.html"
    hashed = names - {"plain.html"}
    assert all(re.fullmatch(r"[A-Za-z0-9_-]+-[0-9a-f]{10}\.html", n) for n in hashed)
    assert len({n.lower() for n in names}) == len(ids)  # distinct without case too
    links = [a["href"] or "" for t, a in Page(index.read_text("utf-8")).tags if t == "a"]
    assert sorted(links) == sorted(names)
    for sid in ids:
        page = Page((folder / safe_filename(sid)).read_text("utf-8"))
        assert page.data()["session"] == sid


HOSTILE = [
    "</script><script>alert(1)</script>",
    '<a href="javascript:alert(2)">click</a>',
    '<svg onload="alert(3)"><circle onmouseover="alert(4)"/></svg>',
    "<img src=x onerror=alert(5)>",
    "line\u2028separator\u2029paragraph",
    "<style>body{display:none}</style><link rel=stylesheet href=https://example.com/x.css>",
    "{{ 7*7 }} {% raw %}",
]
ALLOWED_TAGS = {
    "html", "head", "meta", "title", "style", "body", "header", "h1", "h2", "h3", "p", "b",
    "span", "section", "ul", "li", "svg", "rect", "line", "text", "path", "circle", "a", "code",
    "div", "article", "dl", "dt", "dd", "details", "summary", "pre", "table", "thead", "tbody",
    "tr", "th", "td", "footer", "script",
}  # fmt: skip


@pytest.mark.slow_on_postgres
def test_a_hostile_session_cannot_run_or_load_anything(store: CompactStore, tmp_path: Path) -> None:
    sid = "<script>alert(0)</script>\u2028/../x"
    chat = new_session(store, sid=sid, context_window=20_000)
    chat.request(" ".join(HOSTILE))
    for n, text in enumerate(HOSTILE * 3):
        chat.tool(text + words(6_000), name=f"<b onclick=alert({n})>", args={"q": text})
        chat.user(text + words(1_500))
        chat.sess.record_usage(chat.sess.token_usage(), now=chat.tick())
    chat.sess.process_request(now=T0 + 100)
    chat.sess.compact(instructions=HOSTILE[0], now=T0 + 101)
    assert any(c.boundary for c in chat.sess.compactions())
    text = write_report(store, sid, tmp_path / "h.html").read_text(encoding="utf-8")
    page = Page(text)

    for tag, attributes in page.tags:
        assert tag in ALLOWED_TAGS, tag
        for name, value in attributes.items():
            assert not name.startswith("on"), (tag, name)
            assert name not in ("src", "srcset", "action", "formaction", "style"), (tag, name)
            if name in ("href", "xlink:href"):
                assert value is not None and re.fullmatch(r"#c\d+", value), value
    scripts = page.scripts
    assert [a for a, _ in scripts] == [{"type": "application/json", "id": "report-data"}, {}]
    assert "\u2028" not in scripts[0][1] and "<" not in scripts[0][1]
    assert page.data()["session"] == sid
    assert "alert(" not in scripts[1][1]
    for item in HOSTILE:
        if "<" in item:  # markup reaches the page only escaped (U+2028 is harmless in HTML)
            assert item not in text and item in html.unescape(text)
    assert "{{ 7*7 }}" in text  # text, never a template

    # Only the page's own script and style may run, by hash; nothing may load.
    (csp,) = [a["content"] for t, a in page.tags if t == "meta" and a.get("http-equiv")]
    assert csp is not None
    policy = dict(part.strip().split(" ", 1) for part in csp.split(";"))
    assert policy["default-src"] == "'none'"
    assert policy["img-src"] == "'none'"

    def digest(code: str) -> str:
        return "'sha256-" + base64.b64encode(hashlib.sha256(code.encode()).digest()).decode() + "'"

    assert policy["script-src"] == digest(scripts[1][1])
    (style,) = page.styles
    assert policy["style-src"] == digest(style)


def test_without_jinja2_the_error_names_the_extra(
    store: CompactStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    new_session(store).request("hello")
    monkeypatch.setitem(sys.modules, "jinja2", None)
    with pytest.raises(MissingExtraError, match=r"pip install 'compactstore\[report\]'"):
        write_report(store, "s", tmp_path / "s.html")
    assert not (tmp_path / "s.html").exists()


# -- the command line ---------------------------------------------------------------------


def run(*args: str) -> Any:
    from click.testing import CliRunner

    from compactstore._cli import cli

    return CliRunner().invoke(cli, list(args))


@pytest.mark.slow
def test_the_report_command_writes_one_page_or_every_page(tmp_path: Path) -> None:
    db = str(tmp_path / "s.db")
    with CompactStore.open(db) as store:
        a_busy_session(store, "s")
        new_session(store, sid="a/../b").request("another")
        compactions = len(store.get_session("s").compactions())
    out = run("report", "s", "--db", db, "-o", str(tmp_path / "s.html"))
    assert out.exit_code == 0, out.output
    assert out.stdout.startswith(f"Wrote {tmp_path / 's.html'} (")
    page = Page((tmp_path / "s.html").read_text("utf-8"))
    assert page.field("compactions") == compactions

    out = run("report", "--all", "-o", str(tmp_path / "all"), "--db", db)
    assert out.exit_code == 0, out.output
    assert sorted(p.name for p in (tmp_path / "all").iterdir()) == sorted(
        ["index.html", safe_filename("s"), safe_filename("a/../b")]
    )


def test_the_report_command_default_name_and_errors(tmp_path: Path, monkeypatch: Any) -> None:
    db = str(tmp_path / "s.db")
    with CompactStore.open(db) as store:
        new_session(store, sid="x/y").request("hello")
    monkeypatch.chdir(tmp_path)
    out = run("report", "x/y", "--db", db)
    assert out.exit_code == 0, out.output
    assert (tmp_path / safe_filename("x/y")).is_file()

    for args in (["report"], ["report", "x/y", "--all", "-o", "d"], ["report", "--all"]):
        out = run(*args, "--db", db)
        assert out.exit_code == 2, (args, out.output)
    out = run("report", "nobody", "--db", db, "-o", "n.html")
    assert out.exit_code == 1 and out.stderr.startswith("Error: ") and "nobody" in out.stderr
    assert not (tmp_path / "n.html").exists()
    out = run("report", "x/y", "--db", db, "-o", db)  # never over the database
    assert out.exit_code == 1 and "refusing to write" in out.stderr
    with CompactStore.open(db) as store:
        assert [info.id for info in store.sessions()] == ["x/y"]
    out = run("report", "x/y", "--db", str(tmp_path / "none.db"))
    assert out.exit_code == 1 and not (tmp_path / "none.db").exists()


@pytest.mark.slow
def test_the_demo_ends_with_the_command_that_writes_its_report(
    tmp_path: Path, monkeypatch: Any
) -> None:
    import shlex

    monkeypatch.chdir(tmp_path)
    out = run("demo", "--steps", "40", "--db", "demo.db")
    assert out.exit_code == 0, out.output
    command = shlex.split(out.stdout.strip().splitlines()[-1])
    assert command[:3] == ["compactstore", "report", "demo"]
    written = run(*command[1:])
    assert written.exit_code == 0, written.output
    page = Page((tmp_path / "demo.html").read_text("utf-8"))
    assert page.field("model_calls") >= 40  # the demo records every model call


def _axis_labels(page: str) -> list[str]:
    svg = page[page.index('<svg id="usage-chart"') :]
    svg = svg[: svg.index("</svg>")]
    return [
        label
        for label in re.findall(r'text-anchor="end">([^<]*)</text>', svg)
        if re.fullmatch(r"[\d.,]+k?", label)
    ]


def _value(label: str) -> float:
    return float(label.removesuffix("k").replace(",", "")) * (1000 if label.endswith("k") else 1)


@pytest.mark.slow
def test_the_usage_axis_has_one_unit_and_a_scale_above_the_window(
    store: CompactStore, tmp_path: Path
) -> None:
    chat = new_session(store, sid="over", context_window=25_000)
    chat.request("the original request")
    while chat.sess.token_usage() < 40_000:  # past the window, as a burst the API refused
        chat.chatter(2, chars=4_000)
    recovered = chat.sess.reactive_recover("prompt is too long", now=chat.tick())
    assert recovered is not None and recovered.success and recovered.tokens_before > 40_000
    page = write_report(store, "over", tmp_path / "over.html").read_text("utf-8")
    labels = _axis_labels(page)
    assert labels[:5] == ["0", "6.25k", "12.5k", "18.75k", "25k"]  # never "6,250" beside "12k"
    assert all(label.endswith("k") for label in labels[1:])
    # The reactive marker above the window is under the highest label.
    assert _value(labels[-1]) <= recovered.tokens_before * 1.05 < _value(labels[-1]) + 6_250
    assert _value(labels[-1]) > 25_000


def test_a_small_window_axis_is_in_tokens_and_the_legend_never_says_none(tmp_path: Path) -> None:
    with CompactStore.open(tmp_path / "bg.db", summarizer=lambda m, p, i: "summary") as store:
        chat = new_session(store, sid="small", context_window=8_000)
        chat.request("the original request")
        while True:  # the call that starts a background summary records a row, no strategy
            chat.chatter(2)
            if chat.sess.process_request(background=True, now=chat.tick()).background:
                break
        assert any(c.strategy is None for c in chat.sess.compactions())
        page = write_report(store, "small", tmp_path / "small.html").read_text("utf-8")
    assert _axis_labels(page) == ["0", "2,000", "4,000", "6,000", "8,000"]
    legend = page[page.index('<ul class="legend">') :]
    legend = legend[: legend.index("</ul>")]
    assert ">none<" not in legend
    assert "no change (an attempt, or a background start)" in legend
    assert safe_filename("small") == "small.html"
