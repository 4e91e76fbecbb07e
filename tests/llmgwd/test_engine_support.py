"""Which engines a node is offered on its cards and CPUs, from what its agent reports of the
recorded NVML answers, and what `llmgw nodes` says of a node with cards and no CUDA toolkit."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from llmgw import wire
from llmgw_agentd import inventory
from llmgw_agentd.gpus import GpuReader
from llmgwd.api.base import ClusterNodes
from llmgwd.nodes import engine_support
from tests.llmgw_agentd.fake_nvml import FakeNvml

NO_TOOLKIT = "no CUDA toolkit: llama.cpp runs on CPUs only here"
RECORDINGS = ["dgx-h100-8x80gb", "rtx4090-8x24gb", "a100-80gb-mig"]


def node(tmp: Path, recording: str | None, toolkit: str, vllm: bool = False) -> wire.Inventory:
    reader = GpuReader(FakeNvml.load(recording)) if recording else None
    return inventory.collect(str(tmp), reader, toolkit=toolkit, vllm=vllm)


@pytest.mark.parametrize("recording", RECORDINGS)
def test_cards_without_the_toolkit_are_not_offered_llama_cpp(
    tmp_path: Path, recording: str
) -> None:
    inv = node(tmp_path, recording, toolkit="")
    assert engine_support.refusal(inv, "llama.cpp", gpu=True) == NO_TOOLKIT
    assert not engine_support.offers(inv, "llama.cpp", gpu=True)
    assert engine_support.offers(inv, "llama.cpp", gpu=False)
    assert engine_support.node_note(inv) == NO_TOOLKIT


@pytest.mark.parametrize("recording", RECORDINGS)
def test_cards_with_the_toolkit_are_offered_llama_cpp(
    tmp_path: Path, recording: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("shutil.which", lambda name: f"/usr/bin/{name}")  # cmake is here
    monkeypatch.setattr(inventory, "has_cublas", lambda: True)  # and a whole toolkit
    inv = node(tmp_path, recording, toolkit="12.4", vllm=True)
    assert engine_support.offers(inv, "llama.cpp", gpu=True)
    assert engine_support.offers(inv, "vllm", gpu=True)
    assert engine_support.refusal(inv, "vllm", gpu=False) == "vllm runs on cards only here"
    assert engine_support.node_note(inv) == ""


def test_a_node_without_cards(tmp_path: Path) -> None:
    inv = node(tmp_path, None, toolkit="13.0", vllm=True)  # this machine: a toolkit, no card
    assert engine_support.node_note(inv) == ""
    assert engine_support.offers(inv, "vllm", gpu=False)
    assert engine_support.refusal(inv, "vllm", gpu=True) == "vllm runs on CPUs only here (no card)"
    assert not engine_support.offers(inv, "llama.cpp", gpu=True)
    without_vllm = node(tmp_path, None, toolkit="")
    assert engine_support.refusal(without_vllm, "vllm", gpu=False) == (
        "vllm is not enabled on this node"
    )


def test_an_agent_older_than_engines_runs_llama_cpp_on_cpus_only(tmp_path: Path) -> None:
    old = wire.Inventory(cores=8, memory_bytes=1 << 36, memory_free_bytes=1 << 35,
                         gpus=node(tmp_path, "dgx-h100-8x80gb", "12.4").gpus)  # fmt: skip
    assert engine_support.offers(old, "llama.cpp", gpu=False)
    assert "older" in engine_support.refusal(old, "llama.cpp", gpu=True)
    assert "older" in engine_support.refusal(old, "vllm", gpu=True)


@dataclass
class Record:
    name: str
    inventory: wire.Inventory
    address: str = "10.0.0.1"
    version: str = "1"
    connected: bool = True
    last_seen: float = 0.0
    replicas: Sequence[wire.ReplicaStatus] = field(default_factory=list)


def test_the_api_shows_cards_toolkit_engines_and_the_note(tmp_path: Path) -> None:
    records = [Record("bare", node(tmp_path, "rtx4090-8x24gb", toolkit="")),
               Record("cpu", node(tmp_path, None, toolkit=""))]  # fmt: skip
    bare, cpu = ClusterNodes(lambda: records).nodes()
    assert (bare.gpus, bare.cuda_toolkit, bare.engines, bare.note) == (
        8,
        "",
        ["llama.cpp:cpu"],
        NO_TOOLKIT,
    )
    assert (cpu.gpus, cpu.note) == (0, "")
