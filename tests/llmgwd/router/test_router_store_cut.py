"""A control plane cut off from the store past its grace refuses /v1 (a key revoked
meanwhile must not keep working there), in OpenAI's shape, and serves again once back."""

from __future__ import annotations

import aiohttp
import openai
import pytest

from llmgwd.router import Router
from tests.llmgwd.router.test_router_v1 import (
    CHAT,
    MODEL,
    USER_SECRET,
    FakeEngine,
    FakeKeys,
    FakeModels,
    FakePool,
    assert_error_shape,
    endpoint,
    engine,  # noqa: F401 (a fixture)
    serve,
)


async def test_stale_control_plane_refuses_then_serves_again(engine: FakeEngine) -> None:  # noqa: F811
    stale = [0.0]
    pool = FakePool({MODEL: [endpoint(engine.url)]}, {MODEL: 1})
    router = Router(FakeKeys(), FakeModels(MODEL), pool, stale_s=lambda: stale[0])
    async with serve(router) as url, aiohttp.ClientSession() as http:
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=USER_SECRET, max_retries=0)
        answer = await client.chat.completions.create(**CHAT)  # type: ignore[call-overload]
        assert answer.choices[0].message.content

        stale[0] = 42.0
        headers = {"Authorization": f"Bearer {USER_SECRET}"}
        async with http.post(f"{url}/v1/chat/completions", json=CHAT, headers=headers) as resp:
            body = await resp.json()
            assert resp.status == 503 and int(resp.headers["Retry-After"]) > 0
        assert_error_shape(body, "store_unreachable")
        assert "42 s" in body["error"]["message"] and USER_SECRET not in body["error"]["message"]
        with pytest.raises(openai.InternalServerError):
            await client.models.list()
        seen = len(engine.seen)

        stale[0] = 0.0
        answer = await client.chat.completions.create(**CHAT)  # type: ignore[call-overload]
        assert answer.choices[0].message.content and len(engine.seen) == seen + 1
        await client.close()
