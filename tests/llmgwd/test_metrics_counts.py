"""/metrics as a client's traffic makes it: refusals by a key's rate limit and budget and
on-demand wake-ups counted, labels that stay bounded whatever model names and paths clients
send, and llmgwd's own /metrics on its local socket and its client port."""

from __future__ import annotations

import uuid
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from llmgw.config import ClientPort, ClusterPort, Metrics, ServerConfig
from llmgwd.catalog import Model
from llmgwd.daemon import Daemon
from llmgwd.router import Router
from tests.llmgwd.router.test_router_metering import Metered, m  # noqa: F401 (m: a fixture)
from tests.llmgwd.router.test_router_v1 import (  # noqa: F401 (engine: a fixture)
    CHAT,
    MODEL,
    USER_SECRET,
    FakeEngine,
    FakeKeys,
    FakeModels,
    FakePool,
    FakeWaker,
    endpoint,
    engine,
    on_demand_router,
    serve,
)
from tests.llmgwd.test_metrics import Labels, samples, value

HEADERS = {"Authorization": f"Bearer {USER_SECRET}"}


async def test_rate_limit_and_budget_refusals_are_counted_by_model_and_reason(
    m: Metered,  # noqa: F811
) -> None:
    m.keys.limit(tpm=10)  # smaller than any request
    assert (await m.gw.post("/v1/chat/completions", CHAT))[0] == 429
    m.keys.limit(budget_tokens=10)
    for _ in range(2):
        assert (await m.gw.post("/v1/chat/completions", CHAT))[0] == 429
    found = samples(m.gw.router.metrics.registry)
    assert value(found, "llmgw_refusals_total", model=MODEL, reason="rate_limit") == 1
    assert value(found, "llmgw_refusals_total", model=MODEL, reason="budget") == 2
    chat = "/v1/chat/completions"
    assert value(found, "llmgw_requests_total", model=MODEL, route=chat, status_class="4xx") == 3


@pytest.mark.parametrize(("start_s", "status", "result"), [(0.1, 200, "ready"),
                                                          (5.0, 503, "timeout")])  # fmt: skip
async def test_wake_ups_are_counted_with_their_wait(
    engine: FakeEngine,  # noqa: F811
    start_s: float,
    status: int,
    result: str,
) -> None:
    pool = FakePool()
    waker = FakeWaker(pool, engine.url, start_s=start_s)
    router = on_demand_router(pool, waker, timeout_s=0.5)
    async with serve(router) as url, aiohttp.ClientSession() as http:
        r = await http.post(f"{url}/v1/chat/completions", json=CHAT, headers=HEADERS)
        assert r.status == status
        r.release()
    found = samples(router.metrics.registry)
    assert value(found, "llmgw_wakeups_total", model=MODEL, result=result) == 1
    assert value(found, "llmgw_wakeup_wait_seconds_count", model=MODEL) == 1
    waited = value(found, "llmgw_wakeup_wait_seconds_sum", model=MODEL)
    assert waited >= min(start_s, 0.5) * 0.9


async def test_a_router_told_not_to_count_keeps_no_request_series(
    engine: FakeEngine,  # noqa: F811
) -> None:
    pool = FakePool({MODEL: [endpoint(engine.url)]}, {MODEL: 1})
    router = Router(FakeKeys(), FakeModels(MODEL), pool, count=False)  # request_metrics: false
    async with serve(router) as url, aiohttp.ClientSession() as http:
        r = await http.post(f"{url}/v1/chat/completions", json=CHAT, headers=HEADERS)
        assert r.status == 200
        r.release()
    assert samples(router.metrics.registry) == {}


async def strangers(gw: Metered, count: int) -> None:
    """count rounds of requests naming models and paths nobody knows."""
    for _ in range(count):
        name = f"model-{uuid.uuid4().hex}"
        await gw.gw.post("/v1/chat/completions", {**CHAT, "model": name})
        await gw.gw.post("/v1/embeddings", {"model": name, "input": "x"})
        for method, path in (("GET", f"/v1/models/{name}"), ("GET", f"/v1/{name}"),
                             ("POST", f"/v1/{name}/chat/completions")):  # fmt: skip
            async with gw.gw.http.request(method, f"{gw.gw.url}{path}", headers=HEADERS) as r:
                assert r.status == 404


async def test_model_names_and_paths_that_clients_make_up_add_no_series(
    m: Metered,  # noqa: F811
) -> None:
    await strangers(m, 1)
    before = set(samples(m.gw.router.metrics.registry))
    await strangers(m, 20)
    found = samples(m.gw.router.metrics.registry)
    assert set(found) == before
    assert not any("model-" in v for _, labels in found for _, v in labels)
    routes = {v for _, labels in found for k, v in labels if k == "route"}
    assert routes <= {"", "/v1/chat/completions", "/v1/embeddings", "/v1/models/{model}"}


def parse(text: str) -> dict[tuple[str, Labels], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def scrape(connector: aiohttp.BaseConnector, url: str) -> dict[tuple[str, Labels], float]:
    """GET url/metrics, as Prometheus reads it."""
    async with aiohttp.ClientSession(connector=connector) as http, http.get(f"{url}/metrics") as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain")
        return parse(await r.text())


async def test_llmgwd_serves_its_metrics_on_the_local_socket_and_to_a_loopback_peer(
    tmp_path: Path,
) -> None:
    config = ServerConfig(
        state_dir=str(tmp_path / "state"),
        socket=str(tmp_path / "llmgwd.sock"),
        client=ClientPort(listen="127.0.0.1:0"),
        cluster=ClusterPort(listen="127.0.0.1:0", advertise="https://127.0.0.1:17710"),
        metrics=Metrics(loopback_open=True),  # a loopback peer without a credential (2f4f451)
    )
    d = Daemon(config)
    await d.start()
    try:
        await d.catalog.add_model(Model(name="smol", source="file:/m.gguf", replicas=2))
        on_socket = await scrape(aiohttp.UnixConnector(path=config.socket), "http://llmgwd")
        port = d.client_runner.addresses[0][1]
        on_port = await scrape(aiohttp.TCPConnector(), f"http://127.0.0.1:{port}")
    finally:
        await d.stop()
    for found in (on_socket, on_port):
        # No node has joined: nothing placed, nothing ready, but the model has its series.
        assert value(found, "llmgw_replicas_wanted", model="smol") == 0
        assert value(found, "llmgw_replicas_ready", model="smol") == 0
        assert value(found, "llmgw_nodes", state="connected") == 0
        assert ("llmgw_scheduler_passes_total", ()) in found
