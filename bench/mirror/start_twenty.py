#!/usr/bin/env python3
"""Time to start twenty replicas of one model on one node: served from a file already on the
node (the baseline) and from the mirror (hf:, fetched by the node over the cluster port into
its cache, once for all of them), in one private systemd, in the same run.

    .venv/bin/python bench/mirror/start_twenty.py [--replicas 20]

A CPU replica takes a core of its own (the scheduler's rule), so a node starts at most as
many as it has cores: on a 2-core machine the run asks for 2, and says so.

Needs root and the llama-server build (scripts/build-llama-server). Prints figures only.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from integration import harness  # noqa: E402
from integration.llmgw_node import Node, gguf, llama_server  # noqa: E402

HF_REPO = "local/SmolLM2-135M-Instruct-GGUF"
CACHE = "/var/lib/llmgw-agentd/models"


def _time_to_ready(node: Node, name: str, source: str, replicas: int) -> float:
    node.llmgw("model", "add", name, "--from", source, "--context", "512")
    started = time.monotonic()
    node.llmgw("model", "serve", name, "--replicas", str(replicas))
    node.wait(lambda: node.model(name)["ready"] >= replicas, f"{replicas} ready", 900)
    took = time.monotonic() - started
    node.llmgw("model", "stop", name)
    node.wait(lambda: not node.engine_units(), "engines stopped", 300)
    return took


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", type=int, default=20)
    ap.add_argument("--trace", action="store_true", help="print the agent's log of the run")
    args = ap.parse_args()
    binary = llama_server()
    with harness.booted("bench-twenty", binds=harness.binds()) as ps:
        node = Node(ps, 7700, 7710)
        node.install(binary)
        node.join(node.init_server())
        ps.run(["mkdir", "-p", "/var/tmp/import"])
        ps.run(["cp", str(gguf()), "/var/tmp/import/"])
        node.llmgw("mirror", "import", "/var/tmp/import", "--as", HF_REPO)
        cores = int(ps.run(["nproc"]).stdout.strip())
        n = min(args.replicas, cores)
        if n < args.replicas:
            print(f"(this node has {cores} cores: {n} replicas, not {args.replicas})")
        # The file first and last, the mirror between: the first start of an engine reads
        # a cold disk, so the file's two runs show how much of a difference that makes.
        base = _time_to_ready(node, "from-file", f"file:{gguf()}", n)
        mirrored = _time_to_ready(node, "from-mirror", f"hf:{HF_REPO}", n)
        node.llmgw("model", "remove", "from-file")
        base2 = _time_to_ready(node, "from-file", f"file:{gguf()}", n)
        blobs = ps.run(["ls", f"{CACHE}/blobs"]).stdout.split()
        fetched = ps.run(["journalctl", "-u", "llmgw-agentd", "-o", "cat"]).stdout.count("fetched")
        if args.trace:
            print(
                ps.run(
                    [
                        "journalctl",
                        "-u",
                        "llmgw-agentd",
                        "-u",
                        "llmgwd",
                        "-o",
                        "short-precise",
                        "--no-hostname",
                    ]
                ).stdout
            )
    size = gguf().stat().st_size
    print(f"{n} replicas of SmolLM2-135M (Q4_1, {size / 1e6:.0f} MB) on one node, {cores} cores:")
    print(f"  from a file on the node:   {base:6.1f} s to all ready (first), {base2:.1f} s (last)")
    print(f"  from the mirror (hf:):     {mirrored:6.1f} s to all ready, fetch included")
    ratio = mirrored / ((base + base2) / 2)
    print(f"  ratio mirror/file:         {ratio:6.2f} (the file: the mean of both runs)")
    print(f"  files in the node's cache: {len(blobs)}; agent log lines saying 'fetched': {fetched}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
