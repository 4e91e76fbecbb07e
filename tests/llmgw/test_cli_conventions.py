"""The conventions every resource's commands keep: one listing word a resource (the old
`list` subcommands hidden aliases), -o json|yaml|wide and --no-headers on every listing, a
question before a delete that takes other things with it, and completion of the names."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.shell_completion import BashComplete
from click.testing import CliRunner, Result

from llmgw.cli.main import main
from llmgwd.api.base import ApiContext, NodeInfo
from llmgwd.catalog import Catalog
from llmgwd.store.sqlite import SqliteStore
from tests.llmgw.served_api import served_api
from tests.llmgw.test_cli import JOIN_URL, FakeNodes

LISTINGS = [["models"], ["nodes"], ["keys"], ["users"], ["orgs"]]


class Cluster:
    """An admin API with two of each thing listed; `llmgw --socket SOCKET ...` as run."""

    def __init__(self, socket: str) -> None:
        self.socket = socket
        self.nodes = FakeNodes()
        self.nodes.items = [_node("gpu1"), _node("cpu1")]

    async def remove_node(self, name: str) -> bool:
        known = [n for n in self.nodes.items if n.name == name]
        self.nodes.items = [n for n in self.nodes.items if n.name != name]
        return bool(known)

    def cli(self, *args: str, stdin: str | None = None) -> Result:
        return CliRunner().invoke(main, ["--socket", self.socket, *args], input=stdin)

    def ok(self, *args: str) -> str:
        r = self.cli(*args)
        assert r.exit_code == 0, r.output
        return r.stdout

    def complete(self, args: list[str], incomplete: str = "") -> list[str]:
        shell = BashComplete(main, {}, "llmgw", "_LLMGW_COMPLETE")
        return [
            c.value for c in shell.get_completions(["--socket", self.socket, *args], incomplete)
        ]


def _node(name: str) -> NodeInfo:
    return NodeInfo(name=name, address="10.0.0.7", connected=True, last_seen=0.0, cores=8,
                    memory_bytes=16 << 30, replicas=[])  # fmt: skip


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(str(tmp_path / "d.sock"))

    async def context(store: SqliteStore) -> ApiContext:
        return ApiContext(catalog=Catalog(store), nodes=c.nodes, mint_token=lambda: "t",
                          join_url=JOIN_URL, remove_node=c.remove_node)  # fmt: skip

    with served_api(c.socket, context):
        for name in ("smol", "tiny"):
            c.ok("model", "add", name, "--from", f"file:/{name}.gguf")
        for name in ("alice", "bob"):
            c.ok("key", "create", name)
            c.ok("user", "create", name)
        for name in ("acme", "umbrella"):
            c.ok("org", "create", name)
        yield c


@pytest.mark.parametrize("listing", LISTINGS, ids=" ".join)
def test_o_json_is_json_and_yaml_the_same_answer(cluster: Cluster, listing: list[str]) -> None:
    as_json = cluster.ok(*listing, "--json")
    assert len(json.loads(as_json)) == 2
    assert cluster.ok(*listing, "-o", "json") == as_json
    assert yaml.safe_load(cluster.ok(*listing, "-o", "yaml")) == json.loads(as_json)
    assert cluster.ok(*listing, "--json", "-o", "json") == as_json


@pytest.mark.parametrize("listing", LISTINGS, ids=" ".join)
def test_no_headers_drops_the_header_alone(cluster: Cluster, listing: list[str]) -> None:
    table = cluster.ok(*listing).splitlines()
    assert table[0].split()[0] in ("NAME", "ID")
    assert cluster.ok(*listing, "--no-headers").splitlines() == table[1:]
    wide = cluster.ok(*listing, "-o", "wide", "--no-headers").splitlines()
    assert len(wide) == len(table) - 1


@pytest.mark.parametrize(
    ("listing", "added"),
    [
        (["models"], ["MAX TOKENS", "PRICE", "ON DEMAND", "FILES", "ADDED"]),
        (["nodes"], ["VERSION", "FIREWALL"]),
        (["users"], ["EXTERNAL ID"]),
        (["orgs"], ["CREATED"]),
    ],
)
def test_o_wide_adds_the_columns_left_out(
    cluster: Cluster, listing: list[str], added: list[str]
) -> None:
    normal = cluster.ok(*listing).splitlines()[0]
    wide = cluster.ok(*listing, "-o", "wide").splitlines()[0]
    assert wide.startswith(normal) and all(h in wide and h not in normal for h in added)


@pytest.mark.parametrize(
    ("old", "new"),
    [(["key", "list"], ["keys"]), (["user", "list"], ["users"]), (["org", "list"], ["orgs"]),
     (["model", "list"], ["models"]), (["node", "list"], ["nodes"])],
)  # fmt: skip
def test_the_list_subcommands_are_hidden_aliases(
    cluster: Cluster, old: list[str], new: list[str]
) -> None:
    assert cluster.ok(*old) == cluster.ok(*new)
    assert cluster.ok(*old, "-o", "json") == cluster.ok(*new, "--json")
    assert not re.search(r"^  list ", cluster.ok(old[0], "--help"), re.M)  # not in Commands:


def test_json_and_another_output_is_a_usage_error(cluster: Cluster) -> None:
    r = cluster.cli("keys", "--json", "-o", "yaml")
    assert r.exit_code == 2 and "--json and -o yaml" in r.stderr


DELETES = [
    (["user", "delete", "alice"], ["users"], "alice"),
    (["org", "delete", "acme"], ["orgs"], "acme"),
    (["node", "remove", "gpu1"], ["nodes"], "gpu1"),
    (["model", "remove", "smol", "--files"], ["models"], "smol"),
]


def test_a_team_or_project_deleted_asks_first(cluster: Cluster) -> None:
    cluster.ok("org", "team", "acme", "ml")
    cluster.ok("org", "project", "acme", "chat")
    for kind, name in (("project", "chat"), ("team", "ml")):
        r = cluster.cli("org", kind, "acme", name, "--delete")
        assert r.exit_code == 2 and "give --yes to do it" in r.stderr
        assert name in cluster.ok("org", "show", "acme")
        assert cluster.cli("org", kind, "acme", name, "--delete", "-y").exit_code == 0
        assert name not in cluster.ok("org", "show", "acme")


def _names(cluster: Cluster, listing: list[str]) -> list[str]:
    return [item["name"] for item in json.loads(cluster.ok(*listing, "--json"))]


@pytest.mark.parametrize(("delete", "listing", "name"), DELETES, ids=lambda a: " ".join(a)[:20])
def test_a_delete_without_yes_on_no_terminal_is_refused(
    cluster: Cluster, delete: list[str], listing: list[str], name: str
) -> None:
    r = cluster.cli(*delete)
    assert r.exit_code == 2
    assert "stdin is not a terminal to ask on: give --yes to do it" in r.stderr
    assert name in _names(cluster, listing)


@pytest.mark.parametrize(("delete", "listing", "name"), DELETES[:3], ids=lambda a: " ".join(a)[:20])
def test_a_delete_with_yes_deletes(
    cluster: Cluster, delete: list[str], listing: list[str], name: str
) -> None:
    assert cluster.cli(*delete, "--yes").exit_code == 0
    assert name not in _names(cluster, listing)
    assert len(_names(cluster, listing)) == 1


def test_a_delete_at_a_terminal_asks(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("llmgw.cli.output.interactive", lambda: True)
    r = cluster.cli("org", "delete", "acme", stdin="n\n")
    assert r.exit_code == 2 and "not confirmed: nothing done" in r.stderr
    assert "deletes its teams, projects and memberships. Go on?" in r.stderr
    assert "acme" in _names(cluster, ["orgs"])
    r = cluster.cli("org", "delete", "acme", stdin="y\n")
    assert r.exit_code == 0 and "Organization acme deleted." in r.stdout
    assert _names(cluster, ["orgs"]) == ["umbrella"]


def test_a_delete_of_nothing_with_yes_exits_4(cluster: Cluster) -> None:
    r = cluster.cli("user", "delete", "nobody", "-y")
    assert r.exit_code == 4 and "nobody" in r.stderr


def test_a_listing_of_an_unreachable_daemon_exits_3(tmp_path: Path) -> None:
    r = CliRunner().invoke(main, ["--socket", str(tmp_path / "gone.sock"), "keys", "-o", "yaml"])
    assert r.exit_code == 3 and "llmgwd is not running" in r.stderr


@pytest.mark.parametrize(
    ("args", "listing"),
    [
        (["model", "serve"], ["models"]),
        (["model", "remove"], ["models"]),
        (["node", "drain"], ["nodes"]),
        (["node", "remove"], ["nodes"]),
        (["org", "show"], ["orgs"]),
        (["org", "member"], ["orgs"]),
        (["key", "revoke"], ["keys"]),
    ],
)
def test_names_complete_as_the_api_lists_them(
    cluster: Cluster, args: list[str], listing: list[str]
) -> None:
    names = _names(cluster, listing)
    assert cluster.complete(args) == sorted(names)
    assert cluster.complete(args, names[1][:2]) == [names[1]]


def test_a_revoked_key_is_not_offered(cluster: Cluster) -> None:
    cluster.ok("key", "revoke", "alice")
    assert cluster.complete(["key", "limits"]) == ["bob"]


def test_completion_is_silent_when_the_daemon_is_not_there(
    tmp_path: Path, capsys: pytest.CaptureFixture[Any]
) -> None:
    shell = BashComplete(main, {}, "llmgw", "_LLMGW_COMPLETE")
    gone = ["--socket", str(tmp_path / "gone.sock"), "model", "serve"]
    assert shell.get_completions(gone, "") == []
    assert capsys.readouterr() == ("", "")


def _row(model: str | None, n: int) -> dict[str, Any]:
    return {"model": model, "requests": n, "prompt_tokens": 10 * n, "completion_tokens": n,
            "total_tokens": 11 * n, "spend": 0.5 * n}  # fmt: skip


USAGE = {"by": "model", "since": "2026-12-01", "rows": [_row("smol", 1), _row("tiny", 2)],
         "total": _row(None, 3)}  # fmt: skip
LEVELS = [{"level": "org acme", "limits": {}, "models": []},
          {"level": "team acme/ml", "limits": {}, "models": ["smol"]}]  # fmt: skip


@pytest.mark.parametrize(
    ("args", "answer"),
    [(["usage", "--by", "model"], USAGE), (["limits", "show", "--org", "acme"], LEVELS)],
    ids=["usage", "limits show"],
)
def test_the_reports_tables_take_the_same_options(
    monkeypatch: pytest.MonkeyPatch, args: list[str], answer: Any
) -> None:
    monkeypatch.setattr("llmgw.cli.common.ipc.request", lambda *a, **k: (200, answer))

    def run(*more: str) -> str:
        r = CliRunner().invoke(main, ["--socket", "/x.sock", *args, *more])
        assert r.exit_code == 0, r.output
        return r.stdout

    assert json.loads(run("-o", "json")) == answer == json.loads(run("--json"))
    assert yaml.safe_load(run("-o", "yaml")) == answer
    table = run().splitlines()
    assert run("--no-headers").splitlines() == table[1:] and len(table) > 2
