"""A local stand-in for external providers' APIs (OpenAI's and Anthropic's): it answers what
the APIs' own references print (provider_answers/README.md says where each answer is from),
checks the credential as each API does, and keeps what it was sent."""

from __future__ import annotations

import argparse
import asyncio
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

ANSWERS = Path(__file__).parent / "provider_answers"
ANTHROPIC_VERSION = "2023-06-01"


def recorded(name: str) -> bytes:
    """A recorded answer's bytes."""
    return (ANSWERS / name).read_bytes()


def events(name: str) -> list[bytes]:
    """A recorded stream's events, each with its blank line."""
    return [e + b"\n\n" for e in recorded(name).split(b"\n\n") if e.strip()]


@dataclass
class Seen:
    """One request the stand-in was sent."""

    path: str
    headers: dict[str, str]
    body: dict[str, Any]


@dataclass
class StandIn:
    """Both APIs under /v1, taking one credential. fail: answer that status with that recorded
    body (and Retry-After: retry_after) instead; gate: hold answers until it is set; stall:
    send headers and then nothing; pause: hold a stream after its first event until it is set
    (a provider's stream goes on whether or not llmgw's client stays); inject: events a chat
    stream sends before its recorded ones; drip_s: the wait before each event of a stream."""

    credential: str
    seen: list[Seen] = field(default_factory=list)
    fail: tuple[int, str] | None = None
    retry_after: str = ""
    gate: asyncio.Event | None = None
    stall: bool = False
    pause: asyncio.Event | None = None
    inject: list[bytes] = field(default_factory=list)  # events a chat stream sends first
    drip_s: float = 0.0  # the wait before each event of a stream
    finished: int = 0  # streams sent to their end
    url: str = ""

    def app(self) -> web.Application:
        """The stand-in's application."""
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/embeddings", self._embeddings)
        app.router.add_post("/v1/responses", self._responses)
        app.router.add_post("/v1/messages", self._messages)
        app.router.add_post("/v1/messages/count_tokens", self._count_tokens)
        return app

    async def _take(self, request: web.Request, anthropic: bool) -> dict[str, Any] | web.Response:
        body: dict[str, Any] = await request.json()
        self.seen.append(Seen(request.path, dict(request.headers), body))
        if anthropic:
            ok = request.headers.get("x-api-key") == self.credential and (
                request.headers.get("anthropic-version") == ANTHROPIC_VERSION
            )
        else:
            ok = request.headers.get("Authorization") == f"Bearer {self.credential}"
        if not ok:
            return _json(401, recorded("anthropic_401.json" if anthropic else "openai_401.json"))
        if self.fail is not None:
            headers = {"Retry-After": self.retry_after} if self.retry_after else {}
            return _json(self.fail[0], recorded(self.fail[1]), headers)
        if self.gate is not None:
            await self.gate.wait()
        return body

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await self._take(request, anthropic=False)
        if isinstance(body, web.Response):
            return body
        if not body.get("stream"):
            return _json(200, recorded("openai_chat.json"))
        chunks = events("openai_chat_stream.txt")
        if not (body.get("stream_options") or {}).get("include_usage"):
            chunks = [c for c in chunks if b'"choices":[]' not in c]  # OpenAI's: no usage chunk
        return await self._stream(request, [*self.inject, *chunks])

    async def _embeddings(self, request: web.Request) -> web.StreamResponse:
        body = await self._take(request, anthropic=False)
        if isinstance(body, web.Response):
            return body
        return _json(200, recorded("openai_embeddings.json"))

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        body = await self._take(request, anthropic=False)
        if isinstance(body, web.Response):
            return body
        chunks = events("openai_responses_stream.txt")
        if not body.get("stream"):  # the whole answer: the completed event's response
            last = chunks[-1].split(b"data: ", 1)[1]
            return _json(200, json.dumps(json.loads(last)["response"]).encode())
        return await self._stream(request, chunks)

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        body = await self._take(request, anthropic=True)
        if isinstance(body, web.Response):
            return body
        if not body.get("stream"):
            return _json(200, recorded("anthropic_message.json"))
        return await self._stream(request, events("anthropic_stream.txt"))

    async def _count_tokens(self, request: web.Request) -> web.StreamResponse:
        body = await self._take(request, anthropic=True)
        if isinstance(body, web.Response):
            return body
        return _json(200, recorded("anthropic_count_tokens.json"))

    async def _stream(self, request: web.Request, chunks: list[bytes]) -> web.StreamResponse:
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        await out.prepare(request)
        if self.stall:
            await asyncio.sleep(3600)
        for i, chunk in enumerate(chunks):
            if i == 1 and self.pause is not None:
                await self.pause.wait()
            await asyncio.sleep(self.drip_s)
            await out.write(chunk)
        await out.write_eof()
        self.finished += 1
        return out


def _json(status: int, body: bytes, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        status=status, body=body, content_type="application/json", headers=headers or {}
    )


def main() -> None:
    """Serve the stand-in on 127.0.0.1:PORT (integration tests run it as a process)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--credential-file", required=True)
    args = parser.parse_args()
    credential = Path(args.credential_file).read_text().strip()
    app = StandIn(credential).app()
    web.run_app(app, host="127.0.0.1", port=args.port, print=None)


if __name__ == "__main__":
    main()
