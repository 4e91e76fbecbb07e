"""`llmgw org ...` and `llmgw user ...` against a real admin API on a Unix socket (its caller
is a staff admin)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import Result

from llmgwd.api.base import ApiContext
from llmgwd.catalog import Catalog
from llmgwd.people.directory import Directory
from llmgwd.store.sqlite import SqliteStore
from tests.llmgw.served_api import served_api
from tests.llmgw.test_cli import JOIN_URL, FakeNodes


@pytest.fixture(params=["socket", "https"])
def cli(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Callable[..., Result]]:
    async def context(store: SqliteStore) -> ApiContext:
        return ApiContext(
            catalog=Catalog(store), nodes=FakeNodes(), mint_token=lambda: "t", join_url=JOIN_URL
        )

    with served_api(str(tmp_path / "d.sock"), context, request.param) as run:
        yield run


def _ok(r: Result) -> str:
    assert r.exit_code == 0, r.output
    return r.stdout


def test_an_organization_made_and_shown(cli: Callable[..., Result]) -> None:
    assert "Organization acme made." in _ok(cli("org", "create", "acme", "--title", "ACME"))
    _ok(cli("org", "team", "acme", "ml"))
    _ok(cli("org", "project", "acme", "chat", "--team", "ml"))
    assert "User ann made" in _ok(cli("user", "create", "ann", "--email", "ann@acme.org"))
    assert "ann is manager of team ml." in _ok(cli("org", "member", "acme", "ann", "manager",
                                                   "--team", "ml"))  # fmt: skip
    shown = _ok(cli("org", "show", "acme"))
    assert "ml" in shown and "chat" in shown and "manager" in shown
    assert [o["name"] for o in json.loads(_ok(cli("org", "list", "--json")))] == ["acme"]
    _ok(cli("user", "staff", "ann", "viewer"))
    assert "ann" in _ok(cli("user", "list"))


def test_refusals_end_the_command_with_the_reason(cli: Callable[..., Result]) -> None:
    _ok(cli("org", "create", "acme"))
    r = cli("org", "create", "acme")
    assert r.exit_code != 0 and "exists" in r.output
    r = cli("org", "member", "acme", "nobody", "member")
    assert r.exit_code != 0 and "nobody" in r.output
    r = cli("org", "member", "acme", "ann", "member", "--team", "a", "--project", "b")
    assert r.exit_code == 2


def test_a_user_deleted_leaves_their_organization(cli: Callable[..., Result]) -> None:
    _ok(cli("org", "create", "acme"))
    _ok(cli("user", "create", "ann"))
    _ok(cli("org", "member", "acme", "ann", "manager"))
    assert "User ann deleted" in _ok(cli("user", "delete", "ann", "-y"))
    assert "ann" not in _ok(cli("user", "list"))
    assert "manager" not in _ok(cli("org", "show", "acme"))
    r = cli("user", "delete", "ann", "-y")
    assert r.exit_code != 0 and "ann" in r.output


def test_staff_set_who_a_user_is_at_the_identity_provider(cli: Callable[..., Result]) -> None:
    made = json.loads(_ok(cli("user", "create", "bea", "--external-id", "00u1bea", "--json")))
    assert made["external_id"] == "00u1bea"
    out = _ok(cli("user", "set", "bea", "--external-id", "00u2bea", "--email", "b@uni.example"))
    assert out.strip() == "User bea: b@uni.example, active, external id 00u2bea."
    assert "inactive, external id none" in _ok(cli("user", "set", "bea", "--inactive",
                                                   "--external-id", ""))  # fmt: skip
    r = cli("user", "set", "bea")
    assert r.exit_code == 2 and "nothing to change" in r.output
    r = cli("user", "set", "bea", "--external-id", " padded")
    assert r.exit_code != 0 and "external_id" in r.output


@pytest.fixture
def cli_waiting(tmp_path: Path) -> Iterator[Callable[..., Result]]:
    """The admin API with wes, who signed in under oidc.approval_required and waits."""

    async def context(store: SqliteStore) -> ApiContext:
        await Directory(store).create_user("wes", source="oidc", approved=False)
        return ApiContext(
            catalog=Catalog(store), nodes=FakeNodes(), mint_token=lambda: "t", join_url=JOIN_URL
        )

    with served_api(str(tmp_path / "d.sock"), context, "socket") as run:
        yield run


def test_an_account_waiting_is_shown_and_approved(cli_waiting: Callable[..., Result]) -> None:
    cli = cli_waiting
    [row] = [line for line in _ok(cli("users")).splitlines() if " wes " in line]
    assert " waiting " in row and " oidc " in row
    assert [u["approved"] for u in json.loads(_ok(cli("users", "-o", "json")))] == [False]

    assert "User wes approved" in _ok(cli("user", "approve", "wes"))

    [row] = [line for line in _ok(cli("users")).splitlines() if " wes " in line]
    assert " active " in row
    assert _ok(cli("user", "approve", "wes"))  # approved already: stays so
    r = cli("user", "approve", "nobody")
    assert r.exit_code != 0 and "nobody" in r.output
