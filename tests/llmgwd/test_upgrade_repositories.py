"""`llmgw upgrade --from-repositories` on the cluster port: an agent that does not say it
installs from its repositories is not sent an Upgrade it would take as "fetch nothing"."""

from __future__ import annotations

from pathlib import Path

import aiohttp

from llmgw import wire
from llmgw_agentd.link import link_ssl_context
from tests.llmgwd.test_cluster import INVENTORY, Cluster, eventually
from tests.llmgwd.test_cluster import cluster as cluster  # a fixture
from tests.llmgwd.test_cluster_members import joined

FROM_REPOS = wire.Upgrade("r1", 1, "0.2.0", [], from_repositories=True)


async def _upgrade_sent(c: Cluster, pki_dir: Path, name: str, repositories: bool) -> str:
    """What send_upgrade says for an agent registered with these flags; "" and the Upgrade
    received by the agent where it was sent."""
    register = wire.Register(name, "127.0.0.1", "0.1.0", INVENTORY, upgrades=True,
                             repository_upgrades=repositories)  # fmt: skip
    async with aiohttp.ClientSession() as s:
        ctx = link_ssl_context(pki_dir)
        async with s.ws_connect(f"{c.url}/agent", ssl=ctx) as ws:
            await ws.send_bytes(wire.encode(register))
            await eventually(lambda: c.state.connected() == [name])
            why = c.state.send_upgrade(name, FROM_REPOS)
            while not why:
                msg = wire.decode_server((await ws.receive(timeout=5)).data)
                if isinstance(msg, wire.Upgrade):
                    assert msg == FROM_REPOS
                    break
            return why


async def test_an_agent_not_saying_it_installs_from_repositories_is_not_sent_one(
    cluster: Cluster, tmp_path: Path
) -> None:
    d = await joined(cluster, tmp_path, "n1")
    why = await _upgrade_sent(cluster, d, "n1", repositories=False)
    assert why.startswith("its llmgw-agentd 0.1.0 cannot install from the repositories")
    await eventually(lambda: cluster.state.connected() == [])
    assert await _upgrade_sent(cluster, d, "n1", repositories=True) == ""
