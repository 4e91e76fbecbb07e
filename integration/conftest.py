"""Fixtures for the integration tests: private systemds booted on overlays of /, as root."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, sync_playwright

# The tests import integration.harness, whichever directory pytest was started from.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from integration import debs
from integration.harness import (
    SYSTEMD,
    TEST_BASE,
    Lan,
    MakeLan,
    MakeSystemd,
    PrivateSystemd,
    binds,
    reap_stale,
    shutdown_all,
)

HERE = Path(__file__).parent.resolve()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Everything under integration/ is an integration test."""
    for item in items:
        if HERE in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.integration)


_why_not: str | None = None
_probed = False


def unavailable() -> str | None:
    """Why a private systemd cannot be booted here, or None when it can."""
    global _why_not, _probed
    if _probed:
        return _why_not
    _probed = True
    _why_not = _probe()
    return _why_not


def _probe() -> str | None:
    if os.geteuid() != 0:
        return f"needs root to boot a private systemd (running as uid {os.geteuid()})"
    for tool in ("unshare", "nsenter", "ip"):
        if shutil.which(tool) is None:
            return f"needs {tool} (util-linux / iproute2), not found on PATH"
    if not os.access(SYSTEMD, os.X_OK):
        return f"needs systemd at {SYSTEMD} (apt-get install systemd)"
    if shutil.which("dbus-daemon") is None:
        return "needs the system D-Bus inside (apt-get install dbus)"
    # The one thing that differs between machines: may we mount an overlay of / here?
    probe = TEST_BASE / f".probe-{os.getpid()}"
    try:
        for d in ("upper", "work", "root"):
            (probe / d).mkdir(parents=True, exist_ok=True)
        r = subprocess.run(
            ["unshare", "--fork", "--pid", "--mount", "--propagation", "private", "mount",
             "-t", "overlay", "overlay", "-o",
             f"lowerdir=/,upperdir={probe}/upper,workdir={probe}/work", f"{probe}/root"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        if r.returncode != 0:
            return f"cannot mount an overlay of / in a private mount namespace: {r.stderr.strip()}"
    except OSError as e:
        return f"cannot prepare {TEST_BASE}: {e}"
    finally:
        shutil.rmtree(probe, ignore_errors=True)
    return None


def _skip_or_fail(why: str) -> None:
    # In CI the integration tests are the point: their absence is a failure, not a skip.
    if os.environ.get("CI") == "true":
        pytest.fail(f"integration tests cannot run in CI: {why}", pytrace=False)
    pytest.skip(why)


def _name(request: pytest.FixtureRequest, suffix: str = "") -> str:
    base = re.sub(r"[^A-Za-z0-9_.-]", "-", request.node.name.removesuffix(".py"))[:40]
    return f"{base}{suffix}-{os.getpid()}"


@pytest.fixture(scope="session", autouse=True)
def _reap() -> None:
    """Shut down what a killed earlier run left behind (its owner process is gone)."""
    if unavailable() is None:
        reap_stale()


@pytest.fixture(autouse=True)
def _needs_private_systemd() -> None:
    """Every test here boots private systemds (or namespaces): skipped, with the reason, where
    that cannot be done."""
    why = unavailable()
    if why:
        _skip_or_fail(why)


@pytest.fixture(scope="session")
def tree_debs() -> Iterator[list[Path]]:
    """This checkout's three .debs at its own version, linted, built once for the session
    (test_packages installs them, test_upgrade rolls onto them)."""
    why = debs.build_tools()
    if why:
        pytest.skip(why)
    out = TEST_BASE / f"packages-tree-{os.getpid()}"
    try:
        yield debs.build(out, lint=True)
    finally:
        shutil.rmtree(out, ignore_errors=True)


@pytest.fixture(scope="module")
def systemd(request: pytest.FixtureRequest) -> Iterator[PrivateSystemd]:
    """A private systemd for the module, sharing the host's network; removed after it."""
    why = unavailable()
    if why:
        _skip_or_fail(why)
    ps = PrivateSystemd(_name(request), binds=binds())
    try:
        ps.boot()
        yield ps
    finally:
        ps.shutdown()


@pytest.fixture
def make_systemd(request: pytest.FixtureRequest) -> Iterator[MakeSystemd]:
    """Boots more private systemds (hosts of their own with net=True); all removed after."""
    why = unavailable()
    if why:
        _skip_or_fail(why)
    made: list[PrivateSystemd] = []

    def make(label: str, **kwargs: object) -> PrivateSystemd:
        kwargs.setdefault("binds", binds())
        ps = PrivateSystemd(_name(request, f"-{label}"), **kwargs)  # type: ignore[arg-type]
        made.append(ps)
        ps.boot()
        return ps

    try:
        yield make
    finally:
        errors = shutdown_all(made)
        if errors:
            raise RuntimeError("; ".join(errors))


@pytest.fixture
def make_lan() -> Iterator[MakeLan]:
    """Makes lans (a network namespace with a bridge) for net=True systemds; removed after."""
    why = unavailable()
    if why:
        _skip_or_fail(why)
    made: list[Lan] = []

    def make(label: str, prefix: str = "10.231.0") -> Lan:
        lan = Lan(f"{label}-{os.getpid()}", prefix)
        lan.create()
        made.append(lan)
        return lan

    try:
        yield make
    finally:
        for lan in made:
            lan.destroy()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Debian's chromium driven by Playwright (executable_path: no browser download), one a
    module, for the console's tests."""
    chromium = shutil.which("chromium")
    if chromium is None:
        _skip_or_fail("no chromium here: apt-get install chromium")
        return
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        yield b
        b.close()
