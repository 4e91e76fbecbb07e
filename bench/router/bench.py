"""bench/router: the /v1 router's speed, against the same mock direct and through LiteLLM.

One run measures three targets against one OpenAI-shaped mock (mock.py):
  direct   the mock itself: what the load generator and the mock cost alone
  llmgwd   the real daemon (keys, limits and accounting as this build has them), fed the
           mock as a ready replica by a fake node that joins its real cluster port
  LiteLLM  its proxy, a pinned release in its own venv, master key + a virtual key with
           rpm/tpm limits (custom_auth: its virtual keys would need Postgres + Prisma)

and prints a table: requests per second at p99 under 5 ms, latency added at 100 and
500 requests per second, streams (64 chunks 20 ms apart): time to first chunk and gap
between chunks added, concurrent streams held with no chunk lost, and the proxies'
memory. It prints figures only: it never passes or fails on a time.

    bench/router/run [--quick] [--skip-litellm] [--no-profile]

Processes: the proxy under test gets a core of its own; the mock and the load generator
share another on a 2-core machine. Each step is bounded in time; every process started
is stopped at the end (also on ^C). Output also goes to bench/router/last-run.txt.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import itertools
import json
import math
import os
import platform
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import aiohttp
import fake_agent
import uvloop

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
PY = ROOT / ".venv" / "bin" / "python"
LLMGWD = ROOT / ".venv" / "bin" / "llmgwd"
LLMGW = ROOT / ".venv" / "bin" / "llmgw"
LITELLM_VENV = HERE / ".venv-litellm"
# The newest release whose [proxy] extra resolves on PyPI today. [proxy-runtime] is what its
# image ships: without opentelemetry-sdk this release retries a failing import on every
# request (a third of its CPU). httptools: uvicorn's fast parser (else h11), as in production.
LITELLM_PINS = ("litellm[proxy,proxy-runtime]==1.108.7", "httptools==0.9.0")
PYSPY_PIN = "py-spy==0.4.1"
MODEL = "bench"
CHUNKS = 64
P99_BOUND_MS = 5.0
# "at once": the mock (mock.py) streams this one with no gaps. The router folds a whole answer
# from the engine's stream; the mock answers LiteLLM's stream:false at once, so both are timed
# against an engine that answers at once.
BODY = json.dumps(
    {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Say hello at once."}],
        "max_tokens": 64,
    }
)
STREAM_BODY = json.dumps(
    {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 64,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
)
HUGE_RPM, HUGE_TPM = 100_000_000, 1_000_000_000  # limits checked on every request, never hit


@dataclass(frozen=True)
class Plan:
    """How long each step runs: the full run stays under 10 minutes, --quick near 3."""

    wrk_s: int
    search_steps: int
    search_s: float
    rate_s: float
    repeats: int
    warm_s: float
    stream_latency_n: int  # started 25 a second: the latency of streams, not their capacity
    stream_levels: tuple[int, ...]
    level_s: float  # a level of streams may take this long, plus 1 s per 150 streams
    profile_s: int
    profile_streams: bool
    settle_s: float  # the most a step waits for the proxy to go idle after an overload
    quiet_s: float  # the most the whole run waits for other work on the machine


FULL = Plan(8, 6, 3.0, 5.0, 3, 2.0, 100, (500, 1000, 2000, 5000), 15.0, 10, True, 20.0, 45.0)
QUICK = Plan(3, 3, 1.5, 2.0, 1, 1.0, 25, (200, 1000), 8.0, 4, False, 8.0, 15.0)


# Output: to stdout and to last-run.txt as it goes, so an interrupted run leaves its figures.


class Out:
    def __init__(self, path: Path) -> None:
        self._file: TextIO = path.open("w")

    def __call__(self, line: str = "") -> None:
        print(line, flush=True)
        self._file.write(line + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


out: Out


# Processes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pinner(cpus: set[int]) -> Callable[[], None]:
    def pin() -> None:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, cpus)

    return pin


@dataclass
class Procs:
    """Every long-running process the bench starts, each in its own process group."""

    running: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)

    def spawn(
        self, name: str, argv: list[str], cpus: set[int], log: Path, **kw: Any
    ) -> subprocess.Popen[bytes]:
        with log.open("ab") as f:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=f,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # the group is stopped whole, children too
                preexec_fn=pinner(cpus),
                **kw,
            )
        self.running.append((name, proc))
        return proc

    def stop(self, proc: subprocess.Popen[bytes], timeout_s: float = 10.0) -> None:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        self.running = [(n, p) for n, p in self.running if p is not proc]

    def stop_all(self) -> None:
        for _, proc in reversed(list(self.running)):
            self.stop(proc)


procs = Procs()


def tree(pid: int) -> list[int]:
    """pid and its descendants (LiteLLM may run workers as children)."""
    children: dict[int, list[int]] = collections.defaultdict(list)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat[stat.rfind(")") + 2 :].split()[1])
            children[ppid].append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        todo.extend(children.get(p, []))
    return found


def status_kb(pid: int, field_name: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def rss_kb(pid: int) -> int:
    return sum(status_kb(p, "VmRSS") for p in tree(pid))


def hwm_kb(pid: int) -> int:
    return sum(status_kb(p, "VmHWM") for p in tree(pid))


def cpu_ticks(pid: int) -> int:
    total = 0
    for p in tree(pid):
        try:
            stat = Path(f"/proc/{p}/stat").read_text()
        except OSError:
            continue
        parts = stat[stat.rfind(")") + 2 :].split()
        total += int(parts[11]) + int(parts[12])  # utime + stime
    return total


def core_ticks() -> dict[int, tuple[int, int]]:
    """Per core: (busy, total) jiffies since boot."""
    found = {}
    for line in Path("/proc/stat").read_text().splitlines():
        m = re.match(r"cpu(\d+) (.*)", line)
        if m:
            v = [int(x) for x in m.group(2).split()]
            idle = v[3] + v[4]
            found[int(m.group(1))] = (sum(v[:8]) - idle, sum(v[:8]))
    return found


def tcp_ext() -> dict[str, int]:
    """The kernel's TcpExt counters (machine-wide): ListenOverflows tells of a full accept queue."""
    lines = [ln.split() for ln in Path("/proc/net/netstat").read_text().splitlines()]
    for names, values in itertools.pairwise(lines):
        if names[0] == "TcpExt:" and values[0] == "TcpExt:":
            return dict(zip(names[1:], map(int, values[1:]), strict=False))
    return {}


def own_ticks() -> int:
    """CPU time of this process and of the children it has waited for (load generators, CLI)."""
    parts = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(x) for x in parts[11:15])  # utime stime cutime cstime


def machine_busy() -> tuple[int, int]:
    """(busy, total) jiffies of all cores together."""
    cores = core_ticks().values()
    return sum(b for b, _ in cores), sum(t for _, t in cores)


@dataclass
class Usage:
    """What a step cost: the proxy's CPU (in % of one core), its peak RSS, and the CPU that
    other work on the machine took meanwhile (in % of one core; the machine is shared)."""

    cpu_pct: float = 0.0
    rss_peak_kb: int = 0
    others_pct: float = 0.0

    def text(self) -> str:
        mine = (
            f"proxy CPU {self.cpu_pct:.0f}%, RSS {self.rss_peak_kb / 1024:.0f} MiB; "
            if self.rss_peak_kb
            else ""
        )
        return f"[{mine}others {self.others_pct:.0f}%]"


SEEN_OTHERS: list[float] = []  # other work's share during each measured step
OURS: list[int] = []  # pids whose trees are this bench's (the mock, the proxy under test)


def ours_ticks() -> int:
    return own_ticks() + sum(cpu_ticks(p) for p in OURS)


@contextlib.asynccontextmanager
async def sampled(pid: int | None, record: bool = True) -> AsyncIterator[Usage]:
    """Sample the proxy's RSS every 0.2 s; its CPU time and everyone else's over the block."""
    usage = Usage()
    hz = os.sysconf("SC_CLK_TCK")
    ncpu = len(core_ticks())
    t0, c0, m0, o0 = time.monotonic(), cpu_ticks(pid) if pid else 0, machine_busy(), ours_ticks()
    stop = asyncio.Event()

    async def sample() -> None:
        while not stop.is_set():
            if pid:
                usage.rss_peak_kb = max(usage.rss_peak_kb, rss_kb(pid))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.2)

    task = asyncio.create_task(sample())
    try:
        yield usage
    finally:
        stop.set()
        await task
        dt = time.monotonic() - t0
        m1, o1 = machine_busy(), ours_ticks()
        if dt > 0:
            if pid:
                usage.cpu_pct = 100.0 * (cpu_ticks(pid) - c0) / hz / dt
            # /proc/stat counts in USER_HZ per core: the busy share times the cores.
            span = (m1[1] - m0[1]) / ncpu or 1
            others = (m1[0] - m0[0]) - (o1 - o0)
            usage.others_pct = max(0.0, 100.0 * others / span)
            if record:
                SEEN_OTHERS.append(usage.others_pct)


QUIET_BUDGET_S = [60.0]  # the most a whole run waits for other work to calm down
SETTLE_S = [30.0]  # the most one step waits for the proxy to go idle
NOISY_PCT = 40.0  # other work above this share of a core makes a failed search step run again


async def quiet(pid: int | None, limit_s: float = 5.0, others_max_pct: float = 25.0) -> None:
    """Before a step, wait (boundedly) for the proxy to finish what an overloaded step left it
    (LiteLLM works through abandoned requests for a while), then for other work on the shared
    machine to leave the cores mostly free."""
    settle_until = time.monotonic() + SETTLE_S[0]
    while pid and time.monotonic() < settle_until:
        async with sampled(pid, record=False) as usage:
            await asyncio.sleep(0.5)
        if usage.cpu_pct < 10.0:
            break
    deadline = time.monotonic() + min(limit_s, QUIET_BUDGET_S[0])
    while True:
        t = time.monotonic()
        async with sampled(None, record=False) as usage:
            await asyncio.sleep(0.5)
        QUIET_BUDGET_S[0] = max(0.0, QUIET_BUDGET_S[0] - (time.monotonic() - t))
        if usage.others_pct < others_max_pct or time.monotonic() >= deadline:
            return


# Targets and the load against them


METRICS_OFF = "metrics off"  # the second llmgwd's column with --metrics-off-too


@dataclass
class Target:
    name: str
    port: int
    key: str
    pid: int | None = None  # the proxy's process, for its CPU and memory
    notes: list[str] = field(default_factory=list)
    results: dict[str, Any] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/chat/completions"


@dataclass(frozen=True)
class Cores:
    mock: set[int]
    load: set[int]
    proxy: set[int]

    def text(self) -> str:
        def s(c: set[int]) -> str:
            return ",".join(map(str, sorted(c)))

        return (
            f"mock on cpu {s(self.mock)}, load on cpu {s(self.load)}, proxy on cpu {s(self.proxy)}"
        )


def layout() -> Cores:
    """Proxy alone on a core; mock and load on their own cores if there are enough."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) >= 3:
        return Cores({cpus[0]}, {cpus[1]}, {cpus[2]})
    if len(cpus) == 2:
        return Cores({cpus[0]}, {cpus[0]}, {cpus[1]})
    return Cores(set(cpus), set(cpus), set(cpus))


async def loadgen(cores: Cores, mode: str, cfg: dict[str, Any], limit_s: float) -> dict[str, Any]:
    """Run loadgen.py pinned to the load core; its JSON answer."""
    proc = await asyncio.create_subprocess_exec(
        str(PY),
        str(HERE / "loadgen.py"),
        mode,
        json.dumps(cfg),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        preexec_fn=pinner(cores.load),
    )
    try:
        stdout, stderr = await asyncio.wait_for(proc.communicate(), limit_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return {"error": f"load generator ran past {limit_s:.0f} s"}
    lines = stdout.decode().strip().splitlines()
    if proc.returncode != 0 or not lines:
        return {"error": f"load generator failed: {stderr.decode()[-500:]}"}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def target_cfg(t: Target, body: str) -> dict[str, Any]:
    return {"port": t.port, "path": "/v1/chat/completions", "key": t.key, "body": body}


async def rate(cores: Cores, t: Target, rps: float, seconds: float) -> dict[str, Any]:
    cfg = target_cfg(t, BODY) | {"rps": rps, "duration_s": seconds, "max_conns": 256}
    await quiet(t.pid)
    async with sampled(t.pid) as usage:
        res = await loadgen(cores, "rate", cfg, seconds + 20)
    res["usage"] = usage
    return res


async def streams(
    cores: Cores, t: Target, n: int, ramp_s: float, timeout_s: float, wait_quiet: bool = True
) -> dict[str, Any]:
    cfg = target_cfg(t, STREAM_BODY) | {
        "n": n,
        "ramp_s": ramp_s,
        "timeout_s": timeout_s,
        "chunks": CHUNKS,
        "want_usage": True,
    }
    if wait_quiet:
        await quiet(t.pid)
    before = tcp_ext()
    async with sampled(t.pid) as usage:
        res = await loadgen(cores, "streams", cfg, ramp_s + timeout_s + 30)
    res["usage"] = usage
    after = tcp_ext()
    res["listen_overflows"] = after.get("ListenOverflows", 0) - before.get("ListenOverflows", 0)
    return res


async def wrk(
    cores: Cores, t: Target, seconds: int, conns: int = 64, wait_quiet: bool = True
) -> dict[str, Any]:
    """Closed-loop maximum throughput (wrk, one thread, `conns` keep-alive connections)."""
    env = os.environ | {"WRK_BODY": BODY, "WRK_KEY": t.key}
    argv = [
        "wrk",
        "-t1",
        f"-c{conns}",
        f"-d{seconds}s",
        "--timeout",
        "10s",  # LiteLLM's answers at 64 connections take over wrk's default 2 s
        "--latency",
        "-s",
        str(HERE / "post.lua"),
        t.url,
    ]
    if wait_quiet:
        await quiet(t.pid)
    async with sampled(t.pid) as usage:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            preexec_fn=pinner(cores.load),
        )
        try:
            raw, _ = await asyncio.wait_for(proc.communicate(), seconds + 30)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            return {"error": "wrk ran past its time", "usage": usage}
    text = raw.decode()
    res: dict[str, Any] = {"usage": usage, "text": text}
    if m := re.search(r"Requests/sec:\s+([\d.]+)", text):
        res["rps"] = float(m.group(1))
    for q in ("50", "99"):
        if m := re.search(rf"^\s+{q}%\s+([\d.]+)(us|ms|s)\s*$", text, re.M):
            scale = {"us": 0.001, "ms": 1.0, "s": 1000.0}[m.group(2)]
            res[f"p{q}_ms"] = float(m.group(1)) * scale
    m = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    res["non2xx"] = int(m.group(1)) if m else 0
    m = re.search(r"Socket errors: (.*)", text)
    res["socket_errors"] = m.group(1) if m else ""
    return res


def rate_ok(res: dict[str, Any]) -> bool:
    """A rate is held: every request answered 2xx, p99 under the bound, the rate reached."""
    lat = res.get("latency_ms", {})
    return bool(
        lat
        and not res.get("error")
        and not res.get("errors")
        and not res.get("unfinished")
        and set(res.get("statuses", {})) <= {"200"}
        and lat["p99"] < P99_BOUND_MS
        and res["achieved_rps"] >= 0.97 * res["target_rps"]
    )


def rate_line(res: dict[str, Any]) -> str:
    if res.get("error"):
        return str(res["error"])
    lat = res.get("latency_ms", {})
    bad = {k: v for k, v in res.get("statuses", {}).items() if k != "200"}
    extra = ""
    if bad or res.get("errors") or res.get("unfinished"):
        extra = f" non-200 {bad} errors {res.get('errors')} unfinished {res.get('unfinished')}"
    p = (
        f"p50 {lat['p50']:.2f} p99 {lat['p99']:.2f} p99.9 {lat['p999']:.2f} ms"
        if lat
        else "no answers"
    )
    usage = res["usage"]
    per = (
        f", {10_000 * usage.cpu_pct / res['achieved_rps']:.0f} us CPU a request"
        if usage.rss_peak_kb and res["achieved_rps"]
        else ""
    )
    return (
        f"{res['target_rps']:.0f}/s -> {res['achieved_rps']:.0f}/s, {p}, "
        f"conns {res.get('peak_conns')}{per}{extra} {usage.text()}"
    )


async def search(cores: Cores, t: Target, plan: Plan, ceiling: float) -> dict[str, Any]:
    """The highest rate whose p99 stays under the bound: up by 1.5x, then bisect (log scale)."""
    best: dict[str, Any] | None = None
    fail: float | None = None
    r = max(20.0, 0.6 * ceiling)
    for _ in range(plan.search_steps):
        res = await rate(cores, t, round(r), plan.search_s)
        ok = rate_ok(res)
        out(f"    search {'held' if ok else 'over'}: {rate_line(res)}")
        if not ok and res["usage"].others_pct > NOISY_PCT and not flag_of(res):
            # Other work took a core's worth meanwhile: once more before it decides.
            res = await rate(cores, t, round(r), plan.search_s)
            ok = rate_ok(res)
            out(f"    again, as others were busy: {'held' if ok else 'over'}: {rate_line(res)}")
        if ok:
            best = res
        else:
            fail = r
        lo = best["target_rps"] if best else None
        if fail is None:
            r = r * 1.5
        elif lo is None:
            r = r / 2
            if r < 10:
                break
        else:
            if fail / lo < 1.08:
                break
            r = math.sqrt(lo * fail)
    return best or {"target_rps": 0.0, "below": r}


# The three targets


async def wait_http(
    url: str, limit_s: float, ok: Callable[[int], bool] = lambda s: s < 500
) -> None:
    deadline = time.monotonic() + limit_s
    async with aiohttp.ClientSession() as s:
        while True:
            try:
                async with s.get(url) as r:
                    if ok(r.status):
                        return
            except aiohttp.ClientError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} did not answer within {limit_s:.0f} s")
            await asyncio.sleep(0.2)


async def post_status(t: Target, key: str | None = None) -> int:
    async with (
        aiohttp.ClientSession() as s,
        s.post(
            t.url,
            data=BODY,
            headers={"Authorization": f"Bearer {key or t.key}", "Content-Type": "application/json"},
        ) as r,
    ):
        await r.read()
        return r.status


async def start_mock(cores: Cores, tmp: Path) -> int:
    port = free_port()
    proc = procs.spawn(
        "mock",
        [str(PY), str(HERE / "mock.py"), "--port", str(port), "--chunks", str(CHUNKS)],
        cores.mock,
        tmp / "mock.log",
    )
    OURS.append(proc.pid)
    await wait_http(f"http://127.0.0.1:{port}/health", 15)
    return port


def cli(sock: Path, *args: str) -> str:
    res = subprocess.run(
        [str(LLMGW), "--socket", str(sock), *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if res.returncode != 0:
        raise RuntimeError(f"llmgw {' '.join(args)}: {res.stderr.strip()}")
    return res.stdout


async def api_post(sock: Path, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    conn = aiohttp.UnixConnector(path=str(sock))
    async with (
        aiohttp.ClientSession(connector=conn) as s,
        s.post(f"http://llmgwd/api/v1{path}", json=body) as r,
    ):
        return r.status, await r.json(content_type=None)


async def make_llmgw_keys(sock: Path, notes: list[str]) -> tuple[str, str | None]:
    """The bench key with huge limits (checked on every request, never reached), and a
    one-request-a-minute key that shows whether this build enforces limits at all."""
    help_text = cli(sock, "key", "create", "--help")
    if "--rpm" in help_text and "--tpm" in help_text:
        args = ["--rpm", str(HUGE_RPM), "--tpm", str(HUGE_TPM)]
        if "--budget-tokens" in help_text and "--budget-spend" in help_text:
            # Budgets too, so that their check and the spend at the model's price run.
            args += [
                "--budget-tokens",
                f"{HUGE_TPM * 1000}/month",
                "--budget-spend",
                "1000000000/month",
            ]
        key = cli(sock, "key", "create", "bench", *args).strip()
        tiny = cli(sock, "key", "create", "bench-tiny", "--rpm", "1").strip()
        notes.append(f"key limits set by `llmgw key create {' '.join(args)}`")
        return key, tiny
    limits = {"rpm": HUGE_RPM, "tpm": HUGE_TPM}
    status, answer = await api_post(sock, "/keys", {"name": "bench", "limits": limits})
    if status == 201:
        _, tiny = await api_post(sock, "/keys", {"name": "bench-tiny", "limits": {"rpm": 1}})
        notes.append("key limits set through /api/v1/keys {limits: {rpm, tpm}}")
        return str(answer["key"]), str(tiny["key"])
    notes.append(
        "limits: this build has no way to set key limits (no --rpm/--tpm, "
        "/api/v1/keys refuses 'limits'); keys are checked, limits are not"
    )
    return cli(sock, "key", "create", "bench").strip(), None


@contextlib.asynccontextmanager
async def llmgwd(
    cores: Cores, tmp: Path, mock_port: int, prefix_balancing: str = "", counting: str = ""
) -> AsyncIterator[Target]:
    """The real daemon, a key, the model, and a fake node that reports the mock ready;
    counting: client.request_metrics ('false': a second daemon beside the first's dir)."""
    d = tmp / ("llmgwd" if counting != "false" else "llmgwd-uncounted")
    d.mkdir()
    client, cluster = free_port(), free_port()
    sock = d / "llmgwd.sock"
    config = d / "server.yaml"
    config.write_text(
        f"name: bench\nstate_dir: {d / 'state'}\nsocket: {sock}\nlog_level: info\n"
        f"client:\n  listen: 127.0.0.1:{client}\n"
        + (f"  prefix_balancing: {prefix_balancing}\n" if prefix_balancing else "")
        + (f"  request_metrics: {counting}\n" if counting else "")
        + f"cluster:\n  listen: 127.0.0.1:{cluster}\n  advertise: https://127.0.0.1:{cluster}\n"
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("NOTIFY_SOCKET", "JOURNAL_STREAM", "INVOCATION_ID")
    }
    proc = procs.spawn(
        "llmgwd", [str(LLMGWD), "--config", str(config)], cores.proxy, tmp / "llmgwd.log", env=env
    )
    t = Target("llmgwd", client, "", proc.pid)
    OURS.append(proc.pid)
    await wait_http(f"http://127.0.0.1:{client}/v1/models", 20)
    t.results["rss_start_kb"] = rss_kb(proc.pid)
    t.key, tiny = await make_llmgw_keys(sock, t.notes)
    cli(sock, "model", "add", MODEL, "--from", "file:/var/empty/bench.gguf")
    if "price" in cli(sock, "model", "--help"):
        cli(sock, "model", "price", MODEL, "--prompt", "0.5", "--completion", "1.5")
        t.notes.append("model priced by `llmgw model price --prompt 0.5 --completion 1.5`")
    cli(sock, "model", "serve", MODEL, "--replicas", "1")
    token = json.loads(cli(sock, "node", "token", "--json"))["token"]
    url = f"https://127.0.0.1:{cluster}"
    async with fake_agent.joined(url, token, d / "agent-pki", "bench-node", "127.0.0.1", mock_port):
        deadline = time.monotonic() + 20
        while (status := await post_status(t)) != 200:
            if time.monotonic() > deadline:
                raise RuntimeError(f"llmgwd never answered 200 through the fake node ({status})")
            await asyncio.sleep(0.2)
        if tiny is not None:
            codes = [await post_status(t, tiny) for _ in range(3)]
            t.notes.append(f"limits enforced: a 1-rpm key got {codes} (429 expected after one)")
        if "usage" in cli(sock, "--help"):
            t.notes.append("accounting: `llmgw usage` is in this build")
        t.results["sock"] = str(sock)
        yield t
        with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
            if "usage" in cli(sock, "--help"):
                t.results["usage_cli"] = cli(sock, "usage").strip().splitlines()[:8]
    procs.stop(proc)


def ensure_litellm() -> Path:
    """LiteLLM's proxy in bench/router/.venv-litellm (never the project's venv or lock)."""
    exe = LITELLM_VENV / "bin" / "litellm"
    stamp = LITELLM_VENV / "bench-pins"
    want = " ".join((*LITELLM_PINS, PYSPY_PIN))
    if exe.exists() and stamp.exists() and stamp.read_text() == want:
        return exe
    out(f"  installing {want} into {LITELLM_VENV} (once)")
    py = LITELLM_VENV / "bin" / "python"
    if shutil.which("uv"):
        subprocess.run(
            ["uv", "venv", "-q", "--allow-existing", "--python", "3.11", str(LITELLM_VENV)],
            check=True,
            timeout=300,
        )
        subprocess.run(
            ["uv", "pip", "install", "-q", "--python", str(py), *want.split()],
            check=True,
            timeout=900,
        )
    else:
        subprocess.run([sys.executable, "-m", "venv", str(LITELLM_VENV)], check=True, timeout=300)
        subprocess.run(
            [str(py), "-m", "pip", "install", "-q", *want.split()], check=True, timeout=900
        )
    stamp.write_text(want)
    return exe


@contextlib.asynccontextmanager
async def litellm(cores: Cores, tmp: Path, mock_port: int) -> AsyncIterator[Target]:
    exe = ensure_litellm()
    d = tmp / "litellm"
    d.mkdir()
    shutil.copy(HERE / "litellm_auth.py", d / "litellm_auth.py")
    (d / "config.yaml").write_text(
        "model_list:\n"
        f"  - model_name: {MODEL}\n"
        "    litellm_params:\n"
        f"      model: openai/{MODEL}\n"
        f"      api_base: http://127.0.0.1:{mock_port}/v1\n"
        "      api_key: sk-mock\n"
        "general_settings:\n"
        "  master_key: sk-bench-master\n"
        "  custom_auth: litellm_auth.user_api_key_auth\n"
        "litellm_settings:\n"
        "  telemetry: false\n"
    )
    keys = {"sk-bench-virtual": {"rpm": HUGE_RPM, "tpm": HUGE_TPM}, "sk-bench-tiny": {"rpm": 1}}
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL",)} | {
        "BENCH_LITELLM_KEYS": json.dumps(keys),
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no fetch from GitHub at start
    }
    port = free_port()
    argv = [
        str(exe),
        "--config",
        str(d / "config.yaml"),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--num_workers",
        "1",
    ]
    proc = procs.spawn("litellm", argv, cores.proxy, tmp / "litellm.log", env=env, cwd=d)
    t = Target("LiteLLM", port, "sk-bench-virtual", proc.pid)
    OURS.append(proc.pid)
    t0 = time.monotonic()
    await wait_http(f"http://127.0.0.1:{port}/health/liveliness", 120, lambda s: s == 200)
    t.results["start_s"] = time.monotonic() - t0
    t.results["rss_start_kb"] = rss_kb(proc.pid)
    dists = sorted(LITELLM_VENV.glob("lib/python*/site-packages/litellm-*.dist-info"))
    version = dists[-1].name.removesuffix(".dist-info").split("-")[1] if dists else "?"
    t.notes.append(
        f"LiteLLM {version}, 1 worker (uvicorn), no database: "
        "master key + virtual keys by custom_auth with rpm/tpm limits (no budgets or "
        "spend tracking: those live in its database)"
    )
    status = await post_status(t)
    if status != 200:
        raise RuntimeError(f"LiteLLM answered {status} to the bench key")
    codes = [await post_status(t, "sk-bench-tiny") for _ in range(3)]
    bad = await post_status(t, "sk-not-a-key")
    t.notes.append(f"limits enforced: a 1-rpm key got {codes}; an unknown key got {bad}")
    yield t
    procs.stop(proc)


# One target's measurements


def p99_of(res: dict[str, Any], kind: str = "latency_ms") -> float:
    return float(res.get(kind, {}).get("p99", math.inf))


async def measure(
    cores: Cores, t: Target, plan: Plan, ceiling: float | None, base: Target | None
) -> None:
    """All of one target's figures. The latency steps of a proxy run in pairs with direct
    (direct just before it), so that what it adds is read against a machine in the same
    state: other work on this shared machine comes and goes within seconds."""
    r = t.results
    out(f"\n== {t.name} ==")
    for note in t.notes:
        out(f"  {note}")
    # Warm-up: first requests import and build things lazily (LiteLLM especially).
    await rate(cores, t, 50, plan.warm_s)
    await streams(cores, t, 10, 0.1, 20)
    await asyncio.sleep(1.0)
    if t.pid:
        r["rss_idle_kb"] = rss_kb(t.pid)
        out(
            f"  RSS at start {r['rss_start_kb'] / 1024:.0f} MiB, idle after warm-up "
            f"{r['rss_idle_kb'] / 1024:.0f} MiB"
        )

    w = await wrk(cores, t, plan.wrk_s)
    r["wrk"] = w
    out(
        f"  wrk (64 connections, closed loop): {w.get('rps', 0):.0f} req/s, p50 "
        f"{w.get('p50_ms', 0):.2f} p99 {w.get('p99_ms', 0):.2f} ms, non-2xx {w.get('non2xx')}"
        f" {w.get('socket_errors', '')} {w['usage'].text()}"
    )

    hint = min(w.get("rps", 1000.0), ceiling or 1e9)
    out(f"  p99 < {P99_BOUND_MS:g} ms: searching the rate (open loop, {plan.search_s:g} s a step)")
    r["search"] = await search(cores, t, plan, hint)

    if base is not None:
        for rps in (100, 500):
            pairs: list[tuple[dict[str, Any], dict[str, Any]]] = []
            while len(pairs) < plan.repeats:
                pairs.append(
                    (
                        await rate(cores, base, rps, plan.rate_s),
                        await rate(cores, t, rps, plan.rate_s),
                    )
                )
                if flag_of(pairs[0][1]):
                    break  # overloaded: once is enough
            # The median pair by added p99: one burst of other work does not decide it.
            pairs.sort(key=lambda p: p99_of(p[1]) - p99_of(p[0]))
            pick = len(pairs) // 2
            r[f"rate{rps}_base"], r[f"rate{rps}"] = pairs[pick]
            for i, (d, res) in enumerate(pairs):
                mark = " (median)" if len(pairs) > 1 and i == pick else ""
                out(f"  at {rps}/s{mark}: {rate_line(res)}")
                out(f"    direct just before: {rate_line(d)}")

        n = plan.stream_latency_n
        d = await streams(cores, base, n, n / 25, 30)
        res = await streams(cores, t, n, n / 25, 30)
        r["stream_latency_base"], r["stream_latency"] = d, res
        out(f"  {n} streams, 25 new a second: {stream_line(res)}")
        out(f"    direct just before: {stream_line(d)}")

    r["levels"] = []
    for level in plan.stream_levels:
        ramp = min(1.0, level / 1000)
        res = await streams(cores, t, level, ramp, plan.level_s + level / 150)
        res["held"] = held(res)
        r["levels"].append(res)
        out(
            f"  {level} streams at once ({ramp:g} s ramp): "
            f"{'held' if res['held'] else 'NOT held'}: {stream_line(res)}"
        )
        if not res["held"]:
            break
    if t.pid:
        r["rss_hwm_kb"] = hwm_kb(t.pid)


def held(res: dict[str, Any]) -> bool:
    return bool(not res.get("error") and res["complete"] == res["n"] and res["chunks_lost"] == 0)


def stream_line(res: dict[str, Any]) -> str:
    if res.get("error"):
        return str(res["error"])
    ttft, gap = res.get("ttft_ms", {}), res.get("gap_ms", {})
    f = (
        f"first chunk p50 {ttft.get('p50', 0):.2f} p99 {ttft.get('p99', 0):.2f} ms, gap p50 "
        f"{gap.get('p50', 0):.2f} p99 {gap.get('p99', 0):.2f} max {gap.get('max', 0):.0f} ms"
    )
    bad = ""
    if res["complete"] != res["n"]:
        bad = (
            f"; complete {res['complete']}/{res['n']}, chunks lost {res['chunks_lost']}, "
            f"no usage {res['without_usage']}, unfinished {res['unfinished']}, "
            f"statuses {res['statuses']}, errors {dict(list(res['errors'].items())[:3])}"
        )
    if res.get("listen_overflows"):
        bad += f"; the kernel's accept queues overflowed {res['listen_overflows']} times"
    return f"{f}, peak open {res['peak_open']}, {res['elapsed_s']:.1f} s{bad} {res['usage'].text()}"


# Profile


async def profile(cores: Cores, t: Target, plan: Plan, tmp: Path) -> None:
    """py-spy on llmgwd under wrk's load (and under streams in the full run)."""
    pyspy = LITELLM_VENV / "bin" / "py-spy"
    if not pyspy.exists() or not t.pid:
        out("  (no py-spy: profile skipped)")
        return
    loads: list[tuple[str, Callable[[], Any]]] = [
        ("requests (wrk, 64 connections)", lambda: wrk(cores, t, plan.profile_s + 2, 64, False)),
    ]
    if plan.profile_streams:
        loads.append(("1000 streams", lambda: streams(cores, t, 1000, 1.0, 40, False)))
    for label, load in loads:
        name = "requests" if label.startswith("requests") else "streams"
        raw = HERE / f"profile-llmgwd-{name}.txt"
        await quiet(t.pid)
        spy = await asyncio.create_subprocess_exec(
            str(pyspy),
            "record",
            "--pid",
            str(t.pid),
            "--duration",
            str(plan.profile_s),
            "--rate",
            "200",
            "--nonblocking",
            "--format",
            "raw",
            "--output",
            str(raw),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            preexec_fn=pinner(cores.load),
        )
        loaded = asyncio.create_task(load())
        try:
            _, err = await asyncio.wait_for(spy.communicate(), plan.profile_s + 30)
        except TimeoutError:
            spy.kill()
            err = b"timed out"
        await loaded
        if spy.returncode != 0 or not raw.exists():
            out(f"  py-spy failed: {err.decode()[-300:]}")
            continue
        out(
            f"\n  py-spy, llmgwd under {label}, {plan.profile_s} s "
            f"(collapsed stacks in {raw.relative_to(ROOT)}):"
        )
        for line in summarize_profile(raw):
            out("    " + line)


AREAS = [
    ("logging", ("logging/",)),
    (
        "llmgwd router",
        (
            "llmgwd/router/",
            "llmgwd/accounting/",
            "llmgwd/catalog",
            "llmgwd/nodes/",
        ),
    ),
    (
        "aiohttp client",
        ("aiohttp/client", "aiohttp/connector", "aiohttp/tracing", "aiohttp/cookiejar"),
    ),
    ("aiohttp server", ("aiohttp/web", "aiohttp/base_protocol")),
    ("aiohttp common", ("aiohttp/", "multidict", "yarl")),
    ("event loop (uvloop, C)", ("asyncio/runners",)),
    ("asyncio", ("asyncio/",)),
    ("msgspec/json", ("msgspec", "json/")),
]


def _frame(frame: str) -> tuple[str, str]:
    """'func (path/file.py:12)' into ('func (file.py)', 'path/file.py')."""
    m = re.match(r"(.*) \((.*?)(?::\d+)?\)$", frame)
    if not m:
        return frame, ""
    path = m.group(2)
    short = "/".join(path.split("/")[-2:])
    return f"{m.group(1)} ({short})", path


def summarize_profile(raw: Path) -> list[str]:
    """Self time by function, and by area of the code (the leaf frame's file)."""
    own: collections.Counter[str] = collections.Counter()
    areas: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [_frame(f) for f in stack.split(";")]
        name, path = frames[-1]
        if name.startswith("run (asyncio/runners.py"):
            name = "the event loop itself (uvloop's C code: epoll, sockets, callbacks)"
        own[name] += n
        area = next((a for a, keys in AREAS if any(k in path for k in keys)), "other")
        areas[area] += n
        for f in {fn for fn, p in frames if "llmgwd/" in p and "main.py" not in p}:
            inclusive[f] += n
    if not total:
        return ["no samples"]
    lines = [
        f"{total} samples; self time by area: "
        + ", ".join(f"{a} {100 * n / total:.0f}%" for a, n in areas.most_common())
    ]
    lines.append("self time, top functions:")
    lines += [f"  {100 * n / total:5.1f}%  {f}" for f, n in own.most_common(14)]
    lines.append("llmgwd's own functions, time inside them (callees included):")
    lines += [f"  {100 * n / total:5.1f}%  {f}" for f, n in inclusive.most_common(8)]
    return lines


# The table

NOISE_MS = 0.05  # an added delay below this is within the timer's and the machine's noise


def ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def count(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}"


def better_by(gw: float | None, lt: float | None, higher_is_better: bool) -> str:
    """How many times llmgwd's figure beats LiteLLM's: 'x12' better, 'x0.5' worse."""
    if gw is None or lt is None:
        return "-"
    if higher_is_better:
        if lt <= 0:
            return "-" if gw <= 0 else "LiteLLM 0"
        r = gw / lt
    else:
        # Added delays: one below the noise counts as the noise, so signs cannot flip it.
        if gw <= NOISE_MS and lt <= NOISE_MS:
            return "-"
        r = max(lt, NOISE_MS) / max(gw, NOISE_MS)
    return f"x{r:.0f}" if r >= 100 else f"x{r:.3g}"


def added(t: Target, step: str, q: str, kind: str = "latency_ms") -> float | None:
    """t's figure minus that of direct's run paired with it."""
    a = t.results.get(step, {}).get(kind, {}).get(q)
    b = t.results.get(step + "_base", {}).get(kind, {}).get(q)
    return None if a is None or b is None else a - b


def flag(t: Target, step: str) -> str:
    return flag_of(t.results.get(step, {}))


def flag_of(res: dict[str, Any]) -> str:
    """A mark for a rate the target could not keep up with."""
    late = res.get("achieved_rps", 0) < 0.97 * res.get("target_rps", 0)
    return "!" if res.get("unfinished") or res.get("errors") or late else ""


def report(direct: Target, targets: list[Target]) -> None:
    cols = [direct, *targets]
    names = [c.name for c in cols]
    rows: list[list[str]] = []

    def row(
        label: str,
        values: list[float | None],
        fmt: Callable[[float | None], str] = ms,
        higher_is_better: bool = False,
        marks: list[str] | None = None,
    ) -> None:
        by = dict(zip(names, values, strict=True))
        cells = [fmt(v) + (marks[i] if marks else "") for i, v in enumerate(values)]
        rows.append(
            [label, *cells, better_by(by.get("llmgwd"), by.get("LiteLLM"), higher_is_better)]
        )

    row(
        f"req/s at p99 < {P99_BOUND_MS:g} ms (open loop)",
        [c.results.get("search", {}).get("target_rps") for c in cols],
        count,
        higher_is_better=True,
    )
    row(
        "req/s max (wrk, 64 conns, closed loop)",
        [c.results.get("wrk", {}).get("rps") for c in cols],
        count,
        higher_is_better=True,
    )
    # Direct's column for the paired steps: the runs paired with the first proxy.
    paired = targets[0].results if targets else {}
    for rps in (100, 500):
        for q in ("p50", "p99"):
            step = f"rate{rps}"
            direct_v = paired.get(step + "_base", {}).get("latency_ms", {}).get(q)
            row(
                f"latency {q} at {rps}/s (ms; added for proxies)",
                [direct_v] + [added(t, step, q) for t in targets],
                marks=[""] + [flag(t, step) for t in targets],
            )
    for label, kind, q in (
        ("first chunk p50", "ttft_ms", "p50"),
        ("first chunk p99", "ttft_ms", "p99"),
        ("gap between chunks p50", "gap_ms", "p50"),
        ("gap between chunks p99", "gap_ms", "p99"),
    ):
        direct_v = paired.get("stream_latency_base", {}).get(kind, {}).get(q)
        row(
            f"{label} (ms; added for proxies)",
            [direct_v] + [added(t, "stream_latency", q, kind) for t in targets],
        )
    held_levels = [most_held(c) for c in cols]
    by = dict(zip(names, held_levels, strict=True))
    rows.append(
        [
            "streams held, no chunk lost (peak open at once)",
            *[f"{n} ({peak})" for n, peak in held_levels],
            better_by(
                by["llmgwd"][0] if "llmgwd" in by else None,
                by["LiteLLM"][0] if "LiteLLM" in by else None,
                True,
            ),
        ]
    )
    for label, key in (("RSS idle (MiB)", "rss_idle_kb"), ("RSS peak, VmHWM (MiB)", "rss_hwm_kb")):
        row(label, [None] + [t.results.get(key, 0) / 1024 for t in targets], count)

    header = ["", *names, "llmgwd better by"]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    out("\n== figures ==")
    for cells in [header, *rows]:
        out(
            "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w)
                for i, (c, w) in enumerate(zip(cells, widths, strict=True))
            ).rstrip()
        )
    out("direct: the mock alone; for llmgwd and LiteLLM the latency rows give what they add")
    out("to direct's figure in a run just before theirs (direct's column: the runs paired")
    out("with the first proxy). '!': the proxy did not keep that rate (requests")
    out("unanswered or late), so the delay it adds is larger than shown. 'llmgwd better by':")
    out("LiteLLM's figure over llmgwd's (for req/s and streams the other way round).")
    avg = [u for u in SEEN_OTHERS if u >= 0]
    if avg:
        out(
            f"Other work on this shared machine took {sum(avg) / len(avg):.0f}% of a core on "
            f"average during the steps (of {100 * len(core_ticks())}%); see 'others' per step."
        )

    gw = next((t for t in targets if t.name == "llmgwd"), None)
    lt = next((t for t in targets if t.name == "LiteLLM"), None)
    if gw is not None:
        goals(gw, lt, direct)


def most_held(t: Target) -> tuple[int, int]:
    """The largest level of streams held whole, and how many of them were open at once."""
    done = [(lv["n"], lv["peak_open"]) for lv in t.results.get("levels", []) if lv.get("held")]
    return max(done) if done else (0, 0)


def goals(gw: Target, lt: Target | None, direct: Target) -> None:
    """The issue's goals, read against this run's figures (reading, not a pass/fail)."""
    r = gw.results
    at = r.get("search", {}).get("target_rps", 0.0)
    mx = r.get("wrk", {}).get("rps", 0.0)
    add99 = added(gw, "rate500", "p99")
    streams_held, peak = most_held(gw)
    out("\n== read against issue 3's goals ==")
    out(
        f"  >= 2,000 req/s on one core (auth, limits, accounting): {at:.0f}/s at p99 < "
        f"{P99_BOUND_MS:g} ms, {mx:.0f}/s closed-loop max -> "
        f"{'reached' if at >= 2000 else 'not reached'}"
    )
    if add99 is not None:
        own = p99_of(r["rate500"])
        base = p99_of(r["rate500_base"])
        out(
            f"  added p99 < 2 ms at 500 req/s: {add99:.2f} ms (llmgwd {own:.2f} ms, direct "
            f"{base:.2f} ms just before) -> "
            f"{'reached' if add99 < 2 and not flag(gw, 'rate500') else 'not reached'}"
        )
    if lt is not None:
        lat = lt.results.get("search", {}).get("target_rps", 0.0)
        lmx = lt.results.get("wrk", {}).get("rps", 0.0)
        times = f"{at / lat:.1f}x" if lat else "LiteLLM held no rate at that bound"
        out(
            f"  >= 10x LiteLLM's rate at p99 < {P99_BOUND_MS:g} ms: {at:.0f} vs {lat:.0f} "
            f"({times}); closed-loop max {mx:.0f} vs {lmx:.0f} ({better_by(mx, lmx, True)}) -> "
            f"{'reached' if (not lat and at) or (lat and at / lat >= 10) else 'not reached'}"
        )
    out(
        f"  5,000 concurrent streams, no chunk lost: {streams_held} held, {peak} of them open "
        f"at once -> {'reached' if streams_held >= 5000 and peak >= 4750 else 'not reached'}"
    )


# Main


async def run(args: argparse.Namespace) -> None:
    plan = QUICK if args.quick else FULL
    QUIET_BUDGET_S[0], SETTLE_S[0] = plan.quiet_s, plan.settle_s
    cores = layout()
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # children inherit it
    if hard < 12000:
        # The proxy holds two sockets a stream: skip the levels the fd limit cannot take.
        levels = tuple(n for n in plan.stream_levels if 2 * n + 200 < hard)
        plan = dataclasses.replace(plan, stream_levels=levels)
    out(
        f"bench/router {'--quick ' if args.quick else ''}at {time.strftime('%Y-%m-%d %H:%M:%S')}"
        f" on {platform.node()}: {os.cpu_count()} cpus, Python {platform.python_version()}, "
        f"fd limit {hard}"
    )
    out(f"  {cores.text()}; load average {' '.join(map(str, os.getloadavg()))} at start")
    with tempfile.TemporaryDirectory(prefix="llmgw-bench-") as tmpdir:
        tmp = Path(tmpdir)
        try:
            mock_port = await start_mock(cores, tmp)
            direct = Target("direct", mock_port, "sk-any")
            t_start = time.monotonic()
            await measure(cores, direct, plan, 20000.0, None)
            targets: list[Target] = []
            prefix = {"on": "true", "off": "false"}.get(args.prefix_balancing, "")
            out(f"  llmgwd with client.prefix_balancing {prefix or 'as it defaults'}")
            async with llmgwd(cores, tmp, mock_port, prefix) as gw:
                await measure(cores, gw, plan, None, direct)
                targets.append(gw)
                if not args.no_profile:
                    await profile(cores, gw, plan, tmp)
            if args.metrics_off_too:
                targets.append(await uncounted(cores, tmp, mock_port, prefix, direct, plan))
            if not args.skip_litellm:
                async with litellm(cores, tmp, mock_port) as lt:
                    out(f"  (LiteLLM took {lt.results['start_s']:.0f} s to start)")
                    await measure(cores, lt, plan, None, direct)
                    targets.append(lt)
            for t in targets:
                for line in t.results.get("usage_cli", []):
                    out(f"  {t.name} usage: {line}")
            report(direct, targets)
            metrics_cost(targets)
            out(
                f"\n{time.monotonic() - t_start:.0f} s; load average "
                f"{' '.join(map(str, os.getloadavg()))} at the end (other work on the machine "
                "shows here and in the cpuN figures of each step)"
            )
        except Exception:
            for name in ("llmgwd.log", "litellm.log", "mock.log"):
                log = tmp / name
                if log.exists():
                    out(f"--- last lines of {name} ---")
                    for line in log.read_text(errors="replace").splitlines()[-15:]:
                        out(line)
            raise
        finally:
            procs.stop_all()


async def uncounted(
    cores: Cores, tmp: Path, mock_port: int, prefix: str, direct: Target, plan: Plan
) -> Target:
    """llmgwd measured again in the same run with client.request_metrics false."""
    out("  llmgwd again with client.request_metrics false (no /v1 request counted)")
    async with llmgwd(cores, tmp, mock_port, prefix, counting="false") as off:
        off.name = METRICS_OFF
        await measure(cores, off, plan, None, direct)
    return off


def metrics_cost(targets: list[Target]) -> None:
    """llmgwd counting each request beside llmgwd counting none (issue 14: within 5%)."""
    on = next((t for t in targets if t.name == "llmgwd"), None)
    off = next((t for t in targets if t.name == METRICS_OFF), None)
    if on is None or off is None:
        return
    out("\n== metrics on vs off (client.request_metrics) ==")
    for label, path in (
        (f"req/s at p99 < {P99_BOUND_MS:g} ms", ("search", "target_rps")),
        ("req/s max (wrk)", ("wrk", "rps")),
    ):
        a, b = (t.results.get(path[0], {}).get(path[1]) for t in (on, off))
        change = f"{100 * (a / b - 1):+.1f}%" if a and b else "-"
        out(f"  {label}: on {count(a)}, off {count(b)} ({change} with metrics on)")
    for step in ("rate100", "rate500"):
        a, b = (added(t, step, "p99") for t in (on, off))
        out(f"  added p99 at {step[4:]}/s: on {ms(a)}{flag(on, step)}, off {ms(b)}"
            f"{flag(off, step)} ms")  # fmt: skip
        cpu = [per_request_us(t.results.get(step, {})) for t in (on, off)]
        if all(cpu):
            out(f"  CPU a request at {step[4:]}/s: on {cpu[0]:.0f} us, off {cpu[1]:.0f} us")


def per_request_us(res: dict[str, Any]) -> float | None:
    """llmgwd's CPU for each request of a rate step, in microseconds."""
    usage = res.get("usage")
    if usage is None or not usage.rss_peak_kb or not res.get("achieved_rps"):
        return None
    return float(10_000 * usage.cpu_pct / res["achieved_rps"])


def ensure_wrk() -> None:
    """Debian's wrk, installed once if this runs as root with apt."""
    if not shutil.which("wrk") and os.geteuid() == 0 and shutil.which("apt-get"):
        out("  installing Debian's wrk (once)")
        subprocess.run(
            ["apt-get", "install", "-y", "-q", "wrk"],
            check=False,
            timeout=300,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    if not shutil.which("wrk"):
        raise SystemExit("bench/router needs wrk (apt-get install wrk)")


def main() -> None:
    global out
    parser = argparse.ArgumentParser(
        prog="bench/router/run",
        description="llmgwd's /v1 router against the mock direct "
        "and against LiteLLM's proxy; prints figures, never passes or fails on a time",
    )
    parser.add_argument("--quick", action="store_true", help="a pass of 2-3 minutes")
    parser.add_argument("--skip-litellm", action="store_true", help="direct and llmgwd only")
    parser.add_argument("--no-profile", action="store_true", help="no py-spy profile of llmgwd")
    parser.add_argument("--output", type=Path, default=HERE / "last-run.txt")
    parser.add_argument(
        "--prefix-balancing", choices=("on", "off"), help="llmgwd's setting (else its default)"
    )
    parser.add_argument(
        "--metrics-off-too",
        action="store_true",
        help="measure llmgwd a second time with client.request_metrics false, in the same run",
    )
    args = parser.parse_args()
    out = Out(args.output)

    def stop(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, stop)
    try:
        ensure_wrk()
        uvloop.run(run(args))
    except KeyboardInterrupt:
        out("interrupted")
        sys.exit(130)
    finally:
        procs.stop_all()
        out.close()


if __name__ == "__main__":
    main()
