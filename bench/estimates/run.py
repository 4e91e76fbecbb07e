#!/usr/bin/env python3
"""The scheduler's memory estimate beside what each engine really holds: for every model the
tests serve, one replica started in a private systemd, a chat answered, then the unit's
MemoryCurrent and its processes' resident memory (now, and the peak) against the estimate.

    .venv/bin/python bench/estimates/run.py [--contexts 512,4096] [--vllm]

SmolLM2-135M's GGUF on llama.cpp (CPU) at each context; with --vllm, the SmolLM2 safetensors
set on vLLM's CPU build too (scripts/build-vllm-cpu and scripts/make-test-safetensors make
them; minutes). The estimate is the placement's, read back from the unit's MemoryMax, which
llmgwd makes of it (engine_memory.limit: a quarter more and 512 MiB), and checked against
`llmgw model plan`. Needs root and scripts/build-llama-server's build. Prints figures only.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any, NamedTuple

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from integration import harness  # noqa: E402
from integration.llmgw_node import Node, gguf, llama_server  # noqa: E402
from llmgw.engine_memory import FIXED, MIB  # noqa: E402

VLLM_ENV = "/var/cache/llmgw/vllm/0.32.0-x86_64"  # as integration/test_vllm.py binds it
ST_REPO = "local/SmolLM2-135M-Instruct"


class Case(NamedTuple):
    name: str
    engine: str
    source: str
    context: int


class Row(NamedTuple):
    case: Case
    estimate: int  # bytes, from the unit's MemoryMax
    plan: str  # what `llmgw model plan` says of it
    current: int  # the unit's cgroup: memory.current (v2), memory.usage_in_bytes (v1)
    cgroup_peak: int  # memory.peak (v2), memory.max_usage_in_bytes (v1); 0: not told
    rss: int  # its processes' VmRSS, summed
    peak: int  # their VmHWM, summed


def estimate_of(memory_max: int) -> int:
    """The estimate a MemoryMax was made of (engine_memory.limit, within its MiB rounding)."""
    return (memory_max - FIXED) * 4 // 5 // MIB * MIB


def _status_kib(ps: harness.PrivateSystemd, pid: str, field: str) -> int:
    for line in ps.run(["cat", f"/proc/{pid}/status"], check=False).stdout.splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def number(text: str) -> int:
    """systemctl's figure, 0 where it says "[not set]"."""
    return int(text.strip()) if text.strip().isdigit() else 0


def unit_pids(node: Node, unit: str) -> list[str]:
    """The unit's processes (inside numbers): its cgroup's procs, on cgroup v2 or v1."""
    group = node.ps.systemctl("show", "-P", "ControlGroup", unit).stdout.strip()
    for root in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified", "/sys/fs/cgroup/systemd"):
        got = node.ps.run(["cat", f"{root}{group}/cgroup.procs"], check=False)
        if got.returncode == 0:
            return got.stdout.split()
    return []


def cgroup_memory(node: Node, unit: str) -> tuple[int, int]:
    """The unit's whole cgroup (every process of it, page cache included): its memory now and
    its peak, from cgroup v2's files or v1's memory controller; 0 for what is not there."""
    group = node.ps.systemctl("show", "-P", "ControlGroup", unit).stdout.strip()
    places = (
        ("/sys/fs/cgroup", "memory.current", "memory.peak"),
        ("/sys/fs/cgroup/memory", "memory.usage_in_bytes", "memory.max_usage_in_bytes"),
    )
    for root, now, most in places:  # fmt: skip
        got = node.ps.run(["cat", f"{root}{group}/{now}", f"{root}{group}/{most}"], check=False)
        figures = [number(line) for line in got.stdout.splitlines()]
        if figures and figures[0]:
            return figures[0], figures[1] if len(figures) > 1 else 0
    return 0, 0


def measure(node: Node, case: Case, key: str) -> Row:
    """Serve case, ask one chat so the engine has worked once, then read its memory."""
    node.llmgw("model", "add", case.name, "--from", case.source, "--engine", case.engine,
               "--context", str(case.context))  # fmt: skip
    node.llmgw("model", "serve", case.name, "--replicas", "1")
    node.wait(lambda: node.model(case.name)["ready"] >= 1, f"{case.name} ready", 1200)
    chat(node, key, case.name)
    [unit] = node.engine_units()
    show = node.ps.systemctl("show", "-P", "MemoryMax", unit).stdout.strip()
    current, cgroup_peak = cgroup_memory(node, unit)
    current = current or number(node.ps.systemctl("show", "-P", "MemoryCurrent", unit).stdout)
    pids = unit_pids(node, unit)
    rss = sum(_status_kib(node.ps, p, "VmRSS") for p in pids) * 1024
    peak = sum(_status_kib(node.ps, p, "VmHWM") for p in pids) * 1024
    plan: dict[str, Any] = node.llmgw("model", "plan", case.name, "--json")
    placed = [p["memory"] for prof in plan["profiles"] for p in prof["placed"]]
    node.llmgw("model", "stop", case.name)
    node.wait(lambda: not node.engine_units(), "engine stopped", 300)
    node.llmgw("model", "remove", case.name)
    return Row(case, estimate_of(int(show)), ", ".join(placed), current, cgroup_peak, rss, peak)


def chat(node: Node, key: str, model: str) -> None:
    ask = {"role": "user", "content": "Name three rivers of Europe."}
    body = json.dumps({"model": model, "max_tokens": 32, "messages": [ask]}).encode()
    req = urllib.request.Request(
        f"{node.base_url}/chat/completions",
        data=body,
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=300) as r:
        r.read()


def mib(n: int) -> str:
    return f"{n / MIB:8.0f}"


def table(rows: list[Row]) -> None:
    print(f"{'model':24} {'engine':9} {'ctx':>6} {'estimate':>8} {'(plan)':>9} {'current':>8} "
          f"{'peak':>8} {'rss':>8} {'peak rss':>8} {'peak/est':>8} {'rss/est':>7}")  # fmt: skip
    for r in rows:
        c = r.case
        most = r.cgroup_peak or r.current
        print(f"{c.name:24} {c.engine:9} {c.context:6d} {mib(r.estimate)} {r.plan:>9} "
              f"{mib(r.current)} {mib(r.cgroup_peak)} {mib(r.rss)} {mib(r.peak)} "
              f"{most / r.estimate:8.2f} {r.peak / r.estimate:7.2f}")  # fmt: skip
    print("MiB; estimate: the placement's (weights + KV cache for the context + margin + the")
    print("engine's runtime), read back from the unit's MemoryMax; current/peak: the unit's")
    print("whole cgroup, every process of it and the page cache of the model's files (v2's")
    print("memory.current/peak, v1's usage_in_bytes/max_usage_in_bytes; 0: not told);")
    print("rss/peak rss: VmRSS/VmHWM of the unit's processes, summed (shared pages counted")
    print("in each); peak/est: the cgroup's peak (else current) over the estimate.")


def _script(name: str) -> Path:
    r = subprocess.run([REPO / "scripts" / name], capture_output=True, text=True, timeout=7200)
    if r.returncode != 0:
        raise SystemExit(f"scripts/{name} failed: {r.stderr[-400:]}")
    return Path(r.stdout.strip())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", default="512,4096", help="llama.cpp's contexts, comma-separated")
    ap.add_argument("--vllm", action="store_true", help="vLLM's CPU build too (minutes)")
    args = ap.parse_args()
    cases = [Case(f"smollm2-gguf-{n}", "llama.cpp", f"file:{gguf()}", int(n))
             for n in args.contexts.split(",")]  # fmt: skip
    binds = harness.binds()
    extra = ""
    if args.vllm:
        env, model_dir = _script("build-vllm-cpu"), _script("make-test-safetensors")
        binds += [harness.Bind(env, Path(VLLM_ENV), readonly=True),
                  harness.Bind(model_dir, readonly=True)]  # fmt: skip
        extra = f"  vllm:\n    env: {VLLM_ENV}\n"
        cases.append(Case("smollm2-vllm-2048", "vllm", f"hf:{ST_REPO}", 2048))
    rows: list[Row] = []
    with harness.booted("bench-estimates", binds=binds) as ps:
        node = Node(ps, 7700, 7710)
        node.install(llama_server(), agent_extra=extra)
        node.join(node.init_server())
        key = str(node.llmgw("key", "create", "bench", "--json")["key"])
        if args.vllm:
            ps.run(["cp", "-rL", str(model_dir), "/srv/smol"])
            node.llmgw("mirror", "import", "/srv/smol", "--as", ST_REPO)
        for case in cases:
            rows.append(measure(node, case, key))
            print(f"measured {case.name}", file=sys.stderr)
    table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
