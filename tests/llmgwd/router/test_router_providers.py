"""External providers through the /v1 router, against the local stand-in of provider_standin
(answers recorded from OpenAI's and Anthropic's API references): the official clients get the
upstream's answers under the catalog's name, metered by the upstream's usage with the same key's
limits as a local model's; the credential reaches the upstream in its protocol's header and
nowhere else; the body never picks the upstream; errors in the route's shape, in our words."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import anthropic
import msgspec
import openai
import pytest
from aiohttp.test_utils import TestServer
from anthropic.types import MessageParam
from openai.types.chat import ChatCompletionMessageParam

from llmgw.api_types import ProviderProtocol
from llmgwd.accounting.levels import LEVELS, LevelLimits, Levels, org_level
from llmgwd.accounting.usage import Counts
from llmgwd.catalog import ApiKey, KeyLimits, Model, ModelUpstream
from llmgwd.providers.credentials import Credentials
from llmgwd.router import Balancer, Router, providers
from llmgwd.router.metering import Meter
from tests.llmgwd.router.provider_standin import StandIn
from tests.llmgwd.router.test_router_metering import reserved
from tests.llmgwd.router.test_router_v1 import (  # noqa: F401 (engine: a fixture)
    MODEL,
    USER_SECRET,
    FakeEngine,
    FakeModels,
    FakePool,
    endpoint,
    engine,
    serve,
)

SECRET = b"cluster-secret-for-tests-0123456"
CREDENTIAL = "sk-provider-credential-SEKRIT-0123456789"
GPT, CLAUDE = "gpt", "claude"  # the catalog's names
GPT_UPSTREAM, CLAUDE_UPSTREAM = "gpt-4o-mini", "claude-opus-4-6"  # the upstreams'
HI: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
HI_A: list[MessageParam] = [{"role": "user", "content": "hi"}]
# The recordings' usage (provider_answers/): OpenAI's chat stream, Anthropic's, Responses'.
OPENAI_USAGE, ANTHROPIC_USAGE, RESPONSES_USAGE = (19, 10), (25, 15), (37, 11)
DEADLINE_S = 3.0  # the router's for a provider's answer (the read timeout: 1 s)


def provider(name: str, protocol: ProviderProtocol, url: str, upstream: str, sealed: str) -> Model:
    up = ModelUpstream(protocol=protocol, url=f"{url}/v1", model=upstream, credential=sealed)
    return Model(name=name, source=f"upstream:{url}/v1", upstream=up)


class OneKey:
    """The one user key, of organization acme, whose limits a test sets."""

    def __init__(self) -> None:
        self.key = ApiKey(id="key-user", name="u", hash="", prefix="sk-llmgw-u", org="acme")

    def authenticate(self, secret: str) -> ApiKey | None:
        return self.key if secret == USER_SECRET else None

    def limit(self, **limits: Any) -> None:
        self.key = msgspec.structs.replace(self.key, limits=KeyLimits(**limits))


@dataclass
class Setup:
    url: str
    stand_in: StandIn
    engine: FakeEngine
    keys: OneKey
    meter: Meter
    models: FakeModels
    levels: Levels

    def openai(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=f"{self.url}/v1", api_key=USER_SECRET, max_retries=0)

    def anthropic(self) -> anthropic.AsyncAnthropic:
        return anthropic.AsyncAnthropic(base_url=self.url, api_key=USER_SECRET, max_retries=0)

    async def usage(self) -> dict[str, Counts]:
        return {r.model: r.counts for r in await self.meter.usage.records("")}


@pytest.fixture
async def s(engine: FakeEngine) -> AsyncIterator[Setup]:  # noqa: F811
    stand_in = StandIn(CREDENTIAL)
    server = TestServer(stand_in.app(), host="127.0.0.1")
    await server.start_server()
    stand_in.url = str(server.make_url("")).rstrip("/")
    sealer = Credentials(SECRET)
    models = FakeModels(MODEL)
    given: list[tuple[str, ProviderProtocol, str]] = [
        (GPT, "openai", GPT_UPSTREAM),
        (CLAUDE, "anthropic", CLAUDE_UPSTREAM),
    ]
    for name, protocol, upstream in given:
        models.set(provider(name, protocol, stand_in.url, upstream, sealer.seal(name, CREDENTIAL)))
    pool = FakePool({MODEL: [endpoint(engine.url)]}, {MODEL: 1})
    keys, levels = OneKey(), Levels()
    meter = Meter(levels=levels)
    router = Router(
        keys, models, pool, meter=meter, balancer=Balancer(pool, slots=1, queue_size=0),
        salt_secret=SECRET, read_timeout_s=1.0, provider_deadline_s=DEADLINE_S,
    )  # fmt: skip
    async with serve(router) as url:
        yield Setup(url, stand_in, engine, keys, meter, models, levels)
    await server.close()


async def test_openai_chat_is_the_upstreams_answer_metered_by_its_usage(s: Setup) -> None:
    async with s.openai() as client:
        whole = await client.chat.completions.create(model=GPT, messages=HI)
    assert whole.choices[0].message.content == "Hello! How can I assist you today?"
    assert whole.model == GPT  # the catalog's name, not the upstream's
    assert whole.usage is not None
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == OPENAI_USAGE
    sent = s.stand_in.seen[0]
    assert sent.headers["Authorization"] == f"Bearer {CREDENTIAL}"
    assert sent.body["model"] == GPT_UPSTREAM
    # asked as a stream with its usage, folded (a client that leaves is charged what came)
    assert sent.body["stream"] is True and sent.body["stream_options"] == {"include_usage": True}
    counts = (await s.usage())[GPT]
    assert (counts.requests, counts.prompt_tokens, counts.completion_tokens) == (1, *OPENAI_USAGE)


async def test_openai_stream_is_metered_whether_or_not_the_client_asks_usage(s: Setup) -> None:
    async with s.openai() as client:
        stream = await client.chat.completions.create(model=GPT, messages=HI, stream=True)
        chunks = [c async for c in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Hello! How can I assist you today?"
    assert all(c.usage is None for c in chunks)  # not asked: the usage chunk held back
    assert s.stand_in.seen[0].body["stream_options"] == {"include_usage": True}
    counts = (await s.usage())[GPT]
    assert (counts.prompt_tokens, counts.completion_tokens) == OPENAI_USAGE


async def test_openai_responses_whole_and_streamed(s: Setup) -> None:
    async with s.openai() as client:
        whole = await client.responses.create(model=GPT, input="hi")
        stream = await client.responses.create(model=GPT, input="hi", stream=True)
        kinds = [event.type async for event in stream]
    assert whole.output_text == "Hi there! How can I assist you today?"
    assert whole.model == GPT and whole.usage is not None
    assert (whole.usage.input_tokens, whole.usage.output_tokens) == RESPONSES_USAGE
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    for sent in s.stand_in.seen:
        assert sent.path == "/v1/responses" and sent.body["model"] == GPT_UPSTREAM
    counts = (await s.usage())[GPT]
    assert (counts.requests, counts.prompt_tokens, counts.completion_tokens) == (
        2,
        2 * RESPONSES_USAGE[0],
        2 * RESPONSES_USAGE[1],
    )


async def test_anthropic_messages_whole_and_streamed(s: Setup) -> None:
    async with s.anthropic() as client:
        whole = await client.messages.create(model=CLAUDE, max_tokens=50, messages=HI_A)
        async with client.messages.stream(model=CLAUDE, max_tokens=50, messages=HI_A) as stream:
            text = "".join([t async for t in stream.text_stream])
            final = await stream.get_final_message()
    assert [b.text for b in whole.content if b.type == "text"] == ["Hello!"]
    assert whole.model == CLAUDE
    assert (whole.usage.input_tokens, whole.usage.output_tokens) == ANTHROPIC_USAGE
    assert text == "Hello!" and final.usage.output_tokens == ANTHROPIC_USAGE[1]
    for sent in s.stand_in.seen:
        assert sent.headers["x-api-key"] == CREDENTIAL and "Authorization" not in sent.headers
        assert sent.body["model"] == CLAUDE_UPSTREAM and sent.body["max_tokens"] == 50
    counts = (await s.usage())[CLAUDE]
    assert (counts.requests, counts.prompt_tokens, counts.completion_tokens) == (2, 50, 30)


async def post(s: Setup, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    headers = {"Authorization": f"Bearer {USER_SECRET}"}
    url = f"{s.url}/v1/chat/completions"
    async with aiohttp.ClientSession() as http, http.post(url, json=body, headers=headers) as r:
        return r.status, await r.json()


async def test_anthropic_count_tokens_is_the_upstreams_count_billing_none(s: Setup) -> None:
    async with s.anthropic() as client:
        counted = await client.messages.count_tokens(model=CLAUDE, messages=HI_A)
    assert counted.input_tokens == 2095
    [sent] = s.stand_in.seen
    assert sent.path == "/v1/messages/count_tokens" and sent.body["model"] == CLAUDE_UPSTREAM
    counts = (await s.usage())[CLAUDE]
    assert (counts.requests, counts.prompt_tokens, counts.completion_tokens) == (1, 0, 0)


async def test_one_budget_is_spent_exactly_across_local_and_external_models(s: Setup) -> None:
    for model in (GPT, MODEL):
        assert (await post(s, {"model": model, "messages": HI}))[0] == 200
    usage = await s.usage()
    spent = sum(c.prompt_tokens + c.completion_tokens for c in usage.values())
    assert usage[GPT].prompt_tokens + usage[GPT].completion_tokens == sum(OPENAI_USAGE)
    # A request reserves its body's bytes and max_tokens: one short of that is refused.
    body = {"model": GPT, "messages": HI, "max_tokens": 20}
    s.keys.limit(budget_tokens=spent + reserved(body) - 1, budget_tokens_per="day")
    status, refusal = await post(s, body)
    assert (status, refusal["error"]["code"]) == (429, "insufficient_quota")
    assert len(s.stand_in.seen) == 1  # the refused one never left
    s.keys.limit(budget_tokens=spent + reserved(body), budget_tokens_per="day")
    assert (await post(s, body))[0] == 200


async def test_a_level_without_the_model_in_its_list_gets_404(s: Setup) -> None:
    record = LevelLimits(limits=KeyLimits(), models=[MODEL])
    s.levels.apply(LEVELS + org_level("acme"), msgspec.json.encode(record))
    async with s.openai() as client:
        with pytest.raises(openai.NotFoundError):
            await client.chat.completions.create(model=GPT, messages=HI)
        listed = [m.id async for m in client.models.list()]
    assert listed == [MODEL] and not s.stand_in.seen


async def test_the_body_never_picks_the_upstream_nor_passes_engine_fields(s: Setup) -> None:
    body = {"model": GPT, "messages": HI, "base_url": "http://elsewhere", "api_key": "x",
            "upstream": "http://elsewhere", "url": "http://elsewhere"}  # fmt: skip
    async with aiohttp.ClientSession() as http:
        headers = {"Authorization": f"Bearer {USER_SECRET}"}
        async with http.post(f"{s.url}/v1/chat/completions", json=body, headers=headers) as r:
            assert r.status == 200
        bad = {"model": GPT, "messages": HI, "n_predict": 5}
        async with http.post(f"{s.url}/v1/chat/completions", json=bad, headers=headers) as r:
            assert r.status == 400 and (await r.json())["error"]["param"] == "n_predict"
    [sent] = s.stand_in.seen
    assert not {"base_url", "api_key", "upstream", "url", "n_predict"} & set(sent.body)


async def test_a_route_the_upstream_lacks_is_model_not_supported(s: Setup) -> None:
    async with s.anthropic() as client:
        with pytest.raises(anthropic.BadRequestError) as refused:
            await client.messages.create(model=GPT, max_tokens=5, messages=HI_A)
    assert "does not support /v1/messages" in str(refused.value)
    async with s.openai() as client:
        with pytest.raises(openai.BadRequestError):
            await client.chat.completions.create(model=CLAUDE, messages=HI)
    assert not s.stand_in.seen


async def test_a_refused_credential_is_a_502_that_quotes_nothing(
    s: Setup, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    s.stand_in.credential = "another"  # the upstream no longer takes ours: its 401 quotes it
    async with s.openai() as client:
        with pytest.raises(openai.InternalServerError) as failed:
            await client.chat.completions.create(model=GPT, messages=HI)
    assert failed.value.status_code == 502
    said = failed.value.response.text
    assert "credential or settings" in said
    for secret in (CREDENTIAL, "sk-wrong", "platform.openai.com"):
        assert secret not in said and secret not in caplog.text
    async with s.anthropic() as client:
        with pytest.raises(anthropic.InternalServerError) as failed_a:
            await client.messages.create(model=CLAUDE, max_tokens=5, messages=HI_A)
    assert failed_a.value.body["type"] == "error"  # type: ignore[index]
    assert "invalid x-api-key" not in failed_a.value.response.text
    assert not (await s.usage()).get(GPT, Counts()).completion_tokens


@pytest.mark.parametrize(
    ("status", "answer"), [(429, "openai_429.json"), (529, "anthropic_529.json")]
)
async def test_an_upstream_busy_is_a_503_with_its_retry_after(
    s: Setup, status: int, answer: str
) -> None:
    s.stand_in.fail, s.stand_in.retry_after = (status, answer), "7"
    async with aiohttp.ClientSession() as http:
        headers = {"Authorization": f"Bearer {USER_SECRET}"}
        body = {"model": GPT, "messages": HI}
        async with http.post(f"{s.url}/v1/chat/completions", json=body, headers=headers) as r:
            said = await r.json()
            assert (r.status, r.headers["Retry-After"]) == (503, "7")
    assert said["error"]["code"] == "model_busy" and "org-abc123" not in str(said)


async def test_a_silent_upstream_is_a_504_within_the_read_timeout(s: Setup) -> None:
    s.stand_in.stall = True
    async with s.openai() as client:
        began = asyncio.get_running_loop().time()
        with pytest.raises(openai.APIStatusError) as failed:
            await client.chat.completions.create(model=GPT, messages=HI)
    assert failed.value.status_code == 504
    assert asyncio.get_running_loop().time() - began < 5


async def test_local_slots_do_not_bound_an_external_model(s: Setup) -> None:
    # The balancer has one slot and no queue: eight requests to the provider are all in flight.
    s.stand_in.gate = asyncio.Event()
    async with s.openai() as client:
        calls = [
            asyncio.create_task(client.chat.completions.create(model=GPT, messages=HI))
            for _ in range(8)
        ]
        async with asyncio.timeout(5):
            while len(s.stand_in.seen) < 8:  # noqa: ASYNC110 (the stand-in's list, polled)
                await asyncio.sleep(0.01)
        s.stand_in.gate.set()
        answers = await asyncio.gather(*calls)
    assert len(answers) == 8


async def test_a_credential_sealed_for_another_model_does_not_open(s: Setup) -> None:
    gpt = s.models.get(GPT)
    assert gpt is not None and gpt.upstream is not None
    moved = msgspec.structs.replace(gpt, name="copy")
    s.models.set(moved)  # its sealed credential was bound to "gpt"
    async with s.openai() as client:
        with pytest.raises(openai.InternalServerError):
            await client.chat.completions.create(model="copy", messages=HI)
    assert not s.stand_in.seen


@pytest.mark.parametrize(
    ("path", "model", "usage"),
    [("chat/completions", GPT, OPENAI_USAGE), ("messages", CLAUDE, ANTHROPIC_USAGE)],
)
@pytest.mark.parametrize("stream", [True, False])
async def test_a_client_that_leaves_is_charged_what_the_upstream_reports(
    s: Setup, path: str, model: str, usage: tuple[int, int], stream: bool
) -> None:
    s.stand_in.pause = asyncio.Event()
    body = {"model": model, "messages": HI, "max_tokens": 50, "stream": stream}
    headers = {"Authorization": f"Bearer {USER_SECRET}"}
    async with aiohttp.ClientSession() as http:
        request = asyncio.create_task(http.post(f"{s.url}/v1/{path}", json=body, headers=headers))
        async with asyncio.timeout(5):
            while not s.stand_in.seen:  # noqa: ASYNC110 (the stand-in's list, polled)
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)  # its first event reached the router
        request.cancel()  # the client leaves
    s.stand_in.pause.set()  # the upstream goes on to its end, its usage last
    async with asyncio.timeout(5):
        while not (await s.usage()).get(model):  # noqa: ASYNC110 (settled after the drain)
            await asyncio.sleep(0.05)
    counts = (await s.usage())[model]
    assert s.stand_in.finished == 1
    assert (counts.requests, counts.prompt_tokens, counts.completion_tokens) == (1, *usage)


@pytest.mark.parametrize(
    "url", ["https://169.254.169.254/latest", "http://203.0.113.7/v1", "https://[fe80::1]/v1"]
)
async def test_a_url_stored_before_the_rule_is_never_sent_to(
    s: Setup, url: str, caplog: pytest.LogCaptureFixture
) -> None:
    gpt = s.models.get(GPT)
    assert gpt is not None and gpt.upstream is not None
    up = msgspec.structs.replace(gpt.upstream, url=url)
    s.models.set(msgspec.structs.replace(gpt, upstream=up))
    async with s.openai() as client:
        with pytest.raises(openai.InternalServerError) as failed:
            await client.chat.completions.create(model=GPT, messages=HI)
    assert failed.value.status_code == 502 and "address" in failed.value.response.text
    assert CREDENTIAL not in caplog.text


async def test_openais_chat_is_sent_max_completion_tokens_never_max_tokens(s: Setup) -> None:
    # OpenAI's reasoning models refuse max_tokens: the limit reserved goes as the other.
    for asked in ({"max_tokens": 20}, {"max_completion_tokens": 20}, {}):
        assert (await post(s, {"model": GPT, "messages": HI, **asked}))[0] == 200
    assert [c.body.get("max_completion_tokens") for c in s.stand_in.seen][:2] == [20, 20]
    assert all("max_tokens" not in c.body for c in s.stand_in.seen)
    assert s.stand_in.seen[2].body["max_completion_tokens"] > 0  # the limit reserved
    async with s.anthropic() as client:
        await client.messages.create(model=CLAUDE, max_tokens=5, messages=HI_A)
    assert s.stand_in.seen[-1].body["max_tokens"] == 5  # Anthropic's own name for it


async def test_openai_is_told_not_to_store_and_each_org_gets_its_own_cache_key(s: Setup) -> None:
    assert (await post(s, {"model": GPT, "messages": HI, "store": True}))[0] == 200
    async with s.openai() as client:
        await client.responses.create(model=GPT, input="hi")  # Responses stores by default
    s.keys.key = msgspec.structs.replace(s.keys.key, id="key-other-of-acme")
    assert (await post(s, {"model": GPT, "messages": HI}))[0] == 200
    s.keys.key = msgspec.structs.replace(s.keys.key, org="beta")
    assert (await post(s, {"model": GPT, "messages": HI}))[0] == 200
    sent = [c.body for c in s.stand_in.seen]
    assert [b["store"] for b in sent] == [False] * 4
    acme, acme_too, acme_again, beta = (b["prompt_cache_key"] for b in sent)
    assert acme == acme_too == acme_again != beta  # one per organization, not per key
    assert all("acme" not in k and "beta" not in k for k in (acme, beta))  # a hash, not a name
    async with s.anthropic() as client:
        await client.messages.create(model=CLAUDE, max_tokens=5, messages=HI_A)
    assert not {"store", "prompt_cache_key"} & set(s.stand_in.seen[-1].body)


async def stream_bytes(s: Setup, model: str) -> bytes:
    headers = {"Authorization": f"Bearer {USER_SECRET}"}
    body = {"model": model, "messages": HI, "stream": True}
    url = f"{s.url}/v1/chat/completions"
    async with aiohttp.ClientSession() as http, http.post(url, json=body, headers=headers) as r:
        assert r.status == 200
        return await r.read()


async def test_an_upstreams_comments_and_named_events_never_reach_the_client(s: Setup) -> None:
    s.stand_in.inject = [b": OPENROUTER PROCESSING\n\n", b"event: ping\n\n",
                         b"retry: 100\n\n"]  # fmt: skip
    said = await stream_bytes(s, GPT)
    assert b"OPENROUTER" not in said and b"event:" not in said and b"retry:" not in said
    events = [e for e in said.split(b"\n\n") if e]
    assert all(e.startswith(b"data: ") for e in events) and events[-1] == b"data: [DONE]"
    async with s.openai() as client:  # and the official client reads it as before
        stream = await client.chat.completions.create(model=GPT, messages=HI, stream=True)
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text == "Hello! How can I assist you today?"


async def test_an_upstreams_error_event_is_the_routes_error_in_our_words(s: Setup) -> None:
    s.stand_in.inject = [
        b'event: error\ndata: {"error": {"message": "overloaded at shard 7 for '
        + CREDENTIAL.encode()
        + b'", "type": "server_error"}}\n\n'
    ]
    said = await stream_bytes(s, GPT)
    first = said.split(b"\n\n")[0]
    assert first.startswith(b"data: ")
    error = msgspec.json.decode(first[6:])["error"]
    assert error["code"] == "upstream_error"
    assert b"shard 7" not in said and CREDENTIAL.encode() not in said and b"event:" not in said


async def test_an_answer_past_its_size_bound_is_the_routes_502(
    s: Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The bounds are 16 MiB (whole) and 64 MiB (a stream): lowered under the recordings' sizes.
    monkeypatch.setattr(providers, "MAX_ANSWER_BYTES", 200)
    monkeypatch.setattr(providers, "MAX_STREAM_BYTES", 2000)
    async with s.openai() as client:
        with pytest.raises(openai.InternalServerError) as failed:
            await client.embeddings.create(model=GPT, input="hi")  # 251 bytes, read whole
        assert failed.value.status_code == 502
        await client.chat.completions.create(model=GPT, messages=HI)  # folded: 1668 bytes pass
    said = await stream_bytes(s, GPT)
    monkeypatch.setattr(providers, "MAX_STREAM_BYTES", 800)  # the stream is 1668 bytes
    cut = await stream_bytes(s, GPT)
    assert said.endswith(b"data: [DONE]\n\n")
    last = msgspec.json.decode(cut.split(b"\n\n")[-2][6:])
    assert last["error"]["code"] == "upstream_error" and b"[DONE]" not in cut


async def test_a_stream_that_outlasts_the_deadline_ends_with_a_504_event(s: Setup) -> None:
    s.stand_in.drip_s = 0.6  # under the read timeout each time, 4.2 s in all
    began = asyncio.get_running_loop().time()
    said = await stream_bytes(s, GPT)
    took = asyncio.get_running_loop().time() - began
    last = msgspec.json.decode(said.split(b"\n\n")[-2][6:])
    assert last["error"]["code"] == "upstream_timeout" and b"[DONE]" not in said
    assert DEADLINE_S <= took < DEADLINE_S + 1
    async with s.openai() as client:  # folded: a 504
        with pytest.raises(openai.APIStatusError) as failed:
            await client.chat.completions.create(model=GPT, messages=HI)
    assert failed.value.status_code == 504
