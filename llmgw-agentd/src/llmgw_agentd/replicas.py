"""This node's engines as transient systemd units: started, probed, restarted and adopted."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import signal
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import aiohttp
import msgspec
from dbus_fast import Variant

from llmgw import engine_memory
from llmgw.config import AgentConfig
from llmgw.wire import Inventory, ReplicaSpec, ReplicaState, ReplicaStatus
from llmgw_agentd import cpus, devices, engines, oom, prepare
from llmgw_agentd.cache import Cache, FetchError
from llmgw_agentd.engines import HEALTH_PATH, PROPS_PATH, EngineError
from llmgw_agentd.gpm import GpmSampler
from llmgw_agentd.gpus import GpuReader
from llmgw_agentd.inventory import collect
from llmgw_agentd.systemd import RUNNING_STATES, UNIT_EXISTS, Systemd, SystemdError, UnitState

log = logging.getLogger(__name__)

UNIT_PREFIX = "llmgw-engine-"
ENGINE_SLICE = "llmgw-engines.slice"
RUNTIME_DIR = Path("/run/llmgw-agent")
# systemd copies the 0600 key file into the unit's credentials directory, readable by its
# dynamic user, and expands the variable in ExecStart itself.
KEY_CREDENTIAL = "key"
KEY_ARG = "${CREDENTIALS_DIRECTORY}/" + KEY_CREDENTIAL
LOOPBACK = "127.0.0.1"  # where engines listen before the link has said anything better
ANY = "0.0.0.0"  # where older agents' engines listen: the first apply starts them again
UNHEALTHY_PROBES = 3  # missed /health answers before a ready engine is reported failed

_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")

# What a transient service can have (systemd 252) without hindering a CPU or GPU engine.
SANDBOX: tuple[tuple[str, Variant], ...] = (
    ("DynamicUser", Variant("b", True)),
    ("NoNewPrivileges", Variant("b", True)),
    ("PrivateTmp", Variant("b", True)),
    ("ProtectSystem", Variant("s", "strict")),
    ("ProtectHome", Variant("s", "read-only")),
    ("ProtectKernelTunables", Variant("b", True)),
    ("ProtectKernelModules", Variant("b", True)),
    ("ProtectKernelLogs", Variant("b", True)),
    ("ProtectControlGroups", Variant("b", True)),
    ("ProtectClock", Variant("b", True)),
    ("ProtectHostname", Variant("b", True)),
    ("RestrictRealtime", Variant("b", True)),
    ("RestrictSUIDSGID", Variant("b", True)),
    ("RestrictNamespaces", Variant("t", 0)),  # over D-Bus: the mask of namespaces allowed
    ("LockPersonality", Variant("b", True)),
    ("CapabilityBoundingSet", Variant("t", 0)),
    ("SystemCallArchitectures", Variant("as", ["native"])),
    ("RestrictAddressFamilies", Variant("(bas)", [True, ["AF_INET", "AF_INET6", "AF_UNIX"]])),
)

# spec, host, port, key file argument (None: no key) -> argv
CommandBuilder = Callable[[ReplicaSpec, str, int, str | None], list[str]]
# spec, progress -> the engine's software made ready (built, installed); raises EngineError
Preparer = Callable[[ReplicaSpec, Callable[[str], None]], Awaitable[None]]
OnChange = Callable[[], None]
InventoryReader = Callable[[], Inventory]


class _Settings(msgspec.Struct):
    """The part of /props' default_generation_settings the agent reads."""

    n_ctx: int = 0  # a slot's context: the most tokens one request may hold


class _Props(msgspec.Struct):
    """The part of llama.cpp's GET /props the agent reads."""

    total_slots: int = 0
    default_generation_settings: _Settings = msgspec.field(default_factory=_Settings)


class EngineRecord(msgspec.Struct):
    """STATE_DIR/engines/<id>.json: what the agent started, for a later agent to adopt."""

    fingerprint: str
    port: int
    spec: ReplicaSpec  # with api_key blanked: the key lives only in its 0600 file
    host: str = ""  # where it listens; "": every address (an agent older than this field)
    cpus: list[int] = []  # the CPU ids of its AllowedCPUs; []: not pinned


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


def unit_name(replica_id: str) -> str:
    """The transient unit of a replica."""
    return f"{UNIT_PREFIX}{replica_id}.service"


def check(spec: ReplicaSpec) -> None:
    """Refuse, before any unit exists, a spec that could never start; raises EngineError."""
    if not _ID.fullmatch(spec.id):
        raise EngineError(f"replica id {spec.id!r}: use letters, digits, '.', '_' and '-'")
    engines.check(spec)


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
        self._records = Path(config.state_dir) / "engines"
        self._keys = runtime_dir / "keys"
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
        """Make this node run exactly desired: start, restart (changed spec) and stop units."""
        async with self._lock:
            self._rejected = {}
            want: dict[str, ReplicaSpec] = {}
            for spec in desired:
                try:
                    check(spec)
                    self._check_cards(spec)
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
        for path in sorted(self._records.glob("*.json")):
            record = _read_record(path)
            if record is None:
                continue
            r = _Replica(record.spec, record.fingerprint, record.port, record.host or ANY)
            r.cpus = list(record.cpus)
            self._replicas[r.spec.id] = r
            unit = units.pop(r.unit, None)
            r.kernel_ooms = self._kernel_ooms()
            if unit is not None and unit.active_state in RUNNING_STATES:
                log.info("adopting %s (port %d)", r.unit, r.port, extra=_fields(r))
                self._supervise(r, launch=False)
            elif unit is not None and unit.active_state == "failed":
                self._note_end(r, await self._systemd.state(r.unit))
                r.state, r.message = "failed", "the engine failed while the agent was away"
            else:
                r.state, r.message = "stopped", "not running; waiting for the control plane"
        self._orphans = set(units)
        self._changed()

    async def _apply_one(self, spec: ReplicaSpec) -> None:
        fingerprint = spec.fingerprint()
        r = self._replicas.get(spec.id)
        if r is not None and r.fingerprint == fingerprint and r.host == self._host:
            if r.task is None:  # adopted from its record, but not running
                self._write_key(spec)
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
            port = self._allocate_port(prefer=port)
        except EngineError as e:
            self._reject(spec, e)
            return
        kept = msgspec.structs.replace(spec, api_key="", memory_max_bytes=self._memory_max(spec))
        r = _Replica(kept, fingerprint, port, self._host)
        r.cpus = self._pick_cpus(spec, prefer=old_cpus)
        self._write_key(spec)
        self._write_record(r)
        self._replicas[spec.id] = r
        self._supervise(r, launch=True)

    def _reject(self, spec: ReplicaSpec, e: EngineError) -> None:
        log.warning(
            "replica %s refused: %s", spec.id, e, extra={"model": spec.model, "replica": spec.id}
        )
        self._rejected[spec.id] = ReplicaStatus(spec.id, spec.model, "failed", message=str(e))

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
        (self._records / f"{rid}.json").unlink(missing_ok=True)
        self._key_file(rid).unlink(missing_ok=True)
        log.info("%s: stopped, no longer wanted here", r.unit, extra=_fields(r))
        self._changed()

    async def _drain(self, r: _Replica) -> None:
        """Wait, for at most engines.drain_s, until the engine holds no request (its own
        /metrics says; one that does not answer holds none)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._config.engines.drain_s
        while (busy := await self._busy(r)) > 0:
            if loop.time() >= deadline:
                log.warning(
                    "%s: still %d request(s) after %gs; stopping it anyway", r.unit, busy,
                    self._config.engines.drain_s, extra=_fields(r),
                )  # fmt: skip
                return
            self._set(r, "stopping", f"finishing {busy} request(s)")
            await asyncio.sleep(self._interval)

    async def _busy(self, r: _Replica) -> int:
        """The requests the engine holds now, from its /metrics (asked with its key); 0 when
        it does not answer."""
        assert self._http is not None
        url = f"http://{_probe_host(r.host)}:{r.port}{engines.METRICS_PATH}"
        try:
            async with self._http.get(url, headers=self._auth(r.spec.id)) as resp:
                if resp.status != 200:
                    return 0
                return engines.requests_held(r.spec, await resp.text())
        except (aiohttp.ClientError, TimeoutError, OSError, UnicodeDecodeError):
            return 0

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
        key = self._key_file(r.spec.id)
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
            code = await self._probe(r)
            if code == 200 and not was_ready and not await self._lists_model(r):
                code = 503  # up, but its model not listed yet (vLLM's /v1/models)
            if code == 200:
                if not was_ready:  # ready for the first time in this run: its props, once
                    props = await self._props(r)
                    r.slots = props.total_slots
                    r.context = props.default_generation_settings.n_ctx
                misses, was_ready = 0, True
                self._set(r, "ready", "")
            elif r.state == "ready" and code:
                self._set(r, "starting", f"/health answered {code}")
            elif r.state == "ready":
                misses += 1
                if misses >= UNHEALTHY_PROBES:
                    self._set(r, "failed", "engine stopped answering /health")

    async def _probe(self, r: _Replica) -> int:
        """/health's status code (503 for a 200 whose body says it still loads), 0 when
        nothing answered."""
        assert self._http is not None
        host = _probe_host(r.host)
        try:
            async with self._http.get(f"http://{host}:{r.port}{HEALTH_PATH}") as resp:
                return health_code(resp.status, await resp.read())
        except (aiohttp.ClientError, TimeoutError, OSError):
            return 0

    async def _lists_model(self, r: _Replica) -> bool:
        """Whether the engine lists its model where it says so (asked with its key); True
        for an engine whose /health is enough."""
        path = engines.models_path(r.spec)
        if path is None:
            return True
        assert self._http is not None
        url = f"http://{_probe_host(r.host)}:{r.port}{path}"
        try:
            async with self._http.get(url, headers=self._auth(r.spec.id)) as resp:
                return resp.status == 200 and engines.lists_model(r.spec, await resp.read())
        except (aiohttp.ClientError, TimeoutError, OSError):
            return False

    async def _props(self, r: _Replica) -> _Props:
        """The engine's slots and context from /props (asked with its key); 0 for what it does
        not say."""
        assert self._http is not None
        url = f"http://{_probe_host(r.host)}:{r.port}{PROPS_PATH}"
        try:
            async with self._http.get(url, headers=self._auth(r.spec.id)) as resp:
                if resp.status != 200:
                    return _Props()
                return msgspec.json.decode(await resp.read(), type=_Props)
        except (aiohttp.ClientError, TimeoutError, OSError, msgspec.DecodeError,
                msgspec.ValidationError):  # fmt: skip
            return _Props()

    def _auth(self, rid: str) -> dict[str, str]:
        """The header with the replica's key, as the router sends it (none without a key)."""
        key = self._key_file(rid)
        return {"Authorization": f"Bearer {key.read_text().strip()}"} if key.exists() else {}

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

    # Units, files and ports

    def _engine_command(
        self, spec: ReplicaSpec, host: str, port: int, key: str | None
    ) -> list[str]:
        cuda = prepare.cuda(spec, self._inventory())
        return engines.command(spec, self._config, host=host, port=port, key_file=key, cuda=cuda)

    async def _prepare_engine(self, spec: ReplicaSpec, progress: Callable[[str], None]) -> None:
        """The engine's software: vLLM installed, llama-server built with CUDA for its cards,
        before the unit starts (never in the agent's start-up: in the replica's own task)."""
        await prepare.ensure(spec, self._config, self._inventory(), progress)

    def _properties(self, r: _Replica, key: Path | None) -> list[tuple[str, Variant]]:
        spec = r.spec
        description = f"llmgw engine {spec.engine}: {spec.model} (replica {spec.id})"
        props = [
            ("Description", Variant("s", description)),
            ("Slice", Variant("s", ENGINE_SLICE)),
            ("Type", Variant("s", "exec")),
            ("KillMode", Variant("s", "mixed")),
            # SIGTERM to the engine, SIGKILL to its cgroup once stop_timeout_s passed.
            ("TimeoutStopUSec", Variant("t", int(self._config.engines.stop_timeout_s * 1e6))),
            ("SendSIGKILL", Variant("b", True)),
            ("FinalKillSignal", Variant("i", int(signal.SIGKILL))),
            ("StandardOutput", Variant("s", "journal")),
            ("StandardError", Variant("s", "journal")),
            ("SyslogIdentifier", Variant("s", r.unit.removesuffix(".service"))),
            # Over it the kernel ends the engine (Result=oom-kill) and the agent restarts it;
            # no swap, or the limit would only slow it down instead of bounding it.
            ("MemoryMax", Variant("t", self._memory_max(spec))),
            ("MemorySwapMax", Variant("t", 0)),
            *SANDBOX,
            *self._placement_properties(r),
        ]
        if spec.files and self._cache is not None:  # the cache, seen read-only ("-": if any)
            props.append(("ReadOnlyPaths", Variant("as", [f"-{self._cache.root}"])))
        if key is not None:
            props.append(("LoadCredential", Variant("a(ss)", [(KEY_CREDENTIAL, str(key))])))
        if spec.engine == "vllm":  # torch's gloo (vLLM's workers) lists interfaces by netlink
            props.append(("RestrictAddressFamilies", Variant("(bas)", [True, ["AF_NETLINK"]])))
        return props

    # The placement: memory, CPUs, cards (kept apart from the rest of the unit's properties)

    def _placement_properties(self, r: _Replica) -> list[tuple[str, Variant]]:
        """What holds an engine to its placement: MemoryHigh below its MemoryMax (the kernel
        reclaims and slows it there, before killing it at the limit), AllowedCPUs and the
        threads of its engine's runtime (the CPUs the agent picked for its cores), and
        DevicePolicy=closed with DeviceAllow for exactly its cards' device nodes, plus
        CUDA_VISIBLE_DEVICES naming them; raises EngineError for a card not on this node."""
        spec = r.spec
        high = engine_memory.high(self._memory_max(spec))
        props = [("MemoryHigh", Variant("t", high)), ("DevicePolicy", Variant("s", "closed"))]
        env = cpus.thread_env(spec.engine, r.cpus)
        if r.cpus:  # the cgroup's cpuset (cgroup v2 only), and the threads' affinity (any)
            props.append(("AllowedCPUs", Variant("ay", cpus.mask(r.cpus))))
            props.append(("CPUAffinity", Variant("ay", cpus.mask(r.cpus))))
        if spec.devices:  # the cards (or MIG instances) the scheduler gave it, and only those
            nodes = devices.nodes(spec.devices, self._inventory())
            props.append(("DeviceAllow", Variant("a(ss)", [(n, "rw") for n in nodes])))
            env.append("CUDA_VISIBLE_DEVICES=" + ",".join(spec.devices))
        if env:
            props.append(("Environment", Variant("as", env)))
        return props

    def _check_cards(self, spec: ReplicaSpec) -> None:
        """Refuse a spec whose cards are not on this node or are below its engine's needs."""
        if spec.devices:
            devices.check(spec, self._inventory())

    def _pick_cpus(self, spec: ReplicaSpec, prefer: list[int]) -> list[int]:
        """The CPU ids for spec's cores: those it had (a spec changed), else free ones."""
        held = [o.cpus for o in self._replicas.values() if o.spec.id != spec.id]
        return cpus.pick(spec.cores, held, self._online_cpus(), prefer)

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

    def _memory_max(self, spec: ReplicaSpec) -> int:
        """The spec's limit, or the node's default when it has none (never 0: that kills)."""
        return spec.memory_max_bytes or engine_memory.default_limit(
            _node_memory(), self._config.engines.memory_max_bytes
        )

    def _key_file(self, rid: str) -> Path:
        return self._keys / f"{rid}.key"

    def _write_key(self, spec: ReplicaSpec) -> None:
        """The API key, readable by root only (systemd passes it on as a credential)."""
        path = self._key_file(spec.id)
        if not spec.api_key:
            path.unlink(missing_ok=True)
            return
        self._keys.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(spec.api_key + "\n")
        os.replace(tmp, path)

    def _write_record(self, r: _Replica) -> None:
        self._records.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = self._records / f"{r.spec.id}.json"
        tmp = path.with_name(f".{path.name}.tmp")
        record = EngineRecord(r.fingerprint, r.port, r.spec, r.host, r.cpus)
        tmp.write_bytes(msgspec.json.encode(record))
        os.replace(tmp, path)

    def _allocate_port(self, prefer: int = 0) -> int:
        """A port of the range that no replica has and nothing listens on."""
        taken = {r.port for r in self._replicas.values()}
        lo, hi = self._config.port_range
        for port in ([prefer] if prefer else []) + list(range(lo, hi + 1)):
            if port not in taken and _port_free(self._host, port):
                return port
        raise EngineError(f"no free port left in {lo}-{hi}")


def _read_record(path: Path) -> EngineRecord | None:
    try:
        record = msgspec.json.decode(path.read_bytes(), type=EngineRecord)
    except (OSError, msgspec.DecodeError) as e:
        log.warning("%s: ignored, cannot be read: %s", path, e)
        return None
    if f"{record.spec.id}.json" != path.name or not _ID.fullmatch(record.spec.id):
        log.warning("%s: ignored, its replica id does not match its name", path)
        return None
    return record


class _Health(msgspec.Struct):
    """The part of a /health body the agent reads."""

    status: str | None = None


def health_code(status: int, body: bytes) -> int:
    """/health's answer as readiness: a 200 is ready when its body is empty (vLLM), not JSON,
    or JSON whose "status" is absent or "ok" (llama.cpp 11434.0.0 answers {"status":"ok"}
    once loaded, 503 {"error":{"message":"Loading model"}} before); a 200 whose status is
    anything else ({"status":"loading model"}, as some engine versions answer) counts as a
    503: still loading."""
    if status != 200 or not body.strip():
        return status
    try:
        said = msgspec.json.decode(body, type=_Health).status
    except (msgspec.DecodeError, msgspec.ValidationError):
        return status
    return status if said is None or said.lower() == "ok" else 503


def _node_memory() -> int:
    """The node's RAM in bytes."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _probe_host(host: str) -> str:
    """Where to reach an engine bound to host from this node."""
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def _port_free(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        # As servers do: a port with only closed connections (TIME_WAIT) left is free.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True
