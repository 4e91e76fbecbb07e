"""The CLI from another host: llmgwd under a real systemd on one host of a lan, its client
port's certificate its own from the cluster CA; `llmgw` on a second host (its own network
namespace) with contexts pinning that CA by fingerprint: an admin key lists models and nodes
and makes and revokes a key; a first use shows the fingerprint and pins it once confirmed; a
viewer's login session reads, is refused an admin command with the 403's message, and
`llmgw logout` revokes its key."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from integration.harness import Lan, PrivateSystemd, binds, install_units, shutdown_all
from integration.llmgw_node import VENV, Node
from llmgw import pki

CP, LAPTOP = "10.233.0.2", "10.233.0.3"
URL = f"https://{CP}:7700"
STATE = "/var/lib/llmgw"

# Run inside the control plane's host as llmgw with llmgwd stopped: a key of the user given,
# ending in an hour, as `llmgw login` would have llmgwd make one (a sign-in at an OIDC
# provider is test_people's); prints the key.
SESSION_KEY = """
import asyncio, sys, time
from llmgwd.catalog import Catalog, KeyOwner
from llmgwd.store.sqlite import SqliteStore
async def main():
    store = await SqliteStore.open(sys.argv[1])
    catalog = Catalog(store)
    await catalog.load()
    _, key = await catalog.create_key(f"login {sys.argv[3]}", owner=KeyOwner(user=sys.argv[2]),
                                      expires_at=time.time() + 3600)
    await store.close()
    print(key)
asyncio.run(main())
"""


@dataclass
class Remote:
    """The control plane's host, the operator's laptop and the cluster CA's fingerprint."""

    cp: Node
    laptop: PrivateSystemd
    pin: str  # as `llmgw status` on the control plane prints it

    def cli(self, *args: str, given: str | None = None) -> subprocess.CompletedProcess[str]:
        """`llmgw ARGS` on the laptop (its config in root's home there)."""
        argv = [str(VENV / "bin/llmgw"), *args]
        return self.laptop.run(argv, check=False, input=given, timeout=60)

    def json(self, *args: str) -> Any:
        r = self.cli(*args, "--json")
        assert r.returncode == 0, r.stdout + r.stderr
        return json.loads(r.stdout)


def _host(name: str, lan: Lan, address: int, made: list[PrivateSystemd]) -> PrivateSystemd:
    ps = PrivateSystemd(f"cli-remote-{name}-{os.getpid()}", binds=binds(), net=True,
                        hostname=name)  # fmt: skip
    made.append(ps)
    ps.boot()
    lan.attach(ps, address)
    return ps


@pytest.fixture(scope="module")
def remote() -> Iterator[Remote]:
    lan = Lan(f"clirem-{os.getpid()}", "10.233.0")
    lan.create()
    made: list[PrivateSystemd] = []
    try:
        cp = Node(_host("cp", lan, 2, made), 7700, 7710)
        laptop = _host("laptop", lan, 3, made)
        install_units(cp.ps, venv=VENV)
        cp.agent_config(CP, binary="/nonexistent/llama-server")  # a node, no engine to run
        try:
            cp.join(cp.init_server(host=CP), url=f"https://{CP}:7710")
        except Exception:
            print(cp.ps.journal("llmgwd.service", 60))
            raise
        parked = ["--from", "file:/nonexistent.gguf", "--engine", "llama.cpp"]  # never served
        cp.llmgw("model", "add", "parked", *parked)
        found = re.search(r"CA sha256: ([0-9a-f]{64})", cp.llmgw("status").stdout)
        yield Remote(cp, laptop, found.group(1) if found else "")
    finally:
        errors = shutdown_all(made)
        lan.destroy()
        assert not errors, errors


def test_status_prints_the_fingerprint_a_context_pins(remote: Remote) -> None:
    assert remote.pin == pki.ca_fingerprint(remote.cp.ps.read_file(f"{STATE}/pki/ca.pem"))


def test_an_admin_key_over_a_pinned_context_lists_makes_and_revokes(remote: Remote) -> None:
    cp = remote.cp
    admin = cp.llmgw("key", "create", "ops", "--admin", "--json")["key"]
    remote.laptop.write_file("/root/ops.key", admin + "\n", mode=0o600)
    r = remote.cli("context", "add", "evil", URL, "--ca-fingerprint", "ab" * 32)
    assert r.returncode == 3 and f"offers sha256 {remote.pin}" in r.stderr, r.stderr
    r = remote.cli("context", "add", "gw", URL, "--ca-fingerprint", remote.pin,
                   "--key-file", "/root/ops.key")  # fmt: skip
    assert r.returncode == 0 and f"CA sha256 {remote.pin} pinned" in r.stdout, r.stderr
    assert remote.cli("context", "use", "gw").returncode == 0
    assert "parked" in [m["name"] for m in remote.json("models")]
    nodes = remote.json("nodes")
    assert [(n["name"], n["connected"]) for n in nodes] == [("cp", True)]
    made = remote.json("key", "create", "from-laptop")
    assert made["key"].startswith("sk-llmgw")
    r = remote.cli("key", "revoke", "from-laptop")
    assert r.returncode == 0, r.stderr
    kept = {k["name"]: k["revoked"] for k in cp.llmgw("key", "list", "--json")}
    assert kept["from-laptop"] is True and kept["ops"] is False  # seen on the socket too


def test_a_first_use_shows_the_fingerprint_and_pins_it_once_confirmed(remote: Remote) -> None:
    r = remote.cli("context", "add", "asked", URL, given="n\n")
    assert r.returncode == 1 and f"sha256 {remote.pin}" in r.stderr and "nothing saved" in r.stderr
    r = remote.cli("context", "add", "asked", URL, given="y\n")
    assert r.returncode == 0, r.stderr
    listed = {c["name"]: c["ca_fingerprint"] for c in remote.json("context", "list")}
    assert listed["asked"] == remote.pin


def test_a_viewers_session_reads_and_is_refused_an_admin_command(remote: Remote) -> None:
    cp = remote.cp
    vic = cp.llmgw("user", "create", "vic", "--json")
    cp.llmgw("user", "staff", "vic", "viewer")
    cp.ps.systemctl("stop", "llmgwd.service")
    python = [str(VENV / "bin/python"), "-c", SESSION_KEY, f"{STATE}/state.db", vic["id"], "vic"]
    key = cp.ps.run(["runuser", "-u", "llmgw", "--", *python]).stdout.strip()
    cp.ps.systemctl("start", "llmgwd.service")
    cp.ps.wait_active("llmgwd.service")
    cp.wait(lambda: "cp" in cp.connected(), "the node back")
    r = remote.cli("context", "add", "view", URL, "--ca-fingerprint", remote.pin)
    assert r.returncode == 0, r.stderr
    session = {"server": URL, "key": key, "user": vic["id"], "name": "vic",
               "expires_at": time.time() + 3600}  # fmt: skip
    path = "/root/.config/llmgw/sessions/view.json"  # as `llmgw login` keeps it
    remote.laptop.write_file(path, json.dumps(session), mode=0o600)
    assert "parked" in [m["name"] for m in remote.json("--context", "view", "models")]
    r = remote.cli("--context", "view", "key", "create", "mine")
    assert r.returncode == 1
    assert "(login vic) may not POST /api/v1/keys" in r.stderr, r.stderr
    assert "mine" not in [k["name"] for k in cp.llmgw("key", "list", "--json")]
    r = remote.cli("--context", "view", "logout")
    assert r.returncode == 0 and "Signed out vic" in r.stdout, r.stderr
    assert "its key is revoked" in r.stdout, r.stdout
    revoked = {k["name"]: k["revoked"] for k in cp.llmgw("key", "list", "--json")}
    assert revoked["login vic"] is True
    r = remote.cli("--context", "view", "models")
    assert r.returncode == 1 and "API key" in r.stderr  # signed out: no key sent
