"""The node's memory bandwidth, one core and all cores, measured once at the agent's start.

A buffer well over the last-level cache is copied (memoryview slice assignment: memcpy) a
few times and the best round is kept; a figure counts bytes read plus bytes written, as
STREAM's copy does. All cores copy at once in processes pinned one to a core, started
together by a barrier; the whole measurement is bounded to about a second and a half.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import os
import time
from multiprocessing.queues import Queue
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import NamedTuple

log = logging.getLogger(__name__)

MIB = 1 << 20
CPU_SYSFS = Path("/sys/devices/system/cpu")


class Bandwidth(NamedTuple):
    """Bytes per second (read + written): one core copying alone, and all cores at once."""

    one_core: int
    all_cores: int


def _size(text: str) -> int:
    text = text.strip().upper()
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(text.rstrip("KMG") or 0) * scale


def l3_bytes(sysfs: Path = CPU_SYSFS) -> tuple[int, int]:
    """(the last-level cache one core sees, all last-level caches together) in bytes.

    Read from sysfs: each cache is counted once however many cores share it (a socket's L3,
    or each CCX's on AMD). (0, 0) where sysfs does not tell.
    """
    caches: dict[tuple[int, str], int] = {}
    mine: dict[int, int] = {}
    for index in sysfs.glob("cpu[0-9]*/cache/index[0-9]*"):
        try:
            level = int((index / "level").read_text())
            size = _size((index / "size").read_text())
            shared = (index / "shared_cpu_list").read_text().strip()
        except (OSError, ValueError):
            continue
        caches[(level, shared)] = size
        if index.parent.parent.name == "cpu0":
            mine[level] = max(mine.get(level, 0), size)
    if not caches:
        return 0, 0
    top = max(level for level, _ in caches)
    return mine.get(top, 0), sum(size for (level, _), size in caches.items() if level == top)


def buffer_sizes(ncores: int, sysfs: Path = CPU_SYSFS, limit: int = 0) -> tuple[int, int]:
    """(one core's buffer, each core's buffer when all copy): four times the caches they could
    be served from, so the copies go to memory; at least 64 MiB and 16 MiB. With a limit, the
    buffers of all cores together (two each: source and copy) stay under it."""
    one, total = l3_bytes(sysfs)
    single = max(64 * MIB, 4 * one)
    each = max(16 * MIB, 4 * total // max(ncores, 1))
    if limit:
        single = min(single, limit // 2)
        each = min(each, limit // (2 * max(ncores, 1)))
    return single, each


def _filled(nbytes: int) -> tuple[memoryview, memoryview]:
    # Non-zero contents: a buffer of zeros from calloc maps the one zero page, which reads
    # from cache; writing every page first makes both buffers real memory.
    src = bytearray(b"\x5a") * nbytes
    dst = bytearray(b"\xa5") * nbytes
    return memoryview(src), memoryview(dst)


def one_core(nbytes: int, budget_s: float, rounds: int = 5) -> int:
    """The best copy rate of this core over up to rounds copies within budget_s."""
    src, dst = _filled(nbytes)
    dst[:] = src  # a first copy, not counted: pages and TLB warm
    best = 0.0
    deadline = time.perf_counter() + budget_s
    for _ in range(rounds):
        t0 = time.perf_counter()
        dst[:] = src
        dt = time.perf_counter() - t0
        best = max(best, 2 * nbytes / dt) if dt > 0 else best
        if time.perf_counter() > deadline:
            break
    return int(best)


def _worker(
    cpu: int,
    lead: bool,
    nbytes: int,
    rounds: int,
    deadline: float,
    barrier: Barrier,
    stop: Synchronized[int],
    out: Queue[list[tuple[float, float]]],
) -> None:
    # One pinned process per core; perf_counter is CLOCK_MONOTONIC, the same clock in every
    # process, so the rounds' start and end times compare across them. The lead worker says
    # when time is up; the others see it after the next barrier.
    with contextlib.suppress(OSError):
        os.sched_setaffinity(0, {cpu})
    src, dst = _filled(nbytes)
    dst[:] = src
    times: list[tuple[float, float]] = []
    for _ in range(rounds):
        barrier.wait(timeout=30)
        if stop.value:
            break
        t0 = time.perf_counter()
        dst[:] = src
        times.append((t0, time.perf_counter()))
        if lead and time.perf_counter() > deadline:
            stop.value = 1
    out.put(times)


def all_cores(cpus: list[int], nbytes: int, budget_s: float, rounds: int = 4) -> int:
    """The best rate of all of cpus copying at once (one process each), or 0 if it failed."""
    ctx = mp.get_context("spawn")  # not fork: the agent has threads and an event loop
    barrier = ctx.Barrier(len(cpus))
    stop = ctx.Value("b", 0)
    out: Queue[list[tuple[float, float]]] = ctx.Queue()
    deadline = time.perf_counter() + budget_s
    procs = [
        ctx.Process(
            target=_worker,
            args=(cpu, cpu == cpus[0], nbytes, rounds, deadline, barrier, stop, out),
            daemon=True,
        )
        for cpu in cpus
    ]
    for p in procs:
        p.start()
    results: list[list[tuple[float, float]]] = []
    try:
        for _ in procs:
            results.append(out.get(timeout=budget_s + 20))
    except Exception as e:  # a worker that died or hung: no figure rather than a wrong one
        log.warning("all-core memory bandwidth not measured: %s", e)
        return 0
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
    best = 0.0
    for r in range(min(len(t) for t in results)):
        start = min(t[r][0] for t in results)
        end = max(t[r][1] for t in results)
        if end > start:
            best = max(best, 2 * nbytes * len(results) / (end - start))
    return int(best)


def measure(budget_s: float = 1.5, memory_free: int = 0, sysfs: Path = CPU_SYSFS) -> Bandwidth:
    """Both figures for this process's cores in about budget_s; the buffers stay under an
    eighth of memory_free where it is given."""
    cpus = sorted(os.sched_getaffinity(0))
    single, each = buffer_sizes(len(cpus), sysfs, memory_free // 8)
    one = one_core(single, budget_s / 3)
    every = all_cores(cpus, each, budget_s / 3) if len(cpus) > 1 else one
    log.info(
        "memory bandwidth: %.1f GB/s on one core, %.1f GB/s on %d cores",
        one / 1e9,
        every / 1e9,
        len(cpus),
    )
    return Bandwidth(one, every)
