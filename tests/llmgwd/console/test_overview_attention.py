"""The overview's "needs attention" list as a browser reads it: a node lost, and a disk used over
90 % (as the node's agent last reported it in its inventory) named with its node; a disk under
that, or a node reporting no disks, is not listed."""

from __future__ import annotations

import re
from html import unescape

from llmgw import wire
from llmgwd.api.base import ClusterNodes, NodeInfo
from llmgwd.nodes import state
from tests.llmgwd.console.console_site import Browser, serving

GIB = 1 << 30
# The agent's state directory and /, as llmgw_agentd.inventory.disks reports them.
FULL = [
    wire.Disk("/var/lib/llmgw-agent", 1000 * GIB, 50 * GIB),
    wire.Disk("/", 100 * GIB, 40 * GIB),
]
ROOMY = [wire.Disk("/var/lib/llmgw-agent", 1000 * GIB, 110 * GIB)]  # 89 % used
# Its nftables table as llmgw_agentd.fwkeep reports one it could not set.
NFT_REFUSED = "nftables: Error: Could not process rule: Operation not permitted"


def disk_nodes() -> list[NodeInfo]:
    """As GET /api/v1/nodes shows them (ClusterNodes over the cluster state's records): full-1
    with its state directory's disk 95 % used and its firewall refused, roomy with 89 % and its
    firewall set, bare lost and reporting neither."""
    inventories = {"full-1": (FULL, NFT_REFUSED), "roomy": (ROOMY, "ok"), "bare": ([], "")}
    records = [
        state.NodeInfo(
            name=name,
            address="10.0.0.9",
            version="0.9.1",
            replicas=(),
            desired=None,
            inventory=wire.Inventory(
                cores=8, memory_bytes=64 * GIB, memory_free_bytes=GIB, disks=disks, firewall=fw
            ),
            connected=name != "bare",
            last_seen=1_760_000_000.0,
        )
        for name, (disks, fw) in inventories.items()
    ]
    return ClusterNodes(lambda: records).nodes()


def listed(html: str) -> list[tuple[str, str]]:
    """The attention list's items: (where, what)."""
    part = html.split('<ul class="attention">', 1)[1].split("</ul>", 1)[0]
    items = re.findall(r"<li><strong>(.*?)</strong>: (.*?)</li>", part)
    return [(unescape(w), unescape(t)) for w, t in items]


async def test_a_disk_over_90_percent_used_needs_attention_one_under_does_not() -> None:
    async with serving() as site:
        site.nodes.items = disk_nodes()
        browser = Browser(site)
        try:
            await browser.sign_in("viewer")
            r, html = await browser.get("/console/")
        finally:
            await browser.close()
    assert r.status == 200
    assert listed(html) == [
        ("bare", "node lost: not connected"),
        ("full-1", "disk /var/lib/llmgw-agent 95% full, 50.0 GiB free of 1000.0 GiB"),
    ]


async def test_with_every_disk_under_90_percent_nothing_needs_attention() -> None:
    async with serving() as site:
        site.nodes.items = [n for n in disk_nodes() if n.name == "roomy"]
        browser = Browser(site)
        try:
            await browser.sign_in("viewer")
            _, html = await browser.get("/console/")
        finally:
            await browser.close()
    assert '<ul class="attention">' not in html
    assert re.search(r'<h2 id="h-attention">Needs attention</h2>\s*<p>Nothing.</p>', html)
