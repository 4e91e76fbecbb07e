"""The console's usage page in a real browser (Debian's chromium driven by Playwright) against
/api/v1 and the console over an in-memory store and a meter counted into by the test: the
charts drawn from the table by the static script within the Content-Security-Policy, the form
choosing the grouping, an organization's admin offered their organization only, and the page
at 1280 and 390 pixels wide."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Page

from tests.llmgwd.console.console_site import Site
from tests.llmgwd.console.test_usage_page import SINCE, serving

WIDTHS = (1280, 390)


@pytest.fixture(scope="module")
def site() -> Iterator[Site]:
    """The site served from its own event loop in a thread, for as long as the module runs."""
    ready: list[Site] = []
    up = threading.Event()
    loop = asyncio.new_event_loop()
    down = asyncio.Event()

    async def run() -> None:
        async with serving() as (s, _usage):
            ready.append(s)
            up.set()
            await down.wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(run(),), daemon=True)
    thread.start()
    assert up.wait(30), "the site did not start"
    yield ready[0]
    loop.call_soon_threadsafe(down.set)
    thread.join(30)
    loop.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    p = context.new_page()
    p.set_default_timeout(20_000)
    problems: list[str] = []
    p.on("console", lambda m: problems.append(m.text) if "Content Security" in m.text else None)
    p.on("pageerror", lambda e: problems.append(str(e)))
    yield p
    context.close()
    assert not problems, problems  # no script error, nothing the policy refused


def sign_in(page: Page, site: Site, who: str) -> None:
    page.goto(site.url + "/console/login")
    page.get_by_label("API key").fill(site.keys[who])
    page.get_by_role("button", name="Sign in").click()
    home = "/console/org/acme" if who == "ada" else "/console/"  # an org admin's: their org's
    page.wait_for_url(site.url + home)


def charts(page: Page) -> list[int]:
    """The width of each chart's canvas (in CSS pixels), once the script has drawn them."""
    page.wait_for_selector("#usage-charts:not([hidden]) .chart canvas")
    widths: list[int] = page.eval_on_selector_all(
        "#usage-charts .chart canvas", "cs => cs.map(c => c.getBoundingClientRect().width)"
    )
    return widths


def test_the_charts_draw_the_table_at_each_width(
    site: Site, page: Page, tmp_path_factory: pytest.TempPathFactory
) -> None:
    shots = tmp_path_factory.mktemp("console-usage-screenshots")
    sign_in(page, site, "admin")
    page.goto(f"{site.url}/console/usage?by=model&since={SINCE}")
    assert len(charts(page)) == 3  # tokens, requests, spend
    assert page.locator("#usage-table tbody tr").count() == 2  # smol, tiny
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        page.wait_for_timeout(400)  # the script's resize waits 150 ms
        assert all(w <= width for w in charts(page)), width
        overflow = page.evaluate("document.documentElement.scrollWidth")
        assert overflow <= width, f"the usage page is {overflow} px wide at {width}"
        page.screenshot(path=shots / f"usage-{width}.png", full_page=True)
    print(f"screenshots in {shots}")


def test_the_form_chooses_the_grouping(site: Site, page: Page) -> None:
    sign_in(page, site, "vic")
    page.goto(f"{site.url}/console/usage?since={SINCE}")
    assert page.get_by_label("Organization", exact=True).count() == 1  # every one, or one
    page.get_by_label("Group by", exact=True).select_option("project")
    page.get_by_role("button", name="Show").click()
    page.wait_for_url("**by=project**")
    rows = page.locator("#usage-table tbody tr").evaluate_all("rs => rs.map(r => r.dataset.group)")
    assert rows == ["acme/app", "acme/web", "beta/lab"]
    assert len(charts(page)) == 3


def test_an_org_admin_is_offered_their_organization_only(site: Site, page: Page) -> None:
    sign_in(page, site, "ada")
    page.get_by_role("navigation", name="Console").get_by_role("link", name="Usage").click()
    page.wait_for_url("**/console/usage")
    assert page.get_by_label("Organization", exact=True).count() == 0  # one choice: no list
    page.goto(f"{site.url}/console/usage?by=org&since={SINCE}")
    groups = page.locator("#usage-table tbody tr").evaluate_all(
        "rs => rs.map(r => r.dataset.group)"
    )
    assert groups == ["acme"]
    assert len(charts(page)) == 3
