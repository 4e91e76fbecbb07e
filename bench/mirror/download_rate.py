"""Download rate of llmgw.download.fetch (sha256 checked, synced, published) against a plain copy
of the same bytes on this machine: the same HTTP stream from the same server, read by the same
client library (aiohttp, the same buffer) and written to a file unhashed; and `cp`.

Two cases. Loopback: the server on 127.0.0.1 shares this machine's cores with the client, so
the copy is bound by CPU. A link: the server in a network namespace behind a veth pair whose
sending side is limited by `tc tbf` (1gbit, 5gbit...), as when the upstream is another machine
(it still shares the cores here). Every copy is synced to disk before its clock stops, as
fetch's publish is. The fetch runs both ways: as it runs on this machine's cores
(download.OFFLOAD) and the other way."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import aiohttp
from aiohttp import web

from llmgw import download
from llmgw.blobstore import BlobStore
from llmgw.download import READ_BUFSIZE, fetch
from llmgw.wire import ModelFile

DEFAULT_OFFLOAD = download.OFFLOAD  # what fetch does on this machine's cores
FETCH = {False: "fetch, hashed by the loop", True: "fetch, hashed in a thread"}
PLAIN = "plain HTTP copy"
GOAL = 0.90
# Payload a link carries: tbf counts 1514-byte frames for 1448 bytes of TCP payload.
PAYLOAD_SHARE = 1448 / 1514
NET = "10.247.77"  # the veth pair's /30 (host .1, server .2)


@dataclass(slots=True)
class Run:
    rate: float  # MB/s
    wall: float  # s
    client_cpu: float  # CPU seconds per GB: this process and its children (cp, sync)
    server_cpu: float  # CPU seconds per GB of the upstream server's process


class Upstream:
    """The server, in a process of its own (in a network namespace for a link)."""

    def __init__(self, src: Path, host: str, port: int, netns: str = "") -> None:
        cmd = [sys.executable, __file__, "--serve", str(src), host, str(port)]
        if netns:
            cmd = ["ip", "netns", "exec", netns, *cmd]  # execs the server: the same pid
        self.url = f"http://{host}:{port}/f"
        self.proc = subprocess.Popen(cmd)
        for _ in range(200):
            with contextlib.suppress(OSError), socket.create_connection((host, port), 0.1):
                return
            time.sleep(0.05)
        self.close()
        sys.exit("the server did not start")

    def cpu(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait()


def serve(path: Path, host: str, port: int) -> None:
    """The upstream: the file by sendfile, with ranges."""
    app = web.Application()

    async def handler(request: web.Request) -> web.FileResponse:
        return web.FileResponse(path)

    app.router.add_get("/f", handler)
    web.run_app(app, host=host, port=port, print=None, access_log=None)


@contextlib.contextmanager
def link(rate: str) -> Iterator[tuple[str, str]]:
    """A network namespace joined to this one by a veth pair, the server's side sending at
    `rate` (tc tbf); (namespace, the server's address). Removed on the way out."""
    ns, here, there = f"llmgw-bench-{os.getpid()}", f"lbh{os.getpid()}", f"lbn{os.getpid()}"
    tbf = ["tbf", "rate", rate, "burst", "4mb", "latency", "50ms"]
    setup = [
        ["ip", "netns", "add", ns],
        ["ip", "link", "add", here, "type", "veth", "peer", "name", there],
        ["ip", "link", "set", there, "netns", ns],
        ["ip", "addr", "add", f"{NET}.1/30", "dev", here],
        ["ip", "link", "set", here, "up"],
        ["ip", "-n", ns, "addr", "add", f"{NET}.2/30", "dev", there],
        ["ip", "-n", ns, "link", "set", there, "up"],
        ["ip", "-n", ns, "link", "set", "lo", "up"],
        ["tc", "-n", ns, "qdisc", "add", "dev", there, "root", *tbf],
    ]
    try:
        for cmd in setup:
            subprocess.run(cmd, check=True, timeout=30)
        yield ns, f"{NET}.2"
    finally:
        subprocess.run(["ip", "link", "del", here], stderr=subprocess.DEVNULL, timeout=30)
        subprocess.run(["ip", "netns", "del", ns], stderr=subprocess.DEVNULL, timeout=30)


def make_file(path: Path, size: int) -> str:
    """Random bytes (nothing compresses or dedupes them); their sha256."""
    h = hashlib.sha256()
    with path.open("wb") as f:
        left = size
        while left:
            chunk = os.urandom(min(left, 8 << 20))
            f.write(chunk)
            h.update(chunk)
            left -= len(chunk)
    return h.hexdigest()


async def plain_http(url: str, dest: Path) -> None:
    """The same stream to a file: the same reads, no hash, synced at the end."""
    async with aiohttp.ClientSession() as s, s.get(url, read_bufsize=READ_BUFSIZE) as r:
        r.raise_for_status()
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            while chunk := await r.content.readany():
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)


async def checked_fetch(url: str, root: Path, want: ModelFile, offload: bool) -> None:
    download.OFFLOAD = offload
    async with aiohttp.ClientSession() as s:
        await fetch(s, url, BlobStore(root), want)


def cp(src: Path, dest: Path) -> None:
    subprocess.run(["cp", str(src), str(dest)], check=True)
    subprocess.run(["sync", str(dest)], check=True)


def _cpu() -> float:
    """CPU seconds of this process and its waited-for children (cp, sync): not the server."""
    me, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def timed(work: Callable[[], object], size: int, up: Upstream, limit_s: float) -> Run:
    """Run one copy (a callable or a coroutine factory), at most limit_s seconds."""
    subprocess.run(["sync"], check=True)
    cpu, server, t = _cpu(), up.cpu(), time.perf_counter()
    result = work()
    if asyncio.iscoroutine(result):
        asyncio.run(asyncio.wait_for(result, limit_s))
    wall = time.perf_counter() - t
    gb = size / 1e9
    return Run(size / wall / 1e6, wall, (_cpu() - cpu) / gb, (up.cpu() - server) / gb)


def one_case(
    up: Upstream, src: Path, want: ModelFile, rounds: int, workdir: Path, limit_s: float
) -> dict[str, list[Run]]:
    """Each copy `rounds` times, interleaved; the runs of each."""
    runs: dict[str, list[Run]] = {}
    for n in range(rounds):
        print(f"  round {n + 1} of {rounds} (load {os.getloadavg()[0]:.2f})", flush=True)
        out = workdir / "out"
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()
        copies: dict[str, Callable[[], object]] = {PLAIN: partial(plain_http, up.url, out / "h")}
        if up.url.startswith("http://127.0.0.1"):
            copies = {"cp": partial(cp, src, out / "cp.bin"), **copies}
        for offload in (DEFAULT_OFFLOAD, not DEFAULT_OFFLOAD):
            copies[FETCH[offload]] = partial(
                checked_fetch, up.url, out / f"store-{offload}", want, offload
            )
        for what, work in copies.items():
            r = timed(work, want.size, up, limit_s)
            runs.setdefault(what, []).append(r)
            print(
                f"    {what:<27} {r.rate:6.0f} MB/s   CPU s/GB: client {r.client_cpu:.2f},"
                f" server {r.server_cpu:.2f}",
                flush=True,
            )
        shutil.rmtree(out)
    return runs


def verdict(runs: dict[str, list[Run]], payload_mb_s: float | None, sha_mb_s: float) -> str:
    """Whether the fetch (as it runs here) reaches GOAL of the plain copy's rate, and why."""
    fetched = max(runs[FETCH[DEFAULT_OFFLOAD]], key=lambda r: r.rate)
    plain = max(runs[PLAIN], key=lambda r: r.rate)
    ratio = fetched.rate / plain.rate
    cores = len(os.sched_getaffinity(0))
    if payload_mb_s and plain.rate >= 0.85 * payload_mb_s:
        bound = f"The link (~{payload_mb_s:.0f} MB/s of payload) limits the plain copy"
    else:
        bound = f"CPU limits the plain copy (client and server share {cores} cores)"
    met = "meets" if ratio >= GOAL else "misses"
    return (
        f"fetch / {PLAIN}: {ratio:.2f}: {met} the goal (>= {GOAL:.2f}). {bound}. The fetch"
        f" needs {fetched.client_cpu:.2f} CPU s/GB against the plain copy's"
        f" {plain.client_cpu:.2f} (sha256 alone: {1e3 / sha_mb_s:.2f}); its process used"
        f" {fetched.client_cpu * fetched.rate / 1e3:.0%} of a core, the sync to disk at the"
        " end included."
    )


def report(
    name: str, runs: dict[str, list[Run]], payload_mb_s: float | None, sha_mb_s: float
) -> None:
    print(f"\n{name}: best of each (MB/s; CPU s/GB of that run)")
    for what, rs in runs.items():
        best = max(rs, key=lambda r: r.rate)
        all_ = ", ".join(f"{r.rate:.0f}" for r in rs)
        print(
            f"  {what:<27} {best.rate:6.0f}   client {best.client_cpu:.2f},"
            f" server {best.server_cpu:.2f}   (all: {all_})"
        )
    if "cp" in runs:
        cp_rate = max(r.rate for r in runs["cp"])
        fetched = max(r.rate for r in runs[FETCH[DEFAULT_OFFLOAD]])
        print(f"  fetch / cp: {fetched / cp_rate:.2f}")
    print(f"  {verdict(runs, payload_mb_s, sha_mb_s)}", flush=True)


def bits(rate: str) -> float:
    """tc's rate ("1gbit", "2500mbit") in bits a second."""
    units = {"gbit": 1e9, "mbit": 1e6, "kbit": 1e3}
    for unit, n in units.items():
        if rate.endswith(unit):
            return float(rate.removesuffix(unit)) * n
    raise ValueError(f"not a tc rate: {rate}")


def run(args: argparse.Namespace, workdir: Path) -> None:
    size = args.size_mib << 20
    src = workdir / "src.bin"
    print(f"making {size} random bytes in {src}", flush=True)
    want = ModelFile(path="src.bin", size=size, sha256=make_file(src, size))
    subprocess.run(["sync"], check=True)
    print(f"cores: {len(os.sched_getaffinity(0))}; fetch here: {FETCH[DEFAULT_OFFLOAD]}")
    sha_mb_s = sha256_rate()
    print(f"sha256 alone, one core: {sha_mb_s:.0f} MB/s\n\nloopback, no link limit:")
    up = Upstream(src, "127.0.0.1", args.port)
    try:
        runs = one_case(up, src, want, args.rounds, workdir, 60 + size / 50e6)
    finally:
        up.close()
    report("loopback", runs, None, sha_mb_s)
    if os.geteuid() != 0 or not shutil.which("tc"):
        print("\nlink cases skipped: they need root and iproute2 (ip, tc)")
        return
    for rate in args.links.split(","):
        payload = bits(rate) / 8 * PAYLOAD_SHARE / 1e6
        print(f"\nlink {rate} (veth, tc tbf; ~{payload:.0f} MB/s of payload):", flush=True)
        with link(rate) as (ns, host):
            up = Upstream(src, host, args.port, netns=ns)
            try:
                runs = one_case(up, src, want, args.rounds, workdir, 30 + 5 * size / payload / 1e6)
            finally:
                up.close()
        report(f"link {rate}", runs, payload, sha_mb_s)


def sha256_rate() -> float:
    data, h = os.urandom(1 << 20), hashlib.sha256()
    t = time.perf_counter()
    for _ in range(512):
        h.update(data)
    return 512 * len(data) / (time.perf_counter() - t) / 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--size-mib", type=int, default=512)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--links", default="1gbit,2500mbit,5gbit", help="tc rates, comma-separated")
    p.add_argument("--dir", type=Path, default=None, help="where the files go (default /tmp)")
    p.add_argument("--port", type=int, default=18777)
    p.add_argument("--serve", nargs=3, metavar=("PATH", "HOST", "PORT"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve:
        serve(Path(args.serve[0]), args.serve[1], int(args.serve[2]))
        return
    with tempfile.TemporaryDirectory(prefix="llmgw-bench-mirror-", dir=args.dir) as d:
        run(args, Path(d))


if __name__ == "__main__":
    main()
