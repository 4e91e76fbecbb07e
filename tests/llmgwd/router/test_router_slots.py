"""Balancing against test_router_v1's fake engines: slots as caps, the line, 503s, ejection."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from llmgw.wire import ReplicaSpec
from llmgw_agentd import engines
from llmgwd.nodes.pool import Endpoint
from llmgwd.router import Balancer, Router
from llmgwd.router.ejection import Ejections
from tests.llmgwd.router.test_router_ejection import Clock
from tests.llmgwd.router.test_router_v1 import (
    ENGINE_KEY,
    MODEL,
    USER_SECRET,
    FakeEngine,
    FakeKeys,
    FakeModels,
    FakePool,
    assert_error_shape,
    running,
    serve,
)

HEADERS = {"Authorization": f"Bearer {USER_SECRET}"}
HI: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]


def replica(fake: FakeEngine, rid: str, slots: int = 0) -> Endpoint:
    return Endpoint(rid, MODEL, "n1", fake.url, ENGINE_KEY, slots=slots)


def body(text: str) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}]}


@pytest.fixture
async def engine() -> AsyncIterator[FakeEngine]:
    async with running(FakeEngine()) as fake:
        yield fake


@asynccontextmanager
async def gateway(
    endpoints: list[Endpoint], **balancing: Any
) -> AsyncIterator[tuple[str, Router, aiohttp.ClientSession]]:
    """The router in front of endpoints, its balancer set up with balancing."""
    pool = FakePool({MODEL: endpoints}, {MODEL: len(endpoints)})
    balancer = Balancer(pool, **balancing)
    router = Router(FakeKeys(), FakeModels(MODEL), pool, balancer=balancer, disconnect_poll_s=0.02)
    async with serve(router) as url, aiohttp.ClientSession() as http:
        yield url, router, http


async def chat(http: aiohttp.ClientSession, url: str, text: str) -> tuple[int, Any, Any]:
    async with http.post(f"{url}/v1/chat/completions", json=body(text), headers=HEADERS) as r:
        return r.status, await r.json(), r.headers


async def until(done: Callable[[], bool]) -> None:
    """Wait (a bounded while) for done to hold."""
    for _ in range(500):
        if done():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("never came to pass")


async def ask(client: openai.AsyncOpenAI, stream: bool) -> str:
    """The answer's text, streamed or not."""
    if stream:
        chunks = await client.chat.completions.create(model=MODEL, messages=HI, stream=True)
        return "".join([c.choices[0].delta.content or "" async for c in chunks])
    answer = await client.chat.completions.create(model=MODEL, messages=HI)
    return answer.choices[0].message.content or ""


def texts(fake: FakeEngine) -> list[str]:
    return [seen.body["messages"][0]["content"] for seen in fake.seen]


# Slots as caps.


async def test_no_replica_ever_has_more_requests_than_its_slots() -> None:
    gate = asyncio.Event()
    async with running(FakeEngine(gate=gate)) as engine, running(FakeEngine(gate=gate)) as other:
        endpoints = [replica(engine, "one", slots=1), replica(other, "three", slots=3)]
        async with gateway(endpoints) as (url, router, http):
            tasks = [asyncio.create_task(chat(http, url, str(i))) for i in range(10)]
            await until(lambda: engine.in_flight == 1 and other.in_flight == 3)
            await until(lambda: router.balancer.queued(MODEL) == 6)
            gate.set()
            answers = await asyncio.gather(*tasks)
    assert [status for status, _, _ in answers] == [200] * 10
    assert (engine.most_in_flight, other.most_in_flight) == (1, 3)
    assert len(engine.seen) + len(other.seen) == 10


def test_a_replica_whose_engine_tells_no_slots_gets_llama_servers_default_of_4() -> None:
    unknown = Endpoint("r", MODEL, "n", "http://x:1", "k")
    balancer = Balancer(FakePool())
    assert balancer.cap(unknown) == 4
    assert balancer.cap(Endpoint("r", MODEL, "n", "http://x:1", "k", slots=16)) == 16


async def test_a_vllm_replica_takes_more_than_four_requests_at_once() -> None:
    # The slots its agent reports for a vLLM replica the placement gave none: vLLM's own.
    spec = ReplicaSpec(id="v", model=MODEL, engine="vllm", source="file:/set")
    engine = FakeEngine(gate=asyncio.Event())
    async with running(engine), gateway([replica(engine, "v", engines.slots(spec, 0))]) as gw:
        url, router, http = gw
        tasks = [asyncio.create_task(chat(http, url, str(i))) for i in range(12)]
        await until(lambda: engine.in_flight == 12)
        assert router.balancer.queued(MODEL) == 0
        assert engine.gate is not None
        engine.gate.set()
        answers = await asyncio.gather(*tasks)
    assert [status for status, _, _ in answers] == [200] * 12


# The line of requests waiting for a slot.


async def test_waiting_requests_are_served_first_come_first_as_slots_free(
    engine: FakeEngine,
) -> None:
    engine.gate = asyncio.Event()
    async with gateway([replica(engine, "r1", slots=1)]) as (url, router, http):
        tasks = [asyncio.create_task(chat(http, url, "first"))]
        await until(lambda: engine.in_flight == 1)
        for i, text in enumerate(("second", "third", "fourth")):
            tasks.append(asyncio.create_task(chat(http, url, text)))
            await until(lambda i=i: router.balancer.queued(MODEL) == i + 1)  # type: ignore[misc]
        engine.gate.set()
        answers = await asyncio.gather(*tasks)
    assert [status for status, _, _ in answers] == [200] * 4
    assert texts(engine) == ["first", "second", "third", "fourth"]
    assert engine.most_in_flight == 1


async def test_a_request_that_waits_too_long_gets_503_with_retry_after(engine: FakeEngine) -> None:
    engine.gate = asyncio.Event()
    async with gateway([replica(engine, "r1", slots=1)], queue_timeout_s=0.1) as (url, _, http):
        first = asyncio.create_task(chat(http, url, "first"))
        await until(lambda: engine.in_flight == 1)
        status, answer, headers = await chat(http, url, "second")
        assert status == 503 and int(headers["Retry-After"]) > 0
        assert_error_shape(answer, "model_busy")
        assert "busy" in answer["error"]["message"]
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=USER_SECRET, max_retries=0)
        async with client:
            with pytest.raises(openai.InternalServerError) as caught:
                await client.chat.completions.create(model=MODEL, messages=HI)
        assert caught.value.status_code == 503 and caught.value.code == "model_busy"
        engine.gate.set()
        assert (await first)[0] == 200
    assert texts(engine) == ["first"]


async def test_a_full_line_refuses_at_once(engine: FakeEngine) -> None:
    engine.gate = asyncio.Event()
    async with gateway([replica(engine, "r1", slots=1)], queue_size=1) as (url, router, http):
        first = asyncio.create_task(chat(http, url, "first"))
        await until(lambda: engine.in_flight == 1)
        second = asyncio.create_task(chat(http, url, "second"))
        await until(lambda: router.balancer.queued(MODEL) == 1)
        status, answer, headers = await chat(http, url, "third")
        assert status == 503 and headers["Retry-After"]
        assert "queue is full" in answer["error"]["message"]
        engine.gate.set()
        assert [(await t)[0] for t in (first, second)] == [200, 200]


async def test_a_client_that_leaves_while_waiting_gives_up_its_place(engine: FakeEngine) -> None:
    engine.gate = asyncio.Event()
    async with gateway([replica(engine, "r1", slots=1)], queue_size=1) as (url, router, http):
        first = asyncio.create_task(chat(http, url, "first"))
        await until(lambda: engine.in_flight == 1)
        leaving = asyncio.create_task(chat(http, url, "leaving"))
        await until(lambda: router.balancer.queued(MODEL) == 1)
        leaving.cancel()  # the client hangs up
        await until(lambda: router.balancer.queued(MODEL) == 0)
        staying = asyncio.create_task(chat(http, url, "staying"))  # the place is free again
        await until(lambda: router.balancer.queued(MODEL) == 1)
        engine.gate.set()
        assert [(await t)[0] for t in (first, staying)] == [200, 200]
    assert texts(engine) == ["first", "staying"]
    assert router.balancer.outstanding("r1") == 0


async def test_a_freed_slot_goes_to_the_first_waiter_that_has_not_tried_its_replica() -> None:
    pool = FakePool({MODEL: [Endpoint(r, MODEL, "n", "http://x:1", "k", slots=1) for r in "ab"]})
    balancer = Balancer(pool)
    first, second = await balancer.acquire(MODEL), await balancer.acquire(MODEL)
    assert first is not None and second is not None and first != second
    retrying = asyncio.create_task(balancer.acquire(MODEL, exclude={first.replica_id}))
    await until(lambda: balancer.queued(MODEL) == 1)
    later = asyncio.create_task(balancer.acquire(MODEL))
    await until(lambda: balancer.queued(MODEL) == 2)
    balancer.release(first)  # the one retrying already failed there: the later one takes it
    assert await later == first and not retrying.done()
    balancer.release(second)
    assert await retrying == second


async def test_a_waiter_whose_replicas_all_leave_the_pool_stops_waiting() -> None:
    only = Endpoint("r", MODEL, "n", "http://x:1", "k", slots=1)
    pool = FakePool({MODEL: [only]})
    balancer = Balancer(pool, recheck_s=0.01)
    with balancer.hold(only):
        waiting = asyncio.create_task(balancer.acquire(MODEL))
        await until(lambda: balancer.queued(MODEL) == 1)
        pool.endpoints[MODEL] = []  # its node went away
        assert await waiting is None  # the router answers 503, model not ready
    assert balancer.queued(MODEL) == 0


# Failures before the first byte.


@pytest.mark.parametrize("stream", [False, True])
async def test_a_503_before_any_byte_goes_to_another_replica(
    engine: FakeEngine, stream: bool
) -> None:
    async with running(FakeEngine(unavailable=1)) as loading:
        endpoints = [replica(loading, "loading"), replica(engine, "live")]
        async with gateway(endpoints) as (url, router, _):
            with router.balancer.hold(endpoints[1]):  # busier: the loading one is tried first
                client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=USER_SECRET)
                async with client:
                    text = await ask(client, stream)
    assert loading.unavailable == 0  # it answered its 503
    assert text == "t0 t1 t2 t3 "  # a whole answer is the engine's stream, folded
    assert len(engine.seen) == 1 and not loading.seen


async def test_a_503_from_the_only_replica_is_a_503_with_retry_after(engine: FakeEngine) -> None:
    engine.unavailable = 1
    async with gateway([replica(engine, "r1")]) as (url, _, http):
        status, answer, headers = await chat(http, url, "hi")
    assert status == 503 and int(headers["Retry-After"]) > 0
    assert_error_shape(answer, "model_not_ready")


async def test_a_replica_that_keeps_failing_is_left_out_for_a_while(engine: FakeEngine) -> None:
    clock = Clock()
    ejections = Ejections(failures=3, pause_s=10, clock=clock)
    async with running(FakeEngine(unavailable=100)) as failing:
        endpoints = [replica(failing, "failing"), replica(engine, "live")]
        async with gateway(endpoints, ejections=ejections) as (url, router, http):

            async def tries_of_failing(text: str) -> int:
                """How many times a request went to the failing replica (it answers anyway)."""
                before = failing.unavailable
                with router.balancer.hold(endpoints[1]):  # busier: the failing one goes first
                    assert (await chat(http, url, text))[0] == 200
                return before - failing.unavailable

            assert [await tries_of_failing(f"r{i}") for i in range(4)] == [1, 1, 1, 0]
            clock.advance(10)
            assert await tries_of_failing("back") == 1  # tried again; fails: out for 20 s
            clock.advance(10)
            assert await tries_of_failing("still out") == 0
            clock.advance(10)
            failing.unavailable = 0  # it recovered: its trial request is answered
            await tries_of_failing("recovered")
    assert texts(failing) == ["recovered"]
    assert len(engine.seen) == 6
