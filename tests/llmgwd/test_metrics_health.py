"""The series the slow alerts read, scraped from an llmgwd in-process: each budget's use
against its limit at every level that has one, the store's quorum, and when each certificate
llmgwd serves or uses expires (a renewed file shows at the next scrape)."""

from __future__ import annotations

import ssl
import time
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from llmgw import pki
from llmgw.config import Metrics
from llmgwd.accounting import levels
from llmgwd.accounting.levels import LevelLimits
from llmgwd.accounting.periods import day_id
from llmgwd.accounting.pricing import to_pico
from llmgwd.catalog import KeyLimits, KeyOwner
from llmgwd.metrics.certificates import Certificates
from llmgwd.metrics.store_health import StoreHealth, families
from llmgwd.planes.listing import Member
from tests.llmgwd.test_clientport import llmgwd, tls_files

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
OPEN = Metrics(loopback_open=True)


async def scrape(url: str, trust: ssl.SSLContext | None = None) -> Samples:
    """Every sample of /metrics, by name and labels."""
    async with aiohttp.ClientSession() as s, s.get(url + "/metrics", ssl=trust or False) as r:
        assert r.status == 200
        text = await r.text()
    return {(x.name, frozenset(x.labels.items())): x.value
            for f in text_string_to_metric_families(text) for x in f.samples}  # fmt: skip


def of(samples: Samples, metric: str, /, **labels: str) -> float | None:
    """The value of the sample of that name whose labels include these, None if none."""
    found = [v for (n, ls), v in samples.items() if n == metric and set(labels.items()) <= ls]
    assert len(found) <= 1, (metric, labels)
    return found[0] if found else None


async def test_each_budget_shows_its_use_and_limit_at_its_level(tmp_path: Path) -> None:
    async with llmgwd(tmp_path, OPEN) as port:
        d = port.daemon
        day_limit = KeyLimits(budget_tokens=1000, budget_tokens_per="day")
        key, _ = await d.catalog.create_key("k", "user", day_limit, KeyOwner(user="u1", org="acme"))
        await d.catalog.create_key("free", "user", owner=KeyOwner(user="u1", org="acme"))
        money = KeyLimits(budget_spend=20.0, budget_spend_per="month")
        await levels.change(d.store, "org:acme", LevelLimits(limits=money))
        await d.catalog.load()  # the watch would bring them in a moment; a reload, now
        today = day_id(time.time())
        d.usage.add((today, key.id, "m"), 600, 300, to_pico(4.5))
        await d.health.budgets.refresh()
        # not stored yet
        assert of(await scrape(port.url), "llmgw_budget_tokens_used", name=key.id) == 0
        await d.usage.flush()
        await d.health.budgets.refresh()
        samples = await scrape(port.url)
    tokens = {"level": "key", "name": key.id, "period": "day"}
    assert of(samples, "llmgw_budget_tokens_limit", **tokens) == 1000
    assert of(samples, "llmgw_budget_tokens_used", **tokens) == 900
    spend = {"level": "org", "name": "acme", "period": "month"}
    assert of(samples, "llmgw_budget_spend_currency_units_limit", **spend) == 20.0
    assert of(samples, "llmgw_budget_spend_currency_units_used", **spend) == pytest.approx(4.5)
    # A key with no budget, and the levels without one (the user's), have no series; a
    # budget is in the series of its own unit only.
    limits = {(n, dict(ls)["name"]) for (n, ls) in samples if n.endswith("_limit")}
    assert {(n, name) for n, name in limits if n.startswith("llmgw_budget_")} == {
        ("llmgw_budget_tokens_limit", key.id),
        ("llmgw_budget_spend_currency_units_limit", "acme")}  # fmt: skip


async def test_sqlite_is_one_healthy_member_with_its_quorum(tmp_path: Path) -> None:
    async with llmgwd(tmp_path, OPEN) as port:
        samples = await scrape(port.url)
    assert of(samples, "llmgw_store_quorum", backend="sqlite") == 1
    assert of(samples, "llmgw_store_voters", backend="sqlite") == 1
    assert of(samples, "llmgw_store_voters_healthy", backend="sqlite") == 1


class Etcd:
    """An etcd cluster of three voters and a learner, whose health a test sets."""

    def __init__(self) -> None:
        self.members_list = [Member(i, f"gw{i}", [f"https://gw{i}:7721"]) for i in (1, 2, 3)]
        self.members_list.append(Member(4, "gw4", ["https://gw4:7721"], learner=True))
        self.up = {1: True, 2: True, 3: True, 4: True}
        self.answers = True

    async def members(self) -> list[Member]:
        if not self.answers:
            raise TimeoutError
        return self.members_list

    async def add(self, peer_url: str) -> list[Member]:
        raise NotImplementedError

    async def promote(self, member_id: int) -> bool:
        raise NotImplementedError

    async def remove(self, member_id: int) -> None:
        raise NotImplementedError

    async def healthy(self) -> dict[int, bool]:
        return self.up


def _values(health: StoreHealth) -> dict[str, float]:
    return {s.name: s.value for f in families(health.health) for s in f.samples}


async def test_etcd_has_its_quorum_while_a_majority_of_its_voters_is_healthy() -> None:
    etcd = Etcd()
    health = StoreHealth(etcd)
    assert _values(health)["llmgw_store_quorum"] == 0  # not checked yet: not known to have one
    await health.check()
    every = {"llmgw_store_quorum": 1, "llmgw_store_voters": 3, "llmgw_store_voters_healthy": 3,
             "llmgw_store_learners": 1}  # fmt: skip
    assert _values(health) == every
    etcd.up[3] = etcd.up[4] = False  # a voter and the learner down: two of three
    await health.check()
    assert _values(health)["llmgw_store_quorum"] == 1
    assert _values(health)["llmgw_store_voters_healthy"] == 2
    etcd.up[2] = False  # one of three
    await health.check()
    assert _values(health)["llmgw_store_quorum"] == 0
    assert _values(health)["llmgw_store_voters_healthy"] == 1
    etcd.up = {1: True, 2: True, 3: True}
    etcd.answers = False  # every member healthy as seen, but a linearizable read fails
    await health.check()
    assert _values(health)["llmgw_store_quorum"] == 0
    assert _values(health)["llmgw_store_voters"] == 3  # the members as last listed


async def test_the_certificates_served_show_when_they_expire(tmp_path: Path) -> None:
    tls, trust = tls_files(tmp_path)
    async with llmgwd(tmp_path, OPEN, **tls) as port:
        samples = await scrape(port.url.replace("http:", "https:"), trust)
        state = Path(port.daemon.config.state_dir) / "pki"
    expected = {"ca": state / "ca.pem", "cluster": state / "server.pem",
                "client": Path(tls["tls_cert"])}  # fmt: skip
    for cert, path in expected.items():
        expiry = pki.validity(path.read_bytes())[1].timestamp()
        name = "llmgw_certificate_expiry_timestamp_seconds"
        assert of(samples, name, cert=cert, path=str(path)) == expiry, cert
    assert {dict(ls)["cert"] for (n, ls) in samples if n == name} == set(expected)  # no etcd


def test_a_renewed_certificate_shows_its_new_expiry_and_a_missing_one_none(
    tmp_path: Path,
) -> None:
    ca = pki.make_ca()
    cert, key = tmp_path / "c.pem", tmp_path / "c.key"
    pki.write_pair(pki.make_server_cert(ca, days=10), cert, key)
    certs = Certificates({"client": cert, "ca": tmp_path / "gone.pem"})
    first = certs.expiry("client")
    assert first == pki.validity(cert.read_bytes())[1].timestamp()
    pki.write_pair(pki.make_server_cert(ca, days=90), cert, key)  # an ACME-like renewal
    assert certs.expiry("client") == pytest.approx(first + 80 * 86400, abs=5)
    assert certs.expiry("ca") is None
    labels = [s.labels["cert"] for f in certs.collect() for s in f.samples]
    assert labels == ["client"]
