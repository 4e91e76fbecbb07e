"""/metrics: the router's counts as a client's traffic made them, the GPUs of the recorded
NVML answers (MIG included), the cluster's state, and who may scrape."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

from llmgw.wire import ReplicaStatus
from llmgwd.metrics import endpoint
from llmgwd.metrics.cluster import ClusterCollector
from llmgwd.metrics.gpus import GpuCollector
from llmgwd.metrics.scrape import Fixed, Scraper
from llmgwd.nodes.state import NodeInfo
from llmgwd.store.sqlite import SqliteStore
from tests.llmgw_agentd.nvml_inventory import load, recorded
from tests.llmgwd.router.test_router_slots import HEADERS, body, gateway, replica
from tests.llmgwd.router.test_router_v1 import MODEL, STREAM_PROMPT_TOKENS, FakeEngine, running

Labels = tuple[tuple[str, str], ...]


def samples(registry: CollectorRegistry) -> dict[tuple[str, Labels], float]:
    """Every sample of the registry's exposition, as Prometheus parses it."""
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(found: dict[tuple[str, Labels], float], name: str, **labels: str) -> float:
    return found[(name, tuple(sorted(labels.items())))]


async def test_the_router_counts_requests_tokens_and_first_tokens_as_sent() -> None:
    engine = FakeEngine(chunks=3, gap_s=0.0)
    async with running(engine), gateway([replica(engine, "r1")]) as (url, router, http):
        for stream in (False, False, True):
            ask = {**body("hi"), "stream": stream}
            async with http.post(f"{url}/v1/chat/completions", json=ask, headers=HEADERS) as r:
                assert r.status == 200
                await r.read()
        nowhere = {**body("hi"), "model": "no-such-model-123"}
        async with http.post(f"{url}/v1/chat/completions", json=nowhere, headers=HEADERS) as r:
            assert r.status == 404
        found = samples(router.metrics.registry)
    chat = "/v1/chat/completions"
    ok = value(found, "llmgw_requests_total", model=MODEL, route=chat, status_class="2xx")
    assert ok == 3
    # A model not in the catalog is no label of its own: the names a client sends are unbounded.
    assert value(found, "llmgw_requests_total", model="", route=chat, status_class="4xx") == 1
    assert not any("no-such-model" in str(labels) for _, labels in found)
    # Three answers of 7 prompt and 3 completion tokens: the two whole ones are the engine's
    # streams folded (router/folding.py), as the one streamed.
    assert (
        value(found, "llmgw_tokens_total", model=MODEL, direction="in") == 3 * STREAM_PROMPT_TOKENS
    )
    assert value(found, "llmgw_tokens_total", model=MODEL, direction="out") == 3 * 3
    assert value(found, "llmgw_first_token_seconds_count", model=MODEL) == 1
    assert value(found, "llmgw_request_duration_seconds_count", model=MODEL) == 3


def test_each_card_and_each_mig_instance_of_the_recorded_nvml_answers_is_a_series() -> None:
    dgx, mig = recorded(load("dgx-h100-8x80gb")), recorded(load("a100-80gb-mig"))
    nodes = [node("dgx", dgx), node("a100", mig)]
    registry = CollectorRegistry()
    registry.register(GpuCollector(lambda: nodes))
    found = samples(registry)
    for gpu in dgx.gpus:
        card = {"node": "dgx", "gpu": str(gpu.index)}
        total = value(found, "llmgw_gpu_memory_total_bytes", **card)
        assert total == gpu.memory_total_bytes > 0
        used = value(found, "llmgw_gpu_memory_used_bytes", **card)
        assert used == gpu.memory_total_bytes - gpu.memory_free_bytes
        assert gpu.power_limit_mw is not None
        assert value(found, "llmgw_gpu_power_limit_watts", **card) == gpu.power_limit_mw / 1000
        if gpu.utilization_percent is not None:
            assert value(found, "llmgw_gpu_busy_ratio", **card) == gpu.utilization_percent / 100
    instances = [(g, i) for g in mig.gpus for i in g.instances]
    assert instances  # the recording has MIG instances
    for gpu, inst in instances:
        labels = {"node": "a100", "gpu": str(gpu.index), "instance": inst.uuid,
                  "profile": inst.profile}  # fmt: skip
        assert value(found, "llmgw_mig_memory_total_bytes", **labels) == inst.memory_total_bytes
        # The instance's series carry its own memory, never its card's.
        assert inst.memory_total_bytes < gpu.memory_total_bytes
    mig_rows = [k for k in found if k[0] == "llmgw_mig_memory_total_bytes"]
    assert len(mig_rows) == len(instances)


def node(name: str, inventory: Any, **kw: Any) -> NodeInfo:
    fields: dict[str, Any] = {"address": "10.0.0.1", "version": "1", "inventory": inventory,
                              "replicas": (), "desired": None, "connected": True,
                              "last_seen": 0.0}  # fmt: skip
    return NodeInfo(name=name, **{**fields, **kw})


class Pool:
    def ready(self, model: str) -> list[Any]:
        return [object()] if model == "m" else []

    def wanted(self, model: str) -> int:
        return 2


def test_the_cluster_series_say_nodes_by_state_and_replicas_by_model() -> None:
    inv = recorded(load("rtx4090-8x24gb"))
    replicas = (ReplicaStatus("r1", "m", "ready", restarts=2), ReplicaStatus("r2", "m", "failed"))
    nodes = [node("a", inv, replicas=replicas), node("b", inv, connected=False, silent_s=5.0),
             node("c", inv, connected=False, silent_s=500.0)]  # fmt: skip
    registry = CollectorRegistry()
    registry.register(ClusterCollector(lambda: ["m", "n"], Pool(), lambda: nodes,
                                       lambda m: 4 if m == "m" else 0, 60.0,
                                       lambda: (3, 0.25)))  # fmt: skip
    found = samples(registry)
    assert [
        value(found, "llmgw_nodes", state=s) for s in ("connected", "disconnected", "lost")
    ] == [1, 1, 1]
    assert value(found, "llmgw_replicas_wanted", model="m") == 2
    assert value(found, "llmgw_replicas_ready", model="m") == 1
    assert value(found, "llmgw_replicas_ready", model="n") == 0
    assert value(found, "llmgw_requests_waiting", model="m") == 4
    assert value(found, "llmgw_replicas", model="m", state="failed") == 1
    # r1's two restarts came before llmgwd first heard from node a: not counted (a true
    # counter starts at 0 with llmgwd; tests/llmgwd/test_metrics_names.py counts restarts).
    assert value(found, "llmgw_engine_restarts_total", model="m") == 0
    assert value(found, "llmgw_scheduler_passes_total") == 3
    assert value(found, "llmgw_scheduler_pass_seconds_total") == 0.25


@pytest.mark.parametrize(
    ("remote", "allowed"),
    [("127.0.0.1", True), ("::1", True), ("::ffff:127.0.0.1", True), ("10.1.2.3", False),
     ("", False), (None, False)],
)  # fmt: skip
def test_only_loopback_peers_scrape_without_a_key(remote: str | None, allowed: bool) -> None:
    assert endpoint.loopback(remote) is allowed


class Keys:
    def authenticate(self, secret: str) -> Any:
        return None


async def test_a_scrape_from_elsewhere_without_a_staff_key_is_refused() -> None:
    store = await SqliteStore.open(":memory:")
    handler = endpoint.client_handler(endpoint.of(CollectorRegistry()), Keys(), store, True)
    for secret in ("nope", "metrics-llmgw-nope"):
        request = make_mocked_request(
            "GET", "/metrics", headers={"Authorization": f"Bearer {secret}"}
        )
        answer = await handler(request)  # a mocked request has no loopback peer
        assert answer.status == 401
        assert isinstance(answer, web.Response) and answer.body is not None
        assert secret.encode() not in bytes(answer.body)  # type: ignore[arg-type]
    await store.close()


# What llama-server --metrics answers (its format: `llamacpp:` names, HELP and TYPE each).
LLAMA_METRICS = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total {prompt}
# HELP llamacpp:tokens_predicted_total Number of generation tokens processed.
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 5
# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 1
"""


PROMPT = web.AppKey("prompt", int)


class EnginePool:
    def __init__(self, endpoints: list[Any]) -> None:
        self._endpoints = endpoints

    def ready(self, model: str) -> list[Any]:
        return [e for e in self._endpoints if e.model == model]

    def wanted(self, model: str) -> int:
        return len(self.ready(model))


async def test_the_engines_metrics_are_relayed_once_each_family_with_their_replica() -> None:
    from aiohttp.test_utils import TestServer

    from llmgwd.metrics.engines import EngineRelay
    from llmgwd.nodes.pool import Endpoint

    async def serve(request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != "Bearer engine-key":
            return web.Response(status=401)
        prompt = request.app[PROMPT]
        return web.Response(text=LLAMA_METRICS.format(prompt=prompt))

    servers = []
    for prompt in (11, 22):
        app = web.Application()
        app[PROMPT] = prompt
        app.router.add_get("/metrics", serve)
        servers.append(TestServer(app))
    for s in servers:
        await s.start_server()
    try:
        urls = [str(s.make_url("")).rstrip("/") for s in servers]
        endpoints = [Endpoint("r1", "m", "n1", urls[0], "engine-key"),
                     Endpoint("r2", "m", "n2", urls[1], "engine-key"),
                     Endpoint("r3", "m", "n3", urls[1], "wrong-key")]  # fmt: skip
        relay = EngineRelay(lambda: ["m"], EnginePool(endpoints))
        text = (await relay.render()).decode()
        await relay.close()
    finally:
        for s in servers:
            await s.close()
    assert text.count("# TYPE llamacpp_prompt_tokens_total counter") == 1
    found = {(s.name, tuple(sorted(s.labels.items()))): s.value
             for f in text_string_to_metric_families(text) for s in f.samples}  # fmt: skip
    for rid, node_name, prompt in (("r1", "n1", 11), ("r2", "n2", 22)):
        labels = {"model": "m", "node": node_name, "replica": rid}
        assert value(found, "llamacpp_prompt_tokens_total", **labels) == prompt
    assert value(found, "llmgw_engine_scrape_failures", model="m") == 1  # r3's key is refused
    assert "engine-key" not in text


class Recorder:
    """State that notes which thread read it and which built its series."""

    def __init__(self) -> None:
        self.read_in: list[int] = []
        self.built_in: list[int] = []

    def snapshot(self) -> Fixed[int]:
        self.read_in.append(threading.get_ident())
        return Fixed(self.families, len(self.read_in))

    def families(self, reads: int) -> Iterator[Metric]:
        self.built_in.append(threading.get_ident())
        time.sleep(0.05)  # long enough for the other scrapes to arrive meanwhile
        yield GaugeMetricFamily("llmgw_test_reads", "Reads of the state.", value=reads)


async def test_a_scrape_reads_state_on_the_loop_and_builds_the_series_in_a_thread() -> None:
    state = Recorder()
    scraper = Scraper(CollectorRegistry(), [state])
    texts = await asyncio.gather(*(scraper.render() for _ in range(3)))
    loop_thread = threading.get_ident()
    assert state.read_in == [loop_thread]  # three scrapes at once: one read, one render
    assert state.built_in and loop_thread not in state.built_in
    assert all(b"llmgw_test_reads 1.0" in text for text in texts)
    assert b"llmgw_test_reads 2.0" in await scraper.render()  # the next scrape reads anew
