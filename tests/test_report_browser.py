"""The report in a real browser: headless Chromium (Debian's ``chromium`` and
``chromium-driver``, driven by selenium) loads the page with no console error and no
network request, draws one marker per compaction, and a hostile transcript runs nothing."""

from __future__ import annotations

import json
import shutil
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from compactstore import CompactStore
from compactstore.report import write_report
from tests.helpers import T0
from tests.test_report import HOSTILE, a_busy_session

pytest.importorskip("jinja2", reason="the report needs the 'report' extra (Jinja2)")
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium (the 'test' extra)")

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="needs Chromium: apt-get install -y chromium chromium-driver (.ci/run does)",
)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1200,900",
        "--no-first-run",
        "--disable-background-networking",
    ):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def load(browser: Any, page: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """Open the page; return its console messages and the URLs it requested."""
    browser.get_log("browser")
    browser.get_log("performance")
    browser.get(page.as_uri())
    console = browser.get_log("browser")
    requested = []
    for entry in browser.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            requested.append(message["params"]["request"]["url"])
    return console, requested


def pixels(png: bytes) -> tuple[int, int, list[bytes]]:
    """Width, height and the unfiltered rows of an 8-bit RGB(A) PNG."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    at, data, width, height, channels = 8, b"", 0, 0, 0
    while at < len(png):
        (length,) = struct.unpack(">I", png[at : at + 4])
        kind, body = png[at + 4 : at + 8], png[at + 8 : at + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and colour in (2, 6)
            channels = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            data += body
        at += 12 + length
    raw = zlib.decompress(data)
    stride = width * channels
    rows: list[bytes] = []
    previous = bytearray(stride)
    for y in range(height):
        row_filter, line = (
            raw[y * (stride + 1)],
            bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)]),
        )
        for x in range(stride):
            left = line[x - channels] if x >= channels else 0
            up = previous[x]
            corner = previous[x - channels] if x >= channels else 0
            if row_filter == 1:
                line[x] = (line[x] + left) & 0xFF
            elif row_filter == 2:
                line[x] = (line[x] + up) & 0xFF
            elif row_filter == 3:
                line[x] = (line[x] + (left + up) // 2) & 0xFF
            elif row_filter == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                best = left if pa <= pb and pa <= pc else up if pb <= pc else corner
                line[x] = (line[x] + best) & 0xFF
        rows.append(bytes(line))
        previous = line
    return width, height, rows


def colours(png: bytes) -> int:
    width, _, rows = pixels(png)
    channels = len(rows[0]) // width
    return len({row[i : i + 3] for row in rows for i in range(0, len(row), channels)})


@pytest.mark.slow
def test_the_page_loads_alone_and_draws_every_compaction(browser: Any, tmp_path: Path) -> None:
    with CompactStore.open(tmp_path / "s.db") as store:
        sess = a_busy_session(store).sess
        compactions = sess.compactions()
        page = write_report(store, "s", tmp_path / "s.html")
    console, requested = load(browser, page)
    assert console == []
    assert requested == [page.as_uri()]
    markers = browser.find_elements("css selector", "#usage-chart circle.marker")
    assert len(markers) == len(compactions)
    dimmed = browser.find_elements("css selector", "#usage-chart circle.marker.rolled-back")
    assert len(dimmed) == sum(c.rolled_back_at is not None for c in compactions) > 0
    assert float(dimmed[0].value_of_css_property("opacity")) < 0.5
    bars = browser.find_elements("css selector", "#context-chart rect.bar")
    assert len(bars) == len(sess.context().items)

    # The script ran: pointing at the chart reads out a model call.
    from selenium.webdriver.common.action_chains import ActionChains

    chart = browser.find_element("id", "usage-chart")
    ActionChains(browser).move_to_element(chart).perform()
    assert browser.find_element("id", "readout").text.startswith("model call ")
    assert browser.get_log("browser") == []

    shot = chart.screenshot_as_png
    (tmp_path / "chart.png").write_bytes(shot)
    assert colours(shot) > 20, "the chart is blank"


@pytest.mark.slow
def test_a_hostile_page_runs_nothing_and_loads_nothing(browser: Any, tmp_path: Path) -> None:
    from tests.helpers import new_session, words

    with CompactStore.open(tmp_path / "h.db") as store:
        chat = new_session(store, sid="<img src=x onerror=alert(1)>", context_window=20_000)
        chat.request(" ".join(HOSTILE))
        for text in HOSTILE * 2:
            chat.tool(text + words(6_000), args={"q": text})
            chat.user(text + words(1_500))
            chat.sess.record_usage(chat.sess.token_usage(), now=chat.tick())
        chat.sess.compact(now=T0 + 100)
        page = write_report(store, chat.sess.id, tmp_path / "h.html")
    console, requested = load(browser, page)
    # An alert() would be open now, and a blocked script or load would be a console error.
    assert browser.execute_script("return 1") == 1
    assert console == []
    assert requested == [page.as_uri()]
    assert browser.find_element("id", "session-id").text == chat.sess.id


@pytest.mark.slow
def test_the_cost_charts_draw_and_read_out_a_call(browser: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.action_chains import ActionChains

    from tests.test_report_cost import a_billed_session

    with CompactStore.open(tmp_path / "c.db") as store:
        cost = a_billed_session(store).sess.cost()
        page = write_report(store, "billed", tmp_path / "c.html")
    console, requested = load(browser, page)
    assert console == [] and requested == [page.as_uri()]
    bars = browser.find_elements("css selector", "#cost-chart rect.cost-bar")
    assert len(bars) == cost.calls - cost.unpriced_calls
    assert all(bar.is_displayed() for bar in bars)
    assert len(browser.find_elements("css selector", "#cost-chart circle.rewrite")) == 1
    assert browser.find_elements("css selector", "#cache-chart rect.kind")
    line = browser.find_element("css selector", "#cost-chart path.cumulative")
    assert line.value_of_css_property("stroke") != "none"

    readout = browser.find_element("id", "cost-readout")
    for chart_id in ("cost-chart", "cache-chart"):
        chart = browser.find_element("id", chart_id)
        ActionChains(browser).move_to_element(chart).perform()
        assert readout.text.startswith("billed call "), readout.text
        assert " so far" in readout.text
        shot = chart.screenshot_as_png
        assert colours(shot) > 8, f"{chart_id} is blank"
    assert browser.get_log("browser") == []
