"""/api/v1's routes run in-process for the console: a request made for one Route record, routed
by the API's own router and run through that route's guard and handler as the signed-in
person's principal, so the console reads and changes nothing the API would not."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import msgspec
from aiohttp import web
from aiohttp.http import HttpVersion11
from aiohttp.http_parser import RawRequestMessage
from aiohttp.streams import StreamReader
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from llmgw.api_types import ErrorAnswer
from llmgwd import auth
from llmgwd.api.base import API_PREFIX, MAX_BODY_BYTES, errors_middleware
from llmgwd.api.route import Route, plain_path
from llmgwd.clientport import forwarded

_PARAM = "{%s}"


@dataclass(frozen=True, slots=True)
class Answer:
    """What a route answered: its status and body (JSON)."""

    status: int
    body: bytes

    @property
    def ok(self) -> bool:
        """A 2xx answer."""
        return 200 <= self.status < 300

    def message(self) -> str:
        """The refusal's words (ErrorAnswer's message), or "" for a 2xx."""
        if self.ok:
            return ""
        try:
            return msgspec.json.decode(self.body, type=ErrorAnswer).error.message
        except msgspec.MsgspecError:
            return f"HTTP {self.status}"


def route_path(route: Route, params: Mapping[str, str]) -> str:
    """route's path under /api/v1 with params in place (each quoted whole: a "/" in one is
    never a step of the path), or ValueError when params are not exactly the path's."""
    path = plain_path(route.path)
    names = {n for n in params if _PARAM % n in path}
    if names != set(params) or "{" in _filled(path, {n: "" for n in names}):
        raise ValueError(f"{route.method} {route.path} takes its path's parameters only")
    return API_PREFIX + _filled(path, {n: quote(v, safe="") for n, v in params.items()})


def _carry_client(outer: web.BaseRequest, inner: web.BaseRequest) -> None:
    """The client the client port took the outer request's to be (a trusted proxy's
    X-Forwarded-For, and that it came by the proxy) is the inner one's: what a route asks of
    the client's path (access.private_path) is asked of the browser's, not of the proxy's hop."""
    if forwarded.CLIENT in outer:
        inner[forwarded.CLIENT] = outer[forwarded.CLIENT]
    if forwarded.PROXIED in outer:
        inner[forwarded.PROXIED] = outer[forwarded.PROXIED]


def _filled(path: str, params: Mapping[str, str]) -> str:
    for name, value in params.items():
        path = path.replace(_PARAM % name, value)
    return path


def _message(
    method: str, url: URL, body: bytes | None, outer: web.BaseRequest
) -> RawRequestMessage:
    headers = CIMultiDict[str]({"Host": "console", "Content-Length": str(len(body or b""))})
    if body is not None:
        headers["Content-Type"] = "application/json"
    for proto in outer.headers.getall("X-Forwarded-Proto", []):  # read only where PROXIED
        headers.add("X-Forwarded-Proto", proto)
    raw = tuple((k.encode(), v.encode()) for k, v in headers.items())
    return RawRequestMessage(
        method, str(url), HttpVersion11, CIMultiDictProxy(headers), raw,
        False, None, False, False, url,
    )  # fmt: skip


async def call(
    outer: web.Request,
    api: web.Application,
    who: auth.Principal,
    route: Route,
    params: Mapping[str, str],
    *,
    query: Mapping[str, str] | None = None,
    body: bytes | None = None,
) -> Answer:
    """Run route as who (its guard decides) and give its answer; outer: the console's request,
    whose connection the inner one borrows. The API's router must route the path to this
    very record, or it is a ValueError."""
    url = URL(route_path(route, params), encoded=True).with_query(query or {})
    loop = asyncio.get_running_loop()
    payload = StreamReader(outer.protocol, MAX_BODY_BYTES, loop=loop)
    payload.feed_data(body or b"")
    payload.feed_eof()
    inner = web.Request(
        _message(route.method, url, body, outer), payload, outer.protocol, outer.writer, outer.task,
        loop, client_max_size=MAX_BODY_BYTES, remote=outer.remote,
    )  # fmt: skip
    match = await api.router.resolve(inner)
    resource = match.route.resource
    routed = match.route.method, resource.canonical if resource is not None else ""
    if match.http_exception is not None or routed != (route.method, API_PREFIX + route.plain):
        raise ValueError(f"{url.path} is not {route.method} {route.path}")
    match.add_app(api)
    match.freeze()
    inner._match_info = match  # what Application._handle sets; key_auth's part is ours
    inner[auth.PRINCIPAL] = who
    _carry_client(outer, inner)
    response = await errors_middleware(inner, match.handler)
    data = response.body if isinstance(response, web.Response) else b""
    return Answer(response.status, bytes(data) if isinstance(data, (bytes, bytearray)) else b"")


def decoded(answer: Answer, route: Route) -> Any:
    """A 2xx answer decoded into the route's answer type."""
    return msgspec.json.decode(answer.body, type=route.answer)
