"""`Expect: 100-continue` on /v1: 100 only for a request its route will read (its key good, its
Content-Length within the route's limit), else no 100, the handler's refusal, and a close."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import hdrs, web
from aiohttp.http import HttpVersion11

from llmgwd.router import errors
from llmgwd.router.exchange import EXCHANGE, Exchange

Check = Callable[[web.Request], object]  # raises the route's ApiError (a bad key) or returns
ExpectHandler = Callable[[web.Request], Awaitable[None]]


def continue_if(check: Check, limit: int) -> ExpectHandler:
    """A route's expect handler: 100 Continue when check passes and the declared length is at
    most limit; otherwise nothing, and the handler refuses the request (before reading its
    body, in the route's own shape, through the middleware that logs and counts it)."""

    async def expect(request: web.Request) -> None:
        if request.version != HttpVersion11:
            return
        if request.headers.get(hdrs.EXPECT, "").lower() != "100-continue":
            return  # another expectation: ignored (RFC 9110 lets a server), the body read
        # The request's exchange begins here: the /v1 middleware, run next, takes it over
        # (router/errors.py), with what check noted (the key's id) and whether a 100 went out.
        request[EXCHANGE] = ex = Exchange("", 0.0)
        length = request.content_length
        if length is not None and length > limit:
            ex.body_unsent = True
            return
        try:
            check(request)
        except errors.ApiError:
            ex.body_unsent = True
            return
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0  # as aiohttp's own: the answer has not begun

    return expect


async def close_unsent(request: web.Request, response: web.StreamResponse) -> None:
    """on_response_prepare: an answer to a request whose body was never asked for closes its
    connection (the client may send it after all; nothing after it can be trusted)."""
    ex = request.get(EXCHANGE)
    if ex is not None and ex.body_unsent:
        response.force_close()  # the server closes after it (its headers are made already:
        response.headers[hdrs.CONNECTION] = "close"  # the client is told here)
