"""This node's engines as transient systemd units: started, supervised, restarted, adopted
again by a later agent, and stopped once no longer wanted."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import aiohttp
import msgspec

from llmgw.config import AgentConfig
from llmgw.wire import Inventory, ReplicaSpec, ReplicaState, ReplicaStatus
from llmgw_agentd import cpus, engines, oom, prepare
from llmgw_agentd.cache import Cache, FetchError
from llmgw_agentd.engines import EngineError
from llmgw_agentd.gpm import GpmSampler
from llmgw_agentd.gpus import GpuReader
from llmgw_agentd.inventory import collect
from llmgw_agentd.replicas import admission, ports, unit_properties
from llmgw_agentd.replicas.health import EngineProbe
from llmgw_agentd.replicas.key_files import KeyFiles
from llmgw_agentd.replicas.records import EngineRecord, Records
from llmgw_agentd.replicas.unit_properties import KEY_ARG, UNIT_PREFIX, unit_name
from llmgw_agentd.systemd import RUNNING_STATES, UNIT_EXISTS, Systemd, SystemdError, UnitState

log = logging.getLogger(__name__)
# How long an adopted engine is asked whether it answers before the agent registers.
ADOPT_PROBE_S = 2.0

RUNTIME_DIR = Path("/run/llmgw-agent")
LOOPBACK = "127.0.0.1"  # where engines listen before the link has said anything better
ANY = "0.0.0.0"  # where older agents' engines listen: the first apply starts them again
UNHEALTHY_PROBES = 3  # missed /health answers before a ready engine is reported failed

# spec, host, port, key file argument (None: no key) -> argv
CommandBuilder = Callable[[ReplicaSpec, str, int, str | None], list[str]]
# spec, progress -> the engine's software made ready (built, installed); raises EngineError
Preparer = Callable[[ReplicaSpec, Callable[[str], None]], Awaitable[None]]
OnChange = Callable[[], None]
InventoryReader = Callable[[], Inventory]


@dataclass(eq=False)
class _Replica:
    spec: ReplicaSpec  # api_key blanked, memory_max_bytes filled in
    fingerprint: str
    port: int
    host: str  # the address it listens on
    state: ReplicaState = "starting"
    message: str = ""
    restarts: int = 0
    slots: int = 0  # as the engine said once ready; 0: not known
    context: int = 0  # a request's context, as the engine said once ready; 0: not known
    task: asyncio.Task[None] | None = None
    unwatch: Callable[[], None] | None = None
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    last: UnitState | None = None  # the unit as systemd's signals last described it
    cpus: list[int] = field(default_factory=list)  # its AllowedCPUs, kept across restarts
    reason: str = ""  # why it last ended unasked: "oom", "exit"; "" none
    oom_kills: int = 0  # how often the kernel ended it over its MemoryMax
    kernel_ooms: int = -1  # the kernel's OOM kills when it last started (oom.kernel_count)

    @property
    def unit(self) -> str:
        return unit_name(self.spec.id)


def _fields(r: _Replica) -> dict[str, str]:
    """The journal fields of a replica's log lines (journalctl LLMGW_MODEL=... finds them)."""
    return {"model": r.spec.model, "replica": r.spec.id, "unit": r.unit}


class Replicas:
    """Supervises the engines of this node; units outlive the agent and are adopted again."""

    def __init__(
        self,
        config: AgentConfig,
        *,
        bus_address: str | None = None,
        runtime_dir: Path = RUNTIME_DIR,
        on_change: OnChange | None = None,
        command: CommandBuilder | None = None,
        probe_interval: float = 1.0,
        backoff: tuple[float, float] = (1.0, 30.0),
        cache: Cache | None = None,
        fetch_backoff: tuple[float, float] = (10.0, 300.0),
        inventory: InventoryReader | None = None,
        online_cpus: Callable[[], list[int]] = cpus.available,
        kernel_ooms: Callable[[], int] = oom.kernel_count,
        prepare: Preparer | None = None,
    ) -> None:
        self._config = config
        self._systemd = Systemd(bus_address)
        self._records = Records(Path(config.state_dir) / "engines")
        self._keys = KeyFiles(runtime_dir / "keys")
        self._on_change = on_change
        self._command = command or self._engine_command
        self._prepare = prepare or self._prepare_engine
        # Where engines listen: the configured address, else the one the link learns.
        self._host = config.address or LOOPBACK
        self._interval = probe_interval
        self._backoff = backoff
        self._cache = cache  # where an hf: set's files are fetched to (None: file: only)
        self._fetch_backoff = fetch_backoff  # a set that could not be fetched is tried again
        self._replicas: dict[str, _Replica] = {}
        self._rejected: dict[str, ReplicaStatus] = {}
        self._orphans: set[str] = set()  # units of ours without a record: stopped at first apply
        self._lock = asyncio.Lock()
        self._http: aiohttp.ClientSession | None = None
        # The node's cards (a spec's UUIDs to /dev/nvidiaN, and whether they suit the engine)
        # and the CPU ids engines are pinned to; no profiling counters (the reports' reader
        # samples those).
        reader = GpuReader(gpm=GpmSampler(on=False))
        self._inventory = inventory or partial(collect, config.state_dir, reader)
        self._online_cpus = online_cpus
        self._kernel_ooms = kernel_ooms  # the kernel's OOM kills so far (cgroup v1's only sign)

    # The agent's side

    def set_host(self, address: str) -> None:
        """The address the control plane reaches this node at (the link's own end): engines
        started from now on listen there and nowhere else; ignored when agent.yaml sets one."""
        if not self._config.address and address:
            self._host = address

    async def start(self) -> None:
        """Connect to systemd and adopt the engines already running; stops nothing."""
        await self._systemd.connect()
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2))
        await self._adopt()

    async def apply(self, desired: list[ReplicaSpec]) -> None:
        """Make this node run exactly desired: start, restart (changed spec) and stop units.
        Each spec is checked once, here as it enters (admission.check): one refused is
        reported failed and runs nowhere on this node."""
        async with self._lock:
            self._rejected = {}
            want: dict[str, ReplicaSpec] = {}
            for spec in desired:
                try:
                    admission.check(spec, self._inventory)
                except EngineError as e:
                    self._reject(spec, e)
                    continue
                want[spec.id] = spec
            gone = [rid for rid in self._replicas if rid not in want]
            orphans, self._orphans = self._orphans, set()
            await asyncio.gather(
                *(self._remove(rid) for rid in gone), *(self._stop_unit(u) for u in orphans)
            )
            for spec in want.values():
                await self._apply_one(spec)
            self._changed()

    def statuses(self) -> list[ReplicaStatus]:
        """How every replica of this node is doing, for a heartbeat."""
        out = [
            ReplicaStatus(
                id=r.spec.id,
                model=r.spec.model,
                state=r.state,
                port=r.port,
                unit=r.unit,
                message=r.message,
                restarts=r.restarts,
                slots=r.slots,
                context=r.context,
                reason=r.reason,
                oom_kills=r.oom_kills,
            )
            for r in self._replicas.values()
        ]
        out += [s for rid, s in self._rejected.items() if rid not in self._replicas]
        return sorted(out, key=lambda s: s.id)

    def specs(self) -> list[ReplicaSpec]:
        """The specs of every replica this node runs or fetches (api_key blanked): their
        files are kept in a sweep."""
        return [r.spec for r in self._replicas.values()]

    async def close(self) -> None:
        """Stop supervising and disconnect; the engines keep running and serving."""
        for r in self._replicas.values():
            await self._halt(r)
        await self._systemd.close()
        if self._http is not None:
            await self._http.close()
            self._http = None

    # Adoption and apply

    async def _adopt(self) -> None:
        units = {u.name: u for u in await self._systemd.list_units(f"{UNIT_PREFIX}*.service")}
        adopted: list[_Replica] = []
        for record in self._records.read_all():
            r = _Replica(record.spec, record.fingerprint, record.port, record.host or ANY)
            r.cpus = list(record.cpus)
            self._replicas[r.spec.id] = r
            unit = units.pop(r.unit, None)
            r.kernel_ooms = self._kernel_ooms()
            if unit is not None and unit.active_state in RUNNING_STATES:
                log.info("adopting %s (port %d)", r.unit, r.port, extra=_fields(r))
                adopted.append(r)
            elif unit is not None and unit.active_state == "failed":
                self._note_end(r, await self._systemd.state(r.unit))
                r.state, r.message = "failed", "the engine failed while the agent was away"
            else:
                r.state, r.message = "stopped", "not running; waiting for the control plane"
        self._orphans = set(units)
        await asyncio.gather(*(self._ready_at_once(r) for r in adopted))
        for r in adopted:
            self._supervise(r, launch=False)
        self._changed()

    async def _ready_at_once(self, r: _Replica) -> None:
        """An adopted engine that answers is ready from the first Register on, so the router
        keeps sending it requests through the agent's restart (an upgrade's); else it is
        starting until the supervisor's first probe."""
        engine = self._probe(r)  # its calls answer 0, False or empty props: they never raise
        try:
            async with asyncio.timeout(ADOPT_PROBE_S):  # a hung engine holds no Register up
                if await engine.health() != 200 or not await engine.lists_model():
                    return
                props = await engine.props()
        except TimeoutError:
            return
        r.slots = engines.slots(r.spec, props.total_slots)
        r.context = props.default_generation_settings.n_ctx
        self._set(r, "ready", "")

    async def _apply_one(self, spec: ReplicaSpec) -> None:
        fingerprint = spec.fingerprint()
        r = self._replicas.get(spec.id)
        if r is not None and r.fingerprint == fingerprint and r.host == self._host:
            if r.task is None:  # adopted from its record, but not running
                self._keys.write(spec)
                r.state, r.message = "starting", ""
                self._supervise(r, launch=True)
            return
        port, old_cpus = 0, []
        if r is not None:
            old_cpus = r.cpus
            changed = "its spec changed"
            if r.fingerprint == fingerprint:
                changed = f"it listens on {r.host}, the control plane reaches {self._host}"
            log.info("%s: %s; starting it again", r.unit, changed, extra=_fields(r))
            port = r.port
            await self._remove(spec.id)
        try:
            taken = {o.port for o in self._replicas.values()}
            port = ports.allocate(self._host, self._config.port_range, taken, prefer=port)
        except EngineError as e:
            self._reject(spec, e)
            return
        memory_max = unit_properties.memory_max(spec, self._config)
        kept = msgspec.structs.replace(spec, api_key="", memory_max_bytes=memory_max)
        r = _Replica(kept, fingerprint, port, self._host)
        r.cpus = self._pick_cpus(spec, prefer=old_cpus)
        self._keys.write(spec)
        self._records.write(EngineRecord(r.fingerprint, r.port, r.spec, r.host, r.cpus))
        self._replicas[spec.id] = r
        self._supervise(r, launch=True)

    def _reject(self, spec: ReplicaSpec, e: EngineError) -> None:
        log.warning(
            "replica %s refused: %s", spec.id, e, extra={"model": spec.model, "replica": spec.id}
        )
        self._rejected[spec.id] = ReplicaStatus(spec.id, spec.model, "failed", message=str(e))

    def _pick_cpus(self, spec: ReplicaSpec, prefer: list[int]) -> list[int]:
        """The CPU ids for spec's cores: those it had (a spec changed), else free ones."""
        held = [o.cpus for o in self._replicas.values() if o.spec.id != spec.id]
        return cpus.pick(spec.cores, held, self._online_cpus(), prefer)

    # Stopping

    async def _remove(self, rid: str) -> None:
        """Stop a replica: reported "stopping" (no new request reaches it; a lent node waits)
        while the requests it holds finish and its unit stops, gone from the reports once the
        unit is gone (its port and CPUs held until then)."""
        r = self._replicas[rid]
        await self._halt(r)
        serving = r.state == "ready"
        self._set(r, "stopping", "told to stop")
        if serving:
            await self._drain(r)
        self._set(r, "stopping", "its unit stopping")
        await self._stop_unit(r.unit)
        del self._replicas[rid]
        self._records.remove(rid)
        self._keys.remove(rid)
        log.info("%s: stopped, no longer wanted here", r.unit, extra=_fields(r))
        self._changed()

    async def _drain(self, r: _Replica) -> None:
        """Wait, for at most engines.drain_s, until the engine holds no request (its own
        /metrics says; one that does not answer holds none)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._config.engines.drain_s
        while (busy := await self._probe(r).requests_held()) > 0:
            if loop.time() >= deadline:
                log.warning(
                    "%s: still %d request(s) after %gs; stopping it anyway", r.unit, busy,
                    self._config.engines.drain_s, extra=_fields(r),
                )  # fmt: skip
                return
            self._set(r, "stopping", f"finishing {busy} request(s)")
            await asyncio.sleep(self._interval)

    async def _stop_unit(self, unit: str) -> None:
        try:
            await self._systemd.stop(unit)
            await self._systemd.reset_failed(unit)
        except SystemdError as e:
            log.warning("%s: could not stop it: %s", unit, e)

    async def _halt(self, r: _Replica) -> None:
        if r.task is not None:
            r.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await r.task
            r.task = None
        if r.unwatch is not None:
            r.unwatch()
            r.unwatch = None

    # Supervision: one task per replica

    def _supervise(self, r: _Replica, *, launch: bool) -> None:
        r.unwatch = self._systemd.watch(r.unit, partial(self._on_unit, r))
        r.task = asyncio.create_task(self._run(r, launch=launch), name=f"replica {r.spec.id}")

    def _on_unit(self, r: _Replica, st: UnitState) -> None:
        r.last = st
        if st.ended:
            r.ended.set()

    async def _run(self, r: _Replica, *, launch: bool) -> None:
        delay, fetch_delay = self._backoff[0], self._fetch_backoff[0]
        while True:
            was_ready = False
            try:
                reason = await self._launch(r) if launch else await self._still_running(r)
                if reason is None:
                    reason, was_ready = await self._serve(r)
            except FetchError as e:  # the engine was not started: its files are not whole
                await self._fetch_failed(r, str(e), fetch_delay)
                fetch_delay = min(fetch_delay * 2, self._fetch_backoff[1])
                continue
            except Exception as e:  # a bus or file error must not end supervision
                log.exception("%s: supervision failed", r.unit, extra=_fields(r))
                reason = f"could not be supervised: {e}"
            delay = self._backoff[0] if was_ready else delay
            log.warning("%s: engine %s; restarting in %gs", r.unit, reason, delay, extra=_fields(r))
            self._set(r, "failed", f"engine {reason}; restarting in {delay:g}s")
            await asyncio.sleep(delay)
            delay = min(delay * 2, self._backoff[1])
            launch = True
            r.restarts += 1
            self._set(r, "failed", f"engine {reason}; restarted, waiting for it to answer")

    async def _fetch_failed(self, r: _Replica, reason: str, delay: float) -> None:
        log.warning("%s: %s; trying again in %gs", r.unit, reason, delay, extra=_fields(r))
        self._set(r, "failed", f"{reason}; trying again in {delay:g}s")
        await asyncio.sleep(delay)
        self._set(r, "starting", "")

    async def _local(self, r: _Replica) -> ReplicaSpec:
        """The spec an engine is started from: an hf: set's files fetched into the cache
        first (the replica "starting" with the fetch's progress), its source the cache's."""
        if not r.spec.files:
            return r.spec
        if self._cache is None:
            raise FetchError("this agent has no model cache to fetch the model's files into")
        where = await self._cache.ensure(r.spec, partial(self._set, r, "starting"))
        self._set(r, "starting", "")
        source = engines.local_source(r.spec, where)
        return msgspec.structs.replace(r.spec, source=source)

    async def _still_running(self, r: _Replica) -> str | None:
        """For an adopted unit: it may have ended before the watch was set."""
        r.ended.clear()
        st = await self._systemd.state(r.unit)
        return None if st.running else self._note_end(r, st)

    async def _launch(self, r: _Replica) -> str | None:
        """Start the unit; None when it runs, else why not."""
        spec = await self._local(r)
        key = self._keys.path(r.spec.id)
        try:
            await self._prepare(spec, partial(self._set, r, "starting"))
            argv = self._command(spec, r.host, r.port, KEY_ARG if key.exists() else None)
            props = self._properties(r, key if key.exists() else None)
        except EngineError as e:
            return f"cannot be started: {e}"
        await self._systemd.reset_failed(r.unit)
        r.ended.clear()
        r.kernel_ooms = self._kernel_ooms()
        try:
            result = await self._systemd.start_transient(r.unit, argv, props)
        except SystemdError as e:
            if e.name != UNIT_EXISTS:
                return f"was refused by systemd: {e.text}"
            # The last run is still being unloaded (or runs unwatched): clear it away, once.
            await self._stop_unit(r.unit)
            await asyncio.sleep(0.2)
            r.ended.clear()
            result = await self._systemd.start_transient(r.unit, argv, props)
        if result == "done":
            return None
        st = await self._systemd.state(r.unit)
        return self._note_end(r, st) if st.result or st.exit_code else f"start job {result}"

    async def _serve(self, r: _Replica) -> tuple[str, bool]:
        """Probe until the unit ends; returns why it ended and whether it was ever ready."""
        misses = 0
        was_ready = False
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(r.ended.wait(), self._interval)
            if r.ended.is_set():
                # Cleared before asking: a later exit signals again after systemd's answer.
                r.ended.clear()
                st = await self._systemd.state(r.unit)
                if st.ended:
                    last = r.last if st.removed and r.last is not None else st
                    return self._note_end(r, last), was_ready
                continue
            engine = self._probe(r)
            code = await engine.health()
            if code == 200 and not was_ready and not await engine.lists_model():
                code = 503  # up, but its model not listed yet (vLLM's /v1/models)
            if code == 200:
                if not was_ready:  # ready for the first time in this run: its props, once
                    props = await engine.props()
                    r.slots = engines.slots(r.spec, props.total_slots)
                    r.context = props.default_generation_settings.n_ctx
                misses, was_ready = 0, True
                self._set(r, "ready", "")
            elif r.state == "ready" and code:
                self._set(r, "starting", f"/health answered {code}")
            elif r.state == "ready":
                misses += 1
                if misses >= UNHEALTHY_PROBES:
                    self._set(r, "failed", "engine stopped answering /health")

    def _note_end(self, r: _Replica, st: UnitState) -> str:
        """Count how a unit ended (the kernel's OOM kill apart from other ends); its words."""
        now = self._kernel_ooms()
        killed = oom.killed(st, r.kernel_ooms, now)
        r.kernel_ooms = now
        if killed:
            r.reason = "oom"
            r.oom_kills += 1
            return UnitState(st.name, result="oom-kill").describe()
        if st.result or st.exit_code:
            r.reason = "exit"
        return st.describe()

    def _properties(self, r: _Replica, key: Path | None) -> unit_properties.Properties:
        """The unit's properties: r's placement, the cache read-only, key as its credential."""
        cache_root = self._cache.root if self._cache is not None else None
        return unit_properties.properties(
            r.spec,
            r.cpus,
            key,
            config=self._config,
            cache_root=cache_root,
            inventory=self._inventory,
        )

    def _probe(self, r: _Replica) -> EngineProbe:
        """The replica's engine, asked over the agent's session (open between start and close)."""
        assert self._http is not None
        return EngineProbe(self._http, r.spec, r.host, r.port, self._keys.path(r.spec.id))

    def _set(self, r: _Replica, state: ReplicaState, message: str) -> None:
        if (r.state, r.message) == (state, message):
            return
        if r.state != state:
            log.info("%s: %s -> %s %s", r.unit, r.state, state, message, extra=_fields(r))
        r.state, r.message = state, message
        self._changed()

    def _changed(self) -> None:
        if self._on_change is None:
            return
        try:
            self._on_change()
        except Exception:
            log.exception("on_change callback failed")

    # The defaults of command and prepare

    def _engine_command(
        self, spec: ReplicaSpec, host: str, port: int, key: str | None
    ) -> list[str]:
        return unit_properties.engine_command(
            spec, self._config, self._inventory(), host, port, key
        )

    async def _prepare_engine(self, spec: ReplicaSpec, progress: Callable[[str], None]) -> None:
        """The engine's software: vLLM installed, llama-server built with CUDA for its cards,
        before the unit starts (never in the agent's start-up: in the replica's own task)."""
        await prepare.ensure(spec, self._config, self._inventory(), progress)
