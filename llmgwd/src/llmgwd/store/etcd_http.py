"""A small client of etcd's v3 JSON gateway over aiohttp: requests, streams, TLS, errors, base64.

etcd 3.4+ serves its gRPC API as JSON on the client port (grpc-gateway): each call is a POST
of the request message as JSON (int64 as strings, bytes as base64, fields at their zero value
left out), a streaming call answers one JSON object a line, each {"result": ...} or
{"error": ...}. No protobuf and no gRPC library are needed.
"""

from __future__ import annotations

import base64
import json
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

from llmgw import pki
from llmgwd.store.base import StoreUnavailable

Json = dict[str, Any]

CALL_TIMEOUT_S = 15.0  # over etcd's own request timeout (5 s plus two elections)
CONNECT_TIMEOUT_S = 5.0

# gRPC status codes etcd answers with (in the gateway's "code").
NOT_FOUND = 5
OUT_OF_RANGE = 11


class EtcdError(Exception):
    """etcd refused a request: its gRPC code and message (etcd's messages hold no key or value)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"etcd: {message} (code {code})")
        self.code = code
        self.message = message


class EtcdUnavailable(EtcdError, StoreUnavailable):
    """The member could not be reached, or the connection broke before an answer."""

    def __init__(self, endpoint: str, why: str) -> None:
        super().__init__(14, f"{endpoint} unreachable: {why}")  # 14: gRPC's UNAVAILABLE


class EtcdBusy(EtcdError, StoreUnavailable):
    """The member answered that it cannot serve now: UNAVAILABLE (no leader, leader changed)
    or DEADLINE_EXCEEDED (request timed out), as etcd says while its quorum is lost or moving."""


# gRPC codes of a member that cannot serve now (DEADLINE_EXCEEDED, UNAVAILABLE).
BUSY_CODES = (4, 14)


def b64(data: bytes | str) -> str:
    """A key or value as the gateway takes it."""
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


def unb64(text: str | None) -> bytes:
    """A key or value as the gateway gives it (absent means empty)."""
    return base64.b64decode(text) if text else b""


def tls_context(ca_file: Path, cert_file: Path, key_file: Path) -> ssl.SSLContext:
    """TLS to a member: trust only the cluster CA, present our client certificate."""
    return pki.client_context(pki.read_pem(ca_file), cert_file, key_file)


class EtcdHttp:
    """One member's client URL, over one pooled aiohttp session."""

    def __init__(self, endpoint: str, tls: ssl.SSLContext | None = None) -> None:
        self.endpoint = endpoint.rstrip("/")
        self._tls = tls
        self._session: aiohttp.ClientSession | None = None
        self._streams: set[aiohttp.ClientResponse] = set()

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(ssl=self._tls if self._tls else False, limit=256)
            self._session = aiohttp.ClientSession(connector=connector)
        return self._session

    async def call(self, path: str, body: Json) -> Json:
        """POST one request; its answer, or EtcdError."""
        timeout = aiohttp.ClientTimeout(total=CALL_TIMEOUT_S, sock_connect=CONNECT_TIMEOUT_S)
        try:
            async with self._open().post(self.endpoint + path, json=body, timeout=timeout) as r:
                answer = await r.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError) as e:
            raise EtcdUnavailable(self.endpoint, type(e).__name__) from None
        if not isinstance(answer, dict):
            raise EtcdUnavailable(self.endpoint, "an answer that is not a JSON object")
        _raise_for(answer)
        return answer

    async def stream(self, path: str, body: Json) -> AsyncIterator[Json]:
        """POST a streaming request; each result as it comes. Ends when the member ends it;
        raises EtcdError for an error line and EtcdUnavailable when the connection breaks."""
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S)
        response: aiohttp.ClientResponse | None = None
        try:
            async with self._open().post(self.endpoint + path, json=body, timeout=timeout) as r:
                response = r
                self._streams.add(r)
                pending = b""
                async for chunk in r.content.iter_any():
                    pending += chunk
                    *lines, pending = pending.split(b"\n")
                    for line in lines:
                        if line.strip():
                            yield _result(line)
                if pending.strip():
                    yield _result(pending)
        except (aiohttp.ClientError, TimeoutError) as e:
            raise EtcdUnavailable(self.endpoint, type(e).__name__) from None
        finally:
            if response is not None:
                self._streams.discard(response)

    async def close(self) -> None:
        """Close every stream (its reader sees the connection end), then the session."""
        for r in list(self._streams):
            r.close()
        if self._session is not None:
            await self._session.close()


def _result(line: bytes) -> Json:
    """One line of a stream: its result, or EtcdError."""
    try:
        message = json.loads(line)
    except ValueError:
        raise EtcdError(13, "a stream line that is not JSON") from None
    error = message.get("error")
    if isinstance(error, dict):  # a streaming call's error: {"error": {"grpc_code": ...}}
        _raise_for(error)
    _raise_for(message)
    result = message.get("result", {})
    return result if isinstance(result, dict) else {}


def _raise_for(answer: Json) -> None:
    """EtcdError for an error answer ({"error": ..., "code": ..., "message": ...})."""
    if "error" not in answer and "grpc_code" not in answer and "http_code" not in answer:
        return
    code = answer.get("code", answer.get("grpc_code"))
    message = answer.get("message") or answer.get("error") or "unknown error"
    code = code if isinstance(code, int) else 2  # 2: UNKNOWN
    raise (EtcdBusy if code in BUSY_CODES else EtcdError)(code, str(message))
