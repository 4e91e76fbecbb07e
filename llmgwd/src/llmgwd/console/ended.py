"""Sessions signed out before their cookie's end: each kept in the store every control plane
shares, by its random id, until that end (a lease of the cookie's remaining life, so the store
sweeps it and the records stay bounded), and looked up on each request (one read, no cache:
sign-out holds on every plane at once)."""

from __future__ import annotations

import time

from llmgwd.console.session import Session
from llmgwd.store import Store

ENDED = "/console/ended/"  # + a session's id: signed out


async def end(store: Store, session: Session, now: float | None = None) -> None:
    """Record session as ended until its cookie would have expired."""
    left = session.expires - (time.time() if now is None else now)
    lease = await store.lease_grant(max(left, 1.0))
    await store.put(ENDED + session.sid, b"1", lease=lease)


async def ended(store: Store, session: Session) -> bool:
    """Whether session was signed out."""
    return await store.get(ENDED + session.sid) is not None
