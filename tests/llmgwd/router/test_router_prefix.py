"""Prefix-aware balancing: a conversation's turns go to the replica that holds its prefix,
a session header pins it, a much busier replica is passed over, gone replicas are forgotten."""

from __future__ import annotations

from typing import Any

import aiohttp

from llmgwd.nodes.pool import Endpoint
from llmgwd.router import Balancer
from llmgwd.router.prefix import Affinity, chain, prompt_text
from tests.llmgwd.router.test_router_balancer import Pool, ep
from tests.llmgwd.router.test_router_slots import HEADERS, gateway, replica
from tests.llmgwd.router.test_router_v1 import MODEL, FakeEngine, running

SYSTEM = "You are a careful assistant. " * 40  # ~1,160 characters: several blocks


def turns(name: str, n: int, system: str = SYSTEM) -> list[list[dict[str, Any]]]:
    """The messages of each of n turns of one conversation, each growing the one before."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
    out = []
    for i in range(n):
        messages = [*messages, {"role": "user", "content": f"{name}: question {i} " * 30}]
        out.append(messages)
        messages = [*messages, {"role": "assistant", "content": f"answer {i} " * 30}]
    return out


def affinity(messages: list[dict[str, Any]], session: str = "") -> Affinity:
    return Affinity(session, chain(prompt_text({"messages": messages})))


async def sent_to(balancer: Balancer, aff: Affinity) -> str:
    """The replica a request goes to when nothing else is in flight."""
    endpoint = await balancer.acquire("m", affinity=aff)
    assert endpoint is not None
    balancer.release(endpoint)
    return endpoint.replica_id


def test_a_next_turn_extends_the_chain_of_the_one_before() -> None:
    first, second = turns("c", 2)
    a, b = affinity(first).chain, affinity(second).chain
    assert len(b) > len(a) > 0
    assert b[: len(a) - 1] == a[: len(a) - 1]  # its last block may have grown since
    assert affinity(turns("other", 1)[0]).chain[0] == a[0]  # the shared system prompt


def test_messages_and_responses_bodies_chain_their_conversation_too() -> None:
    """Anthropic's Messages (system apart) and OpenAI's Responses (instructions, input)."""
    first, second = turns("c", 2)
    for system, conversation in (("system", "messages"), ("instructions", "input")):
        a, b = (
            chain(prompt_text({system: SYSTEM, conversation: messages[1:]}))
            for messages in (first, second)
        )
        assert len(b) > len(a) > 1
        assert b[: len(a) - 1] == a[: len(a) - 1]
    assert chain(prompt_text({"input": SYSTEM}))[0] == chain(SYSTEM)[0]


async def test_each_conversation_stays_on_its_replica_and_both_are_used() -> None:
    """Conversations with no prefix in common are spread; each stays where it began."""
    balancer = Balancer(Pool([ep("a"), ep("b")]))
    homes = {}
    for name in ("c1", "c2", "c3", "c4"):
        own = turns(name, 4, system=f"{name} " * 100)
        homes[name] = {await sent_to(balancer, affinity(t)) for t in own}
    assert all(len(home) == 1 for home in homes.values()), homes  # never moved
    assert set().union(*homes.values()) == {"a", "b"}  # and not all on one


async def test_without_prefix_balancing_turns_take_turns() -> None:
    balancer = Balancer(Pool([ep("a"), ep("b")]), prefix_aware=False)
    home = {await sent_to(balancer, affinity(t)) for t in turns("c", 4)}
    assert home == {"a", "b"}


async def test_a_much_busier_replica_is_passed_over() -> None:
    a, b = ep("a"), ep("b")
    balancer = Balancer(Pool([a, b]), slots=8)
    first, second = turns("c", 2)
    balancer.prefix.remember(a, affinity(first))  # type: ignore[union-attr]
    with balancer.hold(a), balancer.hold(a):  # two more than b: still within the slack
        assert await sent_to(balancer, affinity(second)) == "a"
        with balancer.hold(a):  # three more: flooded
            assert await sent_to(balancer, affinity(second)) == "b"


async def test_a_session_pins_its_conversation_whatever_its_prompt() -> None:
    balancer = Balancer(Pool([ep("a"), ep("b")]))
    homes = {
        await sent_to(balancer, affinity([{"role": "user", "content": f"new topic {i}"}], "s1"))
        for i in range(5)
    }
    assert len(homes) == 1


async def test_a_replica_gone_is_forgotten() -> None:
    a, b = ep("a"), ep("b")
    pool = Pool([a, b])
    balancer = Balancer(pool)
    first = affinity(turns("c", 1)[0])
    home = await sent_to(balancer, first)
    assert balancer.prefix is not None and balancer.prefix.held(home, first) > 0
    pool.endpoints = [e for e in pool.endpoints if e.replica_id != home]
    await sent_to(balancer, affinity([{"role": "user", "content": "another"}]))
    assert balancer.prefix.held(home, first) == 0


async def test_the_gateway_sends_a_conversation_to_one_engine() -> None:
    """Through the router: each turn's messages reach the engine that had the turn before;
    a session header pins a conversation whose prompt changes."""
    async with running(FakeEngine()) as one, running(FakeEngine()) as two:
        endpoints: list[Endpoint] = [replica(one, "r1"), replica(two, "r2")]
        async with gateway(endpoints) as (url, _router, http):
            for messages in turns("c", 4):
                await post(http, url, {"model": MODEL, "messages": messages})
            assert sorted([len(one.seen), len(two.seen)]) == [0, 4]
            for i in range(4):
                body = {"model": MODEL, "messages": [{"role": "user", "content": str(i)}]}
                await post(http, url, body, {"x-session-id": "s"})
            assert sorted([len(one.seen), len(two.seen)]) in ([0, 8], [4, 4])


async def post(
    http: aiohttp.ClientSession, url: str, body: dict[str, Any], extra: dict[str, str] | None = None
) -> None:
    headers = {**HEADERS, **(extra or {})}
    async with http.post(f"{url}/v1/chat/completions", json=body, headers=headers) as r:
        assert r.status == 200, await r.text()
