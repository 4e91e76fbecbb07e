"""/api/v1's control planes: a token for a new one, as GET /planes shows them, and one taken
out."""

from __future__ import annotations

from typing import Literal

import msgspec

TOKEN_TTL_S = 900  # a control plane joins within minutes of its token being made


class PlaneTokenIn(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """POST /planes/tokens"""

    ttl_s: int = TOKEN_TTL_S


class RemoveIn(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """POST /planes/leave and DELETE /planes/{name}"""

    force: bool = False


# GET /planes, POST /planes/leave, DELETE /planes/{name}: the control planes.
Health = Literal["healthy", "unreachable", "not started", "no member"]


class PlaneView(msgspec.Struct, frozen=True, kw_only=True):
    """One control plane, as GET /planes shows it."""

    name: str
    url: str = ""  # its cluster port, from its record ("" when it has none: not running)
    member: str = ""  # its etcd member's id, hex ("" without one)
    peer_url: str = ""
    health: Health = "no member"
    role: str = ""  # "leader", "standby", or "" when it runs no llmgwd now
    learner: bool = False  # its member is a learner: joined, not yet promoted to a voter
    self: bool = False  # the control plane that answered
    version: str = ""  # its llmgwd's release ("": not running, or older than this field)


class PlaneRemoved(msgspec.Struct, kw_only=True):
    """POST /planes/leave, DELETE /planes/{name}: the control plane taken out."""

    name: str
    member: str  # its etcd member's id, hex
    removed: bool
