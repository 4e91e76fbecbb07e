"""Where a node's engines listen: the link's own end, or loopback beside the control plane."""

from __future__ import annotations

import pytest

from llmgw_agentd.link import engine_address


@pytest.mark.parametrize(
    ("sockname", "peername", "address"),
    [
        (("127.0.0.1", 40000), ("127.0.0.1", 7710), "127.0.0.1"),  # joined over loopback
        (("10.0.0.5", 40000), ("10.0.0.5", 7710), "127.0.0.1"),  # to its own address
        (("10.0.0.5", 40000), ("10.0.0.1", 7710), "10.0.0.5"),  # a node of a cluster
        (("::ffff:10.0.0.5", 40000, 0, 0), ("::ffff:10.0.0.1", 7710, 0, 0), "10.0.0.5"),
        (("fd00::5", 40000, 0, 0), ("fd00::1", 7710, 0, 0), "fd00::5"),
        (("::1", 40000, 0, 0), ("::1", 7710, 0, 0), "::1"),
        (None, None, ""),  # the socket does not say: the control plane uses the peer address
    ],
)
def test_engines_listen_on_the_links_own_end(
    sockname: object, peername: object, address: str
) -> None:
    assert engine_address(sockname, peername) == address
    assert address != "0.0.0.0"
