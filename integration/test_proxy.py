"""The mirror behind a site's egress proxy, for real: llmgwd pa (the stand-in hub, filled by
`llmgw mirror import`) is reachable from llmgwd pb only through Debian's tinyproxy on pp (pb's
nftables reject every packet to pa's address). With network.proxy naming tinyproxy and its
password, pb resolves and fetches the set through it; with a wrong password tinyproxy's 407 is
named as the proxy's, without the password; with no proxy at all the add fails clearly; and
HTTP_PROXY in llmgwd's environment (a drop-in), the setting absent, is honoured. The password
is in no error, no status and no line of pb's journal."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from integration.harness import MakeLan, MakeSystemd, PrivateSystemd
from integration.llmgw_node import Node, gguf
from integration.mirror_setup import GGUF_NAME, MIRROR_DIR, sha, source_dir

PREFIX = "10.231.7"
A, B, P = f"{PREFIX}.10", f"{PREFIX}.20", f"{PREFIX}.30"
REPO, REPO2 = "smol/SmolLM2-135M-Instruct", "smol/SmolLM2-copy"
USER, PASSWORD = "llmgw", "pr0xy-s3cret-pw"
PROXY = f"http://{USER}:{PASSWORD}@{P}:8888"
SHOWN = f"http://****@{P}:8888"  # the proxy as errors may show it
TINYPROXY_LOG = "/tmp/tinyproxy.log"
TINYPROXY_CONF = f"""User tinyproxy
Group tinyproxy
Port 8888
Listen {P}
Timeout 60
MaxClients 20
LogFile "{TINYPROXY_LOG}"
LogLevel Info
Allow {PREFIX}.0/24
BasicAuth {USER} {PASSWORD}
DisableViaHeader Yes
"""
# pb reaches pa only through the proxy: its packets to pa are refused at once (a reset, so
# a direct try fails fast rather than waiting out connect timeouts).
CUT_OFF = f"""add table inet llmgwtest
add chain inet llmgwtest out {{ type filter hook output priority 0; policy accept; }}
add rule inet llmgwtest out ip daddr {A} tcp dport 7700 reject with tcp reset
"""


@dataclass
class Site:
    hub: Node
    proxy: PrivateSystemd
    b: Node
    server_yaml: str  # pb's server.yaml as init wrote it, without a network section


@pytest.fixture
def site(make_systemd: MakeSystemd, make_lan: MakeLan) -> Iterator[Site]:
    if shutil.which("tinyproxy") is None:
        pytest.skip("needs Debian's tinyproxy (apt-get install tinyproxy)")
    lan = make_lan("px", prefix=PREFIX)
    hub = Node(make_systemd("pa", net=True, hostname="pa"), 7700, 7710)
    lan.attach(hub.ps, 10)
    hub.install("/bin/true", address=A)  # no engine runs: no llama-server needed
    hub.init_server(host=A, agent=False)
    key = hub.llmgw("key", "create", "upstream", "--admin", "--json")["key"]
    for path, text in source_dir().items():
        hub.ps.write_file(f"/srv/import/{path}", text)
    hub.ps.run(["cp", str(gguf()), f"/srv/import/{GGUF_NAME}"])
    for repo in (REPO, REPO2):
        hub.llmgw("mirror", "import", "/srv/import", "--as", repo)

    proxy = make_systemd("pp", net=True, hostname="pp")
    lan.attach(proxy, 30)
    proxy.write_file("/etc/tinyproxy/test.conf", TINYPROXY_CONF)
    proxy.run(["systemd-run", "--unit=test-tinyproxy", "tinyproxy", "-d", "-c",
               "/etc/tinyproxy/test.conf"])  # fmt: skip
    proxy.wait_active("test-tinyproxy.service")

    b = Node(make_systemd("pb", net=True, hostname="pb"), 7700, 7710)
    lan.attach(b.ps, 20)
    b.ps.run(["nft", "-f", "-"], input=CUT_OFF)
    b.install("/bin/true", address=B)
    b.ps.write_file("/etc/llmgw/upstream-token", key + "\n", mode=0o640)
    b.ps.run(["chgrp", "llmgw", "/etc/llmgw/upstream-token"])
    upstream = f"mirror:\n  upstream: http://{A}:7700/hf\n  token_file: /etc/llmgw/upstream-token\n"
    b.init_server(host=B, agent=False, extra=upstream + f"network:\n  proxy: {PROXY}\n")
    # init's own file (with network's defaults) and the mirror's lines, without the proxy
    server_yaml = b.ps.read_file("/etc/llmgw/server.yaml").rsplit("network:\n", 1)[0]
    yield Site(hub, proxy, b, server_yaml)


def _restart(b: Node, server_yaml: str, environment: str = "") -> None:
    """pb's llmgwd again with this server.yaml and, where given, a drop-in's Environment=."""
    b.ps.write_file("/etc/llmgw/server.yaml", server_yaml, mode=0o640)  # it holds a password
    b.ps.run(["chgrp", "llmgw", "/etc/llmgw/server.yaml"])
    dropin = "/etc/systemd/system/llmgwd.service.d/proxy.conf"
    b.ps.write_file(dropin, f"[Service]\nEnvironment={environment}\n" if environment else "")
    b.ps.systemctl("daemon-reload")
    r = b.ps.systemctl("restart", "llmgwd.service", check=False)
    assert r.returncode == 0, b.ps.journal("llmgwd.service", lines=30)
    b.ps.wait_active("llmgwd.service", timeout=60)


def _add(b: Node, name: str, repo: str) -> tuple[int, str]:
    r = b.llmgw("model", "add", name, "--from", f"hf:{repo}@main", check=False)
    return r.returncode, r.stdout + r.stderr


def _fetched_through_the_proxy(s: Site) -> None:
    b = s.b
    direct = b.ps.run(["curl", "-sS", "-m", "5", f"http://{A}:7700/hf/api/models/{REPO}"],
                      check=False)  # fmt: skip
    assert direct.returncode != 0  # the hub is not reachable straight from pb
    code, out = _add(b, "smol", REPO)
    assert code == 0, out
    want = sha(gguf().read_bytes())
    held = b.ps.run(["sha256sum", f"{MIRROR_DIR}/blobs/{want}"]).stdout.split()[0]
    assert held == want
    log = s.proxy.read_file(TINYPROXY_LOG)
    assert f"GET http://{A}:7700/hf/api/models/{REPO}/revision/main" in log
    assert f"GET http://{A}:7700/hf/{REPO}/resolve/" in log


def _a_wrong_password_is_the_proxy_s_refusal(s: Site) -> None:
    wrong = PROXY.replace(PASSWORD, "not-" + PASSWORD)
    _restart(s.b, s.server_yaml + f"network:\n  proxy: {wrong}\n")
    code, out = _add(s.b, "copy", REPO2)
    assert code != 0
    # tinyproxy answers a wrong password with 401 (and WWW-Authenticate), not 407
    assert "answered 401" in out and f"(through proxy {SHOWN})" in out, out
    assert "or the proxy refused network.proxy's user and password" in out
    assert PASSWORD not in out


def _without_a_proxy_the_add_fails_clearly(s: Site) -> None:
    _restart(s.b, s.server_yaml)
    code, out = _add(s.b, "copy", REPO2)
    assert code != 0
    assert f"hf:{REPO2}: cannot reach the upstream" in out, out


def _the_environment_s_proxy_is_honoured(s: Site) -> None:
    _restart(s.b, s.server_yaml, environment=f"HTTP_PROXY={PROXY}")
    code, out = _add(s.b, "copy", REPO2)
    assert code == 0, out
    assert f"GET http://{A}:7700/hf/api/models/{REPO2}/revision/main" in s.proxy.read_file(
        TINYPROXY_LOG
    )


def test_the_mirror_fetches_through_a_real_proxy(site: Site) -> None:
    """One set of three private systemds for every step (they take a while to boot)."""
    _fetched_through_the_proxy(site)
    _a_wrong_password_is_the_proxy_s_refusal(site)
    _without_a_proxy_the_add_fails_clearly(site)
    _the_environment_s_proxy_is_honoured(site)
    b = site.b
    status = b.llmgw("mirror", "status", "--json")
    journal = b.ps.run(["journalctl", "--no-pager", "-o", "cat"]).stdout
    assert PASSWORD not in str(status) and PASSWORD not in journal
    assert f"through proxy {SHOWN}" in journal  # the route llmgwd said it uses, redacted
