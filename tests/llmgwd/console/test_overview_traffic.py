"""The overview's requests per second and errors: GET /api/v1/status's traffic, this control
plane's own figures over the last minute, read from the router's request counter."""

from __future__ import annotations

import re

import aiohttp
from prometheus_client import CollectorRegistry

from llmgwd.router.metrics import RouterMetrics
from llmgwd.router.rates import Rates
from tests.llmgwd.console.console_site import Browser, serving


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_the_overview_shows_this_plane_s_requests_and_errors_per_second() -> None:
    metrics, clock = RouterMetrics(CollectorRegistry(), lambda m: True), Clock()
    rates = Rates(metrics.requests, clock)
    async with serving(traffic=rates) as site:
        clock.now += 60
        for status_class, n in (("2xx", 150), ("4xx", 24), ("5xx", 6)):
            for _ in range(n):
                metrics.requests.labels("smol", "/v1/chat/completions", status_class).inc()
        headers = {"Authorization": f"Bearer {site.keys['admin']}"}
        async with (
            aiohttp.ClientSession() as s,
            s.get(site.url + "/api/v1/status", headers=headers) as r,
        ):
            traffic = (await r.json())["traffic"]
        assert traffic == {
            "scope": "this control plane", "plane": "llmgw", "window_s": 60.0,
            "requests_per_s": 3.0, "errors_4xx_per_s": 0.4, "errors_5xx_per_s": 0.1,
        }  # fmt: skip
        browser = Browser(site)
        await browser.sign_in("viewer")
        _, html = await browser.get("/console/")
        await browser.close()
    figures = {k: v for k, v in re.findall(r'<data class="(rps|e4xx|e5xx)" value="([^"]*)"', html)}
    assert figures == {"rps": "3.0", "e4xx": "0.4", "e5xx": "0.1"}
    assert "This control plane (llmgw), over the last 60.0 s" in html


async def test_a_plane_that_counts_no_requests_says_so() -> None:
    async with serving() as site:
        headers = {"Authorization": f"Bearer {site.keys['admin']}"}
        async with (
            aiohttp.ClientSession() as s,
            s.get(site.url + "/api/v1/status", headers=headers) as r,
        ):
            assert (await r.json())["traffic"] is None
        browser = Browser(site)
        await browser.sign_in("viewer")
        _, html = await browser.get("/console/")
        await browser.close()
    assert "Requests are not counted on this control plane" in html
