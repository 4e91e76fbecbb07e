"""client.cache_isolation: what the router tells a llama.cpp engine about its slots (id_slot,
cache_prompt) and a vLLM engine about its prefix cache (cache_salt), per organization or key."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import msgspec
import pytest

from llmgwd.catalog import ApiKey, hash_secret
from llmgwd.placement.profiles import Profile
from llmgwd.router import Router, prefix
from llmgwd.router.isolation import CacheIsolation, Mode, Ticket
from tests.llmgwd.router import test_router_v1 as v1
from tests.llmgwd.router.test_router_v1 import FakeEngine, FakeModels, FakePool, endpoint, serve

engine = v1.engine  # its fixture, for the tests here

# Two keys of organization acme, one of globex, one of no organization.
ACME, ACME_2, GLOBEX, LONE = (
    "sk-llmgw-acme-0123456789",
    "sk-llmgw-acme2-0123456",
    "sk-llmgw-gx-0123",
    "sk-llmgw-lone-0123",
)
LLAMA, VLLM, POOLING = "smol-gguf", "smol-vllm", "smol-embed"
Send = Callable[..., Awaitable[dict[str, Any]]]
# A prompt of a few of router/prefix.py's blocks: a slot is chosen by the blocks it holds.
PROMPT = "You review this team's code. " + "Each change is read twice before it is merged. " * 20


class Keys:
    def __init__(self) -> None:
        orgs = {ACME: "acme", ACME_2: "acme", GLOBEX: "globex", LONE: ""}
        self._by_hash = {
            hash_secret(s): ApiKey(
                id=f"key-{i}", name=s, hash=hash_secret(s), prefix=s[:10], org=org
            )
            for i, (s, org) in enumerate(orgs.items())
        }

    def authenticate(self, secret: str) -> ApiKey | None:
        return self._by_hash.get(hash_secret(secret))


def _router(engine: FakeEngine, mode: Mode) -> Router:
    models = FakeModels(LLAMA, VLLM, POOLING)
    models._models[VLLM] = msgspec.structs.replace(
        models._models[VLLM], engine="vllm", source="hf:local/smol@abc"
    )
    embed = Profile(name="cpu", kind="cpu", args=["--embeddings"], replicas=1)
    models._models[POOLING] = msgspec.structs.replace(models._models[POOLING], profiles=[embed])
    pool = FakePool(
        {
            m: [dataclasses.replace(endpoint(engine.url, m), model=m, slots=2)]
            for m in models._models
        },
        {m: 1 for m in models._models},
    )
    return Router(Keys(), models, pool, max_body_bytes=64 * 1024, cache_isolation=mode)


@pytest.fixture
async def gateway(
    engine: FakeEngine, request: pytest.FixtureRequest
) -> AsyncIterator[tuple[Router, Send]]:
    router = _router(engine, getattr(request, "param", "org"))
    async with serve(router) as url, aiohttp.ClientSession() as http:

        async def send(
            key: str, model: str = LLAMA, status: int = 200, **extra: Any
        ) -> dict[str, Any]:
            messages = [{"role": "user", "content": extra.pop("prompt", PROMPT)}]
            body = {"model": model, "messages": messages, **extra}
            headers = {"Authorization": f"Bearer {key}"}
            async with http.post(f"{url}/v1/chat/completions", json=body, headers=headers) as r:
                assert r.status == status, await r.text()
            return engine.seen[-1].body

        yield router, send


def reuses(body: dict[str, Any]) -> bool:
    """Whether llama-server may serve the request's prompt from the slot's cache."""
    return body.get("cache_prompt", True) is not False


async def test_an_organization_reuses_its_own_slot(gateway: tuple[Router, Send]) -> None:
    _, send = gateway
    first = await send(ACME)
    second = await send(ACME_2)  # another key of the same organization
    assert not reuses(first)  # nothing of acme's was in any slot yet
    assert reuses(second) and second["id_slot"] == first["id_slot"]


async def test_each_conversation_goes_back_to_the_slot_holding_it(
    gateway: tuple[Router, Send],
) -> None:
    _, send = gateway
    one = await send(ACME)
    other = await send(ACME_2, prompt="Another conversation altogether. " * 20)
    assert other["id_slot"] != one["id_slot"]
    again = await send(ACME, prompt=PROMPT + " And one more question.")
    assert reuses(again) and again["id_slot"] == one["id_slot"]


async def test_another_organization_never_reuses_it(gateway: tuple[Router, Send]) -> None:
    _, send = gateway
    mine = await send(ACME)
    theirs = await send(GLOBEX)
    assert not reuses(theirs) and theirs["id_slot"] != mine["id_slot"]
    # acme's slot is still acme's; globex's second request reuses its own.
    assert reuses(await send(ACME)) and reuses(again := await send(GLOBEX))
    assert again["id_slot"] == theirs["id_slot"]


async def test_a_slot_taken_over_is_not_reused_by_its_old_owner(
    gateway: tuple[Router, Send],
) -> None:
    _, send = gateway
    await send(ACME)
    await send(GLOBEX)
    lone = await send(LONE)  # a key of no organization: its own; takes the least recent slot
    assert not reuses(lone)
    back = await send(ACME)  # acme's slot was overwritten by the lone key
    assert not reuses(back)


async def test_a_request_that_failed_leaves_its_slot_unknown(gateway: tuple[Router, Send]) -> None:
    _, send = gateway
    await send(ACME, status=400, max_tokens=4242)  # the engine refused it: not known whole
    assert not reuses(await send(ACME))


async def test_several_completions_taint_every_slot(gateway: tuple[Router, Send]) -> None:
    _, send = gateway
    await send(ACME)
    await send(GLOBEX, n=2)  # llama-server puts the other completion on a slot of its choice
    assert not reuses(await send(ACME))


async def test_a_model_serving_embeddings_reuses_nothing(gateway: tuple[Router, Send]) -> None:
    _, send = gateway
    await send(ACME, POOLING)
    assert not reuses(await send(ACME, POOLING))


async def test_with_several_control_planes_nothing_is_reused(gateway: tuple[Router, Send]) -> None:
    router, send = gateway
    await send(ACME)
    router.isolation.planes(["https://a:7701", "https://b:7701"])
    shared = await send(ACME)
    assert not reuses(shared) and "id_slot" not in shared
    router.isolation.planes(["https://a:7701"])  # alone again: the other's last requests
    await send(ACME)  # may still reach the engines for a while
    assert not reuses(await send(ACME))


@pytest.mark.parametrize("gateway", ["key"], indirect=True)
async def test_per_key_keys_of_one_organization_do_not_share(gateway: tuple[Router, Send]) -> None:
    _, send = gateway
    await send(ACME)
    assert not reuses(await send(ACME_2))
    assert reuses(await send(ACME_2))


@pytest.mark.parametrize("gateway", ["none"], indirect=True)
async def test_none_leaves_llama_cpp_to_itself(gateway: tuple[Router, Send]) -> None:
    _, send = gateway
    for key in (ACME, GLOBEX):
        body = await send(key)
        assert "id_slot" not in body and "cache_prompt" not in body


async def test_vllm_salts_per_organization(gateway: tuple[Router, Send]) -> None:
    _, send = gateway
    acme, acme_2, globex, lone = [
        (await send(k, VLLM))["cache_salt"] for k in (ACME, ACME_2, GLOBEX, LONE)
    ]
    assert acme == acme_2 and len({acme, globex, lone}) == 3
    assert len(acme) == 43 and not set(acme) & set("/@\\\0") and "acme" not in acme


@pytest.mark.parametrize("gateway", ["none"], indirect=True)
async def test_vllm_unsalted_with_none(gateway: tuple[Router, Send]) -> None:
    _, send = gateway
    assert "cache_salt" not in await send(ACME, VLLM)


def test_a_request_beyond_the_slots_known_taints_them() -> None:
    # The balancer sends a replica no more requests than its slots; should one more come, it
    # goes unpinned (llama-server picks a slot), and no slot is reused after.
    book = CacheIsolation("org")
    replica = dataclasses.replace(endpoint("http://e", LLAMA), model=LLAMA, slots=2)
    ticket = Ticket("org:acme", False, prefix.chain(PROMPT))
    leases = [book.lease(ticket, replica, True, b'{"model":"m"}')[1] for _ in "ab"]
    body, extra = book.lease(ticket, replica, True, b'{"model":"m"}')
    assert extra is None and msgspec.json.decode(body) == {"cache_prompt": False, "model": "m"}
    for lease in leases:
        book.done(replica, lease, True)
    body, _ = book.lease(ticket, replica, True, b'{"model":"m"}')
    assert msgspec.json.decode(body)["cache_prompt"] is False
