"""bench/console/bench.py: the console's server time per page over a big cluster state, and what
50 console pages left open cost /v1, in one run. Prints figures; passes or fails on no time.

The client port is built in this process as llmgwd builds it (daemon.py): /v1 (the router as
bench/router/cpu_per_request.py builds it, over the mock engine in a child), /api/v1 and the
console, on one uvloop loop and one core; the state: 50 nodes of eight H100s each (the recorded
NVML answers of a DGX H100: 400 cards), 100 models with two ready replicas each, and a meter
holding today's use of ten keys on every model.

1. Server time per page: every GET page of the console's own route table (a page added later is
   timed too) and every polled part the pages ask htmx for (HX-Request), each fetched N times in
   turn by one signed-in client; the time from the request's dispatch to its answer made (a
   middleware on the client port's app), p50 and p99, against the goal of 50 ms at p99.
2. /v1 at a fixed open-loop rate (bench/router/loadgen.py, on the other core, with the mock and
   the pollers): the mock direct (first and last), between them the router alone and the
   router with 50 console pages open (bench/console/pollers.py: each polls its page's live
   part at the interval the page itself asks for; the open pages spread over the pages that
   poll, or all on --only), in ABBA order; p99 and the p99 added over the mock direct, and
   their ratio with the pages open to without, the median of every round and of the quiet
   ones; "others": the CPU other work on the machine took in a round, in % of one core (a
   round with much of it measures the machine, not the console).

    .venv/bin/python bench/console/bench.py [--samples 200] [--rps 500] [--seconds 6]
        [--rounds 4] [--pollers 50] [--only /console/gpus]
"""

# ruff: noqa: E402 (the repository and bench/router on sys.path first)

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
ROUTER = ROOT / "bench" / "router"
sys.path[:0] = [str(ROOT), str(ROUTER)]

import aiohttp
import msgspec
import uvloop
from aiohttp import web
from cpu_per_request import CHAT, MODEL, SECRET, Keys, Models, Pool, key_and_meter, start_mock
from gc_tail import machine_jiffies, ours_jiffies
from prometheus_client import CollectorRegistry
from yarl import URL

from llmgw import entry, wire
from llmgw import log as llmgw_log
from llmgw.config import ClientPort
from llmgwd.accounting.usage import Usage
from llmgwd.api.access import key_auth
from llmgwd.api.base import API_PREFIX, ApiContext, ClusterNodes
from llmgwd.api.routes import api_subapp
from llmgwd.catalog import Catalog, Model
from llmgwd.clientport import listener
from llmgwd.console import app as console
from llmgwd.console.base import PREFIX
from llmgwd.nodes import state
from llmgwd.nodes.pool import Endpoint
from llmgwd.people.directory import Directory
from llmgwd.router import Router
from llmgwd.store.sqlite import SqliteStore
from tests.llmgw_agentd.nvml_inventory import load, recorded

NODES, MODELS, REPLICAS, KEYS = 50, 100, 2, 10
GOAL_MS = 50.0
ORG = "acme"
FILLED = {  # each page with path parameters, as fetched
    "/nodes/{name}": "/nodes/n07",
    "/models/{name}": "/models/m042",
    "/org/{org}": f"/org/{ORG}",
}
SESSION = b"b" * 32  # the cluster secret the console's keys derive from
POLLED = re.compile(r'hx-get="([^"]+)"[^>]*hx-trigger="every (\d+(?:\.\d+)?)s"')


def nodes() -> list[state.NodeInfo]:
    """NODES nodes of a DGX H100's recorded cards (each card's UUID its own), REPLICAS ready
    replicas of every model spread over them."""
    inv = recorded(load("dgx-h100-8x80gb"))
    per = MODELS * REPLICAS // NODES
    out = []
    for i in range(NODES):
        cards = [msgspec.structs.replace(g, uuid=f"{g.uuid[:-4]}{i:04x}") for g in inv.gpus]
        replicas = tuple(
            wire.ReplicaStatus(f"m{m % MODELS:03d}-{m // MODELS}", f"m{m % MODELS:03d}", "ready",
                               port=41000 + k, restarts=0)
            for k, m in enumerate(range(i * per, (i + 1) * per))
        )  # fmt: skip
        out.append(state.NodeInfo(
            name=f"n{i:02d}", address=f"10.0.{i // 250}.{i % 250 + 1}", version="0.9.1",
            inventory=msgspec.structs.replace(inv, gpus=cards), replicas=replicas,
            desired=None, connected=True, last_seen=time.time(),
        ))  # fmt: skip
    return out


async def catalog_and_usage() -> tuple[Catalog, Usage, str]:
    """The catalog (MODELS models, KEYS keys, an admin key whose secret is returned) and a
    meter holding today's use of every key on every model."""
    catalog = Catalog(await SqliteStore.open(":memory:"))
    await catalog.load()
    usage = Usage(None)
    day = time.strftime("%Y-%m-%d", time.gmtime())
    for m in range(MODELS):
        await catalog.add_model(Model(name=f"m{m:03d}", source=f"file:/m/{m}.gguf",
                                      replicas=REPLICAS))  # fmt: skip
    for k in range(KEYS):
        key, _ = await catalog.create_key(f"app-{k}")
        for m in range(MODELS):
            usage.add((day, key.id, f"m{m:03d}"), 100 + k * m, 20 + m, 10**9 * (k + 1))
    _, admin = await catalog.create_key("ops", "admin")
    await Directory(catalog.store).create_org(ORG)
    return catalog, usage, admin


class Timer:
    """The client port's time a console request takes, dispatch to answer made, by page: wall
    clock, and the CPU this thread took meanwhile (the same but for other work on the core)."""

    def __init__(self) -> None:
        self.on = False
        self.times: dict[str, list[float]] = defaultdict(list)
        self.cpu: dict[str, list[float]] = defaultdict(list)

    @web.middleware
    async def middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        t, c = time.perf_counter(), time.thread_time()
        response: web.StreamResponse = await handler(request)
        if self.on and request.path.startswith("/console"):
            part = " (polled part)" if request.headers.get("HX-Request") else ""
            self.times[request.path + part].append(time.perf_counter() - t)
            self.cpu[request.path + part].append(time.thread_time() - c)
        return response

    def report(self, statuses: dict[str, int], samples: int, others: float) -> None:
        """Each page's p50, p99 and max, and its CPU's p99; whether the goal is met."""
        print(f"\nserver time a page, {samples} fetches each, in turn (ms; others took "
              f"{others:.0f}% of a core meanwhile):")  # fmt: skip
        print(f"  {'page':44} {'HTTP':>4} {'p50':>7} {'p99':>7} {'max':>7} {'CPU p99':>8}")
        worst = 0.0
        for name, times in self.times.items():
            times.sort()
            p99, cpu = nearest(times, 0.99) * 1000, nearest(sorted(self.cpu[name]), 0.99) * 1000
            worst = max(worst, p99)
            print(f"  {name:44} {statuses.get(name, 0):>4} {statistics.median(times) * 1000:7.2f} "
                  f"{p99:7.2f} {times[-1] * 1000:7.2f} {cpu:8.2f}")  # fmt: skip
        met = "met" if worst < GOAL_MS else "NOT met"
        print(f"  goal: every page under {GOAL_MS:.0f} ms at p99: {met} "
              f"(slowest p99 {worst:.1f} ms)")  # fmt: skip


def nearest(ordered: list[float], q: float) -> float:
    """The q quantile of ordered values, by nearest rank."""
    return ordered[max(0, -(-round(q * 100) * len(ordered) // 100) - 1)]


async def client_port(mock_port: int, timer: Timer) -> tuple[web.AppRunner, int, list[str], str]:
    """/v1, /api/v1 and /console on one port as llmgwd serves them: (runner, port, the
    console's GET pages, the admin key)."""
    catalog, usage, admin = await catalog_and_usage()
    records = nodes()
    url = f"http://127.0.0.1:{mock_port}"
    endpoints = [Endpoint(f"r{i}", MODEL, "n1", url, "engine-key", slots=64, context=4096)
                 for i in (1, 2)]  # fmt: skip
    settings = ClientPort(listen="127.0.0.1:0")
    key, meter = key_and_meter(False)
    router = Router(Keys(key), Models(), Pool(endpoints), meter=meter, registry=CollectorRegistry(),
                    prefix_aware=settings.prefix_balancing)  # fmt: skip
    ctx = ApiContext(catalog=catalog, nodes=ClusterNodes(lambda: records),
                     mint_token=lambda: "t", join_url="", usage=usage)  # fmt: skip
    app = web.Application(client_max_size=settings.max_body_bytes, middlewares=[timer.middleware])
    app.add_subapp("/v1", router.app)
    api = api_subapp(ctx, key_auth(catalog))
    app.add_subapp(API_PREFIX, api)
    made = console.make(api, catalog, SESSION, tls=False)
    console.mount(app, made)
    runner = await listener.serve(app, settings, "127.0.0.1", 0)
    return runner, int(runner.addresses[0][1]), pages(console.console_app(made)), admin


def pages(app: web.Application) -> list[str]:
    """The console's GET pages (static files and the OIDC sign-in's redirects aside), a page
    with path parameters as FILLED has it."""
    out: list[str] = []
    for route in app.router.routes():
        resource = route.resource
        if route.method != "GET" or resource is None or isinstance(resource, web.StaticResource):
            continue
        path = re.sub(r"\{(\w+)[^}]*\}", r"{\1}", resource.canonical)  # its pattern aside
        path = FILLED.get(path, path)
        if "{" in path:
            print(f"  {PREFIX}{path}: a page with a path parameter FILLED lacks; not timed")
        elif not path.startswith("/login/") and PREFIX + path not in out:
            out.append(PREFIX + path)
    return out


async def signed_in(http: aiohttp.ClientSession, base: str, key: str) -> str:
    """Sign in through the console's form; the session cookie's value."""
    async with http.get(base + "/console/login") as r:
        token = re.search(r'name="csrf" value="([0-9a-f]+)"', await r.text())
    assert token, "the sign-in page has no form token"
    form = {"key": key, "csrf": token.group(1)}
    async with http.post(base + "/console/login", data=form, allow_redirects=False) as r:
        assert r.status == 303, f"sign-in: HTTP {r.status}"
    cookie = http.cookie_jar.filter_cookies(URL(base + "/console/")).get("llmgw_console")
    assert cookie is not None, "no session cookie"
    return cookie.value


async def page_times(
    http: aiohttp.ClientSession,
    anon: aiohttp.ClientSession,
    base: str,
    paths: list[str],
    timer: Timer,
    samples: int,
) -> list[tuple[str, float]]:
    """Each page and polled part fetched samples times in turn (after 5 unmeasured); printed,
    and the polled parts (path, seconds) the pages ask for returned."""
    polled: dict[str, float] = {}
    statuses: dict[str, int] = {}
    asks = [(p, False) for p in paths]
    for path in paths:
        async with http.get(base + path) as r:
            for part, every in POLLED.findall(await r.text()):
                polled.setdefault(part, float(every))
    asks += [(p, True) for p in polled]
    busy0, ours0 = machine_jiffies(), ours_jiffies(0)
    for path, hx in asks:
        headers = {"HX-Request": "true"} if hx else {}
        client = anon if path.endswith("/login") else http  # the sign-in page: signed out
        for i in range(samples + 5):
            timer.on = i >= 5
            async with client.get(base + path, headers=headers, allow_redirects=False) as r:
                await r.read()
                statuses[path + (" (polled part)" if hx else "")] = r.status
    timer.on = False
    busy1, ours1 = machine_jiffies(), ours_jiffies(0)
    span = max(1, busy1[1] - busy0[1]) / (os.cpu_count() or 1)
    timer.report(statuses, samples, max(0, busy1[0] - busy0[0] - (ours1 - ours0)) / span * 100)
    return list(polled.items())


async def child(cpus: set[int], script: Path, *args: str, limit_s: float) -> dict[str, Any]:
    """A helper script's one JSON line, run pinned to cpus."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(script), *args, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, preexec_fn=lambda: os.sched_setaffinity(0, cpus),
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), limit_s)
    lines = out.decode().strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"{script.name} failed: {err.decode()[-800:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


async def v1_round(
    load: set[int], port: int, args: argparse.Namespace, polling: dict[str, Any] | None
) -> dict[str, Any]:
    """loadgen.py at args.rps on port for args.seconds; with polling, pollers.py the while."""
    cfg = {"port": port, "path": "/v1/chat/completions", "key": SECRET,
           "body": (CHAT % b"").decode(), "rps": args.rps, "duration_s": args.seconds,
           "warmup_s": 0.5, "max_conns": 64}  # fmt: skip
    span = args.seconds + 0.5
    polls = None
    if polling is not None:
        todo = json.dumps(polling | {"duration_s": span + 2.0})
        polls = asyncio.create_task(child(load, HERE / "pollers.py", todo, limit_s=span + 90))
        await asyncio.sleep(1.0)  # the pollers started, their phases spread
    busy0, ours0 = machine_jiffies(), ours_jiffies(args.mock_pid)
    res = await child(load, ROUTER / "loadgen.py", "rate", json.dumps(cfg), limit_s=span + 30)
    got = await polls if polls is not None else None
    busy1, ours1 = machine_jiffies(), ours_jiffies(args.mock_pid)  # the pollers' CPU counted
    span_j = max(1, busy1[1] - busy0[1]) / (os.cpu_count() or 1)  # jiffies of one core
    others = max(0, (busy1[0] - busy0[0]) - (ours1 - ours0)) / span_j * 100
    return {"load": res, "polls": got, "others": others}


def round_line(name: str, r: dict[str, Any]) -> str:
    lat, polls = r["load"]["latency_ms"], r["polls"]
    bad = r["load"]["measured"] - r["load"]["statuses"].get("200", 0)
    line = (f"  {name:14} {r['load']['achieved_rps']:7.0f} {lat['p50']:7.2f} {lat['p99']:7.2f} "
            f"{lat['p999']:7.2f} {bad:6} {r['others']:6.0f}%")  # fmt: skip
    if polls:
        line += f"   {polls['polls']} polls, p50 {polls['p50_ms']} ms, p99 {polls['p99_ms']} ms"
        line += f", HTTP {polls['statuses']}"
    return line


QUIET_PCT = 25.0  # a round where other work took less than this, in % of one core, is quiet


async def v1_cost(
    load: set[int], port: int, mock_port: int, polling: dict[str, Any], args: argparse.Namespace
) -> None:
    """The mock direct, then the router alone and with the pages open in ABBA order, then the
    mock direct again; the p99s, all rounds' and the quiet rounds' medians."""
    print(
        f"\n/v1 at {args.rps:.0f} req/s open loop, {args.seconds:.0f} s a round; "
        f"{polling['n']} pages open: {polling['pages']} (path, seconds between polls)"
    )
    print(
        f"  {'round':14} {'req/s':>7} {'p50':>7} {'p99':>7} {'p99.9':>7} {'not200':>6} "
        f"{'others':>7}"
    )
    await v1_round(load, port, argparse.Namespace(**vars(args) | {"seconds": 1.0}), None)  # warm
    rounds: dict[str, list[tuple[float, float]]] = {"direct": [], "alone": [], "pages open": []}
    order = [("alone", "pages open") if i % 2 == 0 else ("pages open", "alone")
             for i in range(args.rounds)]  # fmt: skip
    for name in ("direct", *(n for pair in order for n in pair), "direct"):
        target = mock_port if name == "direct" else port
        r = await v1_round(load, target, args, polling if name == "pages open" else None)
        rounds[name].append((r["load"]["latency_ms"]["p99"], r["others"]))
        print(round_line("mock direct" if name == "direct" else name, r), flush=True)
    summary(rounds, polling["n"])


def summary(rounds: dict[str, list[tuple[float, float]]], n: int) -> None:
    """p99 alone and with n pages open, the ratio, and the p99 added over the mock direct:
    the medians of every round, then of the quiet rounds where each condition has one."""
    for which, keep in (("every round", 1e9), (f"quiet rounds (others < {QUIET_PCT:.0f}%)",
                                               QUIET_PCT)):  # fmt: skip
        got = {k: [p for p, o in v if o < keep] for k, v in rounds.items()}
        if not all(got.values()):
            print(f"  {which}: not one for each of direct, alone and pages open")
            continue
        base = min(got["direct"])  # the mock's own floor
        alone, opened = statistics.median(got["alone"]), statistics.median(got["pages open"])
        counts = "/".join(str(len(v)) for v in got.values())
        print(
            f"  {which} ({counts} direct/alone/open), median p99: alone {alone:.2f} ms, {n} "
            f"pages open {opened:.2f} ms, ratio {opened / alone:.2f}; added over the mock "
            f"({base:.2f} ms): {alone - base:.2f} and {opened - base:.2f} ms, ratio "
            f"{(opened - base) / max(alone - base, 1e-3):.2f}"
        )


async def run(args: argparse.Namespace, load: set[int], mock_port: int) -> None:
    timer = Timer()
    runner, port, paths, admin = await client_port(mock_port, timer)
    entry.settle_heap()  # as llmgwd does once started
    base = f"http://127.0.0.1:{port}"
    print(
        f"state: {NODES} nodes, {NODES * 8} cards, {MODELS} models x {REPLICAS} replicas, "
        f"{KEYS * MODELS} usage rows; {len(paths)} console pages in the route table"
    )
    try:
        jar = aiohttp.CookieJar(unsafe=True)
        async with aiohttp.ClientSession(cookie_jar=jar) as http, aiohttp.ClientSession() as anon:
            cookie = await signed_in(http, base, admin)
            polled = await page_times(http, anon, base, paths, timer, args.samples)
        if not polled:
            print("\nno page polls: nothing to set against /v1")
            return
        if args.only:
            polled = [(p, s) for p, s in polled if p == args.only] or polled
        polling = {"url": base, "cookie": cookie, "pages": polled, "n": args.pollers}
        await v1_cost(load, port, mock_port, polling, args)
    finally:
        await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=200, help="fetches of each page")
    parser.add_argument("--rps", type=float, default=500.0, help="/v1 requests a second")
    parser.add_argument("--seconds", type=float, default=6.0, help="measured seconds a round")
    parser.add_argument("--rounds", type=int, default=4, help="rounds of each, ABBA")
    parser.add_argument("--pollers", type=int, default=50, help="console pages left open")
    parser.add_argument("--only", help="every open page this polled one (e.g. /console/gpus)")
    args = parser.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    server, load = {cpus[-1]}, set(cpus[:-1]) or {cpus[-1]}
    stderr, sys.stderr = sys.stderr, open(os.devnull, "w")  # noqa: SIM115 (the access lines)
    llmgw_log.setup("llmgwd", "info")
    sys.stderr = stderr
    mock, mock_port = start_mock(16)
    args.mock_pid = mock.pid
    os.sched_setaffinity(mock.pid, load)
    os.sched_setaffinity(0, server)
    print(
        f"client port on cpu {server}, mock, load and pages on {load}; "
        f"Python {sys.version.split()[0]}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    )
    t = time.monotonic()
    try:
        uvloop.run(run(args, load, mock_port))
    finally:
        mock.terminate()
        mock.wait()
    print(f"\n{time.monotonic() - t:.0f} s in all")


if __name__ == "__main__":
    main()
