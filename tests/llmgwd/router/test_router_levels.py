"""Limits and budgets at every level (key, user, organization, team, project) through the /v1
router, against the fake engine: 50 racing requests from keys of several users and projects
never overspend any level, and a model outside an organization's list is OpenAI's 404."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import msgspec
import pytest

from llmgwd.accounting.levels import (
    LEVELS,
    LevelLimits,
    Levels,
    org_level,
    project_level,
    team_level,
)
from llmgwd.accounting.levels import user_level as user_lv
from llmgwd.accounting.periods import day_id
from llmgwd.accounting.pricing import cost
from llmgwd.catalog import ApiKey, KeyLimits
from llmgwd.people.directory import PROJECTS
from llmgwd.people.records import Project
from llmgwd.router import Balancer, Router
from llmgwd.router.metering import Meter
from tests.llmgwd.router.test_router_metering import FREE, PricedModels, reserved
from tests.llmgwd.router.test_router_v1 import (  # noqa: F401 (engine: a fixture)
    CHAT,
    MODEL,
    FakeEngine,
    FakePool,
    Gateway,
    assert_error_shape,
    endpoint,
    engine,
    serve,
)

RACERS = 50
# Six keys: three users, two projects in team ml and one outside it, all in acme.
KEYS = {
    f"sk-llmgw-{i}": ApiKey(
        id=f"k{i}", name=f"k{i}", hash="", prefix="", user=user, org="acme", project=project
    )
    for i, (user, project) in enumerate(
        [
            ("ann", "chat"),
            ("ann", "ops"),
            ("bob", "chat"),
            ("bob", "search"),
            ("cy", "ops"),
            ("cy", "search"),
        ]
    )
}


class Keys:
    def authenticate(self, secret: str) -> ApiKey | None:
        return KEYS.get(secret)


@dataclass
class Levelled:
    gw: Gateway
    meter: Meter
    levels: Levels

    def put(self, level: str, models: list[str] | None = None, **limits: Any) -> None:
        record = LevelLimits(limits=KeyLimits(**limits), models=models or [])
        self.levels.apply(LEVELS + level, msgspec.json.encode(record))


@pytest.fixture
async def lv(engine: FakeEngine) -> AsyncIterator[Levelled]:  # noqa: F811
    levels = Levels()
    for name, team in (("chat", "ml"), ("search", "ml"), ("ops", "")):
        project = Project(org="acme", name=name, team=team)
        levels.apply(f"{PROJECTS}acme/{name}", msgspec.json.encode(project))
    models = (MODEL, FREE)
    pool = FakePool({n: [endpoint(engine.url, n)] for n in models}, dict.fromkeys(models, 1))
    meter = Meter(levels=levels)
    balancer = Balancer(pool, slots=RACERS)
    router = Router(
        Keys(), PricedModels(), pool, max_body_bytes=64 * 1024, meter=meter, balancer=balancer
    )
    async with serve(router) as url, aiohttp.ClientSession() as http:
        yield Levelled(Gateway(url, engine, pool, router, http), meter, levels)


async def race(lv: Levelled, body: dict[str, Any]) -> list[tuple[str, int]]:
    """RACERS requests at once over the six keys, every answer held until each request was
    refused or reached the engine; (key id, status) of each."""
    lv.gw.engine.gate = asyncio.Event()
    secrets = [list(KEYS)[i % len(KEYS)] for i in range(RACERS)]
    tasks = [asyncio.create_task(lv.gw.post("/v1/chat/completions", body, key=s)) for s in secrets]
    while sum(t.done() for t in tasks) + len(lv.gw.engine.seen) < RACERS:
        await asyncio.wait([t for t in tasks if not t.done()], timeout=0.01)
    lv.gw.engine.gate.set()
    answers = await asyncio.gather(*tasks)
    return [(KEYS[s].id, status) for s, (status, _, _) in zip(secrets, answers, strict=True)]


async def test_racing_requests_never_overspend_any_level(lv: Levelled) -> None:
    body = {**CHAT, "max_tokens": 10}
    need = reserved(body)
    most = cost(PricedModels().models[MODEL], need - 10, 10)
    budgets = {  # in requests' worth; the org's the loosest, ann's the strictest
        org_level("acme"): 30,
        team_level("acme", "ml"): 20,
        project_level("acme", "chat"): 9,
        user_lv("ann"): 6,
    }
    for level, n in budgets.items():
        lv.put(
            level, budget_tokens=need * n + need // 2, budget_spend=(most * n + most // 2) / 1e12
        )
    answers = await race(lv, body)
    ok = Counter(key for key, status in answers if status == 200)
    assert set(Counter(s for _, s in answers)) == {200, 429}
    day = day_id(time.time())
    of = {  # the keys under each level
        org_level("acme"): set(ok),
        team_level("acme", "ml"): {"k0", "k2", "k3", "k5"},
        project_level("acme", "chat"): {"k0", "k2"},
        user_lv("ann"): {"k0", "k1"},
    }
    for level, n in budgets.items():
        admitted = sum(ok[k] for k in of[level])
        assert admitted <= n, level
        tokens, picos = lv.meter.budgets.used(level, day)
        assert tokens <= need * n + need // 2 and picos <= most * n + most // 2
    assert sum(ok.values()) == len(lv.gw.engine.seen)
    # The strictest binds: ann got her 6, chat its 9, and the org was never the limit.
    assert ok["k0"] + ok["k1"] == 6 and ok["k0"] + ok["k2"] == 9


async def test_racing_requests_never_pass_a_levels_rate(lv: Levelled) -> None:
    lv.put(team_level("acme", "ml"), rpm=11)
    lv.put(org_level("acme"), rpm=17)
    answers = await race(lv, CHAT)
    ok = Counter(key for key, status in answers if status == 200)
    assert ok["k0"] + ok["k2"] + ok["k3"] + ok["k5"] == 11  # the team's
    assert sum(ok.values()) == 17  # the org's: k1 and k4 (ops) took the other 6


async def test_a_model_outside_the_organizations_list_is_openais_404(lv: Levelled) -> None:
    lv.put(org_level("acme"), models=[FREE])
    status, answer, _ = await lv.gw.post("/v1/chat/completions", CHAT, key="sk-llmgw-0")
    assert status == 404
    assert_error_shape(answer, "model_not_found", "model")
    assert answer["error"]["message"] == f"The model '{MODEL}' does not exist."
    status, _, _ = await lv.gw.post(
        "/v1/chat/completions", {**CHAT, "model": FREE}, key="sk-llmgw-0"
    )
    assert status == 200
    assert not [s for s in lv.gw.engine.seen if s.body["model"] == MODEL]


async def test_v1_models_lists_only_what_the_organization_allows(lv: Levelled) -> None:
    lv.put(org_level("acme"), models=[FREE])
    async with lv.gw.openai(key="sk-llmgw-0") as client:
        assert [m.id async for m in client.models.list()] == [FREE]
    async with lv.gw.http.get(
        f"{lv.gw.url}/v1/models/{MODEL}", headers={"Authorization": "Bearer sk-llmgw-0"}
    ) as resp:
        assert resp.status == 404
        assert_error_shape(await resp.json(), "model_not_found", "model")
