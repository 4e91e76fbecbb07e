"""One agent's WebSocket on the cluster port, and the messages sent on it whole and in order."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

from aiohttp import WSCloseCode, web

from llmgw import wire


@dataclass(eq=False)
class AgentConn:
    """One agent's WebSocket and the lock that keeps its sends whole and in order."""

    node: str
    ws: web.WebSocketResponse
    peer: str
    serial: str  # of the certificate the connection was admitted with
    key: bytes  # that certificate's public key (SubjectPublicKeyInfo, DER)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


async def send(conn: AgentConn, msg: wire.ServerMessage) -> None:
    """Send msg to the agent; a connection lost meanwhile is no error."""
    async with conn.lock:
        with contextlib.suppress(ConnectionError, RuntimeError):  # the node is lost anyway
            await conn.ws.send_bytes(wire.encode(msg))


def not_leader_reason(leader_url: str) -> str:
    """What a standby answers an agent."""
    if leader_url:
        return f"this control plane is not the leader; the leader is {leader_url}"
    return "this control plane is not the leader, and no leader is known now; try the others"


async def refuse(conn: AgentConn, reason: str, leader: str | None = None) -> None:
    """Send Refused and close; leader not None: a standby's refusal, naming the leader."""
    msg = wire.Refused(reason, leader=leader or "", standby=leader is not None)
    async with conn.lock:
        with contextlib.suppress(ConnectionError, RuntimeError):
            await conn.ws.send_bytes(wire.encode(msg))
    await conn.ws.close(code=WSCloseCode.POLICY_VIOLATION, message=b"refused")
