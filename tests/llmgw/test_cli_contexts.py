"""`llmgw context` and the CLI over HTTPS: the CA pinned by its fingerprint, the key from a
file, $LLMGW_API_KEY or the `llmgw login` session (signed in at the context, its CA pinned),
a role's refusal shown as over the socket."""

from __future__ import annotations

import asyncio
import json
import stat
import threading
import time
from pathlib import Path

import msgspec
import pytest
from aiohttp import web
from click.testing import CliRunner, Result

from llmgw import pki
from llmgw.api_types import DeviceAuthorization, LoginAnswer
from llmgw.cli import contexts, login_device
from llmgw.cli.main import main
from llmgw.cli.session import SavedSession, save_session
from llmgwd.catalog import KeyOwner
from tests.llmgw.https_site import ADMIN_SECRET, add_context, make_tls, start_tls_site
from tests.llmgw.test_cli import Daemon, daemon, rows  # noqa: F401 (daemon: a fixture)

over_https = pytest.mark.parametrize("daemon", ["https"], indirect=True)


def _as(daemon: Daemon, context: str, *args: str, **env: str) -> Result:  # noqa: F811
    return CliRunner().invoke(main, ["--context", context, *args], env={**daemon.env, **env})


def _pin(daemon: Daemon) -> str:  # noqa: F811
    listed = json.loads(daemon.cli("context", "list", "--json").stdout)
    [test] = [c for c in listed if c["name"] == "test"]
    assert test["url"] == daemon.url
    return str(test["ca_fingerprint"])


def _unpinned(daemon: Daemon, name: str) -> None:  # noqa: F811
    """A context trusting the system's CAs (as `context add` keeps for a server they trust)."""
    with pytest.MonkeyPatch.context() as m:
        m.setenv("XDG_CONFIG_HOME", daemon.env["XDG_CONFIG_HOME"])
        kept = contexts.load()
        kept.contexts.append(contexts.Context(name=name, url=daemon.url))
        contexts.save(kept)


@over_https
def test_a_wrong_fingerprint_is_refused_naming_both(daemon: Daemon, tmp_path: Path) -> None:  # noqa: F811
    pin = _pin(daemon)
    wrong = "ab" * 32
    r = daemon.cli("context", "add", "evil", daemon.url, "--ca-fingerprint", wrong)
    assert r.exit_code == 3
    assert f"offers sha256 {pin}" in r.stderr and f"not the pinned CA sha256 {wrong}" in r.stderr
    assert "nothing saved" in r.stderr
    assert [c["name"] for c in json.loads(daemon.cli("context", "list", "--json").stdout)] == [
        "test"
    ]
    _unpinned(daemon, "unpinned")  # the system's CAs: not this one
    r = _as(daemon, "unpinned", "models")
    assert r.exit_code == 3
    assert "not signed by a CA this system trusts" in r.stderr and pin in r.stderr


@over_https
def test_a_server_of_another_ca_is_refused_at_each_command(
    daemon: Daemon,  # noqa: F811
    tmp_path: Path,
) -> None:
    other = pki.make_ca("other")
    (tmp_path / "other.pem").write_bytes(other.cert_pem)
    add_context(tmp_path / "config", "other", daemon.url, "--ca-file", str(tmp_path / "other.pem"))
    r = _as(daemon, "other", "models")
    assert r.exit_code == 3
    assert f"not signed by the pinned CA sha256 {pki.ca_fingerprint(other.cert_pem)}" in r.stderr
    assert f"it offers sha256 {_pin(daemon)}" in r.stderr
    tls = make_tls(tmp_path)  # its certificate is for localhost and 127.0.0.1 only
    runner, elsewhere = daemon.run(start_tls_site(web.Application(), tls.server, "127.0.0.2"))
    add_context(tmp_path / "config", "name", elsewhere, "--ca-fingerprint", tls.fingerprint)
    r = _as(daemon, "name", "models")
    daemon.run(runner.cleanup())
    assert r.exit_code == 3
    assert "has a certificate not for 127.0.0.2" in r.stderr
    r = daemon.cli("context", "add", "x", daemon.url, "--ca-file", str(tmp_path / "other.pem"),
                   "--ca-fingerprint", "cd" * 32)  # fmt: skip
    assert r.exit_code == 3 and f"not the pinned sha256 {'cd' * 32}" in r.stderr


@over_https
def test_a_viewer_signed_in_reads_and_gets_403_on_an_admin_command(
    daemon: Daemon,  # noqa: F811
    tmp_path: Path,
) -> None:
    made = json.loads(daemon.cli("user", "create", "vic", "--json").stdout)
    assert daemon.cli("user", "staff", "vic", "viewer").exit_code == 0
    daemon.run(daemon.catalog.load())  # as llmgwd's watch would: vic is an active user
    _, secret = daemon.run(
        daemon.catalog.create_key("vic-session", owner=KeyOwner(user=made["id"]))
    )
    add_context(tmp_path / "config", "vic", daemon.url, "--ca-fingerprint", _pin(daemon))
    r = _as(daemon, "vic", "key", "list")
    assert r.exit_code == 1 and "an API key is needed" in r.stderr  # not signed in yet

    session = SavedSession(server=daemon.url, key=secret, user=made["id"], name="vic",
                           expires_at=time.time() + 600)  # fmt: skip
    with pytest.MonkeyPatch.context() as m:
        m.setenv("XDG_CONFIG_HOME", daemon.env["XDG_CONFIG_HOME"])
        path = save_session(session)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    r = _as(daemon, "vic", "key", "list")
    assert r.exit_code == 0, r.output
    assert "vic-session" in r.stdout
    r = _as(daemon, "vic", "key", "create", "mine")
    assert r.exit_code == 1
    assert "may not POST /api/v1/keys" in r.stderr
    [only] = daemon.catalog.keys()
    assert only.name == "vic-session"
    r = _as(daemon, "vic", "key", "create", "mine", LLMGW_API_KEY=ADMIN_SECRET)
    assert r.exit_code == 0, r.output  # the key in the environment comes first


@over_https
def test_contexts_are_chosen_kept_0600_and_removed(daemon: Daemon, tmp_path: Path) -> None:  # noqa: F811
    config = tmp_path / "config" / "llmgw" / "contexts.yaml"
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    local = {k: v for k, v in daemon.env.items() if k != "LLMGW_CONTEXT"}
    r = CliRunner().invoke(main, ["--socket", str(tmp_path / "none.sock"), "models"], env=local)
    assert r.exit_code == 3 and "none.sock" in r.stderr  # no context: the local socket
    assert CliRunner().invoke(main, ["context", "use", "test"], env=local).exit_code == 0
    r = CliRunner().invoke(main, ["--socket", str(tmp_path / "none.sock"), "models"], env=local)
    assert r.exit_code == 0 and "No models yet" in r.stdout
    assert json.loads(daemon.cli("context", "list", "--json").stdout)[0]["current"] is True
    pin, key_file = _pin(daemon), str(tmp_path / "admin.key")
    assert rows(daemon.cli("context", "list").stdout) == [
        ["CURRENT", "NAME", "URL", "CA", "KEY"],
        ["*", "test", daemon.url, pin[:16], key_file],
    ]
    assert rows(daemon.cli("context", "list", "-o", "wide", "--no-headers").stdout) == [
        ["*", "test", daemon.url, pin[:16], key_file, pin]
    ]
    r = CliRunner().invoke(main, ["--socket", str(tmp_path / "none.sock"), "--context", "local",
                                  "models"], env=local)  # fmt: skip
    assert r.exit_code == 3
    assert daemon.cli("--context", "nope", "models").exit_code == 1
    r = CliRunner().invoke(main, ["context", "remove", "test"], env=local)
    assert r.exit_code == 0
    r = CliRunner().invoke(main, ["context", "list"], env=local)
    assert "No contexts" in r.stdout
    r = CliRunner().invoke(main, ["context", "add", "x", "http://cp:7700"], env=local)
    assert r.exit_code == 2


def _device_login_app() -> web.Application:
    """The client port's two device sign-in routes, answering a session at once."""
    auth = DeviceAuthorization(device_code="d", user_code="ABCD-EFGH", expires_in=60,
                               interval=1, verification_uri="https://idp/d")  # fmt: skip
    signed_in = LoginAnswer(user="u1", name="ann", key="sk-llmgw-session", expires_at=4e9)

    async def start(_r: web.Request) -> web.Response:
        return web.json_response(msgspec.to_builtins(auth))

    async def token(_r: web.Request) -> web.Response:
        return web.json_response(msgspec.to_builtins(signed_in))

    app = web.Application()
    app.router.add_post("/api/v1/login/device", start)
    app.router.add_post("/api/v1/login/device/token", token)
    return app


def test_login_signs_in_at_the_context_trusting_its_pinned_ca(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(login_device, "pause", lambda _s: None)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    tls = make_tls(tmp_path)
    start = start_tls_site(_device_login_app(), tls.server)
    runner, url = asyncio.run_coroutine_threadsafe(start, loop).result(10)
    env = {"XDG_CONFIG_HOME": str(tmp_path / "config")}
    try:
        r = CliRunner().invoke(main, ["login", "--device", "--server", url], env=env)
        assert r.exit_code == 3 and "CERTIFICATE_VERIFY_FAILED" in r.stderr  # no CA pinned
        add_context(tmp_path / "config", "gw", url, "--ca-fingerprint", tls.fingerprint)
        r = CliRunner().invoke(main, ["--context", "gw", "login", "--device"], env=env)
        assert r.exit_code == 0, r.output
        assert "signed in as ann" in r.stdout
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()
    kept = tmp_path / "config" / "llmgw" / "sessions" / "gw.json"  # the context's own
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    saved = json.loads(kept.read_bytes())
    assert (saved["server"], saved["key"]) == (url, "sk-llmgw-session")
    assert not (tmp_path / "config" / "llmgw" / "session.json").exists()
    r = CliRunner().invoke(main, ["login", "--device"], env=env)
    assert r.exit_code == 2 and "give --server URL, or use a context" in r.stderr


@over_https
def test_each_context_has_its_own_session_until_logout(daemon: Daemon, tmp_path: Path) -> None:  # noqa: F811
    made = json.loads(daemon.cli("user", "create", "ann", "--json").stdout)
    assert daemon.cli("user", "staff", "ann", "viewer").exit_code == 0
    daemon.run(daemon.catalog.load())
    _, secret = daemon.run(
        daemon.catalog.create_key("ann-session", owner=KeyOwner(user=made["id"]))
    )
    for name in ("a", "b"):  # two contexts at one server: two people, say
        add_context(tmp_path / "config", name, daemon.url, "--ca-fingerprint", _pin(daemon))
    session = SavedSession(server=daemon.url, key=secret, user=made["id"], name="ann",
                           expires_at=time.time() + 600)  # fmt: skip
    with pytest.MonkeyPatch.context() as m:
        m.setenv("XDG_CONFIG_HOME", daemon.env["XDG_CONFIG_HOME"])
        path = save_session(session, "a")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    r = _as(daemon, "a", "key", "list")
    assert r.exit_code == 0 and "ann-session" in r.stdout, r.output
    r = _as(daemon, "b", "key", "list")
    assert r.exit_code == 1 and "an API key is needed" in r.stderr  # a's session is a's
    r = _as(daemon, "a", "logout")
    assert r.exit_code == 0 and "Signed out ann" in r.stdout, r.output
    assert "its key is revoked" in r.stdout  # on the server: DELETE /api/v1/me/key
    kept = daemon.catalog.keys()  # the catalog's keys (a list, not a dict's)
    assert [k.revoked for k in kept if k.name == "ann-session"] == [True]
    assert not path.exists()
    r = _as(daemon, "a", "key", "list")
    assert r.exit_code == 1 and "an API key is needed" in r.stderr
    assert "No session was kept for context a" in _as(daemon, "a", "logout").stdout
    with pytest.MonkeyPatch.context() as m:
        m.setenv("XDG_CONFIG_HOME", daemon.env["XDG_CONFIG_HOME"])
        save_session(session, "b")
    assert daemon.cli("context", "remove", "b").exit_code == 0
    assert not path.with_name("b.json").exists()  # a context removed takes its session along
