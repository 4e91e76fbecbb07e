"""The memory llmgwd's settings call for (what units/llmgwd.service's MemoryMax is sized from),
and a warning at start when its own cgroup's memory.max is under it."""

from __future__ import annotations

import logging
from pathlib import Path

from llmgw.config import ClientPort
from llmgwd.router.transcriptions import SPOOL_MEMORY_BYTES

log = logging.getLogger("llmgwd.memory")

MIB = 1024 * 1024
BASE_BYTES = 512 * MIB  # the daemon itself, its caches (catalog, keys, usage, pool), its store
BODIES_HELD = 64  # /v1 JSON bodies at the client port's largest, in flight together
BODY_COPIES = 4  # each: as read, parsed, and encoded again for the engine, with the slack
UPLOAD_BYTES = SPOOL_MEMORY_BYTES + MIB  # a spool's memory and its two connections' buffers
HIGH_SHARE = 0.9  # MemoryHigh: the kernel reclaims and slows the daemon from there


def needed(client: ClientPort) -> int:
    """The MemoryMax llmgwd is given for settings client: a base, the uploads' spools at
    most, and room for BODIES_HELD bodies of client.max_body_bytes (whole MiB)."""
    uploads = client.max_uploads_in_flight * UPLOAD_BYTES
    bodies = BODIES_HELD * BODY_COPIES * client.max_body_bytes
    return -(-(BASE_BYTES + uploads + bodies) // MIB) * MIB


def high(limit: int) -> int:
    """The MemoryHigh that goes with a MemoryMax of limit (whole MiB)."""
    return int(limit * HIGH_SHARE) // MIB * MIB


def own_limit(proc: Path = Path("/proc"), cgroups: Path = Path("/sys/fs/cgroup")) -> int | None:
    """This process's cgroup v2 memory.max in bytes; None: no limit, or not known (cgroup v1,
    not under systemd, unreadable)."""
    try:
        lines = (proc / "self" / "cgroup").read_text().splitlines()
        path = next(line[3:] for line in lines if line.startswith("0::"))
        value = (cgroups / path.lstrip("/") / "memory.max").read_text().strip()
    except (OSError, StopIteration):
        return None
    return int(value) if value.isdigit() else None


def warning(client: ClientPort, limit: int | None) -> str | None:
    """What to tell the admin when limit is under what client calls for, else None."""
    want = needed(client)
    if limit is None or limit >= want:
        return None
    return (
        f"llmgwd's MemoryMax ({limit // MIB} MiB) is under what client.max_body_bytes and "
        f"client.max_uploads_in_flight call for ({want // MIB} MiB): the kernel may kill "
        f"llmgwd under load. Raise it with `systemctl edit llmgwd.service`: [Service] "
        f"MemoryMax={want // MIB}M MemoryHigh={high(want) // MIB}M"
    )


def check(client: ClientPort) -> None:
    """Log the warning, if any, for this process's own limit."""
    text = warning(client, own_limit())
    if text is not None:
        log.warning("%s", text)
