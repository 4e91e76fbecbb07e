"""Keeps the node's nftables table in step with what the agent knows (the control planes,
Slurm on or off, the node's networks), and says how it stands; a broken or missing nftables
is logged once and reported, never a reason to stop engines."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import socket
import subprocess
from collections.abc import Callable, Sequence
from urllib.parse import urlsplit

from llmgw_agentd import firewall
from llmgw_agentd.nft import Nft, NftError

log = logging.getLogger(__name__)

CHECK_S = 15.0  # how often what the table is made from is looked at again


def addresses(urls: Sequence[str]) -> tuple[str, ...]:
    """The IP addresses the control planes' URLs name (host names resolved; one that does
    not resolve now is left out until it does)."""
    out: set[str] = set()
    for url in urls:
        host = urlsplit(url).hostname
        if not host:
            continue
        try:
            infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
        except OSError as e:
            log.debug("cannot resolve %s: %s", host, e)
            continue
        out.update(str(ipaddress.ip_address(str(i[4][0]).partition("%")[0])) for i in infos)
    return tuple(sorted(out))


def networks() -> tuple[str, ...]:
    """The networks of the node's own global addresses (`ip -json address`): the cluster's,
    as far as this node sees it."""
    try:
        text = subprocess.run(
            ["ip", "-json", "address", "show"], capture_output=True, text=True, check=True,
            timeout=10,
        ).stdout  # fmt: skip
        links = json.loads(text)
    except (OSError, subprocess.SubprocessError, ValueError) as e:
        log.warning("cannot list this node's addresses: %s", e)
        return ()
    out: set[str] = set()
    for link in links:
        for a in link.get("addr_info", []):
            if a.get("scope") == "global" and "local" in a and "prefixlen" in a:
                net = ipaddress.ip_interface(f"{a['local']}/{a['prefixlen']}").network
                out.add(str(net))
    return tuple(sorted(out))


class Firewall:
    """The table's keeper: applies a new table when what it is made from changes, and again
    when it went missing (a site's `nft flush ruleset`)."""

    def __init__(
        self,
        engine_ports: tuple[int, int],
        planes: Callable[[], Sequence[str]],
        nft: Callable[[], Nft] = Nft,
    ) -> None:
        self._ports = engine_ports
        self._planes = planes
        self._make_nft = nft
        self._nft: Nft | None = None
        self._applied: firewall.Wanted | None = None
        self._poked = asyncio.Event()
        self.slurm = False  # Slurm's ports restricted to the cluster's hosts (set_slurm)
        self.slurm_peers: tuple[str, ...] = ()  # those hosts; (): the node's own networks
        self.status = "not set yet"

    def poke(self) -> None:
        """Look again now (the control planes changed)."""
        self._poked.set()

    def set_slurm(self, on: bool, peers: Sequence[str] = ()) -> None:
        """Slurm runs on this node, its ports then open to peers alone (the Slurm nodes' and
        the controller's addresses; none given: the node's own networks), or it does not."""
        wanted = tuple(sorted(peers)) if on else ()
        if on != self.slurm or wanted != self.slurm_peers:
            self.slurm, self.slurm_peers = on, wanted
            self.poke()

    def wanted(self) -> firewall.Wanted:
        """What the table is to be made from now (resolves names: call it off the loop)."""
        nets = (self.slurm_peers or networks()) if self.slurm else ()
        return firewall.Wanted(self._ports, addresses(self._planes()), self.slurm, nets)

    def apply(self, wanted: firewall.Wanted) -> None:
        """Replace the table if wanted differs from what was applied or it is gone."""
        try:
            if self._nft is None:
                self._nft = self._make_nft()
            if wanted == self._applied and self._present(self._nft):
                return
            self._nft.run(firewall.ruleset(wanted))
        except NftError as e:
            self._applied = None
            self._report(f"nftables: {e}")
            return
        self._applied = wanted
        self._report("ok")
        log.info(
            "nftables table %s %s set: engine ports %d-%d open to %s; Slurm's ports %s",
            firewall.FAMILY, firewall.TABLE, *self._ports,
            ", ".join(("the node itself", *wanted.planes)),
            f"open to {', '.join(wanted.networks) or 'no network'}" if wanted.slurm
            else "not restricted (Slurm is off)",
        )  # fmt: skip

    def _present(self, nft: Nft) -> bool:
        try:
            nft.run({"nftables": [{"list": {"table": firewall.ref_table()}}]})
        except NftError:
            return False
        return True

    def _report(self, status: str) -> None:
        if status != self.status and status != "ok":
            log.warning("the node's firewall is not set: %s; engines run without it", status)
        self.status = status

    async def run(self) -> None:
        """Keep the table until cancelled (it stays after: a restarted agent finds it)."""
        while True:
            try:
                wanted = await asyncio.to_thread(self.wanted)
                await asyncio.to_thread(self.apply, wanted)
            except Exception:
                log.exception("keeping the node's firewall failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._poked.wait(), CHECK_S)
            self._poked.clear()
