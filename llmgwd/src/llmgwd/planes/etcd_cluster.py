"""The store's etcd cluster as the control planes' commands see it: members listed, added and
removed through this host's member (etcd's JSON gateway), and each member's health from it."""

from __future__ import annotations

import re
import ssl

import aiohttp

from llmgwd.planes.listing import Member
from llmgwd.store.etcd_http import EtcdError, EtcdHttp, EtcdUnavailable, Json

HEALTH_TIMEOUT_S = 3.0
FAILED_PRECONDITION = 9  # etcd's code for a learner not yet in sync (and for a voter)
# The member's own metric of its peers: 1 while the connection to that peer is up.
_ACTIVE = re.compile(r'etcd_network_active_peers\{Local="([0-9a-f]+)",Remote="([0-9a-f]+)"\} (\S+)')


def _member(data: Json) -> Member:
    urls = data.get("peerURLs") or []
    return Member(
        id=int(str(data.get("ID", "0"))),
        name=str(data.get("name", "")),
        peer_urls=[str(u) for u in urls] if isinstance(urls, list) else [],
        learner=bool(data.get("isLearner", False)),
    )


def _members(answer: Json) -> list[Member]:
    found = answer.get("members") or []
    return [_member(m) for m in found if isinstance(m, dict)] if isinstance(found, list) else []


def active_peers(metrics: str) -> dict[int, bool]:
    """{peer id: connected} from a member's /metrics text."""
    return {int(remote, 16): float(value) >= 1 for _, remote, value in _ACTIVE.findall(metrics)}


class EtcdCluster:
    """Membership through one member's client URL (this host's)."""

    def __init__(self, client: EtcdHttp, tls: ssl.SSLContext | None) -> None:
        self._client = client
        self._tls = tls

    async def members(self) -> list[Member]:
        """Every member, as the cluster lists it now (linearizable)."""
        return _members(await self._client.call("/v3/cluster/member/list", {"linearizable": True}))

    async def add(self, peer_url: str) -> list[Member]:
        """Add a learner at peer_url (it counts toward no quorum until promoted); every member
        after (the new one unnamed until it starts)."""
        body = {"peerURLs": [peer_url], "isLearner": True}
        return _members(await self._client.call("/v3/cluster/member/add", body))

    async def promote(self, member_id: int) -> bool:
        """Make a learner a voting member: False while it has not caught up with the leader
        (etcd refuses then; a voter is refused the same way)."""
        try:
            await self._client.call("/v3/cluster/member/promote", {"ID": str(member_id)})
        except EtcdError as e:
            if e.code == FAILED_PRECONDITION and "in sync" in e.message:
                return False
            raise
        return True

    async def remove(self, member_id: int) -> None:
        """Take a member out of the cluster."""
        await self._client.call("/v3/cluster/member/remove", {"ID": str(member_id)})

    async def healthy(self) -> dict[int, bool]:
        """This member healthy (its /health), each peer by whether this member reaches it."""
        try:
            status = await self._client.call("/v3/maintenance/status", {})
            health = await self._get("/health")
            metrics = await self._get("/metrics")
        except EtcdUnavailable:
            return {}
        peers = active_peers(metrics)
        header = status.get("header") or {}
        peers[int(str(header.get("member_id", "0")))] = '"health":"true"' in health.replace(" ", "")
        return peers

    async def _get(self, path: str) -> str:
        timeout = aiohttp.ClientTimeout(total=HEALTH_TIMEOUT_S)
        url = self._client.endpoint + path
        try:
            async with (
                aiohttp.ClientSession(timeout=timeout) as s,
                s.get(url, ssl=self._tls or False) as r,
            ):
                return await r.text()
        except (aiohttp.ClientError, TimeoutError) as e:
            raise EtcdUnavailable(self._client.endpoint, type(e).__name__) from None
