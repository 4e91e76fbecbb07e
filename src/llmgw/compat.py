"""What runs together in a mixed cluster: an agent's wire protocol against its control plane's,
and the store's schema against an llmgwd's; each refusal names both versions.

The order of an upgrade follows: the control planes first, one at a time and the leader last,
then the nodes (what `llmgw upgrade start` plans). An old control plane refuses an agent of a
newer protocol, so an agent upgraded before every control plane cannot connect until they are.
"""

from __future__ import annotations

from llmgw import wire

# The rule (DESIGN.md, "Versions and a mixed cluster"):
# - an agent one release behind its control planes keeps working: a control plane takes the
#   protocols wire.OLDEST_AGENT_PROTOCOL..wire.PROTOCOL; an older agent, or one newer than
#   the control plane (agents are upgraded after every control plane: a release that raises
#   PROTOCOL upgrades no node before the last control plane), is refused;
# - control planes of two adjacent releases run together on one store: a release reads the
#   schema of the release before it and its own, and the store's schema is raised only once
#   every joined control plane (running or not: a stopped one may come back on the old
#   release) writes the new one, so an old one never meets data it cannot read; a store
#   whose schema is newer than an llmgwd's is refused by that llmgwd.


def agent_refusal(
    agent_protocol: int,
    agent_version: str,
    plane_version: str,
    *,
    protocol: int | None = None,
    oldest: int | None = None,
) -> str:
    """Why a control plane of this protocol (taking agents down to oldest; wire's by default)
    refuses an agent of agent_protocol; "" when it takes it."""
    protocol = wire.PROTOCOL if protocol is None else protocol
    oldest = wire.OLDEST_AGENT_PROTOCOL if oldest is None else oldest
    agent = f"llmgw-agentd {agent_version or '(unknown)'} (wire protocol {agent_protocol})"
    plane = f"llmgwd {plane_version} (wire protocol {protocol})"
    if agent_protocol > protocol:
        return (
            f"{agent} is newer than this control plane, {plane}: upgrade the control planes "
            "first, one at a time and the leader last (`llmgw upgrade start` keeps that order), "
            "then the nodes; upgrade every control plane now, or put this node's llmgw-agentd "
            f"back to {plane_version}"
        )
    if agent_protocol < oldest:
        return (
            f"{agent} is too old for {plane}, which takes agents of protocol {oldest} to "
            f"{protocol} (one release behind at most): upgrade this node's llmgw-agentd"
        )
    return ""


def schema_refusal(
    stored: int, stored_by: str, schema: int, oldest: int, plane_version: str
) -> str:
    """Why an llmgwd that writes schema (and reads down to oldest) refuses a store of schema
    stored, written by llmgwd stored_by; "" when it can run on it."""
    store = f"the store's schema is {stored} (written by llmgwd {stored_by or '(unknown)'})"
    if stored > schema:
        return (
            f"{store}, newer than this llmgwd {plane_version} reads (schema {schema}): install "
            f"llmgwd {stored_by or 'of that release'} or newer here"
        )
    if stored < oldest:
        return (
            f"{store}, older than this llmgwd {plane_version} reads (schema {oldest} to "
            f"{schema}): upgrade through the release in between, one release at a time"
        )
    return ""
