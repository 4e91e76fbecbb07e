"""The client port as a client meets it on a real socket: aiohttp's own refusals in our error
shapes with no byte of a key in them or in a log, heads and bodies that trickle are cut off,
one address's connections are capped, /api/v1's body limit holds, CORS allows only the listed
origins, and the Server header says llmgw."""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from llmgw import pki
from llmgw.config import ClientPort, ClusterPort, Metrics, ServerConfig
from llmgwd.clientport import listener
from llmgwd.clientport.gate import (
    OVER_CAP_WAITERS,
    OVER_CAP_WAITERS_PER_CLIENT,
    ConnectionGate,
    FirstByte,
)
from llmgwd.daemon import Daemon

CANARY = "sk-llmgw-CANARYc4n4ryC4N4RY"  # a key-shaped secret that must never come back
OPENAI_KEYS = {"message", "type", "param", "code"}


@dataclass
class Port:
    """A running llmgwd and its client port."""

    daemon: Daemon
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@asynccontextmanager
async def llmgwd(
    tmp_path: Path, metrics: Metrics | None = None, /, **client: Any
) -> AsyncIterator[Port]:
    config = ServerConfig(
        state_dir=str(tmp_path / "state"),
        socket=str(tmp_path / "llmgwd.sock"),
        client=ClientPort(listen="127.0.0.1:0", **client),
        cluster=ClusterPort(listen="127.0.0.1:0", advertise="https://127.0.0.1:17710"),
        metrics=metrics or Metrics(),
    )
    d = Daemon(config)
    await d.start()
    try:
        yield Port(d, d.client_runner.addresses[0][1])
    finally:
        await d.stop()


@dataclass
class Answer:
    """An HTTP answer read off a raw socket."""

    status: int
    headers: dict[str, str]
    body: bytes
    raw: bytes

    def error(self) -> dict[str, Any]:
        assert self.headers["content-type"].startswith("application/json"), self.raw[:300]
        doc = json.loads(self.body)
        assert set(doc) == {"error"}
        detail: dict[str, Any] = doc["error"]
        return detail


def parse(raw: bytes) -> Answer:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return Answer(int(lines[0].split()[1]), headers, body, raw)


async def exchange(port: int, request: bytes) -> Answer:
    """Send request bytes on a new connection; the answer is all read until the server closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    raw = await asyncio.wait_for(reader.read(), 60)
    writer.close()
    return parse(raw)


def all_logged(caplog: pytest.LogCaptureFixture) -> str:
    """Every record as a handler would write it, tracebacks included."""
    formatter = logging.Formatter("%(name)s %(message)s")
    return "\n".join(formatter.format(r) + repr(r.__dict__) for r in caplog.records)


# Finding 7: a malformed or oversized Authorization header.

HEADERS = {
    "oversized": (f"Authorization: Bearer {CANARY}" + "x" * 20_000).encode(),
    "control byte": f"Authorization: Bearer {CANARY}\x01".encode(),
    "space before colon": f"Authorization : Bearer {CANARY}".encode(),
    "bare CR": f"Authorization: Bearer {CANARY}\rX-Other: 1".encode(),
}


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/api/v1/models"])
@pytest.mark.parametrize("header", sorted(HEADERS))
async def test_a_bad_authorization_header_is_answered_in_json_and_never_echoed_or_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, header: str, path: str
) -> None:
    caplog.set_level(logging.DEBUG)
    async with llmgwd(tmp_path) as port:
        request = b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\n"
        answer = await exchange(port.port, request + HEADERS[header] + b"\r\n\r\n")
    assert answer.status == (431 if header == "oversized" else 400)
    error = answer.error()
    assert set(error) == (OPENAI_KEYS if path.startswith("/v1") else OPENAI_KEYS - {"param"})
    assert error["code"] in ("request_header_fields_too_large", "malformed_request")
    assert answer.headers["server"] == "llmgw"
    assert b"CANARY" not in answer.raw and b"Bearer" not in answer.raw
    assert "CANARY" not in all_logged(caplog)
    assert "refused a request from 127.0.0.1" in caplog.text  # it was logged, safely


# Finding 8: time limits on reading a request, and a cap on one address's connections.


async def test_connections_trickling_their_heads_are_closed(tmp_path: Path) -> None:
    async def trickle(port: int) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        read = asyncio.ensure_future(reader.read())
        while not read.done():  # one more header byte every 50 ms, until the server hangs up
            try:
                writer.write(b"X")
                await writer.drain()
            except ConnectionError:
                break
            await asyncio.wait([read], timeout=0.05)
        writer.close()
        return await asyncio.wait_for(read, 60)

    async with llmgwd(tmp_path, head_timeout_s=0.5) as port:
        answers = await asyncio.wait_for(
            asyncio.gather(*(trickle(port.port) for _ in range(50)), return_exceptions=True), 120
        )
        # All 50 were closed without an answer (or reset while the client still wrote).
        assert all(a == b"" or isinstance(a, ConnectionError) for a in answers), answers


async def test_an_idle_keep_alive_connection_outlives_the_head_timeout(tmp_path: Path) -> None:
    async with llmgwd(tmp_path, head_timeout_s=0.2) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port.port)
        for _ in range(2):  # the second request comes after several head timeouts of idling
            writer.write(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
            status = await asyncio.wait_for(reader.readline(), 60)
            assert status.startswith(b"HTTP/1.1 401")
            length = 0
            while (line := await reader.readline()) != b"\r\n":
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            await reader.readexactly(length)
            await asyncio.sleep(1.0)
        writer.close()


async def test_a_stalled_body_is_refused_with_408(tmp_path: Path) -> None:
    async with llmgwd(tmp_path, body_timeout_s=0.3) as port:
        _, secret = await port.daemon.catalog.create_key("root", role="admin")
        head = (
            "POST /api/v1/keys HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {secret}\r\nContent-Length: 100\r\n\r\n"
        )
        answer = await exchange(port.port, head.encode() + b'{"name": "')  # then nothing
    assert answer.status == 408
    assert answer.error()["code"] == "timeout"


async def test_one_address_holds_at_most_its_cap_of_connections(tmp_path: Path) -> None:
    async with llmgwd(tmp_path, max_connections_per_address=3, uncapped_addresses=()) as port:
        held = [await asyncio.open_connection("127.0.0.1", port.port) for _ in range(3)]
        for reader, writer in held:  # each is served, so each is counted by now
            writer.write(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await asyncio.wait_for(reader.readline(), 60)).startswith(b"HTTP/1.1 401")
        get = b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        refused = await exchange(port.port, get)
        assert refused.status == 429
        assert refused.error()["code"] == "too_many_connections"
        assert refused.headers["server"] == "llmgw"
        held[0][1].close()
        for _ in range(600):  # once the server saw that close, a new one is let in
            again = await exchange(port.port, get)
            if again.status != 429:
                break
            await asyncio.sleep(0.05)
        assert again.status == 401
        for _, writer in held[1:]:
            writer.close()


async def test_loopback_is_not_capped_unless_the_settings_say_so(tmp_path: Path) -> None:
    async with llmgwd(tmp_path, max_connections_per_address=1) as port:
        held = [await asyncio.open_connection("127.0.0.1", port.port) for _ in range(3)]
        for reader, writer in held:
            writer.write(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert parse(await asyncio.wait_for(reader.read(), 60)).status == 401
            writer.close()


# Finding 13: /api/v1's own 64 KB limit.


async def test_api_refuses_a_100_kb_body_with_413_in_its_shape(tmp_path: Path) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(100):
            yield b" " * 1024

    async with llmgwd(tmp_path) as port:
        _, secret = await port.daemon.catalog.create_key("root", role="admin")
        auth = {"Authorization": f"Bearer {secret}", "Content-Type": "application/json"}
        async with aiohttp.ClientSession() as s:
            for body in (b" " * 100 * 1024, chunks()):  # declared, then chunked
                async with s.post(f"{port.url}/api/v1/keys", data=body, headers=auth) as r:
                    assert r.status == 413
                    error = (await r.json())["error"]
                    assert error["code"] == "request_too_large"
                    assert "param" in error and "65536" in error["message"]
            async with s.post(f"{port.url}/api/v1/keys", json={"name": "x"}, headers=auth) as r:
                assert r.status == 201  # a small body still goes through


# Finding 15: CORS for the listed origins only, and the Server header.


async def test_cors_allows_only_the_listed_origins(tmp_path: Path) -> None:
    listed, other = "https://chat.example.org", "https://evil.example.com"
    preflight = {"Access-Control-Request-Method": "POST"}
    async with llmgwd(tmp_path, cors_origins=(listed,)) as port, aiohttp.ClientSession() as s:
        for origin, allowed in ((other, None), (listed, listed)):
            url = f"{port.url}/v1/chat/completions"
            async with s.options(url, headers={"Origin": origin, **preflight}) as r:
                assert r.headers.get("Access-Control-Allow-Origin") == allowed
                assert "Access-Control-Allow-Credentials" not in r.headers
                if allowed:
                    assert r.status == 204
                    assert "Authorization" in r.headers["Access-Control-Allow-Headers"]
            async with s.get(f"{port.url}/v1/models", headers={"Origin": origin}) as r:
                assert r.status == 401
                assert r.headers.get("Access-Control-Allow-Origin") == allowed
                assert "Access-Control-Allow-Credentials" not in r.headers
                assert r.headers["Server"] == "llmgw"


async def test_no_origin_is_allowed_by_default_and_the_server_is_just_llmgw(
    tmp_path: Path,
) -> None:
    async with llmgwd(tmp_path) as port, aiohttp.ClientSession() as s:
        origin = {"Origin": "https://evil.example.com", "Access-Control-Request-Method": "POST"}
        for method, path in (("OPTIONS", "/v1/models"), ("GET", "/api/v1/models"), ("GET", "/")):
            async with s.request(method, port.url + path, headers=origin) as r:
                assert not any(h.lower().startswith("access-control-") for h in r.headers)
                assert r.headers["Server"] == "llmgw"
                assert (await r.json())["error"]["message"]  # JSON, even for a 404 at /


# Finding 8, after review: a body's overall time, TLS handshakes, IPv6 clients.


async def trickle_body(port: int, head: str) -> Answer:
    """Send head, then one body byte every 50 ms (never a stall), until the server answers;
    again when a byte written as the server closed made it reset before its answer was read."""
    for _ in range(20):
        try:
            return await trickle_once(port, head)
        except ConnectionResetError:
            continue
    raise AssertionError("every try was reset before its answer came")


async def trickle_once(port: int, head: str, step_s: float = 0.05) -> Answer:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head.encode())
    read = asyncio.ensure_future(reader.read())
    while not read.done():
        try:
            writer.write(b" ")
            await writer.drain()
        except ConnectionError:
            break
        await asyncio.wait([read], timeout=step_s)
    writer.close()
    return parse(await asyncio.wait_for(read, 60))


async def test_a_body_that_trickles_too_slowly_is_refused_with_408(tmp_path: Path) -> None:
    # 20 bytes/s never stalls for body_timeout_s (30 s), but is under the 1,000 bytes/s
    # that body_min_bytes_per_s asks once the 0.3 s grace has passed.
    async with llmgwd(tmp_path, body_grace_s=0.3, body_min_bytes_per_s=1000) as port:
        _, secret = await port.daemon.catalog.create_key("root", role="admin")
        for path in ("/api/v1/keys", "/v1/chat/completions"):
            head = (
                f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Authorization: Bearer {secret}\r\nContent-Length: 60000\r\n\r\n"
            )
            answer = await asyncio.wait_for(trickle_body(port.port, head), 120)
            error = answer.error()
            if path.startswith("/api/"):
                assert (answer.status, error["code"]) == (408, "timeout")
            else:  # the router answers in OpenAI's shape, with the same 408
                assert (answer.status, error["code"]) == (408, "request_timeout")
                assert set(error) == OPENAI_KEYS
                assert "slower than 1000 bytes/s" in error["message"]


async def test_the_time_a_handler_does_not_read_is_not_counted_against_the_body(
    tmp_path: Path,
) -> None:
    async def slow_reader(request: web.Request) -> web.Response:
        await asyncio.sleep(2.0)  # reading is paused meanwhile: the wait is the server's
        return web.json_response({"read": len(await request.read())})

    app = web.Application(client_max_size=8 * 1024 * 1024)
    app.router.add_post("/upload", slow_reader)
    settings = ClientPort(body_grace_s=1.0, body_min_bytes_per_s=1_000_000)
    runner = await listener.serve(app, settings, "127.0.0.1", 0)
    try:
        url = f"http://127.0.0.1:{runner.addresses[0][1]}/upload"
        async with aiohttp.ClientSession() as s, s.post(url, data=b"x" * 4_000_000) as r:
            assert r.status == 200
            assert await r.json() == {"read": 4_000_000}
    finally:
        await runner.cleanup()


def tls_files(tmp_path: Path) -> tuple[dict[str, str], ssl.SSLContext]:
    """A certificate for 127.0.0.1 as client port settings, and a client context trusting it."""
    ca = pki.make_ca()
    pair = pki.make_server_cert(ca)
    cert, key = tmp_path / "client.crt", tmp_path / "client.key"
    pki.write_pair(pair, cert, key)
    trust = ssl.create_default_context(cadata=ca.cert_pem.decode())
    return {"tls_cert": str(cert), "tls_key": str(key)}, trust


async def test_with_tls_connections_stuck_before_their_handshake_are_capped_and_closed(
    tmp_path: Path,
) -> None:
    tls, trust = tls_files(tmp_path)
    capped = {"max_connections_per_address": 2, "uncapped_addresses": ()}
    async with llmgwd(tmp_path, head_timeout_s=0.5, **tls, **capped) as port:
        url = f"https://127.0.0.1:{port.port}/v1/models"
        stuck = [await asyncio.open_connection("127.0.0.1", port.port) for _ in range(2)]
        async with aiohttp.ClientSession() as s:
            with pytest.raises(aiohttp.ClientError):  # the cap is full of unfinished handshakes
                async with s.get(url, ssl=trust) as r:
                    pytest.fail(f"a third connection was served: {r.status}")
            for reader, writer in stuck:  # the server gives up on their handshakes
                assert await asyncio.wait_for(reader.read(), 30) == b""
                writer.close()
            for _ in range(600):  # once the server saw those closes, HTTPS is served again
                try:
                    async with s.get(url, ssl=trust) as r:
                        assert (r.status, r.headers["Server"]) == (401, "llmgw")
                        break
                except aiohttp.ClientError:
                    await asyncio.sleep(0.05)
            else:
                pytest.fail("HTTPS was not served again")


class _Silent(asyncio.Protocol):
    """What FirstByte hands a connection to here: it holds it, saying nothing."""


async def held_open(conns: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]) -> int:
    """How many of conns the server still holds open (a read neither ends nor fails)."""

    async def still_open(reader: asyncio.StreamReader) -> bool:
        try:
            await asyncio.wait_for(reader.read(1), 0.3)
        except TimeoutError:
            return True
        except OSError:
            return False
        return False

    return sum(await asyncio.gather(*(still_open(r) for r, _ in conns)))


async def test_idle_connections_over_the_cap_are_closed_but_one_a_client(tmp_path: Path) -> None:
    # Silent connections to a port that serves TLS and plain HTTP both: one over the cap
    # waits for its first byte (to be told 429), uncounted; the rest are closed at once.
    gate = ConnectionGate(2, uncapped=())
    server = await asyncio.get_running_loop().create_server(
        lambda: FirstByte(_Silent, _Silent, gate, 30.0), "127.0.0.1", 0, backlog=512
    )
    port = server.sockets[0].getsockname()[1]
    conns = []
    try:
        for _ in range(60):
            conns.append(await asyncio.open_connection("127.0.0.1", port))
        await asyncio.sleep(0.2)
        assert 2 <= await held_open(conns) <= 2 + OVER_CAP_WAITERS_PER_CLIENT  # of 60
        # Many clients (loopback's 127.0.0.x) each one over: at most OVER_CAP_WAITERS wait.
        for n in range(10, 10 + OVER_CAP_WAITERS + 8):
            for _ in range(3):
                conns.append(
                    await asyncio.open_connection("127.0.0.1", port, local_addr=(f"127.0.0.{n}", 0))
                )
        await asyncio.sleep(0.2)
        clients = OVER_CAP_WAITERS + 9  # each holds its 2; of 72 over the cap, 16 wait
        assert 2 * clients <= await held_open(conns) <= 2 * clients + OVER_CAP_WAITERS
    finally:
        for _, writer in conns:
            writer.close()
        server.close()
        await server.wait_closed()


def test_an_ipv6_client_is_counted_by_its_64() -> None:
    gate = ConnectionGate(2, uncapped=["::1/128"])
    assert gate.admit("2001:db8:0:7::1") == gate.admit("2001:db8:0:7::2") == "2001:db8:0:7::/64"
    assert gate.admit("2001:db8:0:7:ffff::9") is None  # a third address of the same /64
    assert gate.admit("2001:db8:0:8::1") == "2001:db8:0:8::/64"  # the next /64 is another client
    for address in ("192.0.2.1", "::ffff:192.0.2.1"):  # IPv4 by address, mapped or not
        assert gate.admit(address) == "192.0.2.1"
    assert gate.admit("192.0.2.1") is None
    assert gate.admit("192.0.2.2") == "192.0.2.2"
    assert all(gate.admit("::1") for _ in range(3))  # an uncapped address stays uncapped
    gate.release("2001:db8:0:7::/64")
    assert gate.admit("2001:db8:0:7::3") == "2001:db8:0:7::/64"
