"""The .deb packages for real: built from this checkout by scripts/build-packages, installed
with apt into a private systemd, both daemons started with systemctl, the quick-start model
served and answering /v1, its fields in the journal, an upgrade to a newer build keeping
the cluster, `llmgw upgrade` rolling it onto a third, then remove (which keeps the state) and
purge (which leaves nothing).

The tests run in order and share one machine: each step starts where the one before left.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from integration.debs import APT, PACKAGES, build, deb_version
from integration.harness import REPO, TEST_BASE, MakeSystemd, PrivateSystemd
from integration.llmgw_node import MODEL, Node
from integration.steady import Stream

CLIENT_PORT = 17720  # apart from test_single_node's ports and a quickstart's 7700
CLUSTER_PORT = 17730
BUMP = "+upgrade1"  # sorts after the version it is added to
# The llama-server copy agent.yaml names: a site's own file, which no package touches.
LLAMA = "/usr/local/lib/llmgw/llama-server"
# llmgwd's package installs the Grafana dashboard as the repository keeps it.
DASHBOARD = ("/usr/share/llmgw/grafana/llmgw.json", REPO / "packaging/grafana/llmgw.json")
# ... and Prometheus' scrape config, alert rules and their unit tests; llmgw the guide's page.
PROMETHEUS = ("llmgw.rules.yml", "prometheus.yml", "tests.yml")
SHIPPED = (DASHBOARD, *((f"/usr/share/llmgw/prometheus/{name}",
                         REPO / "packaging/prometheus" / name) for name in PROMETHEUS))  # fmt: skip
GUIDE = "/usr/share/man/man7/llmgw-cluster.7.gz"
# The daemons' modules import every compiled dependency (msgspec, uvloop, cryptography, ...).
COMPILED = (
    "import llmgw.cli.main, llmgwd.main, llmgwd.daemon, llmgw_agentd.main, llmgw_agentd.daemon"
)


@pytest.fixture(scope="module")
def debs(tree_debs: list[Path]) -> Iterator[dict[str, list[Path]]]:
    """Two builds: the checkout's version (the session's, linted), and a newer one to upgrade
    to."""
    # Under TEST_BASE, on the host's root: the private systemd's overlay shows it as it is.
    out = TEST_BASE / f"packages-{os.getpid()}"
    try:
        new = build(out / "new", deb_version(tree_debs[0]) + BUMP)
        yield {"old": tree_debs, "new": new}
    finally:
        shutil.rmtree(out, ignore_errors=True)


class PackagedNode(Node):
    """A Node whose llmgw is the package's /usr/bin/llmgw."""

    def llmgw(self, *args: str, check: bool = True) -> Any:
        r = self.ps.run(["/usr/bin/llmgw", *args], check=check, timeout=120)
        if "--json" in args and r.returncode == 0:
            return json.loads(r.stdout)
        return r


def llama_server() -> str:
    r = subprocess.run([REPO / "scripts/build-llama-server"], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"llama-server could not be built here: {r.stderr[-500:]}")
    return r.stdout.strip()


def apt(ps: PrivateSystemd, *args: str) -> str:
    r = ps.run(["apt-get", "-y", "--no-install-recommends", *args], env=APT, timeout=600)
    return r.stdout + r.stderr


def installed_version(ps: PrivateSystemd, package: str) -> str:
    r = ps.run(["dpkg-query", "-W", "-f", "${Status} ${Version}", package], check=False)
    return r.stdout.removeprefix("install ok installed ") if "installed" in r.stdout else ""


@pytest.fixture(scope="module")
def host(debs: dict[str, list[Path]], systemd: PrivateSystemd) -> PrivateSystemd:
    """The private systemd with the first build installed by apt, nothing else done."""
    # A container image's policy-rc.d (exit 101) forbids maintainer scripts to start or stop
    # anything; a real host has none, and the packages' own choices are what is tested.
    systemd.run(["rm", "-f", "/usr/sbin/policy-rc.d"])
    apt(systemd, "install", *map(str, debs["old"]))
    return systemd


@pytest.fixture(scope="module")
def node(host: PrivateSystemd) -> PackagedNode:
    """The node brought up as a site would: agent.yaml, server init, join, serve."""
    n = PackagedNode(host, CLIENT_PORT, CLUSTER_PORT)
    host.run(["install", "-D", "-m", "0755", llama_server(), LLAMA])
    host.write_file(
        "/etc/llmgw/agent.yaml",
        f"address: 127.0.0.1\nengines:\n  llama.cpp:\n    binary: {LLAMA}\n",
    )
    n.join(n.init_server())
    n.serve_model(1)
    n.key = n.llmgw("key", "create", "packages", "--json")["key"]
    return n


def chat(node: Node) -> str:
    client = openai.OpenAI(base_url=node.base_url, api_key=node.key, max_retries=0, timeout=120)
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Name a colour."}], max_tokens=8
    )
    return r.choices[0].message.content or ""


def exposure(ps: PrivateSystemd, unit: str) -> float:
    out = ps.run(["systemd-analyze", "security", "--no-pager", unit]).stdout
    m = re.search(rf"Overall exposure level for {re.escape(unit)}: ([0-9.]+)", out)
    assert m, out[-2000:]
    return float(m.group(1))


def test_the_agent_package_ships_its_uv(debs: dict[str, list[Path]], tmp_path: Path) -> None:
    """The agent installs vLLM with uv, which neither Debian nor RHEL packages: the
    llmgw-agentd .deb carries uv's binary where the uv module finds it (sys.prefix/bin)."""
    [agent] = [d for d in debs["old"] if d.name.startswith("llmgw-agentd_")]
    listing = subprocess.run(["dpkg-deb", "-c", str(agent)], capture_output=True, text=True,
                             check=True).stdout.splitlines()  # fmt: skip
    [entry] = [line for line in listing if line.endswith(" ./usr/lib/llmgw/venv/bin/uv")]
    assert entry.startswith("-rwxr-xr-x")
    subprocess.run(["dpkg-deb", "-x", str(agent), str(tmp_path)], check=True)
    r = subprocess.run([str(tmp_path / "usr/lib/llmgw/venv/bin/uv"), "--version"],
                       capture_output=True, text=True, check=False)  # fmt: skip
    assert r.returncode == 0 and r.stdout.startswith("uv "), r.stderr


def test_install_enables_and_starts_nothing(host: PrivateSystemd) -> None:
    for unit in ("llmgwd.service", "llmgw-agentd.service"):
        assert host.systemctl("is-enabled", unit, check=False).stdout.strip() == "disabled"
        assert host.systemctl("is-active", unit, check=False).stdout.strip() == "inactive"
    assert host.run(["id", "-gn", "llmgw"]).stdout.strip() == "llmgw"
    # root:llmgw 0750 from tmpfiles.d, as the units' ConfigurationDirectoryMode= says.
    assert host.run(["stat", "-c", "%a %U %G", "/etc/llmgw"]).stdout.split() == [
        "750", "root", "llmgw"]  # fmt: skip
    # Every compiled module of the environment loads (a stripped numpy.libs would not).
    host.run(["/usr/lib/llmgw/venv/bin/python3", "-I", "-c", COMPILED])
    version = host.run(["/usr/bin/llmgw", "--version"]).stdout
    assert "0." in version
    for daemon in ("llmgwd", "llmgw-agentd"):
        r = host.run([f"/usr/bin/{daemon}", "--help"])
        assert "--config" in r.stdout
    for installed, source in SHIPPED:
        assert host.read_file(installed) == source.read_text(), installed
    host.run(["test", "-s", GUIDE])


def test_units_verify_and_llmgwd_is_hardened(host: PrivateSystemd) -> None:
    # /lib/systemd/system (bookworm's debhelper) is /usr/lib/systemd/system on merged /usr.
    units = host.run("ls -d /lib/systemd/system/llmgw*").stdout.split()
    assert {Path(u).name for u in units} == {
        "llmgwd.service", "llmgw-etcd.service", "llmgw-agentd.service",
        "llmgw-engines.slice"}  # fmt: skip
    # verify also runs `man` on each Documentation= page: the packages' pages must be there.
    r = host.run(["systemd-analyze", "verify", *units], check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    daemon, agent = exposure(host, "llmgwd.service"), exposure(host, "llmgw-agentd.service")
    print(f"systemd-analyze security: llmgwd {daemon}, llmgw-agentd {agent}")
    assert daemon <= 3.0
    # The agent runs as root with CAP_NET_ADMIN and the system bus: 3.1 when written.
    assert agent <= 3.5


def test_completion_is_what_the_command_prints(host: PrivateSystemd) -> None:
    for shell, path in (("bash", "/usr/share/bash-completion/completions/llmgw"),
                        ("zsh", "/usr/share/zsh/vendor-completions/_llmgw")):  # fmt: skip
        printed = host.run(["/usr/bin/llmgw"], env={"_LLMGW_COMPLETE": f"{shell}_source"}).stdout
        assert host.read_file(path).strip() == printed.strip()
    r = host.run(["/usr/bin/llmgw"],
                 env={"_LLMGW_COMPLETE": "bash_complete", "COMP_WORDS": "llmgw mo",
                      "COMP_CWORD": "1"})  # fmt: skip
    assert "plain,model" in r.stdout and "plain,models" in r.stdout


def test_served_model_answers_v1(node: PackagedNode) -> None:
    assert chat(node)
    assert node.ps.systemctl("is-enabled", "llmgwd.service").stdout.strip() == "enabled"


def test_journal_has_llmgw_fields_and_no_secret(node: PackagedNode) -> None:
    r = node.ps.run(["journalctl", "--no-pager", "-o", "json", "-u", "llmgwd.service",
                     f"LLMGW_MODEL={MODEL}"])  # fmt: skip
    entries = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert entries, "journalctl -u llmgwd LLMGW_MODEL=... found nothing"
    assert all(e["SYSLOG_IDENTIFIER"] == "llmgwd" for e in entries)
    assert any("LLMGW_REPLICA" in e and "LLMGW_NODE" in e for e in entries)
    everything = node.ps.run(["journalctl", "--no-pager", "-o", "export"]).stdout
    assert node.key not in everything
    # The units and tmpfiles.d agree on /etc/llmgw's mode: systemd has nothing to say.
    assert "already exists but the mode is different" not in everything


def _state(node: PackagedNode) -> dict[str, Any]:
    return {
        "models": sorted(m["name"] for m in node.llmgw("models", "--json")),
        "keys": node.llmgw("key", "list", "--json"),
        "nodes": sorted(n["name"] for n in node.llmgw("nodes", "--json")),
        "server.yaml": node.ps.read_file("/etc/llmgw/server.yaml"),
        "agent.yaml": node.ps.read_file("/etc/llmgw/agent.yaml"),
    }


def test_upgrade_keeps_the_cluster(node: PackagedNode, debs: dict[str, list[Path]]) -> None:
    ps = node.ps
    before = _state(node)
    [engine] = node.engine_units()
    pids = {u: node.main_pid(u) for u in ("llmgwd.service", "llmgw-agentd.service", engine)}
    new = deb_version(debs["new"][0])
    out = apt(ps, "install", *map(str, debs["new"]))
    assert all(installed_version(ps, p) == new for p in PACKAGES), out
    # The enabled daemons were restarted onto the new build; the engine was left running.
    ps.wait_active("llmgwd.service")
    ps.wait_active("llmgw-agentd.service")
    assert node.main_pid("llmgwd.service") != pids["llmgwd.service"]
    assert node.main_pid("llmgw-agentd.service") != pids["llmgw-agentd.service"]
    node.wait(lambda: all(n["connected"] for n in node.llmgw("nodes", "--json")), "agent back")
    node.wait_ready(1)
    assert _state(node) == before
    assert node.main_pid(engine) == pids[engine]
    assert chat(node)  # the same key, the same model
    assert json.loads(ps.run(["/usr/bin/llmgw", "status", "--json"]).stdout)["version"]


@pytest.fixture(scope="module")
def newer(debs: dict[str, list[Path]]) -> Iterator[list[Path]]:
    """A third build, newer than both, for `llmgw upgrade` to roll the host onto."""
    out = TEST_BASE / f"packages-upgrade-{os.getpid()}"
    try:
        yield build(out, deb_version(debs["old"][0]) + "+upgrade2")
    finally:
        shutil.rmtree(out, ignore_errors=True)


def test_llmgw_upgrade_rolls_the_host(node: PackagedNode, newer: list[Path]) -> None:
    """`llmgw upgrade stage` and `start`: the host's agent fetches the packages from the mirror
    and installs them through a transient unit; both daemons come back on the new release,
    the engine runs on (its PID the same) and the model answers with the same key: under
    steady /v1 load (the official client, retries off) no request failed meanwhile."""
    ps = node.ps
    [engine] = node.engine_units()
    pids = {u: node.main_pid(u) for u in ("llmgwd.service", "llmgw-agentd.service", engine)}
    release = deb_version(newer[0])
    staged = ps.run(["/usr/bin/llmgw", "upgrade", "stage", *map(str, newer)], timeout=300)
    assert staged.stdout.count("Staged ") == 3, staged.stdout + staged.stderr
    seen: set[str] = set()

    def settled() -> bool:
        r = ps.run(["/usr/bin/llmgw", "upgrade", "status", "--json"], check=False, timeout=30)
        if r.returncode != 0:  # llmgwd restarting onto the new release
            return False
        roll = json.loads(r.stdout)["roll"]
        seen.update(h["step"] for h in roll["hosts"])
        return bool(roll["state"] in ("done", "halted"))

    with Stream(node.key, [node.base_url]) as load:
        t_start = time.time()
        node.llmgw("upgrade", "start")
        node.wait(settled, "the roll's end", timeout=600)
        time.sleep(2)  # and a moment after
    load.report("llmgw upgrade", t_start)
    assert load.rows and not load.failures(), load.failures()[:3]
    roll = node.llmgw("upgrade", "status", "--json")["roll"]
    assert roll["state"] == "done", roll["error"] + ps.journal("llmgw-agentd.service", 40)
    # the control plane's host (named by its address) through its agent, then the node (that
    # same host's agent, already on the release)
    assert [(h["role"], h["step"], h["version"]) for h in roll["hosts"]] == [
        ("plane", "done", release),
        ("node", "done", release),
    ]
    assert {"fetching", "done"} <= seen, seen
    assert all(installed_version(ps, p) == release for p in PACKAGES)
    ps.wait_active("llmgw-agentd.service")
    assert node.main_pid("llmgw-agentd.service") != pids["llmgw-agentd.service"]
    assert node.main_pid("llmgwd.service") != pids["llmgwd.service"]
    node.wait(lambda: all(n["connected"] for n in node.llmgw("nodes", "--json")), "agent back")
    node.wait_ready(1)
    assert node.main_pid(engine) == pids[engine]
    assert chat(node)
    text = ps.run(["/usr/bin/llmgw", "upgrade", "status"]).stdout
    assert f"to {release}: done" in text, text


def _leftovers(ps: PrivateSystemd) -> list[str]:
    """Files named after llmgw that the private systemd's life made and did not remove.

    Its overlay's upper layer holds everything written there (a removed file of the host's
    is a whiteout, a character device); /run is a tmpfs of its own. Left out: the harness's
    target, the site's /usr/local, and man-db's cache of pages people read.
    """
    left = []
    for path in ps.upper.rglob("*llmgw*"):
        rel = "/" + str(path.relative_to(ps.upper))
        if path.is_char_device() or path.name == "llmgw-container.target":
            continue
        if not rel.startswith(("/usr/local/", "/var/cache/man/")):
            left.append(rel)
    run = ps.run(["find", "/run", "-name", "*llmgw*"], check=False).stdout.split()
    return sorted(left + run)


def test_remove_keeps_state_and_purge_removes_it(node: PackagedNode) -> None:
    ps = node.ps
    apt(ps, "remove", *PACKAGES)
    for unit in ("llmgwd.service", "llmgw-agentd.service"):
        assert ps.systemctl("is-active", unit, check=False).stdout.strip() != "active"
    assert node.engine_units() == []  # the engines went with the agent
    for kept in ("/etc/llmgw/server.yaml", "/etc/llmgw/agent.yaml", "/var/lib/llmgw",
                 "/var/lib/llmgw-agent"):  # fmt: skip
        assert ps.run(["test", "-e", kept], check=False).returncode == 0, f"{kept} was removed"
    assert ps.run(["test", "-e", "/usr/bin/llmgw"], check=False).returncode != 0
    apt(ps, "purge", *PACKAGES)
    assert all(installed_version(ps, p) == "" for p in PACKAGES)
    left = _leftovers(ps)
    assert left == [], "left after purge:\n" + "\n".join(left)


@pytest.fixture(scope="module")
def rpms() -> Iterator[list[Path]]:
    """The .rpm packages, built (and linted, where rpmlint is) by scripts/build-packages."""
    if shutil.which("uv") is None:
        pytest.skip("uv is not on PATH (python3 -m pip install uv)")
    if shutil.which("rpmbuild") is None and os.geteuid() == 0 and shutil.which("apt-get"):
        subprocess.run(["apt-get", "install", "-y", "--no-install-recommends", "rpm"],
                       capture_output=True, env={**os.environ, **APT}, timeout=600,
                       check=False)  # fmt: skip
    if shutil.which("rpmbuild") is None:
        pytest.skip("needs rpmbuild (apt-get install rpm)")
    out = TEST_BASE / f"rpms-{os.getpid()}"
    cmd = [str(REPO / "scripts/build-packages"), "--rpm", "--out", str(out)]
    cmd += [] if shutil.which("rpmlint") else ["--no-lint"]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
        assert r.returncode == 0, f"build-packages --rpm failed:\n{r.stderr[-4000:]}"
        found = sorted(out.glob("*.rpm"))
        assert {p.name.rsplit("-", 2)[0] for p in found} == set(PACKAGES)
        yield found
    finally:
        shutil.rmtree(out, ignore_errors=True)


def test_rpm_payload_installs_and_serves(rpms: list[Path], make_systemd: MakeSystemd) -> None:
    """The RHEL 9 packages' files and scriptlets, on this Debian (python3.11 is here too):
    sysusers and tmpfiles run, the environment (wheels for RHEL's glibc 2.34, compiled
    for 3.11) runs both daemons under systemd, and erase keeps the cluster's state."""
    ps = make_systemd("rpm")
    ps.run(["rm", "-f", "/usr/sbin/policy-rc.d"])
    # --nodeps: Debian's rpm has no database of the Debian packages that satisfy them.
    ps.run(["rpm", "-i", "--nodeps", *map(str, rpms)], timeout=300)
    ps.run(["touch", "/tmp/installed"])
    ps.run(["/usr/lib/llmgw/venv/bin/python3", "-I", "-c", COMPILED])
    assert ps.run(["id", "-gn", "llmgw"]).stdout.strip() == "llmgw"
    assert ps.run(["stat", "-c", "%a %U %G", "/etc/llmgw"]).stdout.split() == [
        "750", "root", "llmgw"]  # fmt: skip
    for installed, source in SHIPPED:
        assert ps.read_file(installed) == source.read_text(), installed
    ps.run(["test", "-s", GUIDE])
    units = [f"/usr/lib/systemd/system/{u}" for u in
             ("llmgwd.service", "llmgw-etcd.service", "llmgw-agentd.service",
              "llmgw-engines.slice")]  # fmt: skip
    r = ps.run(["systemd-analyze", "verify", *units], check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert ps.systemctl("is-enabled", "llmgwd.service", check=False).stdout.strip() == "disabled"
    node = PackagedNode(ps, CLIENT_PORT + 40, CLUSTER_PORT + 40)
    node.init_server()  # enables and starts both daemons, waits until both are active
    status = node.llmgw("status", "--json")
    assert status["nodes"]["total"] == 0 and status["version"]
    # No bytecode was written at run time: the package's own is current.
    assert ps.run("find /usr/lib/llmgw -newer /tmp/installed -name '*.pyc'").stdout == ""
    # Debian has no systemd-update-helper for %systemd_preun: stop them as RHEL's would.
    ps.systemctl("disable", "--now", "llmgwd.service", "llmgw-agentd.service")
    ps.run(["rpm", "-e", "--nodeps", *PACKAGES], timeout=300)
    assert ps.run(["test", "-e", "/usr/lib/llmgw"], check=False).returncode != 0
    for kept in ("/etc/llmgw/server.yaml", "/var/lib/llmgw"):
        assert ps.run(["test", "-e", kept], check=False).returncode == 0, f"{kept} was removed"


def _python312() -> str | None:
    """A Python 3.12 to stand in for Ubuntu 24.04's /usr/bin/python3.12, if one is here."""
    found = shutil.which("python3.12")
    if found and "/shims/" not in found:  # a pyenv shim would run pyenv's default instead
        return found
    pyenv = sorted(Path.home().glob(".pyenv/versions/3.12*/bin/python3.12"))
    return str(pyenv[-1]) if pyenv else None


def test_environment_builds_for_python_3_12(tmp_path: Path) -> None:
    """The environment is made per target Python: one for 3.12 (Ubuntu 24.04) made on this
    3.11 host holds 3.12's wheels (numpy's are not 3.11's either) and imports under 3.12."""
    if shutil.which("uv") is None:
        pytest.skip("uv is not on PATH (python3 -m pip install uv)")
    python = _python312()
    if python is None:
        pytest.skip("no Python 3.12 here to run the environment with (Ubuntu 24.04 has one)")
    root = tmp_path / "root"
    # This host's glibc, not Ubuntu's 2.39: the wheels must load here to be tried.
    subprocess.run([sys.executable, str(REPO / "packaging/venv.py"), "--dest", str(root),
                    "--lists", str(tmp_path / "lists"), "--python", python,
                    "--python-version", "3.12"], check=True, timeout=600)  # fmt: skip
    venv = root / "usr/lib/llmgw/venv"
    assert [p.name for p in (venv / "lib").iterdir()] == ["python3.12"]
    assert list((venv / "lib/python3.12/site-packages").glob("*.cpython-312-*.so"))
    r = subprocess.run([str(venv / "bin/python3"), "-I", "-c",
                        "import sys, llmgw.cli.main, llmgwd.main, llmgw_agentd.main, uvloop;"
                        "print(sys.version_info[:2], sys.prefix)"],
                       capture_output=True, text=True, check=False)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("(3, 12)") and r.stdout.split()[-1] == str(venv)
