"""bench/upgrade/bench.py: an `llmgw upgrade` roll over 3 control planes and 20 simulated nodes:
its wall time, its order, and per model the longest time it had fewer ready replicas than
wanted. Prints figures; passes or fails on no time.

The real roll (llmgwd.upgrade.roll) and the leader's driver (llmgwd.upgrade.driver.Driver) run
in this process over a real SQLite store (in memory), as tests/llmgwd/test_upgrade_api.py
drives them, on a virtual clock: the Driver takes its clock, and its passes (one every
driver.EVERY_S, as Driver.run makes them) are called here at their virtual times, so a roll of
minutes runs in a second or two and no time is scaled. What is simulated stands in for
ClusterState: each host's llmgw-agentd answers wire.Upgrade as llmgw_agentd/upgrade.py does
(fetching, told every second; installing; the packages' scripts restart the agent, and on a
control plane's host llmgwd, at the install's end; the new agent, told the same try again,
says "restarting"), and the leader's llmgwd stopping passes leadership to another plane after
--failover-s, whose new Driver carries the stored roll on. A model's replica is ready while its
host's agent is connected or away for less than the node grace (ClusterState's 60 s): engines
are units of their own and stay up; --engines-restart stops them with the agent and a replica
is ready again --engine-load-s after its agent is back.

No per-host figures of a real roll are recorded (integration/test_packages.py times only its
whole run, three package builds included), so the step times are flags, their defaults guesses.

    .venv/bin/python bench/upgrade/bench.py [--fetch-s 5] [--install-s 30] [--parallel 4]
        [--engines-restart] [--engine-load-s 60] [--hosts]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import heapq
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import msgspec

from llmgw import wire
from llmgw.api_types import StagedPackage, UpgradeRoll
from llmgwd.nodes.state import ClusterState
from llmgwd.planes import registry
from llmgwd.store.sqlite import SqliteStore
from llmgwd.upgrade import driver, records, roll

OLD, NEW = "0.1.0", "0.2.0"
PACKAGES = {"llmgw": 2_000_000, "llmgwd": 40_000_000, "llmgw-agentd": 30_000_000}
LIMIT_S = 6 * 3600.0  # a roll not ended by then (virtual) is reported as such


@dataclass
class Agent:
    """One host's simulated llmgw-agentd (a control plane's host has one of its name)."""

    name: str
    version: str = OLD
    connected: bool = True
    life: int = 0  # bumped at each restart: an old agent's pending reports are dropped
    key: tuple[str, int] | None = None  # the (roll, try) in hand
    replicas: list[str] = field(default_factory=list)  # models it serves


@dataclass
class Seen:
    """Each host's start and end as the passes saw them, and the roll's end."""

    started: dict[str, float] = field(default_factory=dict)
    ended: dict[str, float] = field(default_factory=dict)
    end: float = 0.0
    state: str = ""


class View(msgspec.Struct):
    """A node as the Driver reads it from ClusterState."""

    name: str
    version: str
    connected: bool
    address: str = ""


class Sim:
    """ClusterState's face to the Driver, the agents, the planes and the virtual clock."""

    def __init__(self, store: SqliteStore, args: argparse.Namespace, planes: list[str]) -> None:
        self.store, self.args, self.now = store, args, 0.0
        self.queue: list[tuple[float, int, Callable[[], object]]] = []
        self.seq = 0
        self.agents: dict[str, Agent] = {}
        self.upgrade_reports: dict[str, wire.UpgradeReport] = {}
        self.planes = {p: OLD for p in planes}  # each plane's llmgwd release ("" stopped)
        self.leader = ""  # the first plane once elected
        self.term = 0
        self.driver: driver.Driver | None = None
        self.passes = 0
        self.unready: dict[str, list[tuple[float, float]]] = {}  # host -> its replicas down
        self.seen = Seen()

    def at(self, when: float, what: Callable[[], object]) -> None:
        self.seq += 1
        heapq.heappush(self.queue, (when, self.seq, what))

    # What the Driver calls (ClusterState's).
    def nodes(self) -> list[View]:
        return [View(a.name, a.version, a.connected) for a in self.agents.values()]

    def node(self, name: str) -> View | None:
        a = self.agents.get(name)
        return View(a.name, a.version, a.connected) if a is not None else None

    def send_upgrade(self, name: str, msg: wire.Upgrade) -> str:
        a = self.agents.get(name)
        if a is None:
            return "no such node"
        if not a.connected:
            return "its agent is not connected"
        self._take(a, msg)
        return ""

    # The agents.
    def _take(self, a: Agent, msg: wire.Upgrade) -> None:
        """llmgw_agentd.upgrade.Upgrader.start and _run."""
        if a.key == (msg.roll, msg.attempt):
            return
        a.key = (msg.roll, msg.attempt)
        total = sum(PACKAGES.values())
        if a.version == msg.release:  # started by the install: its unit has ended well
            self._report(a, a.life, msg, "restarting", total, total)
            return
        fetch, life = self.args.fetch_s, a.life
        steps = max(1, int(fetch))
        for i in range(steps):  # "fetching", told every second
            done = total * i // steps
            self.at(self.now + i, partial(self._report, a, life, msg, "fetching", done, total))
        end = self.now + fetch
        self.at(end, lambda: self._report(a, life, msg, "installing", total, total))
        self.at(end + self.args.install_s, lambda: self._restart(a, life))

    def _report(
        self, a: Agent, life: int, msg: wire.Upgrade, step: wire.UpgradeStep, done: int, total: int
    ) -> None:
        if a.life == life and a.connected:
            report = wire.UpgradeReport(msg.roll, msg.attempt, step, done, total, "")
            self.upgrade_reports[a.name] = report

    def _restart(self, a: Agent, life: int) -> None:
        """The packages' scripts restart the agent (and llmgwd on a control plane's host)."""
        if a.life != life:
            return
        a.life, a.key, a.connected = a.life + 1, None, False
        back = self.now + self.args.agent_restart_s
        if a.replicas and self.args.engines_restart:
            self.unready.setdefault(a.name, []).append((self.now, back + self.args.engine_load_s))
        elif a.replicas and self.args.agent_restart_s > self.args.grace_s:
            self.unready.setdefault(a.name, []).append((self.now + self.args.grace_s, back))
        self.at(back, lambda: self._back(a))
        if a.name in self.planes:
            self._plane_stop(a.name)

    def _back(self, a: Agent) -> None:
        a.connected, a.version = True, NEW

    # The control planes.
    def _plane_stop(self, name: str) -> None:
        self.planes[name] = ""
        self.at(self.now + self.args.plane_restart_s, lambda: self._plane_start(name))
        if name == self.leader:  # its stop releases /leader at once
            self.driver, self.leader = None, ""
            self.at(self.now + self.args.failover_s, self._elect)

    def _plane_start(self, name: str) -> None:
        self.planes[name] = NEW
        if not self.leader:
            self._elect()

    def _elect(self) -> None:
        up = [p for p, v in self.planes.items() if v]
        if self.leader or not up:
            return
        self.leader, self.term = up[0], self.term + 1
        self.upgrade_reports = {}  # a new leader's ClusterState starts empty
        self.driver = driver.Driver(self.store, self._cluster(), clock=lambda: self.now)
        self._pass(self.driver)

    def _cluster(self) -> ClusterState:
        return self  # type: ignore[return-value]  # the Driver's view of it only

    async def write_planes(self) -> None:
        for name, version in self.planes.items():
            role: wire.PlaneRole = "leader" if name == self.leader else "standby"
            seen = version or OLD  # a stopped llmgwd's record as it left it
            info = wire.PlaneInfo(name, f"https://{name}:7710", role=role, version=seen)
            await self.store.put(registry.SERVERS + name, msgspec.json.encode(info))

    def _pass(self, d: driver.Driver) -> None:
        """A pass of d due now (run_sim awaits it: an event returning the Driver)."""
        self.at(self.now, partial(_same, d))


def _same(d: driver.Driver) -> driver.Driver:
    return d


async def run_sim(sim: Sim) -> None:
    """Events in time order; a Driver popped is a leader's pass, the next one EVERY_S on."""
    while sim.queue and sim.now < LIMIT_S:
        when, _, what = heapq.heappop(sim.queue)
        sim.now = when
        d = what()
        if not isinstance(d, driver.Driver) or d is not sim.driver:
            continue
        await sim.write_planes()
        await d.tick()
        sim.passes += 1
        current, _ = await records.roll(sim.store)
        note(sim, current)
        if current is not None and current.state != "running":
            return
        sim.at(sim.now + driver.EVERY_S, partial(_same, d))


def note(sim: Sim, current: UpgradeRoll | None) -> None:
    """Record each host's start and end, and the roll's state, as of this pass."""
    if current is None:
        return
    seen = sim.seen
    for h in current.hosts:
        if h.step != "waiting":
            seen.started.setdefault(h.name, sim.now)
        if h.step == "done":
            seen.ended.setdefault(h.name, sim.now)
    seen.end, seen.state = sim.now, current.state


def models(spec: str) -> dict[str, int]:
    """--models NAME:REPLICAS,... as a dict."""
    out = {}
    for part in spec.split(","):
        name, _, count = part.partition(":")
        out[name] = int(count or 1)
    return out


def place(sim: Sim, nodes: list[str], wanted: dict[str, int]) -> dict[str, list[str]]:
    """Replicas spread over the nodes (every third node, round), a model's on distinct
    nodes; model -> its replicas' hosts."""
    hosts: dict[str, list[str]] = {}
    slot = 0
    for model, count in wanted.items():
        for _ in range(count):
            node = nodes[(slot * 3) % len(nodes)]
            slot += 1
            sim.agents[node].replicas.append(model)
            hosts.setdefault(model, []).append(node)
    return hosts


def longest_short(intervals: list[tuple[float, float]]) -> tuple[float, int]:
    """The longest span during which any interval is open, and the most open at once."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    longest, most, open_, since = 0.0, 0, 0, 0.0
    for t, d in events:
        if open_ == 0 and d == 1:
            since = t
        open_ += d
        most = max(most, open_)
        if open_ == 0:
            longest = max(longest, t - since)
    return longest, most


async def setup(args: argparse.Namespace) -> tuple[Sim, list[str]]:
    store = await SqliteStore.open(":memory:")
    planes = [f"cp{i}" for i in range(1, args.planes + 1)]
    nodes = [f"n{i:02d}" for i in range(1, args.nodes + 1)]
    sim = Sim(store, args, planes)
    for name in planes + nodes:
        sim.agents[name] = Agent(name)
    for name, size in PACKAGES.items():
        sha = hashlib.sha256(name.encode()).hexdigest()  # no bytes: nothing is fetched
        pkg = StagedPackage(kind="deb", name=name, version=NEW, arch="amd64", release=NEW,
                            sha256=sha, size=size, filename=f"{name}_{NEW}_amd64.deb")  # fmt: skip
        await records.stage(store, pkg)
    await sim.write_planes()
    new = roll.plan("bench", NEW, planes, planes + nodes, parallel=args.parallel, now=0.0)
    await records.put_if(store, new, 0)
    return sim, nodes


def report(sim: Sim, hosts: dict[str, list[str]], wanted: dict[str, int], wall: float) -> None:
    a = sim.args
    engines = f"restart (load {a.engine_load_s:g} s)" if a.engines_restart else "stay up"
    print(f"roll of {a.planes} control planes and {a.nodes} nodes, --parallel {a.parallel}: "
          f"fetch {a.fetch_s:g} s, install {a.install_s:g} s, agent restart {a.agent_restart_s:g}"
          f" s, llmgwd restart {a.plane_restart_s:g} s, failover {a.failover_s:g} s, engines "
          f"{engines}")  # fmt: skip
    print(f"roll {sim.seen.state} after {sim.seen.end:.0f} s (virtual; {sim.passes} driver passes, "
          f"{sim.term} leader terms, {wall:.2f} s real)")  # fmt: skip
    order = sorted(sim.seen.started, key=lambda n: (sim.seen.started[n], n))
    print("order:", " ".join(order))
    if a.hosts:
        for n in order:
            start, end = sim.seen.started[n], sim.seen.ended.get(n, float("nan"))
            print(f"  {n:6} started {start:6.0f} s  done {end:6.0f} s  ({end - start:.0f} s)")
    print(f"{'model':12} {'wanted':>6} {'least ready':>11} {'longest short':>14}")
    for model, count in wanted.items():
        spans = [iv for h in set(hosts[model]) for iv in sim.unready.get(h, [])]
        longest, most = longest_short(spans)
        print(f"{model:12} {count:6} {count - most:11} {longest:12.0f} s")


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    ap.add_argument("--planes", type=int, default=3)
    ap.add_argument("--nodes", type=int, default=20)
    ap.add_argument("--parallel", type=int, default=4, help="as llmgw upgrade start's")
    ap.add_argument("--fetch-s", type=float, default=5.0, help="a host's fetch (a guess)")
    ap.add_argument("--install-s", type=float, default=30.0, help="apt-get install (a guess)")
    ap.add_argument("--agent-restart-s", type=float, default=3.0, help="agent away (a guess)")
    ap.add_argument("--plane-restart-s", type=float, default=5.0, help="llmgwd away (a guess)")
    ap.add_argument("--failover-s", type=float, default=1.0, help="to a new leader's first pass")
    ap.add_argument("--grace-s", type=float, default=60.0, help="ClusterState's node grace")
    ap.add_argument("--engines-restart", action="store_true", help="engines stop with the agent")
    ap.add_argument("--engine-load-s", type=float, default=60.0, help="with --engines-restart")
    ap.add_argument("--models", default="llama-8b:4,qwen-32b:2,smollm2:6,embed:1")
    ap.add_argument("--hosts", action="store_true", help="each host's start and end")
    return ap.parse_args()


async def main() -> None:
    args = parse()
    began = time.perf_counter()
    sim, nodes = await setup(args)
    wanted = models(args.models)
    hosts = place(sim, nodes, wanted)
    sim._elect()
    await run_sim(sim)
    report(sim, hosts, wanted, time.perf_counter() - began)
    await sim.store.close()


if __name__ == "__main__":
    asyncio.run(main())
