"""Whether an engine that ended was killed by the kernel over its memory limit (an OOM kill).

On the unified cgroup hierarchy (v2) systemd reads the unit's memory.events and says so
itself: Result=oom-kill. On the legacy hierarchy (v1) it cannot, and the engine just ends
by SIGKILL; there the kernel's own count of OOM kills (/proc/vmstat's oom_kill, every
cgroup's together) tells: a SIGKILL the agent did not send, while that count rose since the
engine started, is taken for an OOM kill. (A person's kill -9 at the moment another process
of the host is OOM-killed would be taken for one too.)
"""

from __future__ import annotations

import signal
from pathlib import Path

from llmgw_agentd.systemd import UnitState

VMSTAT = Path("/proc/vmstat")


def kernel_count(vmstat: Path = VMSTAT) -> int:
    """The kernel's OOM kills since boot (-1 where it does not say: kernels before 4.13)."""
    try:
        for line in vmstat.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        pass
    return -1


def killed(st: UnitState, count_before: int, count_now: int) -> bool:
    """Whether the unit's end was an OOM kill (count_*: kernel_count before and after)."""
    if st.result == "oom-kill":
        return True
    sigkill = st.exit_code == 2 and st.exit_status == signal.SIGKILL
    return sigkill and count_before >= 0 and count_now > count_before
