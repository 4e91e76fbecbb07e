"""What `llmgw server join` and `migrate` share: systemctl, and the address etcd peers use."""

from __future__ import annotations

import ipaddress
import subprocess
from urllib.parse import urlsplit

import click

from llmgw.cli.common import Refused
from llmgw.cli.server import main_ip

ETCD_UNIT = "llmgw-etcd.service"
LLMGWD_UNIT = "llmgwd.service"


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
    """Refused unless llmgwd is installed here (a control plane's host)."""
    try:
        import llmgwd  # noqa: F401
    except ImportError:
        raise Refused("llmgwd is not installed on this host: install the llmgwd package") from None
