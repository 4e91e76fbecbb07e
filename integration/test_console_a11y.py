"""Every console page in a real browser (Debian's chromium driven by Playwright) at 1280 and 390
pixels wide, checked by npm's axe-core: no serious or critical violation, nothing wider than
the window, and a screenshot of each (kept in LLMGW_SCREENSHOTS=DIR too, for the README and the
man page). The pages are read from the console's own route table, so a page added later is
checked too; they are served over an in-memory store (no model needed) with recorded NVML
inventories on the nodes and a meter counted into."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp import web
from playwright.sync_api import Browser, Page

from integration import axe
from integration.conftest import _skip_or_fail
from llmgwd.accounting.usage import Usage
from llmgwd.api.access import key_auth
from llmgwd.api.base import ApiContext
from llmgwd.api.routes import api_subapp
from llmgwd.console import app as console
from tests.llmgwd.console.console_site import SECRET, Site, serving
from tests.llmgwd.console.test_gpu_map import recorded_nodes

WIDTHS = (1280, 390)
FILLED = {  # each page with path parameters, as visited: a new one goes here
    "/nodes/{name}": "/nodes/dgx",
    "/models/{name}": "/models/smol",
    "/org/{org}": "/org/acme",
}
NOT_FOUND = "/nodes/no-such-node"  # the error page, as a page of its own


@dataclass(frozen=True, slots=True)
class Served:
    """The site and the console's pages, each a path under /console."""

    site: Site
    pages: tuple[str, ...]


def page_paths(app: web.Application) -> tuple[str, ...]:
    """The GET pages of the console's app (its static files and the sign-in's aside), a page
    with path parameters as FILLED has it."""
    paths: list[str] = []
    for route in app.router.routes():
        resource = route.resource
        if route.method != "GET" or resource is None or isinstance(resource, web.StaticResource):
            continue
        path = re.sub(r"\{(\w+)[^}]*\}", r"{\1}", resource.canonical)  # its pattern aside
        if "{" in path:
            assert path in FILLED, f"the console page {path} needs a place in FILLED"
            path = FILLED[path]
        if not path.startswith("/login") and path not in paths:
            paths.append(path)
    return tuple(paths)


def _pages_of(site: Site) -> tuple[str, ...]:
    """The route table of a console made as the client port makes it."""
    ctx = ApiContext(catalog=site.catalog, nodes=site.nodes, mint_token=lambda: "t", join_url="")
    api = api_subapp(ctx, key_auth(site.catalog))
    return page_paths(console.console_app(console.make(api, site.catalog, SECRET, tls=False)))


def _metered(site: Site, usage: Usage) -> None:
    """Today's requests by the admin's and the viewer's keys over both models."""
    day = time.strftime("%Y-%m-%d", time.gmtime())
    for key, model, prompt, completion in (
        ("admin", "smol", 1200, 300),
        ("admin", "tiny", 400, 90),
        ("viewer", "smol", 80, 20),
    ):
        usage.add((day, site.key_ids[key], model), prompt, completion, 10**11)


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    """The site served from its own event loop in a thread, for as long as the module runs."""
    ready: list[Served] = []
    up = threading.Event()
    loop = asyncio.new_event_loop()
    down = asyncio.Event()

    async def run() -> None:
        usage = Usage(None)
        async with serving(usage=usage) as s:
            s.nodes.items = recorded_nodes()
            _metered(s, usage)
            ready.append(Served(s, _pages_of(s)))
            up.set()
            await down.wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(run(),), daemon=True)
    thread.start()
    assert up.wait(30), "the site did not start"
    yield ready[0]
    loop.call_soon_threadsafe(down.set)
    thread.join(30)
    loop.close()


@pytest.fixture(scope="module")
def axe_js() -> Path:
    script = axe.installed()
    if script is None:
        _skip_or_fail(axe.HOW)
        raise AssertionError("unreachable")
    return script


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Where each screenshot goes: the test's tmp dir, and LLMGW_SCREENSHOTS if set."""
    dirs = [tmp_path_factory.mktemp("console-screenshots")]
    if os.environ.get("LLMGW_SCREENSHOTS"):
        dirs.append(Path(os.environ["LLMGW_SCREENSHOTS"]))
        dirs[-1].mkdir(parents=True, exist_ok=True)
    return dirs


def _name(path: str) -> str:
    if path == NOT_FOUND:
        return "not-found"
    return path.strip("/").replace("/", "-") or "overview"


def _checked(page: Page, name: str, width: int, script: Path, shots: list[Path]) -> list[str]:
    """The page's screenshot taken, and what is wrong with it at this width."""
    page.wait_for_load_state("networkidle")
    page.wait_for_timeout(300)  # a chart's script draws once the page has loaded
    first = shots[0] / f"{name}-{width}.png"
    page.screenshot(path=first, full_page=True)
    for more in shots[1:]:
        shutil.copyfile(first, more / first.name)
    found = [f"{name} at {width} px: {v}" for v in axe.violations(page, script)]
    wide = page.evaluate("document.documentElement.scrollWidth")
    if wide > width:
        found.append(f"{name} is {wide} px wide in a window of {width} px")
    return found


@pytest.mark.parametrize("width", WIDTHS)
def test_every_page_is_accessible_and_fits_at(
    width: int, served: Served, browser: Browser, axe_js: Path, shots: list[Path]
) -> None:
    # bypass_csp: axe-core is a script injected into the page, which the console's policy
    # (script-src 'self') rightly refuses. Only this test's context bypasses the policy, to
    # run the checker; test_console.py and test_console_usage.py load the pages under it.
    context = browser.new_context(viewport={"width": width, "height": 900}, bypass_csp=True)
    page = context.new_page()
    page.set_default_timeout(20_000)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    site, found = served.site, []
    try:
        r = page.goto(site.url + "/console/login")
        assert r is not None and r.status == 200
        found += _checked(page, "login", width, axe_js, shots)
        page.get_by_label("API key").fill(site.keys["admin"])
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_url(site.url + "/console/")
        for path in (*served.pages, NOT_FOUND):
            r = page.goto(site.url + "/console" + path)
            assert r is not None and r.status == (404 if path == NOT_FOUND else 200), path
            if "<html" not in r.text():
                continue  # a part htmx fetches into its page, checked there
            found += _checked(page, _name(path), width, axe_js, shots)
    finally:
        context.close()
    print(f"{len(served.pages) + 2} pages at {width} px, screenshots in {shots[0]}")
    assert not errors, errors
    assert not found, "\n".join(found)


def test_the_pages_are_read_from_the_route_table(served: Served) -> None:
    for page in ("/", "/models", "/models/smol", "/nodes", "/nodes/dgx", "/gpus", "/usage"):
        assert page in served.pages, served.pages
