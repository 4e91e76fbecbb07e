"""The node's Slurm set up as root outside the agent's sandbox: the agent runs this module as
the transient unit llmgw-slurm-setup.service (packages, munge's key, the controller's files,
Slurm's directories, and `slurmd -V`/`-C`, which want what the agent's unit may not do:
write /usr and /etc, change its groups). Its output is the unit's journal."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import msgspec

from llmgw.wire import SlurmPart
from llmgw_agentd.slurm import dropins, files, install, munge, report
from llmgw_agentd.slurm.cmd import SlurmError, run

UNIT = "llmgw-slurm-setup.service"
SET_UP, UNDO = "set-up", "undo"


class Done(msgspec.Struct, frozen=True):
    """What a run did and found, read back by the agent (written to its state directory)."""

    munge_changed: bool = False  # munged must restart
    files_changed: bool = False  # slurmctld must restart
    version: str = ""  # `slurmd -V`'s
    node_line: str = ""  # `slurmd -C`'s NodeName line
    removed: list[str] = []  # the files undo removed
    message: str = ""  # what failed ("": nothing)


class Where(msgspec.Struct, frozen=True):
    """Where a run writes (other roots in tests)."""

    etc: str = str(dropins.SLURM_ETC)
    munge_key: str = str(munge.KEY)
    state: str = str(files.STATE)
    record: str = "/var/lib/llmgw-agent/" + files.WRITTEN


def install_now(wanted: list[str], proxy_env: Mapping[str, str] | None = None) -> None:
    """Install wanted with this system's package manager (through the proxy proxy_env names,
    as apt-get and dnf read it), its output to the journal; SlurmError when it fails or
    there is none."""
    argvs = install.commands(wanted)
    if not argvs:
        raise SlurmError(f"{', '.join(wanted)} not installed, and no apt-get or dnf")
    env = {**os.environ, **(proxy_env or {}), "DEBIAN_FRONTEND": "noninteractive"}
    for argv in argvs:
        print(f"running {' '.join(argv)}", flush=True)
        try:
            code = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL,
                                  timeout=install.INSTALL_S).returncode  # fmt: skip
        except subprocess.TimeoutExpired:
            raise SlurmError(f"{argv[0]} ran past {install.INSTALL_S:.0f} s") from None
        if code != 0:
            raise SlurmError(f"{' '.join(argv[:2])} exited with status {code}")


def set_up(part: SlurmPart, where: Where, proxy_env: Mapping[str, str] | None = None) -> Done:
    """Everything the part wants of the system; SlurmError or OSError when a step fails."""
    missing = install.missing(part)
    if missing:
        install_now(missing, proxy_env)
    munge_changed = munge.write_key(part.munge_key, Path(where.munge_key))
    files_changed = False
    if part.slurmctld:
        files_changed = files.write(part, Path(where.etc), Path(where.record))
    files.make_dirs(part.slurmctld, Path(where.state))
    version = report.version(run(["slurmd", "-V"]))
    line = report.node_line(run(["slurmd", "-C"]))
    return Done(munge_changed, files_changed, version, line)


def undo(where: Where) -> Done:
    """Remove the files a set-up wrote that are still as it wrote them."""
    return Done(removed=files.remove(Path(where.record)))


class Order(msgspec.Struct, frozen=True):
    """What a run is to do: written by the agent, 0600 (the part holds munge's key)."""

    mode: str  # SET_UP or UNDO
    where: Where
    part: SlurmPart | None = None
    # The packages' proxy (network.proxy as http_proxy...): here, in this 0600 file, and
    # not in the unit's Environment=, which anyone on the node can read.
    proxy_env: dict[str, str] = {}


def carry_out(order: Order) -> Done:
    """Do what order says; a step that fails is Done.message."""
    try:
        if order.mode == SET_UP and order.part is not None:
            return set_up(order.part, order.where, order.proxy_env)
        return undo(order.where)
    except (SlurmError, OSError, ValueError) as e:
        return Done(message=str(e))


def main(argv: list[str]) -> int:
    """python -m llmgw_agentd.slurm.setup IN OUT: IN the Order (JSON), OUT where Done goes."""
    given, out = Path(argv[1]), Path(argv[2])
    try:
        done = carry_out(msgspec.json.decode(given.read_bytes(), type=Order))
    except (OSError, msgspec.DecodeError) as e:
        done = Done(message=f"reading {given}: {e}")
    if done.message:
        print(f"setting up Slurm failed: {done.message}", file=sys.stderr, flush=True)
    out.write_bytes(msgspec.json.encode(done))
    return 1 if done.message else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
