"""bench/router/gc_tail.py: the router's open-loop latency tail, garbage collector default or tuned.

The router is built in this process as llmgwd builds it (cpu_per_request.router_port: the
client port, its middlewares, a Meter, prefix-aware balancing over two replicas, the access
line to /dev/null), with all of llmgwd's modules imported as the daemon has them (about
70,000 objects the collector tracks); the mock engine and the open-loop load generator
(loadgen.py) run in children on the other core. Each round sets one collector mode in this
process, then loadgen.py sends a fixed rate for a few seconds; the modes take turns round by
round in ABBA order, so a machine that gets busier weighs on each alike.

A mode: `default` (thresholds 700/10/10, nothing frozen), `daemon` (what llmgw.entry does once
a daemon has started), `freeze` (default thresholds), or `[freeze:]T0[/T1/T2]` (frozen or not,
those thresholds). Each round starts from a full collection (and a freeze where the mode
freezes). gc.callbacks time every collection: per round, collections by generation, the longest
pause (wall clock: the loop held, the core taken by others meanwhile counted) and the most CPU
one took (this thread's: the collector's own cost), and both in all; "others": the CPU that
other work on the machine took meanwhile, in % of one core.

    .venv/bin/python bench/router/gc_tail.py [--rates 500,1200] [--rounds 6] [--seconds 4]
        [--modes default,daemon]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvloop
from cpu_per_request import CHAT, SECRET, router_port, start_mock

import llmgwd.daemon  # noqa: F401 (the daemon's modules and their objects, as llmgwd has them)
from llmgw import entry
from llmgw import log as llmgw_log

HERE = Path(__file__).resolve().parent
PY = HERE.parents[1] / ".venv" / "bin" / "python"
DEFAULT = (700, 10, 10)


@dataclass(frozen=True)
class Mode:
    name: str
    freeze: bool
    threshold: tuple[int, int, int]

    @staticmethod
    def parse(spec: str) -> Mode:
        if spec == "default":
            return Mode(spec, False, DEFAULT)
        if spec == "daemon":
            return Mode(spec, True, entry.GC_THRESHOLD)
        if spec == "freeze":
            return Mode(spec, True, DEFAULT)
        freeze = spec.startswith("freeze:")
        parts = [int(p) for p in spec.removeprefix("freeze:").split("/")]
        parts += list(DEFAULT[len(parts) :])
        return Mode(spec, freeze, (parts[0], parts[1], parts[2]))

    def apply(self) -> None:
        """This mode from a clean slate: nothing frozen, a full collection, then its settings."""
        gc.unfreeze()
        gc.set_threshold(*self.threshold)
        gc.collect()
        if self.freeze:
            gc.freeze()


@dataclass
class Pauses:
    """Every collection in a round: how many of each generation, how long the longest held the
    loop (wall clock, which counts the core taken by others meanwhile) and what it cost (this
    thread's CPU, which does not), and both in all."""

    started: tuple[float, float] = (0.0, 0.0)
    by_gen: list[int] = field(default_factory=lambda: [0, 0, 0])
    longest_ms: float = 0.0
    longest_gen: int = -1
    longest_cpu_ms: float = 0.0
    total_ms: float = 0.0
    total_cpu_ms: float = 0.0

    def callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self.started = (time.perf_counter(), time.thread_time())
            return
        took = (time.perf_counter() - self.started[0]) * 1e3
        cpu = (time.thread_time() - self.started[1]) * 1e3
        self.by_gen[info["generation"]] += 1
        self.total_ms += took
        self.total_cpu_ms += cpu
        self.longest_cpu_ms = max(self.longest_cpu_ms, cpu)
        if took > self.longest_ms:
            self.longest_ms, self.longest_gen = took, info["generation"]


@dataclass
class Round:
    mode: str
    rate: float
    result: dict[str, Any]
    pauses: Pauses
    others_pct: float
    cpu_us: float  # this process's CPU (the router's, collections included) a request sent

    def line(self) -> str:
        lat, p = self.result.get("latency_ms", {}), self.pauses
        if not lat:
            return f"{self.mode:22} {self.rate:6.0f}/s  {self.result.get('error', 'no answers')}"
        bad = {k: v for k, v in self.result.get("statuses", {}).items() if k != "200"}
        extra = f" non-200 {bad}" if bad or self.result.get("errors") else ""
        return (
            f"{self.mode:22} {self.rate:6.0f}/s {self.result['achieved_rps']:7.0f} "
            f"{lat['p50']:6.2f} {lat['p99']:6.2f} {lat['p999']:6.2f} {lat['max']:7.2f}   "
            f"{p.by_gen[0]:4d} {p.by_gen[1]:4d} {p.by_gen[2]:3d} {p.longest_ms:7.2f} "
            f"(gen {p.longest_gen:2d}) {p.longest_cpu_ms:6.2f} {p.total_ms:7.1f} "
            f"{p.total_cpu_ms:7.1f} {self.cpu_us:6.0f}  {self.others_pct:5.0f}%"
            f"{extra}"
        )


def cores() -> tuple[set[int], set[int]]:
    """(the router's core, the mock's and the load's): the last core alone for the router."""
    cpus = sorted(os.sched_getaffinity(0))
    return {cpus[-1]}, set(cpus[:-1]) or {cpus[-1]}


def machine_jiffies() -> tuple[int, int]:
    """(busy, all) jiffies of every core together since boot."""
    v = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return sum(v) - v[3] - v[4], sum(v)


def ours_jiffies(pid: int) -> int:
    """CPU jiffies of this process, its children waited for (the load), and the mock."""
    total = 0
    for p, fields in ((os.getpid(), 4), (pid, 2)):
        with contextlib.suppress(OSError):
            stat = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += sum(int(x) for x in stat[11 : 11 + fields])  # utime stime [cutime cstime]
    return total


async def loadgen(cpus: set[int], cfg: dict[str, Any], limit_s: float) -> dict[str, Any]:
    """loadgen.py's rate mode, pinned to cpus, run while this loop goes on serving."""
    proc = await asyncio.create_subprocess_exec(
        str(PY), str(HERE / "loadgen.py"), "rate", json.dumps(cfg),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        preexec_fn=lambda: os.sched_setaffinity(0, cpus),
    )  # fmt: skip
    try:
        out, err = await asyncio.wait_for(proc.communicate(), limit_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return {"error": f"load generator ran past {limit_s:.0f} s"}
    lines = out.decode().strip().splitlines()
    if proc.returncode != 0 or not lines:
        return {"error": f"load generator failed: {err.decode()[-500:]}"}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


async def one_round(mode: Mode, rate: float, cfg: dict[str, Any], load: set[int], mock_pid: int
                    ) -> Round:  # fmt: skip
    """One mode at one rate: its collector settings, the load, what the collector did."""
    mode.apply()
    pauses = Pauses()
    busy0, ours0, cpu0 = machine_jiffies(), ours_jiffies(mock_pid), time.process_time()
    gc.callbacks.append(pauses.callback)
    try:
        limit = cfg["duration_s"] + cfg["warmup_s"] + 30
        result = await loadgen(load, {**cfg, "rps": rate}, limit)
    finally:
        gc.callbacks.remove(pauses.callback)
    sent = int(rate * (cfg["duration_s"] + cfg["warmup_s"]))  # as loadgen.py counts them
    cpu = (time.process_time() - cpu0) * 1e6 / sent
    busy1, ours1 = machine_jiffies(), ours_jiffies(mock_pid)
    span = max(1, busy1[1] - busy0[1]) / (os.cpu_count() or 1)  # jiffies of one core
    others = max(0, (busy1[0] - busy0[0]) - (ours1 - ours0)) / span * 100
    return Round(mode.name, rate, result, pauses, others, cpu)


QUIET_PCT = 25.0  # a round with less of other work than this, in % of one core, is quiet


def group_line(name: str, rate: float, mine: list[Round]) -> str:
    """One mode at one rate over its rounds: medians, and the p99 of the quiet rounds alone."""
    lat = [r.result["latency_ms"] for r in mine if r.result.get("latency_ms")]

    def med(key: str, lat: list[dict[str, float]] = lat) -> float:
        return statistics.median(x[key] for x in lat)

    gens = [statistics.median(r.pauses.by_gen[g] for r in mine) for g in range(3)]
    quiet = [r.result["latency_ms"]["p99"] for r in mine
             if r.others_pct < QUIET_PCT and r.result.get("latency_ms")]  # fmt: skip
    quiet_p99 = f"{statistics.median(quiet):.2f} ms ({len(quiet)})" if quiet else "none"
    return (
        f"{name:22} {rate:6.0f}/s  p50 {med('p50'):7.2f}  p99 {med('p99'):7.2f}  max "
        f"{med('max'):7.2f} ms;  quiet p99 {quiet_p99};  collections {gens[0]:.0f}/"
        f"{gens[1]:.0f}/{gens[2]:.0f}, longest {max(r.pauses.longest_ms for r in mine):.2f} ms "
        f"({max(r.pauses.longest_cpu_ms for r in mine):.2f} CPU), CPU in them "
        f"{statistics.median(r.pauses.total_cpu_ms for r in mine):.0f} ms a round; "
        f"{statistics.median(r.cpu_us for r in mine):.0f} us a request"
    )


def summary(rounds: list[Round], modes: list[Mode], rates: list[float]) -> list[str]:
    """Per rate and mode, over its rounds (those with answers)."""
    lines = []
    for rate in rates:
        for mode in modes:
            mine = [r for r in rounds if r.rate == rate and r.mode == mode.name]
            if any(r.result.get("latency_ms") for r in mine):
                lines.append(group_line(mode.name, rate, mine))
    return lines


async def run(args: argparse.Namespace, modes: list[Mode], load: set[int], mock: Any,
              mock_port: int) -> None:  # fmt: skip
    runner, port = await router_port(mock_port)
    body = (CHAT % b"").decode()
    cfg = {"port": port, "path": "/v1/chat/completions", "key": SECRET, "body": body,
           "duration_s": args.seconds, "warmup_s": 0.5, "max_conns": 64}  # fmt: skip
    rates = [float(r) for r in args.rates.split(",")]
    rounds: list[Round] = []
    print(f"{'mode':22} {'rate':>8} {'got':>7} {'p50':>6} {'p99':>6} {'p99.9':>6} {'max':>7}"
          f"   {'gen0':>4} {'gen1':>4} {'gn2':>3} {'longest':>7} {'':8} {'CPU':>6} "
          f"{'all':>7} {'CPU':>7} {'us/req':>6}  others")  # fmt: skip
    try:
        await loadgen(load, {**cfg, "rps": rates[0], "duration_s": 1.0}, 60)  # warm
        for rate in rates:
            for i in range(args.rounds):
                for mode in modes if i % 2 == 0 else modes[::-1]:
                    rounds.append(await one_round(mode, rate, cfg, load, mock.pid))
                    print(rounds[-1].line(), flush=True)
    finally:
        await runner.cleanup()
    print(f"\nmedians of the rounds; quiet p99: the median of the rounds where others took under "
          f"{QUIET_PCT:.0f}% (how many); collections by generation, a round's median; the "
          "longest pause of all rounds and the most CPU one took; the CPU all of a round's "
          "collections took; this process's CPU a request sent")  # fmt: skip
    print("\n".join(summary(rounds, modes, rates)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="500,1200", help="requests a second, comma-separated")
    parser.add_argument("--rounds", type=int, default=6, help="rounds of each mode at each rate")
    parser.add_argument("--seconds", type=float, default=4.0, help="measured seconds a round")
    parser.add_argument("--modes", default="default,daemon", help="collector modes, in turn")
    args = parser.parse_args()
    modes = [Mode.parse(m) for m in args.modes.split(",")]
    proxy, load = cores()
    stderr = sys.stderr
    sys.stderr = open(os.devnull, "w")  # noqa: SIM115 (the access lines go there)
    llmgw_log.setup("llmgwd", "info")
    sys.stderr = stderr
    mock, mock_port = start_mock(16)
    os.sched_setaffinity(mock.pid, load)
    os.sched_setaffinity(0, proxy)
    print(f"router on cpu {proxy}, mock and load on {load}; Python {sys.version.split()[0]}; "
          f"{len(gc.get_objects())} objects tracked; {args.seconds:.1f} s a round; "
          f"modes {', '.join(m.name for m in modes)}")  # fmt: skip
    try:
        uvloop.run(run(args, modes, load, mock, mock_port))
    finally:
        gc.unfreeze()
        mock.terminate()
        mock.wait()


if __name__ == "__main__":
    main()
