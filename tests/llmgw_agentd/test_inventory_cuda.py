"""The node's CUDA toolkit and the engines it reports, and which llama-server a replica gets:
the CUDA build for a spec on cards, all its layers offloaded; against recorded NVML answers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmgw.config import AgentConfig, LlamaCpp
from llmgw.wire import ReplicaSpec
from llmgw_agentd import inventory
from llmgw_agentd.engines import EngineError, llamacpp
from llmgw_agentd.gpus import GpuReader
from tests.llmgw_agentd.fake_nvml import FakeNvml


def fake_nvcc(tmp: Path, release: str) -> str:
    path = tmp / "nvcc"
    path.write_text(f'#!/bin/sh\necho "Cuda compilation tools, release {release}, V{release}.1"\n')
    path.chmod(0o755)
    return str(path)


def test_the_toolkit_is_what_nvcc_says_else_its_version_json(tmp_path: Path) -> None:
    version_json = tmp_path / "version.json"
    assert inventory.cuda_toolkit(fake_nvcc(tmp_path, "12.4"), version_json) == "12.4"
    assert inventory.cuda_toolkit(None, version_json) == ""
    version_json.write_text(json.dumps({"cuda": {"name": "CUDA SDK", "version": "12.6.2"}}))
    assert inventory.cuda_toolkit(None, version_json) == "12.6"
    assert inventory.cuda_toolkit(str(tmp_path / "gone"), version_json) == "12.6"
    version_json.write_text("{")
    assert inventory.cuda_toolkit(None, version_json) == ""


def test_the_inventory_carries_the_toolkit_and_engines_from_recorded_cards(
    tmp_path: Path,
) -> None:
    reader = GpuReader(FakeNvml.load("dgx-h100-8x80gb"))
    inv = inventory.collect(str(tmp_path), reader, toolkit="12.4", vllm=True)
    assert inv.cuda_toolkit == "12.4" and len(inv.gpus) == 8
    assert "vllm:gpu" in inv.engines and "vllm:cpu" not in inv.engines
    bare = inventory.collect(str(tmp_path), reader, toolkit="", vllm=False)
    assert bare.cuda_toolkit == "" and bare.engines == ["llama.cpp:cpu"]
    no_cards = inventory.collect(str(tmp_path), None, toolkit="12.4")  # vLLM by default
    assert no_cards.engines == ["llama.cpp:cpu", "vllm:cpu"]


@pytest.mark.parametrize("name", ["dgx-h100-8x80gb", "rtx4090-8x24gb", "a100-80gb-mig"])
def test_llama_cpp_on_cards_needs_the_toolkit_and_a_build_or_the_means_to_make_one(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLMGW_CACHE", str(tmp_path))
    gpus = GpuReader(FakeNvml.load(name)).read().gpus
    assert gpus
    assert inventory.engines(gpus, "", False, can_build=True) == ["llama.cpp:cpu"]
    assert inventory.engines(gpus, "12.4", False, can_build=False) == ["llama.cpp:cpu"]
    assert "llama.cpp:gpu" in inventory.engines(gpus, "12.4", False, can_build=True)
    # Built for every card's compute capability (build-llama-server's name for it): offered
    # without cmake.
    sms = "_".join(sorted({g.compute_capability.replace(".", "") for g in gpus}))
    built = tmp_path / "llama.cpp" / f"{llamacpp.VERSION}-x86_64-cuda12.4-sm{sms}"
    built.mkdir(parents=True)
    (built / "llama-server").write_text("")
    monkeypatch.setattr("platform.machine", lambda: "x86_64")
    assert "llama.cpp:gpu" in inventory.engines(gpus, "12.4", False, can_build=False)


def test_vllm_is_offered_where_the_configuration_has_it() -> None:
    assert inventory.vllm_allowed(AgentConfig())
    assert not inventory.vllm_allowed(object())  # a configuration without engines.vllm


def spec(**kw: object) -> ReplicaSpec:
    base: dict[str, object] = {"id": "r1", "model": "m", "engine": "llama.cpp",
                               "source": "file:/models/m.gguf"}  # fmt: skip
    return ReplicaSpec(**(base | kw))  # type: ignore[arg-type]


def test_a_replica_on_cards_offloads_every_layer_and_one_on_cpus_none() -> None:
    on_cards = llamacpp.command(spec(devices=["GPU-a", "GPU-b"]), binary="/b", host="h", port=1,
                                key_file=None, threads=4)  # fmt: skip
    at = on_cards.index("--n-gpu-layers")
    assert on_cards[at + 1] == "all"
    assert on_cards[on_cards.index("--threads") + 1] == "4"
    on_cpus = llamacpp.command(spec(), binary="/b", host="h", port=1, key_file=None)
    assert "--n-gpu-layers" not in on_cpus


def build(root: Path, name: str) -> Path:
    path = root / "llama.cpp" / name / "llama-server"
    path.parent.mkdir(parents=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_a_spec_on_cards_gets_the_cuda_build_of_this_toolkit_for_its_cards(tmp_path: Path) -> None:
    env = {"LLMGW_CACHE": str(tmp_path)}
    cpu = build(tmp_path, f"{llamacpp.VERSION}-x86_64-noamx")
    older = build(tmp_path, f"{llamacpp.VERSION}-x86_64-cuda12.2-sm90")
    h100 = build(tmp_path, f"{llamacpp.VERSION}-x86_64-cuda12.4-sm90")
    both = build(tmp_path, f"{llamacpp.VERSION}-x86_64-cuda12.4-sm89_90")
    find = llamacpp.find_binary
    assert find(LlamaCpp(), env, "x86_64") == cpu
    assert find(LlamaCpp(), env, "x86_64", cuda=("12.4", ["9.0"])) == h100
    assert find(LlamaCpp(), env, "x86_64", cuda=("12.4", ["8.9", "9.0"])) == both
    assert find(LlamaCpp(), env, "x86_64", cuda=("12.2", ["9.0"])) == older
    with pytest.raises(EngineError, match=r"not built with CUDA 12\.4 for compute capability 8\.6"):
        find(LlamaCpp(), env, "x86_64", cuda=("12.4", ["8.6"]))
    with pytest.raises(EngineError, match="no CUDA toolkit on this node"):
        find(LlamaCpp(), env, "x86_64", cuda=("", ["9.0"]))
    # A site's own binary is used for both.
    assert find(LlamaCpp(binary=str(cpu)), env, cuda=("12.4", ["9.0"])) == cpu


def test_cublas_is_looked_for_where_toolkits_put_it(tmp_path: Path) -> None:
    assert not inventory.has_cublas(tmp_path)  # nvcc alone, as on this machine
    headers = tmp_path / "targets" / "x86_64-linux" / "include"
    headers.mkdir(parents=True)
    (headers / "cublas_v2.h").write_text("")
    assert inventory.has_cublas(tmp_path)
