"""Prefix-aware choice of a replica: a hash chain of a prompt's leading blocks, remembered per
replica, and a session header that pins a conversation while its replica can take it."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
from aiohttp import web

from llmgwd.nodes.pool import Endpoint

BLOCK_CHARS = 256  # characters of serialized prompt per hashed block
MAX_BLOCKS = 256  # blocks hashed per request (64 KiB of prompt): the cost stays bounded
BLOCKS_PER_REPLICA = 16384  # blocks remembered per replica, least recently used forgotten
SESSIONS = 65536  # session ids pinned at once, least recently used forgotten
LOAD_SLACK = 2  # a cached replica is passed over when it has this many more requests in
# flight than the least busy one: no replica is flooded by the conversations it holds
SESSION_HEADER = "x-session-id"
MAX_SESSION_CHARS = 256

_encode = msgspec.json.encode


class Affinity(msgspec.Struct, frozen=True):
    """What ties a request to a replica: its session id (or "") and its prompt's block chain."""

    session: str
    chain: tuple[int, ...]


def chain(text: str) -> tuple[int, ...]:
    """The hash of each leading block of text chained with the ones before it: two prompts
    share their first n hashes exactly when they share their first n blocks."""
    hashes: list[int] = []
    h = 0
    end = min(len(text), BLOCK_CHARS * MAX_BLOCKS)
    for at in range(0, end - BLOCK_CHARS + 1, BLOCK_CHARS):
        h = hash((h, text[at : at + BLOCK_CHARS]))
        hashes.append(h)
    return tuple(hashes)


def prompt_text(doc: dict[str, Any]) -> str:
    """The prompt serialized so that a conversation's next turn extends it: tools and the
    system text first (Messages' system, Responses' instructions), then each message's role
    and content in order (chat's messages, Responses' input), or a completion's prompt."""
    parts: list[str] = []
    for lead in ("tools", "system", "instructions"):
        if value := doc.get(lead):
            parts.append(value if isinstance(value, str) else _encode(value).decode())
    messages = doc.get("messages", doc.get("input"))
    if isinstance(messages, list):
        for m in messages:
            if isinstance(m, dict):
                content = m.get("content")
                text = content if isinstance(content, str) else _encode(content).decode()
                parts.append(f"\x1e{m.get('role')}\x1f{text}")
    elif isinstance(messages, str):
        parts.append(messages)
    elif isinstance(prompt := doc.get("prompt"), str):
        parts.append(prompt)
    return "".join(parts)


def affinity_of(request: web.Request, doc: dict[str, Any]) -> Affinity:
    """The request's session header (bounded) and its prompt's block chain."""
    session = request.headers.get(SESSION_HEADER, "")[:MAX_SESSION_CHARS]
    return Affinity(session, chain(prompt_text(doc)))


class _Lru(OrderedDict[Any, Any]):
    """A bounded map that forgets its least recently used entry."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def put(self, key: Any, value: Any) -> None:
        """Set key, most recently used; the oldest goes when full."""
        self[key] = value
        self.move_to_end(key)
        if len(self) > self.size:
            self.popitem(last=False)


class PrefixIndex:
    """The blocks each replica was last sent, and the replica each session was last sent to."""

    def __init__(
        self, blocks: int = BLOCKS_PER_REPLICA, sessions: int = SESSIONS, slack: int = LOAD_SLACK
    ) -> None:
        self._blocks = blocks
        self._slack = slack
        self._replicas: dict[str, _Lru] = {}  # replica id -> its blocks' hashes
        self._known: dict[str, set[str]] = {}  # model -> ids of its replicas in _replicas
        self._sessions = _Lru(sessions)  # session id -> replica id

    def choose(
        self,
        affinity: Affinity,
        candidates: Sequence[Endpoint],
        load: Callable[[str], int],
        least: int,
    ) -> Endpoint | None:
        """The candidate pinned by the session, else the one holding the longest prefix, if
        it has at most slack more requests in flight than least; None: no such one."""
        limit = least + self._slack
        if affinity.session:
            rid = self._sessions.get(affinity.session)
            for ep in candidates:
                if ep.replica_id == rid and load(rid) <= limit:
                    return ep
        best, key = None, (0, 0)
        for ep in candidates:
            busy = load(ep.replica_id)
            if busy > limit:
                continue
            matched = self._matched(ep.replica_id, affinity.chain)
            if matched and (matched, -busy) > key:  # the longest, then the least busy
                best, key = ep, (matched, -busy)
        return best

    def remember(self, endpoint: Endpoint, affinity: Affinity) -> None:
        """endpoint was sent this prompt: its blocks are now likely in its engine's cache."""
        rid = endpoint.replica_id
        if affinity.session:
            self._sessions.put(affinity.session, rid)
        blocks = self._replicas.get(rid)
        if blocks is None:
            blocks = self._replicas[rid] = _Lru(self._blocks)
            self._known.setdefault(endpoint.model, set()).add(rid)
        for h in affinity.chain:
            blocks.put(h, None)

    def forget_gone(self, model: str, ready: Sequence[Endpoint]) -> None:
        """Drop the blocks of model's replicas that are no longer among its ready ones (a
        session pinned to one is sent elsewhere, and pinned again there)."""
        known = self._known.get(model)
        if not known:
            return
        gone = known.difference([ep.replica_id for ep in ready])
        for rid in gone:
            del self._replicas[rid]
            known.discard(rid)

    def held(self, replica_id: str, affinity: Affinity) -> int:
        """How many leading blocks of affinity's prompt replica_id is thought to hold."""
        return self._matched(replica_id, affinity.chain)

    def _matched(self, rid: str, hashes: tuple[int, ...]) -> int:
        """How many leading blocks of hashes the replica was sent."""
        blocks = self._replicas.get(rid)
        if not blocks:
            return 0
        n = 0
        for h in hashes:
            if h not in blocks:
                break
            n += 1
        return n
