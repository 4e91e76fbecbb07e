"""POST /v1/audio/transcriptions with the official openai client: the multipart form checked
and bounded, only its known fields passed on, usage counted, each error in OpenAI's shape, and
a model whose engine lacks the route (llama-server's recorded 501 for a text-only model)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import aiohttp
import openai
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from llmgwd.router import Balancer, Router
from llmgwd.router.metering import Meter
from tests.llmgwd.router.test_router_metering import LimitedKeys, Metered, PricedModels
from tests.llmgwd.router.test_router_v1 import (
    ENGINE_KEY,
    MODEL,
    USER_SECRET,
    FakePool,
    Gateway,
    endpoint,
    serve,
)

AUDIO = b"RIFF\x24\x00\x00\x00WAVEfmt " + bytes(range(256)) * 8  # bytes the engine must get whole
RECORDED = Path(__file__).parent / "llama_answers"
LACKING = json.loads((RECORDED / "transcriptions_lacking.json").read_text())
# OpenAI's documented answer (no audio model is built here to record one from).
USAGE = {"type": "tokens", "input_tokens": 14, "output_tokens": 4, "total_tokens": 18}
ANSWER = {"text": "Hello there.", "logprobs": None, "usage": USAGE}
LIMIT = 64 * 1024


class AudioEngine:
    """Answers a transcription (or, lacking, llama-server's 501), keeping the form it got."""

    def __init__(self) -> None:
        self.forms: list[tuple[dict[str, str], tuple[str, str, bytes]]] = []
        self.lacking = False

    def app(self) -> web.Application:
        app = web.Application(client_max_size=LIMIT * 2)
        app.router.add_post("/v1/audio/transcriptions", self._answer)
        return app

    async def _answer(self, request: web.Request) -> web.Response:
        assert request.headers["Authorization"] == f"Bearer {ENGINE_KEY}"
        post = await request.post()
        upload: Any = post["file"]
        texts = {k: str(v) for k, v in post.items() if k != "file"}
        self.forms.append((texts, (upload.filename, upload.content_type, upload.file.read())))
        if self.lacking:
            return web.json_response(LACKING, status=501)
        if texts.get("response_format") == "text":
            return web.Response(text="Hello there.\n", content_type="text/plain")
        return web.json_response({**ANSWER, "model": "/models/whisper.gguf", "timings": {}})


@pytest.fixture
async def m() -> AsyncIterator[Metered]:
    fake = AudioEngine()
    server = TestServer(fake.app(), host="127.0.0.1")
    await server.start_server()
    url = str(server.make_url("")).rstrip("/")
    pool = FakePool({MODEL: [endpoint(url)]}, {MODEL: 1})
    keys, meter = LimitedKeys(), Meter()
    router = Router(keys, PricedModels(), pool, meter=meter, balancer=Balancer(pool),
                    max_audio_bytes=LIMIT)  # fmt: skip
    async with serve(router) as gw_url, aiohttp.ClientSession() as http:
        yield Metered(Gateway(gw_url, fake, pool, router, http), meter, keys)  # type: ignore[arg-type]
    await server.close()


def engine(m: Metered) -> AudioEngine:
    found: Any = m.gw.engine
    return found  # type: ignore[no-any-return]


async def test_a_transcription_is_passed_on_answered_and_counted(m: Metered) -> None:
    async with m.gw.openai() as client:
        answer = await client.audio.transcriptions.create(
            model=MODEL, file=("../../x\r\n.wav", AUDIO, "audio/wav"), language="en",
            temperature=0.2,
        )  # fmt: skip
        text = await client.audio.transcriptions.create(
            model=MODEL, file=("a.mp3", AUDIO, "text/html"), response_format="text"
        )
    assert answer.text == "Hello there." and text.strip() == "Hello there."
    assert answer.usage is not None and answer.usage.type == "tokens"
    assert "model" not in answer.model_dump() and "timings" not in answer.model_dump()
    counts = (await m.usage())[MODEL]
    assert (counts.requests, counts.prompt_tokens, counts.completion_tokens) == (2, 14, 4)
    (fields, upload), (_, second) = engine(m).forms
    assert fields == {"model": MODEL, "language": "en", "temperature": "0.2"}
    assert upload == ("audio.wav", "audio/wav", AUDIO)  # the client's file name never passes
    assert second == ("audio.mp3", "application/octet-stream", AUDIO)


async def test_unknown_or_bad_fields_are_refused_before_the_engine(m: Metered) -> None:
    async with m.gw.openai() as client:
        with pytest.raises(openai.BadRequestError) as unknown:
            await client.audio.transcriptions.create(
                model=MODEL, file=("a.wav", AUDIO), extra_body={"n_threads": "8"}
            )
        with pytest.raises(openai.BadRequestError) as bad_format:
            await client.audio.transcriptions.create(
                model=MODEL, file=("a.wav", AUDIO), response_format=cast(Any, "xml")
            )
        with pytest.raises(openai.BadRequestError) as too_hot:
            await client.audio.transcriptions.create(model=MODEL, file=("a.wav", AUDIO),
                                                     temperature=3)  # fmt: skip
        with pytest.raises(openai.NotFoundError) as no_model:
            await client.audio.transcriptions.create(model="nope", file=("a.wav", AUDIO))
    assert unknown.value.code == "unknown_parameter" and unknown.value.param == "n_threads"
    assert bad_format.value.param == "response_format" and too_hot.value.param == "temperature"
    assert no_model.value.code == "model_not_found"
    assert engine(m).forms == []


async def test_the_forms_bounds_and_shape(m: Metered) -> None:
    async with m.gw.openai(key="sk-wrong") as client:
        with pytest.raises(openai.AuthenticationError):
            await client.audio.transcriptions.create(model=MODEL, file=("a.wav", AUDIO))
    async with m.gw.openai() as client:
        with pytest.raises(openai.APIStatusError) as too_large:
            await client.audio.transcriptions.create(model=MODEL, file=("a.wav", b"x" * LIMIT))
    assert too_large.value.status_code == 413
    status, body, _ = await m.gw.post("/v1/audio/transcriptions", {"model": MODEL, "file": "x"})
    assert status == 400 and "multipart/form-data" in body["error"]["message"]
    many = aiohttp.FormData({"model": MODEL}, default_to_multipart=True)
    for _ in range(100):  # a form of many parts ends at the first one given twice
        many.add_field("prompt", "p")
    two = aiohttp.FormData({"model": MODEL}, default_to_multipart=True)
    two.add_field("file", AUDIO, filename="a.wav")
    two.add_field("file", AUDIO, filename="b.wav")
    no_file = aiohttp.FormData({"model": MODEL}, default_to_multipart=True)
    long = aiohttp.FormData({"model": MODEL, "prompt": "p" * 5000})
    long.add_field("file", AUDIO, filename="a.wav")
    answers = []
    for form in (many, two, no_file, long):
        url, auth = f"{m.gw.url}/v1/audio/transcriptions", f"Bearer {USER_SECRET}"
        async with m.gw.http.post(url, data=form, headers={"Authorization": auth}) as resp:
            answers.append((resp.status, (await resp.json())["error"]))
    assert [a[0] for a in answers] == [400, 400, 400, 400]
    assert "'prompt' is given more than once" in answers[0][1]["message"]
    assert "'file' is given more than once" in answers[1][1]["message"]
    assert answers[2][1]["code"] == "missing_required_parameter"
    assert answers[3][1]["param"] == "prompt"
    headers = {"Authorization": f"Bearer {USER_SECRET}",
               "Content-Type": "multipart/form-data; boundary=b"}  # fmt: skip
    cut = b'--b\r\nContent-Disposition: form-data; name="model"\r\n\r\nsmoll'  # no end
    async with m.gw.http.post(url, data=cut, headers=headers) as resp:
        assert resp.status == 400 and (await resp.json())["error"]["param"] == "file"
    assert engine(m).forms == []


async def test_a_model_whose_engine_lacks_the_route_is_a_clear_400(m: Metered) -> None:
    engine(m).lacking = True
    async with m.gw.openai() as client:
        with pytest.raises(openai.BadRequestError) as e:
            await client.audio.transcriptions.create(model=MODEL, file=("a.wav", AUDIO))
    assert e.value.code == "model_not_supported"
    assert "/v1/audio/transcriptions" in e.value.message
