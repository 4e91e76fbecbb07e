"""Download rate of llmgw.download.fetch (sha256 on, synced, published) against plain copies of
the same bytes on this machine: the same HTTP stream written to a file unhashed, and `cp`.

Each copy is synced to disk before its clock stops, as fetch's publish does. The fetch runs
both ways: as it runs on this machine's cores (download.OFFLOAD) and the other way."""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
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


def serve(path: Path, port: int) -> None:
    """The upstream, in a process of its own: the file by sendfile, with ranges."""
    app = web.Application()

    async def handler(request: web.Request) -> web.FileResponse:
        return web.FileResponse(path)

    app.router.add_get("/f", handler)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


async def plain_http(url: str, dest: Path) -> None:
    """The same stream to a file: no hash, synced at the end, as the fetch is."""
    async with aiohttp.ClientSession() as s, s.get(url, read_bufsize=READ_BUFSIZE) as r:
        r.raise_for_status()
        with dest.open("wb", buffering=0) as f:
            while chunk := await r.content.readany():
                f.write(chunk)
            os.fsync(f.fileno())


async def checked_fetch(url: str, root: Path, want: ModelFile, offload: bool) -> None:
    download.OFFLOAD = offload
    async with aiohttp.ClientSession() as s:
        await fetch(s, url, BlobStore(root), want)


def cp(src: Path, dest: Path) -> None:
    subprocess.run(["cp", str(src), str(dest)], check=True)
    subprocess.run(["sync", str(dest)], check=True)


def timed(what: str, work: Callable[[], object], size: int, out: dict[str, list[float]]) -> None:
    """Run one copy (a callable or a coroutine factory) and record its MB/s."""
    subprocess.run(["sync"], check=True)
    before = _cpu()
    t = time.perf_counter()
    result = work()
    if asyncio.iscoroutine(result):
        asyncio.run(result)
    rate = size / (time.perf_counter() - t) / 1e6
    cpu = (_cpu() - before) * 1e9 / size
    out.setdefault(what, []).append(rate)
    print(f"  {what:<28} {rate:8.0f} MB/s   CPU {cpu:.2f} ns a byte", flush=True)


def _cpu() -> float:
    """CPU seconds of this process and its waited-for children (cp, sync): not the server."""
    me, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def wait_for(port: int) -> None:
    for _ in range(100):
        try:
            with __import__("socket").create_connection(("127.0.0.1", port), timeout=0.1):
                return
        except OSError:
            time.sleep(0.05)
    sys.exit("the server did not start")


def run(size: int, rounds: int, workdir: Path, port: int) -> None:
    src = workdir / "src.bin"
    print(f"making {size} random bytes in {src}", flush=True)
    sha = make_file(src, size)
    subprocess.run(["sync"], check=True)
    want = ModelFile(path="src.bin", size=size, sha256=sha)
    url = f"http://127.0.0.1:{port}/f"
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(src), str(port)])
    rates: dict[str, list[float]] = {}
    try:
        wait_for(port)
        for n in range(rounds):
            print(f"round {n + 1} of {rounds} (load {os.getloadavg()[0]:.2f})", flush=True)
            out = workdir / "out"
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir()
            timed("cp", partial(cp, src, out / "cp.bin"), size, rates)
            timed("plain HTTP copy", partial(plain_http, url, out / "http.bin"), size, rates)
            for offload in (DEFAULT_OFFLOAD, not DEFAULT_OFFLOAD):
                fetched = partial(checked_fetch, url, out / f"store-{offload}", want, offload)
                timed(FETCH[offload], fetched, size, rates)
            shutil.rmtree(out)
    finally:
        server.terminate()
        server.wait()
    report(rates)


def report(rates: dict[str, list[float]]) -> None:
    best = {k: max(v) for k, v in rates.items()}
    print("\nbest of each (MB/s):")
    for k, v in best.items():
        print(f"  {k:<28} {v:8.0f}   (all: {', '.join(f'{x:.0f}' for x in rates[k])})")
    fetched = best[FETCH[DEFAULT_OFFLOAD]]
    print(f"fetch as it runs here: {FETCH[DEFAULT_OFFLOAD]}")
    print(f"fetch / plain HTTP copy: {fetched / best['plain HTTP copy']:.2f}  (goal >= 0.90)")
    print(f"fetch / cp:              {fetched / best['cp']:.2f}")
    print(f"cores: {len(os.sched_getaffinity(0))}, load now {os.getloadavg()[0]:.2f}")
    print(f"sha256 alone, one core: {sha256_rate():.0f} MB/s")


def sha256_rate() -> float:
    data, h = os.urandom(1 << 20), hashlib.sha256()
    t = time.perf_counter()
    for _ in range(512):
        h.update(data)
    return 512 * len(data) / (time.perf_counter() - t) / 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--size-mib", type=int, default=1024)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--dir", type=Path, default=None, help="where the files go (default /tmp)")
    p.add_argument("--port", type=int, default=18777)
    p.add_argument("--serve", nargs=2, metavar=("PATH", "PORT"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve:
        serve(Path(args.serve[0]), int(args.serve[1]))
        return
    with tempfile.TemporaryDirectory(prefix="llmgw-bench-mirror-", dir=args.dir) as d:
        run(args.size_mib << 20, args.rounds, Path(d), args.port)


if __name__ == "__main__":
    main()
