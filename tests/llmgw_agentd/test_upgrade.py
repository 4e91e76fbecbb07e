"""The node's part in `llmgw upgrade`: its packages fetched from the mirror (a cut resumed with
a Range, bytes counted, sha256 checked), installed by a transient unit of its own, reported."""

from __future__ import annotations

import asyncio
import hashlib
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path

import msgspec
import pytest

from llmgw import wire
from llmgw_agentd import upgrade, upgrade_repo
from llmgw_agentd.cache import Mirror
from llmgw_agentd.systemd import Systemd
from tests.llmgw_agentd.fake_systemd import FakeSystemd, fake_systemd
from tests.llmgw_agentd.test_cache import FakeMirror, blob, eventually
from tests.llmgw_agentd.test_cache import mirror as mirror  # a fixture

AGENT = blob(2 << 20, 5)  # the staged llmgw-agentd .deb's bytes
CLI = blob(300_000, 6)
DAEMON = blob(1000, 7)  # llmgwd: not installed on this node
RPM = blob(1000, 8)  # an .rpm: not this node's kind


def pkg(name: str, data: bytes, kind: str = "deb") -> wire.UpgradePackage:
    sha = hashlib.sha256(data).hexdigest()
    return wire.UpgradePackage(
        kind=kind,  # type: ignore[arg-type]
        name=name, version="9.9.9", arch="amd64", sha256=sha, size=len(data),
        filename=f"{name}_9.9.9_amd64.{kind}",
    )  # fmt: skip


PACKAGES = [
    pkg("llmgw-agentd", AGENT),
    pkg("llmgw", CLI),
    pkg("llmgwd", DAEMON),
    pkg("x", RPM, "rpm"),
]


def upgrade_msg(attempt: int = 1) -> wire.Upgrade:
    return wire.Upgrade(roll="r1", attempt=attempt, release="9.9.9", packages=PACKAGES)


async def on_this_node(kind: str, name: str) -> bool:
    return kind == "deb" and name in ("llmgw-agentd", "llmgw")


class Node:
    """An Upgrader over the fake mirror and the fake systemd; its install command records its
    arguments (the real apt-get line) and exits with `status`."""

    def __init__(self, tmp: Path, mirror: FakeMirror, bus: str, fake: FakeSystemd) -> None:
        self.reports: list[wire.UpgradeReport] = []
        self.argv_file = tmp / "argv"
        self.status = 0
        self.fake = fake
        self.up = upgrade.Upgrader(
            tmp / "upgrade", Systemd(bus), lambda: Mirror(mirror.url), self.reports.append,
            kind="deb", is_installed=on_this_node, command=self._command, tick_s=0.01,
        )  # fmt: skip

    def _command(self, kind: str, files: Sequence[Path]) -> list[str]:
        script = f'printf "%s\\n" "$@" > {self.argv_file}; cat "$4" > /dev/null; exit {self.status}'
        return ["/bin/sh", "-c", script, "sh", *upgrade.install_command(kind, files)]

    @property
    def last(self) -> wire.UpgradeReport:
        return self.reports[-1]


@pytest.fixture
async def node(tmp_path: Path, mirror: FakeMirror) -> AsyncIterator[Node]:
    for p, data in zip(PACKAGES, (AGENT, CLI, DAEMON, RPM), strict=True):
        mirror.blobs[p.sha256] = data
    async with fake_systemd(tmp_path) as (bus, fake):
        n = Node(tmp_path, mirror, bus, fake)
        yield n
        await n.up.close()


async def test_a_cut_fetch_resumes_counts_bytes_and_installs_in_its_own_unit(
    node: Node, mirror: FakeMirror
) -> None:
    agent_sha = PACKAGES[0].sha256
    mirror.cut[agent_sha] = 1 << 20  # the first answer stops halfway through
    await node.up.run(upgrade_msg())
    assert node.last.step == "restarting", node.last
    # resumed where the cut left it, not from byte 0
    ranges = [r for sha, r in mirror.requests if sha == agent_sha]
    assert ranges == ["", f"bytes={1 << 20}-"]
    # bytes counted over both packages of this node (llmgwd and the .rpm are not fetched)
    total = len(AGENT) + len(CLI)
    assert {r.total_bytes for r in node.reports} == {total}
    fetched = [r.done_bytes for r in node.reports if r.step == "fetching"]
    assert fetched == sorted(fetched) and fetched[-1] == total
    assert any(0 < d < total for d in fetched)
    assert {p.sha256 for p in PACKAGES[2:]}.isdisjoint(s for s, _ in mirror.requests)
    # apt-get was given the two files by path, each the staged bytes
    argv = node.argv_file.read_text().split("\n")[:-1]
    where = node.up.root / "install-r1"
    assert argv == [*upgrade.APT, str(where / "llmgw-agentd_9.9.9_amd64.deb"),
                    str(where / "llmgw_9.9.9_amd64.deb")]  # fmt: skip
    assert (where / "llmgw-agentd_9.9.9_amd64.deb").stat().st_size == len(AGENT)
    name = upgrade.unit_name("r1", 1)
    assert node.fake.started == [name]


async def test_the_install_unit_is_a_unit_of_its_own_kept_when_it_fails(
    node: Node, mirror: FakeMirror
) -> None:
    node.status = 100
    await node.up.run(upgrade_msg())
    name = upgrade.unit_name("r1", 1)
    assert node.last.step == "failed"
    assert node.last.message.startswith(f"{name}: exited with status 100")
    props = node.fake.units[name].properties  # failed: still loaded, for its record
    assert props["Type"] == "exec"
    assert props["WorkingDirectory"] == str(node.up.root / "install-r1")
    assert props["Environment"] == ["DEBIAN_FRONTEND=noninteractive"]
    assert props["RuntimeMaxUSec"] == upgrade.INSTALL_LIMIT_S * 1_000_000
    assert "Slice" not in props  # not the agent's cgroup, nor the engines' slice


async def test_a_changed_byte_is_refused_and_said(node: Node, mirror: FakeMirror) -> None:
    mirror.changed.add(PACKAGES[1].sha256)
    await node.up.run(upgrade_msg())
    assert node.last.step == "failed"
    assert "sha256 expected" in node.last.message
    assert node.fake.started == []  # nothing installed


async def test_nothing_of_ours_installed_fails_with_why(node: Node) -> None:
    async def nothing(kind: str, name: str) -> bool:
        return False

    node.up._installed = nothing
    await node.up.run(upgrade_msg())
    assert node.last.step == "failed"
    assert node.last.message == (
        "none of the staged packages is installed here (llmgw, llmgw-agentd, llmgwd)"
    )


async def test_a_second_try_of_the_same_roll_is_a_new_unit(node: Node) -> None:
    node.status = 1
    node.up.start(upgrade_msg(1))
    await eventually(lambda: node.reports and node.last.step == "failed")
    node.status = 0
    node.up.start(upgrade_msg(2))
    await eventually(lambda: node.last.attempt == 2 and node.last.step == "restarting")
    assert node.fake.started == [upgrade.unit_name("r1", 1), upgrade.unit_name("r1", 2)]
    await asyncio.sleep(0)


async def test_an_agent_started_by_the_install_waits_for_its_unit(
    node: Node, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The package's scripts restart the agent while dpkg runs: the new agent, told the same
    try again, says "restarting" only once that install unit has ended well."""
    gate = tmp_path / "gate"  # the install runs until the test opens it, not for a set time
    wait = f"while [ ! -e {gate} ]; do sleep 0.02; done"
    node._command = lambda kind, files: ["/bin/sh", "-c", wait]  # type: ignore[method-assign]
    node.up._command = node._command
    node.up.start(upgrade_msg())
    name = upgrade.unit_name("r1", 1)
    await eventually(lambda: node.reports and node.last.step == "installing")
    await eventually(lambda: name in node.fake.units and node.fake.units[name].pid)
    await node.up.close()  # the old agent stops; its unit runs on
    assert node.fake.units[name].active_state == "active"
    monkeypatch.setattr(upgrade, "package_version", lambda: "9.9.9")
    gate.touch()
    await node.up.run(upgrade_msg())  # the new agent, on the release, told the same try
    assert node.last.step == "restarting" and name not in node.fake.units
    assert node.fake.started == [name]  # not started again


PROXY = {"https_proxy": "http://u:secret@proxy:3128", "http_proxy": "http://u:secret@proxy:3128"}


def repo_msg(release: str = "9.9.9") -> wire.Upgrade:
    return wire.Upgrade(roll="r1", attempt=1, release=release, from_repositories=True)


async def test_from_the_repositories_installs_the_nodes_packages_in_a_unit_of_its_own(
    node: Node, tmp_path: Path, mirror: FakeMirror
) -> None:
    """No staged file fetched: the unit runs upgrade_repo on a 0600 order holding the node's
    packages, the version and network.proxy (which the unit's properties never show)."""
    seen = tmp_path / "seen"
    script = f'stat -c %a "$1" > {seen}.mode; cp "$1" {seen}.order'
    node.up._repo = lambda order: ["/bin/sh", "-c", script, "sh", str(order)]
    node.up._proxy_env = dict(PROXY)
    await node.up.run(repo_msg())
    assert [r.step for r in node.reports] == ["installing", "restarting"], node.reports
    assert node.reports[0].message == "llmgw=9.9.9 llmgw-agentd=9.9.9"
    assert mirror.requests == []  # nothing fetched
    assert (tmp_path / "seen.mode").read_text().strip() == "600"
    order = msgspec.json.decode((tmp_path / "seen.order").read_bytes(), type=upgrade_repo.Order)
    assert order == upgrade_repo.Order("deb", ["llmgw", "llmgw-agentd"], "9.9.9", PROXY)
    where = node.up.root / "install-r1"
    assert not (where / upgrade.ORDER).exists()  # the proxy's password not left behind
    assert node.fake.started == [upgrade.unit_name("r1", 1)]
    argv = upgrade.repo_command(where / upgrade.ORDER)
    assert argv == [sys.executable, "-m", "llmgw_agentd.upgrade_repo", str(where / upgrade.ORDER)]


async def test_from_the_repositories_a_failed_unit_is_said_and_kept(
    node: Node, tmp_path: Path
) -> None:
    node.up._repo = lambda order: ["/bin/sh", "-c", "exit 100"]
    node.up._proxy_env = dict(PROXY)
    await node.up.run(repo_msg())
    name = upgrade.unit_name("r1", 1)
    assert node.last.step == "failed"
    assert node.last.message.startswith(f"{name}: exited with status 100")
    props = node.fake.units[name].properties
    assert props["Type"] == "exec"
    assert props["Description"] == "llmgw upgrade r1: install 9.9.9 from the repositories"
    assert props["Environment"] == ["DEBIAN_FRONTEND=noninteractive"]  # no proxy here
    assert "secret" not in repr(props)


async def test_from_the_repositories_the_package_managers_version_is_given(
    node: Node, tmp_path: Path
) -> None:
    seen = tmp_path / "seen.order"
    node.up._repo = lambda order: ["/bin/sh", "-c", f'cp "$1" {seen}', "sh", str(order)]
    msg = wire.Upgrade("r1", 1, "9.9.9", from_repositories=True, version="1:9.9.9-2")
    await node.up.run(msg)
    assert node.reports[0].message == "llmgw=1:9.9.9-2 llmgw-agentd=1:9.9.9-2"
    assert msgspec.json.decode(seen.read_bytes(), type=upgrade_repo.Order).version == "1:9.9.9-2"


@pytest.mark.parametrize("version", ["1.0; rm -rf /", "--foo", "-1", "1.0 2", "1.0=2", ""])
async def test_a_version_that_is_no_version_reaches_no_command(node: Node, version: str) -> None:
    await node.up.run(repo_msg(version))
    assert node.last.step == "failed" and "not a package version" in node.last.message
    assert node.fake.started == []
    with pytest.raises(ValueError, match="not a package version"):
        upgrade_repo.commands("deb", ["llmgw"], version)


def test_the_repository_commands_pin_the_version() -> None:
    assert upgrade_repo.commands("deb", ["llmgw", "llmgw-agentd"], "0.2.0") == [
        ["/usr/bin/apt-get", "update"],
        ["/usr/bin/apt-get", "install", "-y", "--only-upgrade", "-o",
         "Dpkg::Options::=--force-confold", "llmgw=0.2.0", "llmgw-agentd=0.2.0"],
    ]  # fmt: skip
    assert upgrade_repo.commands("rpm", ["llmgwd"], "1:0.2.0~rc1-1") == [
        ["/usr/bin/dnf", "install", "-y", "--refresh", "llmgwd-1:0.2.0~rc1-1"]
    ]
    with pytest.raises(ValueError, match="not llmgw packages"):
        upgrade_repo.commands("deb", ["--reinstall"], "0.2.0")


def test_the_order_runs_each_command_through_the_proxy_until_one_fails(tmp_path: Path) -> None:
    ran: list[tuple[list[str], dict[str, str]]] = []

    def run(argv: Sequence[str], env: Mapping[str, str]) -> int:
        ran.append((list(argv), dict(env)))
        return 100

    order = upgrade_repo.Order("deb", ["llmgw"], "0.2.0", PROXY)
    assert upgrade_repo.carry_out(order, run) == 100
    assert [argv for argv, _ in ran] == [["/usr/bin/apt-get", "update"]]  # install not run
    env = ran[0][1]
    assert env["https_proxy"] == PROXY["https_proxy"] and env["DEBIAN_FRONTEND"] == "noninteractive"
    path = tmp_path / "order.json"
    path.write_bytes(msgspec.json.encode(upgrade_repo.Order("deb", ["llmgw"], "--foo")))
    assert upgrade_repo.main(["x", str(path)]) == 1  # refused before any command
    assert not path.exists()
