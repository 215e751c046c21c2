"""The dashboard in a real browser (Debian's Chromium driven by Playwright) over `clawr1 up --demo`:
it loads, a pushed live update arrives, a curated row leaves the trainer's preview, the tree view
opens, no table overflows its card, and the console stays clean. Screenshots go to docs/."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.common import free_port
from tests.integration.live_stack import clawr1_up

CHROMIUM = "/usr/bin/chromium"
DOCS = Path(__file__).resolve().parents[3] / "docs"
PREVIEW_GROUP = "browser-check"  # never commits: its preview changes only when curation takes rows out


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    data = tmp_path_factory.mktemp("browser-demo") / "data"
    env = {"CLAWR1_DEMO_ENGINE_PORT": str(free_port()), "CLAWR1_DEMO_PROGRESS_S": "30"}
    with clawr1_up(data, env=env, args=["--demo"], stop_timeout=120) as live:
        yield live.url("api")


def _browser() -> tuple[object, object]:
    if shutil.which("chromium") is None and not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: `apt-get install -y chromium` as root (make install does it)")
    from playwright.sync_api import sync_playwright

    driver = sync_playwright().start()
    return driver, driver.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])


def test_the_dashboard_runs_the_loop_in_chromium(demo: str) -> None:
    driver, browser = _browser()
    try:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})  # type: ignore[attr-defined]
        problems: list[str] = []
        page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: problems.append(str(e)))
        page.goto(f"{demo}/dashboard")
        page.wait_for_selector("#live-status.live", timeout=30_000)

        # A pushed update arrives: the "updated" stamp changes without any click.
        stamp = "() => document.getElementById('updated').textContent"
        page.wait_for_function(f"({stamp})().length > 0", timeout=60_000)
        first = page.text_content("#updated")
        page.wait_for_function(f"(first) => ({stamp})() !== first", arg=first, timeout=60_000)

        # The trainer's preview through its preset: wait until whole groups are ready to take.
        page.fill("#preview-group", PREVIEW_GROUP)
        page.fill("#preview-preset", "demo-train")
        page.fill("#preview-groups", "2")
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline and not page.query_selector("#preview .preview-step"):
            page.click("#preview-form button[type=submit]")
            page.wait_for_timeout(3000)
        chosen = page.query_selector("#preview .preview-step") and page.text_content("#preview .preview-step")
        assert chosen, f"the preview never showed a batch: {page.text_content('#preview')}"
        page.evaluate("window.scrollTo(0, 0)")
        page.screenshot(path=str(DOCS / "dashboard.png"))
        page.locator("#preview-card").screenshot(path=str(DOCS / "dashboard-preview.png"))

        # Curate that row from its inspector: exclude it; the pushed updates refresh the preview.
        page.click("#preview .preview-step")
        page.wait_for_selector("#step-curate")
        page.wait_for_selector("#heat i")
        page.check("#step-exclude")
        page.fill("#step-note", "browser test: exclude")
        page.click("#step-curate")
        page.wait_for_function("() => document.getElementById('step-curate-result').textContent"
                               ".startsWith('curated 1')")
        page.screenshot(path=str(DOCS / "dashboard-inspector.png"))
        page.keyboard.press("Escape")
        page.wait_for_function(
            "(id) => ![...document.querySelectorAll('#preview .preview-step')]"
            ".some(e => e.textContent === id)",
            arg=chosen, timeout=120_000)

        # The prefix-tree view of the largest-savings scope.
        page.click("#scopes tbody tr")
        page.wait_for_selector("#ribbon i")
        page.wait_for_selector("#mask rect")
        assert "packed tokens" in page.text_content("#tree-body")
        page.screenshot(path=str(DOCS / "dashboard-tree.png"))

        # No table sticks out of its card.
        overflow = page.evaluate("""() => [...document.querySelectorAll('.card table')].filter(t => {
            const card = t.closest('.card').getBoundingClientRect();
            const wrap = t.parentElement.getBoundingClientRect();
            return wrap.right > card.right + 1 || wrap.left < card.left - 1; }).length""")
        assert overflow == 0
        assert problems == []
    finally:
        browser.close()  # type: ignore[attr-defined]
        driver.stop()  # type: ignore[attr-defined]
