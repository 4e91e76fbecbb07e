"""The agent reads a join refusal's reason from the cluster port's one error body."""

from __future__ import annotations

from llmgw.errors import cluster_error
from llmgw_agentd.link import _reason


def test_the_refusal_says_the_cluster_ports_reason() -> None:
    body = cluster_error(403, "this join token was used already", "token_used").body
    assert isinstance(body, bytes)
    assert _reason(body) == "this join token was used already"


def test_a_body_of_another_shape_gives_no_reason() -> None:
    assert _reason(b"<html>bad gateway</html>") == "no reason given"
    assert _reason(b'{"detail": "nope"}') == "no reason given"
