"""One /v1 request's state, shared by the router's modules: one object a request, under one key."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

if TYPE_CHECKING:
    from llmgwd.router.isolation import Ticket
    from llmgwd.router.usage_events import Tally


class Exchange:
    """What the router's modules note on a /v1 request as it goes: made by the outermost /v1
    middleware (router/errors.py) as the request's handling begins, read by the access line,
    the metrics, the answer's headers and the proxy. Every attribute is set from the start:
    no look-up ever misses."""

    __slots__ = ("body_type", "body_unsent", "engine", "engine_s", "engine_sent", "fold", "key_id",
                 "model", "outcome", "rate_headers", "replica", "request_id", "started",
                 "stream", "tally", "ticket")  # fmt: skip

    def __init__(self, request_id: str, started: float) -> None:
        self.request_id = request_id
        self.started = started  # perf_counter() when handling began (router/overhead.py)
        self.outcome = ""  # for the access line: cancelled, client_gone, upstream_broke
        self.model: str | None = None  # the model the client named, once read
        self.engine = ""  # that model's engine (llama.cpp, vllm), once found
        self.key_id: str | None = None  # the key's id, once its secret matched one
        self.replica = ""  # the replica last sent the request
        self.stream: web.StreamResponse | None = None  # prepared: a stream's headers went out
        self.engine_sent = 0.0  # when the request went to the engine (each try: the last)
        self.engine_s = 0.0  # the answering engine's share, seconds (router/overhead.py)
        self.ticket: Ticket | None = None  # llama.cpp's cache ticket (router/isolation.py)
        self.rate_headers: dict[str, str] | None = None  # x-ratelimit-*, success too
        self.tally: Tally | None = None  # the admitted request's tally (router/usage_events.py)
        # The body's type for the engine: a multipart form's, with its boundary, when not JSON
        # (router/transcriptions.py).
        self.body_type = "application/json"
        # The client asked for a whole answer but the engine is asked for a stream, to be
        # folded into one (router/folding.py).
        self.fold = False
        self.body_unsent = False  # no 100 was sent: the body never comes (router/expect.py)


EXCHANGE = web.RequestKey("llmgw_exchange", Exchange)
