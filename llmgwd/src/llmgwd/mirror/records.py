"""The mirror's records in the store: snapshots (a repository at a commit), refs and peers."""

from __future__ import annotations

import msgspec

from llmgwd.mirror.snapshot import Snapshot
from llmgwd.store import Store, prefix_end

SNAPSHOTS = "/mirror/snapshots/"  # + ORG/REPO@COMMIT
REFS = "/mirror/refs/"  # + ORG/REPO@REV -> the commit it named when last resolved
PEERS = "/mirror/peers/"  # + the peer's URL, quoted by the store key's rules below


class Peer(msgspec.Struct, frozen=True, kw_only=True):
    """Another mirror this one copies from: its hub endpoint and the file with its token."""

    url: str  # https://HOST:7700/hf
    token_file: str = ""
    added_at: float = 0.0
    last_sync: float = 0.0
    last_error: str = ""


_snap_dec = msgspec.json.Decoder(Snapshot)
_peer_dec = msgspec.json.Decoder(Peer)
_enc = msgspec.json.Encoder()


class Records:
    """Snapshots, refs and peers: read from the store at start, then kept in memory with
    every write going through the store first (by the control plane asked); another control
    plane reads them again when it gets a set from the others (Mirror._obtain)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._snaps: dict[str, Snapshot] = {}
        self._refs: dict[str, str] = {}
        self._peers: dict[str, Peer] = {}

    async def load(self) -> None:
        """Read every record."""
        kvs, _ = await self._store.range(SNAPSHOTS, prefix_end(SNAPSHOTS))
        self._snaps = {kv.key[len(SNAPSHOTS) :]: _snap_dec.decode(kv.value) for kv in kvs}
        kvs, _ = await self._store.range(REFS, prefix_end(REFS))
        self._refs = {kv.key[len(REFS) :]: kv.value.decode() for kv in kvs}
        kvs, _ = await self._store.range(PEERS, prefix_end(PEERS))
        peers = [_peer_dec.decode(kv.value) for kv in kvs]
        self._peers = {p.url: p for p in peers}

    # Reads.

    def snapshot(self, repo: str, commit: str) -> Snapshot | None:
        """The snapshot of repo at a commit."""
        return self._snaps.get(f"{repo}@{commit}")

    def ref(self, repo: str, revision: str) -> str | None:
        """The commit a branch or tag named when it was last resolved here."""
        return self._refs.get(f"{repo}@{revision}")

    def snapshots(self) -> list[Snapshot]:
        """Every snapshot, by repository and commit."""
        return [self._snaps[k] for k in sorted(self._snaps)]

    def refs_of(self, repo: str) -> dict[str, str]:
        """A repository's refs: revision -> commit."""
        head = f"{repo}@"
        return {k[len(head) :]: c for k, c in self._refs.items() if k.startswith(head)}

    def peers(self) -> list[Peer]:
        """Every peer, by URL."""
        return [self._peers[u] for u in sorted(self._peers)]

    # Writes.

    async def put_snapshot(self, snap: Snapshot, revision: str = "") -> None:
        """Record a snapshot (and the ref that named it, when it was not a commit)."""
        key = f"{snap.repo}@{snap.commit}"
        await self._store.put(SNAPSHOTS + key, _enc.encode(snap))
        self._snaps[key] = snap
        if revision and revision != snap.commit:
            await self.put_ref(snap.repo, revision, snap.commit)

    async def put_ref(self, repo: str, revision: str, commit: str) -> None:
        """Record that a branch or tag names a commit."""
        await self._store.put(f"{REFS}{repo}@{revision}", commit.encode())
        self._refs[f"{repo}@{revision}"] = commit

    async def drop_snapshot(self, repo: str, commit: str) -> None:
        """Forget a snapshot and every ref naming it."""
        key = f"{repo}@{commit}"
        await self._store.delete(SNAPSHOTS + key)
        self._snaps.pop(key, None)
        for rev, c in self.refs_of(repo).items():
            if c == commit:
                await self._store.delete(f"{REFS}{repo}@{rev}")
                self._refs.pop(f"{repo}@{rev}", None)

    async def put_peer(self, peer: Peer) -> None:
        """Add or update a peer."""
        await self._store.put(PEERS + peer.url, _enc.encode(peer))
        self._peers[peer.url] = peer

    async def drop_peer(self, url: str) -> bool:
        """Remove a peer; whether it was there."""
        count, _ = await self._store.delete(PEERS + url)
        self._peers.pop(url, None)
        return bool(count)
