"""The gateway's own cost in every /v1 answer: the x-llmgw-overhead-ms header.

It is the time from the start of the /v1 handling (the request's headers read) to the start
of the answer's headers, less the time the engine that answered spent on the exchange: from
the request sent to it to its answer's headers for a stream (so it is known when the
stream's headers go out), to the end of its answer otherwise. What is left is llmgw's: the
client's body read, checks, limits, waiting for a free slot, tries on replicas that did not
take the request, and the answer's rewriting. An answer made without an engine (an error,
/v1/models) counts whole.
"""

from __future__ import annotations

import time

from aiohttp import web

HEADER = "x-llmgw-overhead-ms"

STARTED = web.RequestKey("llmgw_started", float)  # perf_counter() when handling began (set
# by the outermost /v1 middleware, router/errors.py)
ENGINE_SENT = web.RequestKey("llmgw_engine_sent", float)  # when the request went to the engine
ENGINE_S = web.RequestKey("llmgw_engine_s", float)  # the answering engine's share, seconds


def engine_sent(request: web.Request) -> None:
    """The request is being sent to an engine now (each try: the last one counts)."""
    request[ENGINE_SENT] = time.perf_counter()
    request[ENGINE_S] = 0.0


def engine_answered(request: web.Request) -> None:
    """The engine's answer (its headers, or its whole body) is in."""
    request[ENGINE_S] = time.perf_counter() - request[ENGINE_SENT]


def add_header(request: web.Request, response: web.StreamResponse) -> None:
    """The header, in milliseconds with two decimals (called as the answer's headers go out)."""
    started = request.get(STARTED)
    if started is None:
        return
    spent = time.perf_counter() - started - request.get(ENGINE_S, 0.0)
    response.headers[HEADER] = f"{max(spent, 0.0) * 1000:.2f}"
