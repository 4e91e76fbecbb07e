"""A small HTTP forward proxy on the loopback for the tests: CONNECT tunnels and absolute-form
requests, each one recorded (method, target, Proxy-Authorization); it can refuse them all."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from urllib.parse import urlsplit


@dataclass
class ForwardProxy:
    """Forwards what it is asked, or answers refuse (a status) to every request."""

    refuse: int = 0
    seen: list[tuple[str, str, str]] = field(default_factory=list)
    url: str = ""
    _server: asyncio.Server | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self.url

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def targets(self) -> list[str]:
        return [target for _, target, _ in self.seen]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._one(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, OSError):
            pass
        finally:
            writer.close()
            self._tasks.discard(task)

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
        first, *lines = head.split("\r\n")
        method, target, _ = first.split(" ", 2)
        headers = [(k.strip(), v.strip()) for k, _, v in (ln.partition(":") for ln in lines if ln)]
        auth = next((v for k, v in headers if k.lower() == "proxy-authorization"), "")
        self.seen.append((method, target, auth))
        if self.refuse:
            writer.write(f"HTTP/1.1 {self.refuse} Refused\r\nContent-Length: 0\r\n\r\n".encode())
            await writer.drain()
            return
        if method == "CONNECT":
            host, _, port = target.rpartition(":")
            up_r, up_w = await asyncio.open_connection(host, int(port))
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        else:
            u = urlsplit(target)
            up_r, up_w = await asyncio.open_connection(u.hostname, u.port or 80)
            path = u.path + (f"?{u.query}" if u.query else "")
            dropped = ("proxy-authorization", "proxy-connection", "connection")
            kept = [f"{k}: {v}" for k, v in headers if k.lower() not in dropped]
            up_w.write(f"{method} {path} HTTP/1.1\r\n".encode("latin-1"))
            up_w.write("".join(f"{h}\r\n" for h in [*kept, "Connection: close"]).encode("latin-1"))
            up_w.write(b"\r\n")
        await asyncio.gather(_pipe(reader, up_w), _pipe(up_r, writer), return_exceptions=True)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            writer.write_eof()
