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

from llmgwd.router.exchange import Exchange

HEADER = "x-llmgw-overhead-ms"

# The request's exchange (router/exchange.py) holds the times: when handling began (set by
# the outermost /v1 middleware, router/errors.py), when the request went to the engine and
# the answering engine's share.


def engine_sent(ex: Exchange) -> None:
    """The request is being sent to an engine now (each try: the last one counts)."""
    ex.engine_sent = time.perf_counter()
    ex.engine_s = 0.0


def engine_answered(ex: Exchange) -> None:
    """The engine's answer (its headers, or its whole body) is in."""
    ex.engine_s = time.perf_counter() - ex.engine_sent


def add_header(ex: Exchange, response: web.StreamResponse) -> None:
    """The header, in milliseconds with two decimals (called as the answer's headers go out)."""
    spent = time.perf_counter() - ex.started - ex.engine_s
    response.headers[HEADER] = f"{max(spent, 0.0) * 1000:.2f}"
