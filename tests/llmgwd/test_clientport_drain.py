"""llmgwd stopping (a restart, an upgrade): the client port stops accepting, yet a request a
client sends on its idle keep-alive connection meanwhile is answered, with Connection: close,
rather than cut; a connection that stays idle is closed after the drain's bound."""

from __future__ import annotations

import asyncio
import time

from aiohttp import web

from llmgw.config import ClientPort
from llmgwd.clientport import listener

REQUEST = b"GET /hi HTTP/1.1\r\nHost: llmgw\r\n\r\n"


async def hi(request: web.Request) -> web.Response:
    return web.json_response({"hi": True})


async def answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    """One HTTP answer off the connection: its status and headers (its body read past)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name:
            headers[name.strip().lower()] = value.strip()
    await reader.readexactly(int(headers.get("content-length", "0")))
    return int(lines[0].split()[1]), headers


async def serving() -> tuple[web.AppRunner, int]:
    app = web.Application()
    app.router.add_get("/hi", hi)
    runner = await listener.serve(app, ClientPort(), "127.0.0.1", 0)
    return runner, int(runner.addresses[0][1])


async def test_a_request_on_an_idle_connection_while_stopping_is_answered_and_ends_it() -> None:
    runner, port = await serving()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(REQUEST)
        status, headers = await answer(reader)
        assert status == 200 and headers.get("connection", "").lower() != "close"
        stopping = asyncio.create_task(runner.cleanup())
        await asyncio.sleep(0.3)  # the port no longer accepts; this connection is idle
        writer.write(REQUEST)  # what a pooled client sends just then
        status, headers = await answer(reader)
        assert status == 200
        assert headers["connection"].lower() == "close"  # the next request opens a new one
        assert await asyncio.wait_for(reader.read(), 10) == b""  # and this one is ended
        await asyncio.wait_for(stopping, 10)
    finally:
        writer.close()


async def test_a_connection_left_idle_is_closed_after_the_drain_bound() -> None:
    runner, port = await serving()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(REQUEST)
        await answer(reader)
        started = time.monotonic()
        await asyncio.wait_for(runner.cleanup(), 10)
        waited = time.monotonic() - started
        assert await asyncio.wait_for(reader.read(), 5) == b""
        # the stop gave it the drain's time (listener.DRAIN_IDLE_S) to bring a request, then
        # closed it (the wait_for bounds the whole stop)
        assert waited >= listener.DRAIN_IDLE_S * 0.9
    finally:
        writer.close()
