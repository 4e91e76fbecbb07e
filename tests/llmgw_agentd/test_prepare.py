"""llama.cpp on cards: the agent builds llama-server with CUDA when the first replica on cards
needs it, once for every replica waiting, in the background, the build's progress as their
"starting" message, then starts them with the built binary. The build here is a small fake
of scripts/build-llama-server (the real one cannot build for CUDA on this machine: it has
nvcc but no cuBLAS); tests/llmgw_agentd/test_llama_build.py runs the real script."""

from __future__ import annotations

import platform
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmgw.wire import ReplicaSpec
from llmgw_agentd.engines import llamacpp
from tests.llmgw_agentd.nvml_inventory import load, recorded
from tests.llmgw_agentd.test_placement import node, props  # noqa: F401 (node: a fixture)
from tests.llmgw_agentd.test_replicas import FAKE_ENGINE, Node, ready, spec, until

BUILT = f"{llamacpp.VERSION}-{platform.machine()}-cuda12.4-sm$LLAMA_CUDA_ARCHITECTURES"
# scripts/build-llama-server --cuda as the agent runs it: its steps on stderr, then the
# binary in $LLMGW_CACHE; it waits for $GATE to exist, so a test sees it still building.
FAKE_BUILD = f"""#!/bin/sh
[ "$1" = --cuda ] || exit 2
echo run >> "$RUNS"
echo "llama-server {llamacpp.VERSION} (CUDA 12.4): building, 50%" >&2
while [ ! -e "$GATE" ]; do sleep 0.05; done
[ -e "$GATE.fail" ] && {{ echo "CUDA::cublas not found" >&2; exit 1; }}
out="$LLMGW_CACHE/llama.cpp/{BUILT}"
mkdir -p "$out" && cp "$ENGINE" "$out/.new" && mv "$out/.new" "$out/llama-server"
"""
# The built llama-server: the stand-in engine, given the options it knows.
FAKE_SERVER = f"""#!{sys.executable}
import os, sys
argv, keep = sys.argv[1:], []
for i, a in enumerate(argv):
    if a in ("--host", "--port", "--api-key-file", "--ctx-size"):
        keep += [a, argv[i + 1]]
os.execv(sys.executable, [sys.executable, {FAKE_ENGINE!r}, *keep])
"""


@pytest.fixture
def site(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A world-readable place (engines run as dynamic users) with the fake build and model."""
    where = Path(tempfile.mkdtemp(prefix="llmgw-prepare-", dir="/tmp"))
    where.chmod(0o755)
    for name, text in (("build", FAKE_BUILD), ("engine", FAKE_SERVER), ("m.gguf", "")):
        (where / name).write_text(text)
        (where / name).chmod(0o755)
    monkeypatch.setenv("LLMGW_BUILD_LLAMA_SERVER", str(where / "build"))
    monkeypatch.setenv("LLMGW_CACHE", str(where / "cache"))
    monkeypatch.setenv("HOME", str(where / "home"))  # no build of this user's is taken
    monkeypatch.setattr(llamacpp, "SYSTEM_CACHE", where / "cache")
    monkeypatch.setenv("RUNS", str(where / "runs"))
    monkeypatch.setenv("GATE", str(where / "gate"))
    monkeypatch.setenv("ENGINE", str(where / "engine"))
    try:
        yield where
    finally:
        shutil.rmtree(where)


def on_cards(agent: Node, site: Path, rid: str, card: int) -> ReplicaSpec:
    uuid = agent.inventory.gpus[card].uuid
    return spec(rid, source=f"file:{site / 'm.gguf'}", devices=[uuid])


async def test_llama_cpp_on_cards_is_built_once_then_started_with_the_build(
    node: Node,  # noqa: F811
    site: Path,
) -> None:
    node.inventory = recorded(load("dgx-h100-8x80gb"), toolkit="12.4")
    replicas = await node.new_replicas(command=None, prepare=None)  # the agent's own
    # apply() returns while the build runs: it is in the replicas' tasks, not the agent's way.
    await replicas.apply([on_cards(node, site, "r1", 0), on_cards(node, site, "r2", 1)])
    building = "building llama.cpp with CUDA 12.4: building, 50%"
    got = await until(replicas, lambda s: all(
        r in s and s[r].state == "starting" and s[r].message == building for r in ("r1", "r2")
    ))  # fmt: skip
    assert set(got) == {"r1", "r2"} and node.fake.started == []
    (site / "gate").touch()
    await until(replicas, lambda s: ready("r1")(s) and ready("r2")(s))
    assert (site / "runs").read_text() == "run\n"  # one build for both
    built = site / "cache" / "llama.cpp" / BUILT.replace("$LLAMA_CUDA_ARCHITECTURES", "90")
    for unit in ("llmgw-engine-r1.service", "llmgw-engine-r2.service"):
        argv = props(node, unit)["ExecStart"][0][1]
        assert argv[0] == str(built / "llama-server")
        assert argv[argv.index("--n-gpu-layers") + 1] == "all"
    assert all(s.message == "" for s in replicas.statuses())  # the progress cleared


async def test_a_failed_build_is_the_replicas_error_and_is_tried_again(
    node: Node,  # noqa: F811
    site: Path,
) -> None:
    node.inventory = recorded(load("dgx-h100-8x80gb"), toolkit="12.4")
    replicas = await node.new_replicas(command=None, prepare=None)
    (site / "gate").touch()
    (site / "gate.fail").touch()
    await replicas.apply([on_cards(node, site, "r1", 0)])
    got = await until(replicas, lambda s: "r1" in s and s["r1"].state == "failed")
    assert "could not be built with CUDA (exit 1): " in got["r1"].message
    assert got["r1"].message.endswith("CUDA::cublas not found; restarting in 0.1s")
    (site / "gate.fail").unlink()
    await until(replicas, ready("r1"))
    assert node.fake.started and (site / "runs").read_text().count("run") >= 2


async def test_no_toolkit_no_build_and_the_replica_says_so(
    node: Node,  # noqa: F811
    site: Path,
) -> None:
    node.inventory = recorded(load("dgx-h100-8x80gb"), toolkit="")
    replicas = await node.new_replicas(command=None, prepare=None)
    await replicas.apply([on_cards(node, site, "r1", 0)])
    got = await until(replicas, lambda s: "r1" in s and s["r1"].state == "failed")
    assert "no CUDA toolkit on this node: llama.cpp runs on CPUs only here" in got["r1"].message
    assert not (site / "runs").exists() and node.fake.started == []
