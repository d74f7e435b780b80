"""Make docs/report.png: the report of the demo session, as headless Chromium shows it.

    python scripts/screenshot.py [--output docs/report.png] [--steps 300]

It runs ``compactstore demo``'s session into a temporary SQLite file, writes its report
(``compactstore.report.write_report``) and has Debian's ``chromium`` and ``chromedriver``
(driven by selenium, as tests/test_report_browser.py does) take a screenshot of the top of
the page. Needs the ``report`` and ``test`` extras (Jinja2, selenium) and Chromium with its
driver (``apt-get install chromium chromium-driver``); nothing is downloaded.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WIDTH, HEIGHT = 1100, 860


def screenshot(output: Path, steps: int) -> Path:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    from compactstore import CompactStore
    from compactstore._demo import run_demo
    from compactstore.report import write_report

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    if chromium is None or driver_path is None:
        raise SystemExit("needs Chromium: apt-get install -y chromium chromium-driver")
    with tempfile.TemporaryDirectory() as directory:
        page = Path(directory) / "demo.html"
        with CompactStore.open(Path(directory) / "demo.db") as store:
            report = run_demo(store, steps=steps)
            write_report(store, report.session_id, page)
        options = webdriver.ChromeOptions()
        options.binary_location = chromium
        for argument in (
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--hide-scrollbars",
            f"--window-size={WIDTH},{HEIGHT}",
            "--no-first-run",
            "--disable-background-networking",
        ):
            options.add_argument(argument)
        browser = webdriver.Chrome(service=Service(driver_path), options=options)
        try:
            browser.set_window_size(WIDTH, HEIGHT)
            browser.get(page.as_uri())
            png = browser.get_screenshot_as_png()
        finally:
            browser.quit()
    output.write_bytes(png)
    return output


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "report.png")
    parser.add_argument("--steps", type=int, default=300)
    arguments = parser.parse_args(argv)
    path = screenshot(arguments.output, arguments.steps)
    print(f"wrote {path} ({path.stat().st_size:,} bytes)")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main(sys.argv[1:]))
