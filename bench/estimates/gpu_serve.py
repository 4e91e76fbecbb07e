#!/usr/bin/env python3
"""On a machine with an NVIDIA card (scripts/gpu-check runs it): SmolLM2's GGUF on llama.cpp
with CUDA, with --vllm-env the SmolLM2 safetensors set on vLLM, and with --freetoken-env a
mixture of experts (--moe, scripts/make-test-moe's) on FreeToken, each served on the card
through llmgwd in a private systemd; prints first token, tokens per second, and the memory
used (on the card by nvidia-smi, in RAM by the unit) against the placement's estimate.

    .venv/bin/python bench/estimates/gpu_serve.py --llama-server BIN [--vllm-env DIR
        --safetensors DIR] [--freetoken-env DIR --moe DIR]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from integration import harness  # noqa: E402
from integration.llmgw_node import Node, gguf  # noqa: E402
from llmgw.engine_memory import FIXED, MIB  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from run import number, unit_pids  # type: ignore[import-not-found]  # noqa: E402

VLLM_INSIDE = "/var/cache/llmgw/vllm-gpu"
FREETOKEN_INSIDE = "/var/cache/llmgw/freetoken"
ST_REPO = "local/SmolLM2-135M-Instruct"
MOE_REPO = "local/tiny-moe"


def estimate_of(memory_max: int) -> int:
    """The estimate a MemoryMax was made of (engine_memory.limit, within its MiB rounding)."""
    return (memory_max - FIXED) * 4 // 5 // MIB * MIB


def stream(node: Node, key: str, model: str) -> tuple[float, float, int]:
    """One streamed chat: seconds to the first token, tokens per second after it, tokens."""
    ask = {"role": "user", "content": "Write a short story about a lighthouse keeper."}
    body = {"model": model, "max_tokens": 256, "stream": True, "messages": [ask],
            "stream_options": {"include_usage": True}}  # fmt: skip
    req = urllib.request.Request(
        f"{node.base_url}/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    started = time.monotonic()
    first = 0.0
    tokens = 0
    with urllib.request.urlopen(req, timeout=300) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if not first and any(c["delta"].get("content") for c in chunk.get("choices", [])):
                first = time.monotonic()
            if chunk.get("usage"):
                tokens = int(chunk["usage"]["completion_tokens"])
    done = time.monotonic()
    return first - started, (tokens - 1) / max(done - first, 1e-9), tokens


def card_mib(pids: list[str]) -> int:
    """The card memory nvidia-smi says the processes use (MiB)."""
    out = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
        capture_output=True, text=True, check=False,
    ).stdout  # fmt: skip
    used = 0
    for line in out.splitlines():
        pid, _, mem = line.partition(",")
        if pid.strip() in pids:
            used += int(mem.strip() or 0)
    return used


def host_pids(node: Node, unit: str) -> list[str]:
    """The unit's processes as the host numbers them (nvidia-smi lists host PIDs)."""
    inside = unit_pids(node, unit)
    out = []
    # Inside PIDs differ from the host's: match by NSpid in every host process's status.
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            text = status.read_text()
        except OSError:
            continue
        for row in text.splitlines():
            if row.startswith("NSpid:") and len(row.split()) > 2 and row.split()[-1] in inside:
                out.append(status.parent.name)
    return out


def serve_and_measure(node: Node, key: str, name: str, start_s: float) -> dict[str, Any]:
    node.llmgw("model", "replicas", name, "1", "--profile", "gpu")
    started = time.monotonic()
    node.wait(lambda: node.model(name)["ready"] >= 1, f"{name} ready on the card", start_s)
    ready = time.monotonic() - started
    first, tps, tokens = stream(node, key, name)
    [unit] = node.engine_units()
    plan = node.llmgw("model", "plan", name, "--json")
    placed = [p for prof in plan["profiles"] for p in prof["placed"]]
    memory_max = int(node.ps.systemctl("show", "-P", "MemoryMax", unit).stdout.strip())
    figures = {
        "model": name,
        "ready_s": round(ready, 1),
        "first_token_s": round(first, 3),
        "tokens_per_s": round(tps, 1),
        "tokens": tokens,
        "devices": [p["devices"] for p in placed],
        "estimate_on_card": [p["memory"] for p in placed],
        "card_used_mib": card_mib(host_pids(node, unit)),
        "ram_estimate_mib": estimate_of(memory_max) >> 20,
        "ram_current_mib": number(node.ps.systemctl("show", "-P", "MemoryCurrent", unit).stdout)
        >> 20,
        "argv": node.ps.systemctl("show", "-P", "ExecStart", unit).stdout.strip()[:400],
    }
    node.llmgw("model", "replicas", name, "0", "--profile", "gpu")
    node.wait(lambda: not node.engine_units(), "engine stopped", 300)
    return figures


def engines_bound(args: argparse.Namespace) -> tuple[list[harness.Bind], str]:
    """What the private systemd binds in (the checkout, the llama-server build cache, the
    engines' environments and sets, read-only) and agent.yaml's engine lines for them."""
    binds = harness.binds()
    extra = ""
    if args.vllm_env:
        binds += [harness.Bind(Path(args.vllm_env), Path(VLLM_INSIDE), readonly=True),
                  harness.Bind(Path(args.safetensors), readonly=True)]  # fmt: skip
        extra += f"  vllm:\n    env: {VLLM_INSIDE}\n"
    if args.freetoken_env:
        binds += [harness.Bind(Path(args.freetoken_env), Path(FREETOKEN_INSIDE), readonly=True),
                  harness.Bind(Path(args.moe), readonly=True)]  # fmt: skip
        extra += f"  freetoken:\n    env: {FREETOKEN_INSIDE}\n"
    return binds, extra


def serve_set(
    node: Node, key: str, src: str, repo: str, name: str, engine: str, start_s: float
) -> dict[str, Any]:
    """A safetensors set imported into the mirror as repo, served as name on engine (ready
    within start_s)."""
    node.ps.run(["cp", "-rL", src, f"/srv/{name}"])
    node.llmgw("mirror", "import", f"/srv/{name}", "--as", repo)
    node.llmgw("model", "add", name, "--from", f"hf:{repo}", "--engine", engine,
               "--context", "4096")  # fmt: skip
    return serve_and_measure(node, key, name, start_s)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-server", required=True, help="llama-server built with CUDA")
    ap.add_argument("--vllm-env", help="an environment with vLLM (CUDA) installed")
    ap.add_argument("--safetensors", help="the SmolLM2 safetensors set (make-test-safetensors)")
    ap.add_argument("--freetoken-env", help="an environment with FreeToken installed")
    ap.add_argument("--moe", help="a mixture of experts' safetensors set (make-test-moe)")
    args = ap.parse_args()
    binds, extra = engines_bound(args)
    results = []
    with harness.booted("gpu-check", binds=binds) as ps:
        node = Node(ps, 7700, 7710)
        node.install(args.llama_server, agent_extra=extra)
        node.join(node.init_server())
        key = str(node.llmgw("key", "create", "gpu-check", "--json")["key"])
        print(json.dumps(node.llmgw("nodes", "--json"), indent=1)[:3000], file=sys.stderr)
        node.llmgw("model", "add", "smol-gguf", "--from", f"file:{gguf()}", "--engine",
                   "llama.cpp", "--context", "4096")  # fmt: skip
        results.append(serve_and_measure(node, key, "smol-gguf", 300))
        if args.vllm_env:
            smol = (args.safetensors, ST_REPO, "smol-vllm", "vllm", 600)
            results.append(serve_set(node, key, *smol))
        if args.freetoken_env:  # FreeToken compiles its kernels for the card as it loads
            moe = (args.moe, MOE_REPO, "moe-freetoken", "freetoken", 1200)
            results.append(serve_set(node, key, *moe))
    for r in results:
        print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
