"""What `llmgw plane join` and `migrate` share with llmgwd's side of them (`llmgwd join`,
`llmgwd migrate`): systemctl, the address etcd peers use, and running llmgwd."""

from __future__ import annotations

import importlib.util
import ipaddress
import os
import subprocess
import sys
from urllib.parse import urlsplit

import click

from llmgw.cli.common import Refused
from llmgw.cli.plane import main_ip

ETCD_UNIT = "llmgw-etcd.service"
LLMGWD_UNIT = "llmgwd.service"
# What /usr/bin/llmgwd runs (packaging/venv.py), with the host-side step's arguments.
LLMGWD_MAIN = "from llmgwd.main import main; main()"


def systemctl(*args: str) -> None:
    """Run systemctl; its complaint becomes ours."""
    res = subprocess.run(["systemctl", *args], capture_output=True, text=True, check=False)
    if res.returncode != 0:
        why = res.stderr.strip() or f"exit status {res.returncode}"
        raise Refused(f"systemctl {' '.join(args)} failed: {why}")


def progress(message: str) -> None:
    """One step, on stderr."""
    click.echo(message, err=True)


def peer_ip(given: str | None, advertise: str) -> str:
    """The address this host's etcd member is reached at by its peers: --peer-ip, else the
    advertised host when it is an address, else the main IP."""
    for candidate in (given, urlsplit(advertise).hostname, main_ip()):
        if not candidate:
            continue
        try:
            return str(ipaddress.ip_address(candidate))
        except ValueError:
            if candidate == given:
                why = f"{given!r} is not an IP address"
                raise click.BadParameter(why, param_hint="--peer-ip") from None
    raise Refused("cannot tell this host's address: give it with --peer-ip")


def need_llmgwd() -> None:
    """Refused unless llmgwd is installed here (a control plane's host), beside this CLI."""
    if importlib.util.find_spec("llmgwd") is None:
        raise Refused(
            "llmgwd is not installed on this host: install the llmgwd package (this command "
            "runs its host-side steps, `llmgwd join` and `llmgwd migrate`)"
        )


def run_llmgwd(args: list[str], env: dict[str, str] | None = None) -> None:
    """Run `llmgwd ARGS` (a host-side step) in this CLI's own Python environment, where the
    llmgwd package installs itself, its output ours; a status other than 0 becomes ours.
    env: more environment (a secret goes there, never on a command line others can read)."""
    need_llmgwd()
    command = [sys.executable, "-I", "-c", LLMGWD_MAIN, *args]
    done = subprocess.run(command, env={**os.environ, **(env or {})}, check=False)
    if done.returncode != 0:
        raise SystemExit(done.returncode)  # llmgwd said why on stderr
