"""`llmgw upgrade --from-repositories` on a node: run in the install unit, it installs the
node's llmgw packages at one version from its own apt or dnf repositories, the proxy read
from a 0600 order file (never the unit's Environment=, which anyone on the node can read)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence

import msgspec

from llmgw import wire

APT = "/usr/bin/apt-get"
DNF = "/usr/bin/dnf"
# No question asked, a changed configuration file kept; only a package already installed.
APT_INSTALL = (APT, "install", "-y", "--only-upgrade", "-o", "Dpkg::Options::=--force-confold")
DNF_INSTALL = (DNF, "install", "-y", "--refresh")

Run = Callable[[Sequence[str], Mapping[str, str]], int]


class Order(msgspec.Struct, frozen=True):
    """What the unit is to install: written 0600 by the agent (the proxy may hold a password)."""

    kind: str  # "deb" or "rpm"
    names: list[str]  # the llmgw packages installed on the node
    version: str
    proxy_env: dict[str, str] = {}


def commands(kind: str, names: Sequence[str], version: str) -> list[list[str]]:
    """apt-get update, then apt-get install --only-upgrade PKG=VERSION...; or dnf install
    PKG-VERSION...; ValueError for a version or a name that could be read as anything else."""
    if not wire.repository_version_ok(version):
        raise ValueError(f"not a package version: {version[:80]!r}")
    bad = [n for n in names if not n.startswith("llmgw") or not n.replace("-", "").isalnum()]
    if bad or not names:
        raise ValueError(f"not llmgw packages: {', '.join(bad) or 'none'}")
    if kind == "deb":
        return [[APT, "update"], [*APT_INSTALL, *(f"{n}={version}" for n in names)]]
    if kind == "rpm":
        return [[*DNF_INSTALL, *(f"{n}-{version}" for n in names)]]
    raise ValueError(f"no package manager for {kind!r}")


def _run(argv: Sequence[str], env: Mapping[str, str]) -> int:
    print(f"running {' '.join(argv)}", flush=True)
    return subprocess.run(list(argv), env=dict(env), stdin=subprocess.DEVNULL).returncode


def carry_out(order: Order, run: Run = _run) -> int:
    """Each command in turn; the first that fails ends it with its status (1: refused)."""
    try:
        argvs = commands(order.kind, order.names, order.version)
    except ValueError as e:
        print(e, file=sys.stderr, flush=True)
        return 1
    env = {**os.environ, **order.proxy_env}
    if order.kind == "deb":
        env["DEBIAN_FRONTEND"] = "noninteractive"
    for argv in argvs:
        code = run(argv, env)
        if code != 0:
            print(f"{' '.join(argv[:2])} exited with status {code}", file=sys.stderr, flush=True)
            return code
    return 0


def main(argv: list[str]) -> int:
    """python -m llmgw_agentd.upgrade_repo ORDER: the order (JSON) carried out."""
    try:
        with open(argv[1], "rb") as f:
            order = msgspec.json.decode(f.read(), type=Order)
        os.unlink(argv[1])  # the proxy's password kept no longer than needed
    except (OSError, IndexError, msgspec.DecodeError) as e:
        print(f"reading the order: {e}", file=sys.stderr, flush=True)
        return 1
    return carry_out(order)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
