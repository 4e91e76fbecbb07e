"""A gpu profile's cards a replica set through POST /api/v1/models/{name}/replicas (the model
card's form and `llmgw model replicas --gpus`): kept when not named, refused on a cpu profile."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from tests.llmgwd import test_api
from tests.llmgwd.test_api import MODEL, call

# test_api's fixtures: a catalog in memory behind /api/v1 on a Unix socket, as root calls it.
catalog, nodes, ctx, client = test_api.catalog, test_api.nodes, test_api.ctx, test_api.client

PATH = "/models/smol/replicas"


def profile(model: dict[str, Any], name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(p for p in model["profiles"] if p["name"] == name)
    return found


async def test_a_gpu_profile_s_cards_are_set_and_then_kept(client: aiohttp.ClientSession) -> None:
    assert (await call(client, "POST", "/models", MODEL))[0] == 201
    status, made = await call(client, "POST", PATH, {"profile": "gpu", "replicas": 1, "gpus": 2})
    assert status == 200
    assert (profile(made, "gpu")["kind"], profile(made, "gpu")["gpus"]) == ("gpu", 2)
    status, changed = await call(client, "POST", PATH, {"profile": "gpu", "replicas": 2, "gpus": 4})
    assert (status, profile(changed, "gpu")["gpus"], profile(changed, "gpu")["replicas"]) == (
        200,
        4,
        2,
    )
    status, kept = await call(client, "POST", PATH, {"profile": "gpu", "replicas": 3})
    assert (status, profile(kept, "gpu")["gpus"]) == (200, 4)
    status, new = await call(client, "POST", PATH, {"profile": "gpu-one", "replicas": 1})
    assert (status, profile(new, "gpu-one")["gpus"]) == (200, 1)


@pytest.mark.parametrize(
    "body",
    [
        {"profile": "cpu", "replicas": 1, "gpus": 2},  # a new cpu profile
        {"profile": "gpu", "replicas": 1, "gpus": 0},
        {"profile": "gpu", "replicas": 1, "gpus": 65},
        {"profile": "gpu", "replicas": 1, "gpus": "two"},
    ],
)
async def test_cards_where_there_are_none_or_out_of_bounds_are_400(
    client: aiohttp.ClientSession, body: dict[str, Any]
) -> None:
    assert (await call(client, "POST", "/models", MODEL))[0] == 201
    status, answer = await call(client, "POST", PATH, body)
    assert (status, answer["error"]["param"]) == (400, "gpus")


async def test_an_existing_cpu_profile_takes_no_cards(client: aiohttp.ClientSession) -> None:
    assert (await call(client, "POST", "/models", MODEL))[0] == 201
    assert (await call(client, "POST", PATH, {"profile": "cpu", "replicas": 1}))[0] == 200
    status, answer = await call(client, "POST", PATH, {"profile": "cpu", "replicas": 1, "gpus": 2})
    assert (status, answer["error"]["param"]) == (400, "gpus")
    assert "no cards" in answer["error"]["message"]
