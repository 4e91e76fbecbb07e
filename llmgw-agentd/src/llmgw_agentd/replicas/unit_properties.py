"""An engine's transient unit: its name, its command line, and the properties systemd starts
it with (sandbox, memory limits, its CPUs and cards, its key as a credential)."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

from dbus_fast import Variant

from llmgw import engine_memory
from llmgw.config import AgentConfig
from llmgw.wire import Inventory, ReplicaSpec
from llmgw_agentd import cpus, devices, engines, prepare

UNIT_PREFIX = "llmgw-engine-"
ENGINE_SLICE = "llmgw-engines.slice"
# systemd copies the 0600 key file into the unit's credentials directory, readable by its
# dynamic user, and expands the variable in ExecStart itself.
KEY_CREDENTIAL = "key"
KEY_ARG = "${CREDENTIALS_DIRECTORY}/" + KEY_CREDENTIAL

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

Properties = list[tuple[str, Variant]]


def unit_name(replica_id: str) -> str:
    """The transient unit of a replica."""
    return f"{UNIT_PREFIX}{replica_id}.service"


def engine_command(
    spec: ReplicaSpec,
    config: AgentConfig,
    inventory: Inventory,
    host: str,
    port: int,
    key: str | None,
) -> list[str]:
    """The unit's ExecStart: spec's engine on host:port (llama.cpp on cards: its CUDA build)."""
    cuda = prepare.cuda(spec, inventory)
    return engines.command(spec, config, host=host, port=port, key_file=key, cuda=cuda)


def properties(
    spec: ReplicaSpec,
    cpu_ids: list[int],
    key: Path | None,
    *,
    config: AgentConfig,
    cache_root: Path | None,
    inventory: Callable[[], Inventory],
) -> Properties:
    """The unit's properties: spec's engine pinned to cpu_ids ([]: not pinned), the model
    cache read-only (None: no cache), key (None: none) passed as its credential."""
    description = f"llmgw engine {spec.engine}: {spec.model} (replica {spec.id})"
    props = [
        ("Description", Variant("s", description)),
        ("Slice", Variant("s", ENGINE_SLICE)),
        ("Type", Variant("s", "exec")),
        ("KillMode", Variant("s", "mixed")),
        # SIGTERM to the engine, SIGKILL to its cgroup once stop_timeout_s passed.
        ("TimeoutStopUSec", Variant("t", int(config.engines.stop_timeout_s * 1e6))),
        ("SendSIGKILL", Variant("b", True)),
        ("FinalKillSignal", Variant("i", int(signal.SIGKILL))),
        ("StandardOutput", Variant("s", "journal")),
        ("StandardError", Variant("s", "journal")),
        ("SyslogIdentifier", Variant("s", unit_name(spec.id).removesuffix(".service"))),
        # Over it the kernel ends the engine (Result=oom-kill) and the agent restarts it;
        # no swap, or the limit would only slow it down instead of bounding it.
        ("MemoryMax", Variant("t", memory_max(spec, config))),
        ("MemorySwapMax", Variant("t", 0)),
        *SANDBOX,
        *placement(spec, cpu_ids, config=config, inventory=inventory),
    ]
    if spec.files and cache_root is not None:  # the cache, seen read-only ("-": if any)
        props.append(("ReadOnlyPaths", Variant("as", [f"-{cache_root}"])))
    if key is not None:
        props.append(("LoadCredential", Variant("a(ss)", [(KEY_CREDENTIAL, str(key))])))
    if spec.engine == "vllm":  # torch's gloo (vLLM's workers) lists interfaces by netlink
        props.append(("RestrictAddressFamilies", Variant("(bas)", [True, ["AF_NETLINK"]])))
    return props


def placement(
    spec: ReplicaSpec,
    cpu_ids: list[int],
    *,
    config: AgentConfig,
    inventory: Callable[[], Inventory],
) -> Properties:
    """What holds an engine to its placement: MemoryHigh below its MemoryMax (the kernel
    reclaims and slows it there, before killing it at the limit), AllowedCPUs and the
    threads of its engine's runtime (the CPUs the agent picked for its cores), and
    DevicePolicy=closed with DeviceAllow for exactly its cards' device nodes, plus
    CUDA_VISIBLE_DEVICES naming them; raises EngineError for a card not on this node."""
    high = engine_memory.high(memory_max(spec, config))
    props = [("MemoryHigh", Variant("t", high)), ("DevicePolicy", Variant("s", "closed"))]
    env = cpus.thread_env(spec.engine, cpu_ids)
    if cpu_ids:  # the cgroup's cpuset (cgroup v2 only), and the threads' affinity (any)
        props.append(("AllowedCPUs", Variant("ay", cpus.mask(cpu_ids))))
        props.append(("CPUAffinity", Variant("ay", cpus.mask(cpu_ids))))
    if spec.devices:  # the cards (or MIG instances) the scheduler gave it, and only those
        nodes = devices.nodes(spec.devices, inventory())
        props.append(("DeviceAllow", Variant("a(ss)", [(n, "rw") for n in nodes])))
        env.append("CUDA_VISIBLE_DEVICES=" + ",".join(spec.devices))
    if env:
        props.append(("Environment", Variant("as", env)))
    return props


def memory_max(spec: ReplicaSpec, config: AgentConfig) -> int:
    """The spec's limit, or the node's default when it has none (never 0: that kills)."""
    return spec.memory_max_bytes or engine_memory.default_limit(
        _node_memory(), config.engines.memory_max_bytes
    )


def _node_memory() -> int:
    """The node's RAM in bytes."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
