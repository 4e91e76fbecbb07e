"""llmgw-etcd.service as installed: a member from the config llmgwd.planes.etcd_member writes, run
as llmgw under the unit's hardening, ready by sd_notify, clients on 127.0.0.1:7720 only
and with a cluster certificate only, and llmgwd's store on it."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from integration.harness import REPO, MakeSystemd, PrivateSystemd, install_units
from llmgw import pki
from llmgwd.planes import etcd_member

ETCD = Path("/usr/bin/etcd")
STATE = "/var/lib/llmgw"
PKI = f"{STATE}/pki"
VENV_PY = REPO / ".venv" / "bin" / "python"

pytestmark = pytest.mark.skipif(not ETCD.exists(), reason="etcd is not installed (/usr/bin/etcd)")


def _write_member(ps: PrivateSystemd, tmp: Path) -> None:
    """The CA (as llmgwd makes it), the etcd certificates and etcd.yaml (as join would)."""
    pki_dir = tmp / "pki"
    pki.write_pair(pki.make_ca(), pki_dir / etcd_member.CA_CERT, pki_dir / etcd_member.CA_KEY)
    etcd_member.ensure_certs(pki_dir, "cp1", "127.0.0.1")
    for f in sorted(pki_dir.iterdir()):
        ps.write_file(f"{PKI}/{f.name}", f.read_text(), 0o600 if f.suffix == ".key" else 0o644)
    ps.run(["chown", "-R", "llmgw:llmgw", STATE])
    ps.run(["chmod", "0700", PKI])
    config = tmp / "etcd.yaml"
    etcd_member.write_member_config(
        config,
        name="cp1",
        advertise_ip="127.0.0.1",
        initial_cluster={"cp1": etcd_member.peer_url("127.0.0.1")},
        state="new",
        state_dir=Path(STATE),
    )
    ps.write_file(str(etcd_member.CONFIG_PATH), config.read_text())


def _curl(ps: PrivateSystemd, path: str, body: str, cert: str = f"{PKI}/etcd-client") -> str:
    cmd = (
        f"curl -sS --cacert {PKI}/ca.pem --cert {cert}.pem --key {cert}.key "
        f"https://127.0.0.1:7720{path} -d {shlex.quote(body)}"
    )
    return ps.run(cmd, check=False).stdout


def test_the_unit_runs_a_member_for_llmgwd(make_systemd: MakeSystemd, tmp_path: Path) -> None:
    ps = make_systemd("etcd", net=True)
    install_units(ps)
    _write_member(ps, tmp_path)
    ps.systemctl("start", "llmgw-etcd.service")  # Type=notify: returns once it is ready
    ps.wait_active("llmgw-etcd.service")
    assert ps.run(["ps", "-o", "user=", "-C", "etcd"]).stdout.split() == ["llmgw"]
    listening = ps.run(["ss", "-Hltn"]).stdout
    assert "127.0.0.1:7720" in listening and "127.0.0.1:7721" in listening
    assert "0.0.0.0:7720" not in listening and "*:7720" not in listening
    assert ps.run(["stat", "-c", "%a %U", f"{STATE}/etcd"]).stdout.split() == ["700", "llmgw"]
    assert '"revision"' in _curl(ps, "/v3/kv/put", '{"key":"YQ==","value":"MQ=="}')
    # A client without a certificate from the cluster CA gets no answer.
    stranger = pki.make_etcd_cert(pki.make_ca("stranger"), "intruder")
    ps.write_file("/root/stranger.pem", stranger.cert_pem.decode())
    ps.write_file("/root/stranger.key", stranger.key_pem.decode(), 0o600)
    assert _curl(ps, "/v3/kv/range", '{"key":"YQ=="}', cert="/root/stranger") == ""
    # llmgwd's own opening of the store, as llmgw with server.yaml's `store:` section.
    script = (
        "import asyncio, pathlib; from llmgw import config; from llmgwd.store.open import "
        "open_store\nasync def main():\n"
        "    cfg = config.parse('store:\\n  backend: etcd\\n', config.ServerConfig)\n"
        f"    s = await open_store(cfg, pathlib.Path('{STATE}'))\n"
        "    print((await s.get('a')).value.decode()); await s.close()\n"
        "asyncio.run(main())"
    )
    out = ps.run(["setpriv", "--reuid=llmgw", "--regid=llmgw", "--clear-groups",
                  str(VENV_PY), "-c", script])  # fmt: skip
    assert out.stdout.strip() == "1"
    exposure = ps.run(["systemd-analyze", "security", "--no-pager", "llmgw-etcd.service"])
    print(exposure.stdout.strip().splitlines()[-1])
    ps.systemctl("stop", "llmgw-etcd.service")
    assert ps.systemctl("is-active", "llmgw-etcd.service", check=False).stdout.strip() in (
        "inactive",
        "failed",
    )
