"""`llmgw slurm setup|status|lend|reclaim|off` against a real admin API on a Unix socket."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from llmgw.api_types import SlurmNodeView
from llmgw.cli import plane
from llmgw.cli.main import main
from llmgwd.api.base import ApiContext
from llmgwd.catalog import Catalog
from llmgwd.nodes.members import Members
from llmgwd.slurm.settings import SettingsStore
from llmgwd.store.sqlite import SqliteStore
from tests.llmgw.served_api import served_api
from tests.llmgw.test_cli import JOIN_URL, FakeNodes

STATUS = [
    SlurmNodeView(name="n1", status="reclaiming: 1 jobs running", held=True, state="draining",
                  jobs=["7"], version="22.05.8"),
    SlurmNodeView(name="n2", status="in llmgw", held=False, message="its agent reports no Slurm"),
]  # fmt: skip


@pytest.fixture(params=["socket", "https"])
def cli(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Callable[..., Result]]:
    async def context(store: SqliteStore) -> ApiContext:
        for name in ("n1", "n2"):
            await Members(store).admit(name, "s-" + name)
        return ApiContext(
            catalog=Catalog(store),
            nodes=FakeNodes(),
            mint_token=lambda: "tok-1",
            join_url=JOIN_URL,
            slurm=SettingsStore(store),
            slurm_status=lambda: STATUS,
        )

    with served_api(str(tmp_path / "d.sock"), context, request.param) as run:
        yield run


def test_setup_lend_reclaim_and_off(cli: Callable[..., Result]) -> None:
    r = cli("slurm", "setup", "--controller", "n1", "--nodes", "n1, n2", "--partition", "gpu")
    assert r.exit_code == 0, r.output
    assert "Slurm is on: cluster llmgw, controller n1, partition gpu" in r.stdout
    assert "a new leader with no kept node list waits 120 s for the nodes" in r.stdout

    r = cli("slurm", "setup", "--controller", "n1", "--nodes", "n1,n2", "--hold-for", "300")
    assert r.exit_code == 0, r.output
    assert "waits 300 s for the nodes" in r.stdout and "partition gpu" in r.stdout
    assert "nodes: n1, n2" in r.stdout

    r = cli("slurm", "lend", "n2")
    assert r.exit_code == 0, r.output
    assert "lent:  n2" in r.stdout
    assert json.loads(cli("slurm", "reclaim", "n2", "--json").stdout)["lent"] == []

    r = cli("slurm", "off")
    assert r.exit_code == 0 and r.stdout.startswith("Slurm is off."), r.output


def test_setup_all_nodes_puts_every_node_in_slurm(cli: Callable[..., Result]) -> None:
    r = cli("slurm", "setup", "--controller", "n1")
    assert r.exit_code == 2 and "--nodes A,B or --all-nodes" in r.output

    r = cli("slurm", "setup", "--controller", "n1", "--all-nodes")
    assert r.exit_code == 0, r.output
    assert "nodes: every node of the cluster, those joining later too" in r.stdout
    shown = json.loads(cli("slurm", "status", "--json").stdout)
    assert (shown["all_nodes"], shown["nodes"]) == (True, [])
    assert cli("slurm", "lend", "n2").exit_code == 0  # a member, though not named

    r = cli("slurm", "setup", "--controller", "n1", "--nodes", "n1,n2")  # named ones alone
    assert "nodes: n1, n2\n" in r.stdout
    assert json.loads(cli("slurm", "status", "--json").stdout)["all_nodes"] is False


def test_status_shows_each_nodes_standing(cli: Callable[..., Result]) -> None:
    r = cli("slurm", "status")

    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert lines[0] == "Slurm is off."
    n1 = next(x for x in lines if x.startswith("n1 "))
    assert "reclaiming: 1 jobs running" in n1 and "draining" in n1 and "22.05.8" in n1
    assert "n2: its agent reports no Slurm" in lines


def test_lending_a_node_not_in_slurm_says_why(cli: Callable[..., Result]) -> None:
    r = cli("slurm", "lend", "n1")
    assert r.exit_code == 1
    assert "Slurm is off" in r.output

    r = cli("slurm", "setup", "--controller", "n1", "--nodes", "n1,n9")
    assert r.exit_code == 1
    assert "'n9' has not joined the cluster" in r.output


@pytest.mark.parametrize("cli", ["socket"], indirect=True)  # this host's llmgwd, any context
def test_plane_init_slurm_turns_slurm_on_with_this_host_as_controller(
    cli: Callable[..., Result], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = {
        "token": "t",
        "expires_in": 600,
        "url": "https://cp:7710",
        "command": "llmgw node join https://cp:7710 --token t",
    }  # a TokenView
    monkeypatch.setattr(plane, "_started", lambda *_: token)  # llmgwd answers on the socket
    args = ["plane", "init", "--config", str(tmp_path / "s.yaml"), "--state-dir",
            str(tmp_path / "state"), "--slurm"]  # fmt: skip

    r = cli(*args)

    assert r.exit_code == 0, r.output
    name = socket.gethostname()
    assert f"Slurm is on: slurmctld runs on node {name} once it joins." in r.stdout
    assert "slurmd runs on every node, those joining later too" in r.stdout
    shown = json.loads(cli("slurm", "status", "--json").stdout)
    assert (shown["enabled"], shown["controller"], shown["nodes"]) == (True, name, [])
    assert shown["all_nodes"] is True  # the seed's --slurm: a slurmd on every node

    r = cli(*args, "--force", "--no-all-nodes")

    assert r.exit_code == 0, r.output
    assert "No node runs slurmd yet" in r.stdout
    assert json.loads(cli("slurm", "status", "--json").stdout)["all_nodes"] is False


def test_plane_init_slurm_without_starting_says_how(tmp_path: Path) -> None:
    args = ["plane", "init", "--config", str(tmp_path / "s.yaml"), "--state-dir",
            str(tmp_path / "state"), "--slurm", "--no-start"]  # fmt: skip

    r = CliRunner().invoke(main, args)

    assert r.exit_code == 0, r.output
    assert "`llmgw slurm setup --controller" in r.stderr
    assert "--all-nodes` turns it on" in r.stderr
