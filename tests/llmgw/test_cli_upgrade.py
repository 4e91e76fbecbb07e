"""llmgw upgrade stage|start|status|resume|abort as a person runs them, over the Unix socket and
over HTTPS; and the status's lines for each step of a roll."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import cast

import msgspec
import pytest
from click.testing import CliRunner, Result

from llmgw import wire
from llmgw.api_types import UpgradeHost, UpgradeRoll, UpgradeView
from llmgw.api_types.upgrade import RollState
from llmgw.blobstore import BlobStore
from llmgw.cli import upgrade
from llmgw.cli.common import Settings, Unreachable
from llmgw.cli.upgrade import render
from llmgw.wire import UpgradeStep
from llmgwd.api.base import ApiContext
from llmgwd.catalog import Catalog
from llmgwd.mirror.service import Mirror
from llmgwd.planes import registry
from llmgwd.store.sqlite import SqliteStore
from tests.llmgw.served_api import served_api
from tests.llmgw.test_packages import make_deb
from tests.llmgwd.test_api import FakeNodes, Tokens, node

Run = Callable[..., Result]


@pytest.fixture(params=["socket", "https"])
def llmgw(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Run]:
    async def context(store: SqliteStore) -> ApiContext:
        catalog = Catalog(store)
        await catalog.load()
        nodes = FakeNodes()
        nodes.items = [node("n1")]
        info = wire.PlaneInfo("p1", "https://p1:7710", role="leader", version="0.1.0")
        await store.put(registry.SERVERS + "p1", msgspec.json.encode(info))
        mirror = cast(Mirror, type("M", (), {"store": BlobStore(tmp_path / "mirror")})())
        return ApiContext(catalog=catalog, nodes=nodes, mint_token=Tokens(), join_url="",
                          mirror=mirror)  # fmt: skip

    with served_api(str(tmp_path / "d.sock"), context, request.param) as run:
        yield run


def test_stage_start_status_abort(llmgw: Run, tmp_path: Path) -> None:
    deb = make_deb(tmp_path / "a.deb", "llmgw-agentd", "0.2.0")
    r = llmgw("upgrade", "stage", str(deb))
    assert r.exit_code == 0, r.output
    assert "Staged llmgw-agentd 0.2.0 (deb, amd64" in r.stdout
    assert "release 0.2.0" in r.stdout
    r = llmgw("upgrade", "start")
    assert r.exit_code == 0, r.output
    assert "to 0.2.0 started: 2 hosts." in r.stdout
    r = llmgw("upgrade", "status")
    assert r.exit_code == 0, r.output
    assert "Staged: llmgw-agentd_0.2.0_amd64.deb (release 0.2.0" in r.stdout
    lines = r.stdout.splitlines()
    assert lines[2].split() == ["HOST", "ROLE", "STEP", "PROGRESS", "RELEASE", "NOTE"]
    assert [ln.split()[:3] for ln in lines[3:5]] == [["p1", "plane", "waiting"],
                                                      ["n1", "node", "waiting"]]  # fmt: skip
    r = llmgw("upgrade", "resume")
    assert r.exit_code != 0 and "is running: nothing to resume" in r.output
    r = llmgw("upgrade", "abort")
    assert r.exit_code == 0 and r.stdout.endswith(": aborted.\n")
    r = llmgw("upgrade", "status", "--watch")  # aborted, nothing in flight: it ends at once
    assert r.exit_code == 0 and "Aborted: no other host starts" in r.stdout


def test_start_from_the_repositories_names_the_version(llmgw: Run) -> None:
    r = llmgw("upgrade", "start", "--from-repositories", "--release", "0.2.0; rm -rf /")
    assert r.exit_code != 0 and "is not a package version" in r.output
    r = llmgw("upgrade", "start", "--from-repositories", "--release", "--foo")
    assert r.exit_code != 0 and "is not a package version" in r.output
    r = llmgw("upgrade", "start", "--from-repositories", "--release", "0.2.0")
    assert r.exit_code == 0, r.output
    assert "to 0.2.0 started: 2 hosts." in r.stdout  # nothing was staged
    r = llmgw("upgrade", "status")
    assert r.exit_code == 0, r.output
    assert "to 0.2.0 from the repositories: running" in r.stdout


def test_stage_refuses_a_file_that_is_no_package(llmgw: Run, tmp_path: Path) -> None:
    (tmp_path / "x.deb").write_bytes(b"not a package")
    r = llmgw("upgrade", "stage", str(tmp_path / "x.deb"))
    assert r.exit_code != 0 and "neither a .deb (ar archive) nor an .rpm" in r.output


def test_status_shows_bytes_steps_versions_and_why() -> None:
    hosts = [
        UpgradeHost(name="p1", role="plane", step="done", version="0.2.0"),
        UpgradeHost(
            name="n1",
            role="node",
            step="fetching",
            done_bytes=12 << 20,
            total_bytes=48 << 20,
            version="0.1.0",
        ),
        UpgradeHost(
            name="n2",
            role="node",
            step="failed",
            version="0.1.0",
            message="llmgw-upgrade-ab-1.service: exited with status 100",
        ),
        UpgradeHost(name="n3", role="node"),
    ]
    roll = UpgradeRoll(id="ab", release="0.2.0", state="halted", hosts=hosts, started_at=100.0,
                       error="n2: llmgw-upgrade-ab-1.service: exited with status 100")  # fmt: skip
    text = render(UpgradeView(roll=roll), now=160.0)
    lines = text.splitlines()
    assert lines[0] == "Roll ab to 0.2.0: halted, started 1m ago, 4 nodes at once"
    assert lines[2].split()[:3] == ["p1", "plane", "done"] and "0.2.0" in lines[2]
    assert lines[3].split(maxsplit=2)[2] == "fetching  25%, 12.0 MiB of 48.0 MiB  0.1.0"
    assert lines[4].split()[2] == "failed" and lines[4].endswith("exited with status 100")
    assert lines[5].split() == ["n3", "node", "waiting", "-"]
    assert lines[6] == "Halted: n2: llmgw-upgrade-ab-1.service: exited with status 100"
    assert "llmgw upgrade resume" in lines[7]


def test_watch_waits_out_llmgwd_restarting(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """In a roll llmgwd restarts onto the new release: --watch asks again, saying why."""
    answers: list[object] = [Unreachable("cannot reach llmgwd at /run/llmgw/llmgwd.sock"), {}]

    def call(*_: object) -> object:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(upgrade, "call", call)
    monkeypatch.setattr(upgrade, "WATCH_EVERY_S", 0.0)
    assert upgrade._view_waiting(cast(Settings, None)) == UpgradeView()
    assert capsys.readouterr().err == (
        "cannot reach llmgwd at /run/llmgw/llmgwd.sock; asking again\n"
    )


def _roll(state: RollState, step: UpgradeStep, message: str = "") -> UpgradeRoll:
    host = UpgradeHost(name="n1", role="node", step=step, message=message)
    return UpgradeRoll(id="ab", release="0.2.0", state=state, hosts=[host])


@pytest.mark.parametrize(
    ("end", "code", "last"),
    [(_roll("done", "done"), 0, "done"), (_roll("halted", "failed", "exit 100"), 1, "Halted")],
)
def test_start_wait_follows_the_roll_to_its_end(
    monkeypatch: pytest.MonkeyPatch, end: UpgradeRoll, code: int, last: str
) -> None:
    """`llmgw upgrade start --wait`: the roll's status each time it changes, until it ends;
    exit status 1 when it halted, as `status --watch`."""
    started = _roll("running", "waiting")
    views = [UpgradeView(roll=started), UpgradeView(roll=_roll("running", "installing")),
             UpgradeView(roll=end)]  # fmt: skip
    asked: list[str] = []

    def call(_settings: object, method: str, path: str, _body: object = None) -> object:
        asked.append(method)
        if method == "POST":
            return msgspec.to_builtins(started)
        return msgspec.to_builtins(views.pop(0))

    monkeypatch.setattr(upgrade, "call", call)
    monkeypatch.setattr(upgrade, "WATCH_EVERY_S", 0.0)
    settings = Settings(socket="/nonexistent", agent_socket="/nonexistent")
    r = CliRunner().invoke(upgrade.upgrade, ["start", "--wait"], obj=settings)
    assert r.exit_code == code, r.output
    assert asked == ["POST", "GET", "GET", "GET"]
    assert "Roll ab to 0.2.0 started: 1 hosts." in r.stdout
    assert "installing" in r.stdout and last in r.stdout.splitlines()[-1] + r.stdout
    assert "Follow it with" not in r.stdout
