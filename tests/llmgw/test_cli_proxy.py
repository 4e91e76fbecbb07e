"""The CLI's HTTPS contexts through HTTPS_PROXY (a CONNECT tunnel, TLS end to end, the pinned
CA still checked), straight when NO_PROXY names the host, and a proxy's refusal said as its."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from llmgw import ipc
from llmgw.cli import https
from llmgw.cli.main import main
from tests.llmgw.forward_proxy import ForwardProxy
from tests.llmgw.https_site import add_context
from tests.llmgw.test_cli import Daemon, daemon  # noqa: F401 (the fixture)

over_https = pytest.mark.parametrize("daemon", ["https"], indirect=True)


@pytest.fixture
def forward(daemon: Daemon) -> Iterator[ForwardProxy]:  # noqa: F811
    fp = ForwardProxy()
    daemon.run(fp.start())
    yield fp
    daemon.run(fp.close())


PROXY_VARS = ("HTTPS_PROXY", "HTTP_PROXY", "NO_PROXY", "https_proxy", "http_proxy", "no_proxy")


def _cli(daemon: Daemon, *args: str, **env: str) -> Result:  # noqa: F811
    """llmgw ARGS under the context, with the proxy variables env gives and no others."""
    unset: dict[str, str | None] = dict.fromkeys(PROXY_VARS)
    base = ["--socket", daemon.socket, "--agent-socket", daemon.agent_socket]
    return CliRunner().invoke(main, [*base, *args], env={**unset, **daemon.env, **env})


def _target(daemon: Daemon) -> str:  # noqa: F811
    return daemon.url.removeprefix("https://")


@over_https
def test_a_context_s_commands_go_through_https_proxy(
    daemon: Daemon,  # noqa: F811
    forward: ForwardProxy,
) -> None:
    user_url = forward.url.replace("http://", "http://ops:s3cret@")
    r = _cli(daemon, "models", HTTPS_PROXY=user_url)
    assert r.exit_code == 0, r.output
    assert forward.seen and all(m == "CONNECT" for m, _, _ in forward.seen)
    assert forward.targets()[0] == _target(daemon)
    assert forward.seen[0][2] == "Basic b3BzOnMzY3JldA=="  # ops:s3cret, to the proxy alone


@over_https
def test_context_add_pins_the_ca_through_the_proxy(
    daemon: Daemon,  # noqa: F811
    forward: ForwardProxy,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in PROXY_VARS:
        monkeypatch.delenv(name, raising=False)
    ca = https.offered_chain(daemon.url)[-1]
    monkeypatch.setenv("HTTPS_PROXY", forward.url)
    add_context(tmp_path / "other", "via", daemon.url, "--ca-fingerprint", https.fingerprint(ca))
    assert _target(daemon) in forward.targets()


@over_https
def test_no_proxy_sends_the_context_straight(
    daemon: Daemon,  # noqa: F811
    forward: ForwardProxy,
) -> None:
    r = _cli(daemon, "models", HTTPS_PROXY=forward.url, NO_PROXY="127.0.0.0/8")
    assert r.exit_code == 0, r.output
    assert forward.seen == []


@over_https
def test_a_proxy_s_refusal_is_said_as_the_proxy_s(
    daemon: Daemon,  # noqa: F811
    forward: ForwardProxy,
) -> None:
    forward.refuse = 403
    user_url = forward.url.replace("http://", "http://ops:s3cret@")
    r = _cli(daemon, "models", HTTPS_PROXY=user_url)
    assert r.exit_code == 3, r.output
    assert "through proxy http://****@127.0.0.1:" in r.output and "403" in r.output
    assert "s3cret" not in r.output


@pytest.fixture
def refusing() -> Iterator[ForwardProxy]:
    """A forward proxy that refuses every request (403), on its own event loop's thread."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    fp = ForwardProxy(refuse=403)
    asyncio.run_coroutine_threadsafe(fp.start(), loop).result(5)
    yield fp
    asyncio.run_coroutine_threadsafe(fp.close(), loop).result(5)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


def test_an_ipv6_context_is_connected_to_in_brackets(
    refusing: ForwardProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in PROXY_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTPS_PROXY", refusing.url)
    url = "https://[2001:db8::1]:7700"
    with pytest.raises(ipc.IpcError, match="403"):
        https.offered_chain(url)
    with pytest.raises(ipc.IpcError, match="403"):
        https.request(https.Remote(url), "GET", "/v1/models")
    assert refusing.targets() == ["[2001:db8::1]:7700"] * 2
