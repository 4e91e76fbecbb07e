"""People on a real llmgwd under systemd: staff make an organization, team, project and users
with the CLI over the local socket; a person signs in with `llmgw login --device` at npm's
oidc-provider (their group a membership), makes a key of their own in a project, and it
answers /v1; SCIM deactivating them stops that key at once (reactivating brings it back);
an organization's rpm limit refuses the member's third request of the minute with 429."""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from integration.harness import REPO, PrivateSystemd
from integration.llmgw_node import MODEL, VENV, Node
from tests.llmgwd.people import npm_oidc

CLIENT_PORT, CLUSTER_PORT = 17880, 17890  # apart from the other integration tests' ports
SECRET_IN = "/etc/llmgw/oidc-client-secret"
ORG, TEAM, PROJECT = "physics", "theory", "lattice"


def llama_server() -> str:
    r = subprocess.run([REPO / "scripts/build-llama-server"], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"llama-server could not be built here: {r.stderr[-500:]}")
    return r.stdout.strip()


@pytest.fixture(scope="module")
def secret_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("oidc") / "client-secret"
    path.write_text("llmgw-integration-secret-5d1e\n")
    return path


@pytest.fixture(scope="module")
def issuer(secret_file: Path) -> Iterator[str]:
    """npm's oidc-provider on the host's loopback, which the private systemd shares."""
    with npm_oidc.running(secret_file) as url:
        claims = {"preferred_username": "ada", "email": "ada@physics.example"}
        npm_oidc.put_account(url, "ada-sub", claims | {"groups": ["physics-all"]})
        yield url


def oidc_yaml(issuer: str) -> str:
    return (
        f"oidc:\n  issuer: {issuer}\n  client_id: llmgw\n  client_secret_file: {SECRET_IN}\n"
        f"  allowed_groups: [physics-all]\n"
        f"  rules:\n    - {{group: physics-all, org: {ORG}, role: member}}\n"
    )


@pytest.fixture(scope="module")
def node(systemd: PrivateSystemd, issuer: str, secret_file: Path) -> Node:
    """One node: llmgwd (sign-in at the provider) and its agent serving SmolLM2."""
    n = Node(systemd, CLIENT_PORT, CLUSTER_PORT)
    n.install(llama_server(), address="")
    systemd.write_file(SECRET_IN, secret_file.read_text(), mode=0o640)
    systemd.run(["chown", "root:llmgw", SECRET_IN])
    n.join(n.init_server(extra=oidc_yaml(issuer)))
    n.serve_model(1)
    return n


@pytest.fixture(scope="module")
def people() -> dict[str, Any]:
    """What the tests of this module hand on, in order: ids and keys."""
    return {}


def http(node: Node) -> httpx.Client:
    return httpx.Client(base_url=f"http://127.0.0.1:{node.client_port}", timeout=60)


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def device_login(
    node: Node, issuer: str, home: Path, sub: str, name: str = "ada"
) -> dict[str, Any]:
    """`llmgw login --device` as the person runs it; the code confirmed at the provider's page
    as they would; the session it keeps."""
    server = f"http://127.0.0.1:{node.client_port}"
    env = {"XDG_CONFIG_HOME": str(home), "PATH": "/usr/bin:/bin", "HOME": str(home)}
    proc = subprocess.Popen(
        [str(VENV / "bin/llmgw"), "login", "--device", "--server", server],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        shown = ""
        while not (found := re.search(r"open (\S+) on any device.*?\n\n\s+(\S+)\n", shown, re.S)):
            line = proc.stdout.readline()
            assert line, f"llmgw login ended before showing a code: {shown}"
            shown += line
        npm_oidc.Person().confirm_code(found.group(1), found.group(2), sub)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, shown + out
    assert f"signed in as {name} until" in out, out
    session: dict[str, Any] = json.loads((home / "llmgw" / "session.json").read_text())
    return session


def test_a_member_signs_in_and_their_project_key_answers_v1(
    node: Node, issuer: str, people: dict[str, Any], tmp_path: Path
) -> None:
    # Staff, with the CLI over the local socket.
    node.llmgw("org", "create", ORG, "--title", "Physics")
    node.llmgw("org", "team", ORG, TEAM)
    node.llmgw("org", "project", ORG, PROJECT, "--team", TEAM)
    bo = node.llmgw("user", "create", "bo", "--email", "bo@physics.example", "--json")
    assert (bo["name"], bo["source"], bo["active"]) == ("bo", "staff", True)
    node.llmgw("org", "member", ORG, "bo", "manager", "--project", PROJECT)
    # The person signs in; their group makes them a member of the organization.
    session = device_login(node, issuer, tmp_path, "ada-sub")
    members = {(m["user"], m["scope"]["kind"], m["role"], m["set_by"])
               for m in node.llmgw("org", "show", ORG, "--json")["members"]}  # fmt: skip
    ada = next(u for u in node.llmgw("user", "list", "--json") if u["name"] == "ada")
    assert ada["source"] == "oidc" and ada["email"] == "ada@physics.example"
    assert (ada["id"], "org", "member", "group") in members
    assert (bo["id"], "project", "manager", "hand") in members
    node.llmgw("org", "member", ORG, "ada", "member", "--project", PROJECT)
    with http(node) as c:
        # A member of the project, she makes her own key in it.
        r = c.post(f"/api/v1/orgs/{ORG}/projects/{PROJECT}/keys", json={"name": "laptop"},
                   headers=bearer(session["key"]))  # fmt: skip
        assert r.status_code == 201, r.text
        made = r.json()
        assert (made["user"], made["org"], made["project"]) == (ada["id"], ORG, PROJECT)
        r = c.get("/v1/models", headers=bearer(made["key"]))
        assert r.status_code == 200, r.text
        assert MODEL in [m["id"] for m in r.json()["data"]]
        # The staff's route is not the member's: a project key is narrowed to its project.
        assert c.get("/api/v1/users", headers=bearer(made["key"])).status_code == 403
    people.update(ada=ada["id"], key=made["key"], session=session["key"])


def scim(node: Node, token: str, method: str, user: str, doc: dict[str, Any]) -> dict[str, Any]:
    with http(node) as c:
        headers = bearer(token) | {"Content-Type": "application/scim+json"}
        r = c.request(method, f"/scim/v2/Users/{user}", json=doc, headers=headers)
    assert r.status_code == 200, r.text
    answer: dict[str, Any] = r.json()
    return answer


def active_op(active: bool) -> dict[str, Any]:
    return {"schemas": ["urn:ietf:params:scim:api:messages:2.0:PatchOp"],
            "Operations": [{"op": "replace", "path": "active", "value": active}]}  # fmt: skip


def models_status(node: Node, key: str) -> int:
    with http(node) as c:
        return c.get("/v1/models", headers=bearer(key)).status_code


def test_scim_deactivation_stops_the_members_keys_at_once(
    node: Node, people: dict[str, Any]
) -> None:
    if "key" not in people:
        pytest.skip("needs the member's key from the test before")
    token = node.llmgw("scim", "token", "--json")["token"]
    user, key = people["ada"], people["key"]
    assert models_status(node, key) == 200
    assert scim(node, token, "PATCH", user, active_op(False))["active"] is False
    assert models_status(node, key) == 401  # at once: no wait, no retry
    assert models_status(node, people["session"]) == 401  # her sign-in's key too
    # Reactivated, the same key works again: deactivation refuses keys, it revokes none.
    assert scim(node, token, "PATCH", user, active_op(True))["active"] is True
    assert models_status(node, key) == 200
    # PUT (the whole user) as identity providers send it does the same.
    doc = {"schemas": ["urn:ietf:params:scim:schemas:core:2.0:User"], "userName": "ada",
           "emails": [{"value": "ada@physics.example", "primary": True}]}  # fmt: skip
    assert scim(node, token, "PUT", user, doc | {"active": False})["active"] is False
    assert models_status(node, key) == 401
    assert scim(node, token, "PUT", user, doc | {"active": True})["active"] is True
    assert models_status(node, key) == 200
    # A token that is not the SCIM token gets nowhere near /scim/v2.
    with http(node) as c:
        assert c.get("/scim/v2/Users", headers=bearer(key)).status_code == 401


def test_a_person_provisioned_by_scim_signs_in_as_that_user(
    node: Node, issuer: str, tmp_path: Path
) -> None:
    """The identity provider provisions Bea by SCIM (externalId: her subject there) before
    she ever signs in; her first `llmgw login` is that user, whatever name the token gives."""
    token = node.llmgw("scim", "token", "--json")["token"]
    doc = {"schemas": ["urn:ietf:params:scim:schemas:core:2.0:User"], "userName": "bea",
           "externalId": "bea-sub", "emails": [{"value": "bea@physics.example"}]}  # fmt: skip
    with http(node) as c:
        headers = bearer(token) | {"Content-Type": "application/scim+json"}
        r = c.post("/scim/v2/Users", json=doc, headers=headers)
    assert r.status_code == 201, r.text
    made = r.json()
    claims = {"preferred_username": "b.lovelace", "email": "bea@physics.example"}
    npm_oidc.put_account(issuer, "bea-sub", claims | {"groups": ["physics-all"]})
    session = device_login(node, issuer, tmp_path, "bea-sub", name="bea")
    assert session["user"] == made["id"]
    users = {u["name"]: u for u in node.llmgw("user", "list", "--json")}
    assert "b.lovelace" not in users  # no second user made for her
    assert (users["bea"]["source"], users["bea"]["external_id"]) == ("scim", "bea-sub")
    assert models_status(node, session["key"]) == 200
    # Staff make Cy with the external id his sign-in will carry: his first login is Cy.
    cy = node.llmgw("user", "create", "cy", "--external-id", "cy-sub", "--json")
    (tmp_path / "cy").mkdir()
    npm_oidc.put_account(issuer, "cy-sub", {"preferred_username": "cyrus",
                                            "groups": ["physics-all"]})  # fmt: skip
    assert device_login(node, issuer, tmp_path / "cy", "cy-sub", name="cy")["user"] == cy["id"]
    assert "cyrus" not in {u["name"] for u in node.llmgw("user", "list", "--json")}


def chat(c: httpx.Client, key: str) -> httpx.Response:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
    return c.post("/v1/chat/completions", json=body, headers=bearer(key))


def first_limited(node: Node, c: httpx.Client, key: str) -> httpx.Response:
    """The first request the organization's new limit counts (the store's watch brings it to
    the router's memory; a request before it is not counted): its headers say the limit."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        answer = chat(c, key)
        if answer.headers.get("x-ratelimit-limit-requests") == "2":
            return answer
        time.sleep(0.2)
    raise AssertionError(
        "the organization's rpm limit not in force after 30 s\n"
        + node.ps.journal("llmgwd.service", 30)
    )


def test_an_organizations_rpm_limit_refuses_the_third_request(
    node: Node, people: dict[str, Any]
) -> None:
    if "key" not in people:
        pytest.skip("needs the member's key from the first test")
    key = people["key"]
    level = node.llmgw("limits", "set", "--org", ORG, "--rpm", "2", "--json")
    assert level["limits"]["rpm"] == 2, level
    try:
        with http(node) as c:
            answers = [first_limited(node, c, key)] + [chat(c, key) for _ in range(2)]
        assert [a.status_code for a in answers[:2]] == [200, 200], answers[1].text
        assert answers[2].status_code == 429, answers[2].text
        error = answers[2].json()["error"]
        assert error["code"] == "rate_limit_exceeded", error
        assert answers[2].headers.get("retry-after"), dict(answers[2].headers)
    finally:
        node.llmgw("limits", "set", "--org", ORG, "--rpm", "0")
