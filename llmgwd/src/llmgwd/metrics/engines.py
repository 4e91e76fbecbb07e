"""The engines' own metrics (llama-server --metrics, vLLM's /metrics), relayed by llmgwd at
GET /metrics/engines with `model`, `node` and `replica` labels added, and a colon in a name
made an underscore (`llamacpp:prompt_tokens_total` is `llamacpp_prompt_tokens_total`:
Prometheus keeps colons for recording rules, and promtool refuses them).

Relayed rather than listed for Prometheus' service discovery: an engine's port is open to
the control planes only, and it wants the engine's key, which never leaves the cluster; one
scrape of llmgwd reads every ready replica at once (each within ENGINE_TIMEOUT_S; one that
does not answer is left out and counted in llmgw_engine_scrape_failures)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Iterator

import aiohttp
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from llmgwd.nodes.pool import Endpoint, Pool

ENGINE_TIMEOUT_S = 5.0
Names = Callable[[], Iterable[str]]  # the catalog's model names
_ADDED = ("model", "node", "replica")


class _Families(Collector):
    """Families already gathered, for generate_latest."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        """The families as gathered."""
        return iter(self._families)


class EngineRelay:
    """Reads the ready replicas' /metrics with their keys and merges them, labelled."""

    def __init__(self, models: Names, pool: Pool) -> None:
        self._models, self._pool = models, pool
        self._session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        """Close the session to the engines."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def render(self) -> bytes:
        """Every ready replica's metrics, each family once, in Prometheus' text format."""
        if self._session is None:
            timeout = aiohttp.ClientTimeout(total=ENGINE_TIMEOUT_S)
            self._session = aiohttp.ClientSession(timeout=timeout)
        replicas = [e for name in self._models() for e in self._pool.ready(name)]
        texts = await asyncio.gather(*(self._fetch(e) for e in replicas))
        failed = GaugeMetricFamily(
            "llmgw_engine_scrape_failures",
            "Ready replicas whose /metrics did not answer in this scrape.",
            labels=["model"],
        )
        families: dict[str, Metric] = {}
        fails: dict[str, int] = {}
        for endpoint, text in zip(replicas, texts, strict=True):
            if text is None:
                fails[endpoint.model] = fails.get(endpoint.model, 0) + 1
                continue
            merge(families, text, endpoint)
        for model, n in sorted(fails.items()):
            failed.add_metric([model], n)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Families([*families.values(), failed]))
        return generate_latest(registry)

    async def _fetch(self, endpoint: Endpoint) -> str | None:
        assert self._session is not None
        headers = {"Authorization": f"Bearer {endpoint.api_key}"}
        try:
            async with self._session.get(f"{endpoint.url}/metrics", headers=headers) as r:
                if r.status != 200:
                    return None
                return await r.text()
        except (aiohttp.ClientError, TimeoutError, UnicodeDecodeError):
            return None


def merge(families: dict[str, Metric], text: str, endpoint: Endpoint) -> None:
    """text's families into families, each sample labelled with the replica it came from
    (a text that does not parse is left out whole)."""
    added = dict(zip(_ADDED, (endpoint.model, endpoint.node, endpoint.replica_id), strict=True))
    try:
        parsed = list(text_string_to_metric_families(text))
    except ValueError:
        return
    for family in parsed:
        name = family.name.replace(":", "_")
        into = families.get(name)
        if into is None:
            into = families[name] = Metric(name, family.documentation, family.type, family.unit)
        if into.type != family.type:
            continue
        for s in family.samples:
            labels = {**s.labels, **added}
            into.add_sample(s.name.replace(":", "_"), labels, s.value, s.timestamp)
