"""Cache isolation (client.cache_isolation): whose requests may reuse an engine's cached prompt."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from llmgwd.catalog import ApiKey, Model, profiles_of
from llmgwd.nodes.pool import Endpoint
from llmgwd.router import cache_salt, prefix

if TYPE_CHECKING:
    from llmgwd.router.exchange import Exchange

Mode = Literal["org", "key", "none"]
MODES: tuple[Mode, ...] = ("org", "key", "none")
# After this control plane was told it is alone again, what another plane sent may still reach
# the engines this long (its last requests, up to the read timeout): no slot is reused before.
REUSE_HOLD_S = 600.0
# The routes whose llama.cpp requests are pinned to a slot (llama-server reads id_slot there);
# an embedding or a rerank takes any slot, so a model that serves them reuses none.
_POOLING_ARGS = frozenset({"--embedding", "--embeddings", "--reranking", "--rerank"})
_MAX_REPLICAS = 4096  # replicas remembered before the book is started afresh


@dataclass(frozen=True, slots=True)
class Ticket:
    """What the router decided for a llama.cpp request: its partition ("": none may reuse),
    whether it fans out over other slots (n > 1: llama-server picks them), and its prompt's
    block chain (router/prefix.py), to find the slot holding most of it."""

    partition: str
    fans_out: bool
    chain: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Lease:
    """One slot of a replica taken for a request: whether the request reuses what it holds."""

    slot: int
    reuse: bool
    gen: int
    partition: str
    began: float
    chain: tuple[int, ...]


def mode(setting: str) -> Mode:
    """client.cache_isolation's value (checked when the configuration was read)."""
    for m in MODES:
        if m == setting:
            return m
    raise ValueError(f"cache_isolation: {setting!r} is none of {', '.join(MODES)}")


def partition(key: ApiKey, mode: Mode) -> str:
    """Whose cache a request may share: its key's organization (a key of none: the key's own),
    its key, or everyone's ("")."""
    if mode == "none":
        return ""
    if mode == "org" and key.org:
        return "org:" + key.org
    return "key:" + key.id


def pools_prompts(model: Model) -> bool:
    """Whether a llama.cpp model serves embeddings or reranking too: those requests take any
    slot (llama-server reads no id_slot for them), so none of its slots can be vouched for."""
    return any(_POOLING_ARGS.intersection(p.args) for p in profiles_of(model))


@dataclass(slots=True)
class _Slot:
    owner: str = ""  # the partition whose requests alone wrote it; "": not known
    since: float = 0.0  # when the first of those began
    busy: bool = False
    used: int = 0  # when last taken (the book's clock)
    chain: tuple[int, ...] = ()  # the block chain of the last prompt it was given


@dataclass(slots=True)
class _Replica:
    slots: list[_Slot]
    gen: int = 0  # raised when something else may have written its slots


@dataclass
class SlotBook:
    """Per replica and slot, which partition's requests alone filled it, as this control plane
    sent them: a request reuses a slot only when its own partition did."""

    replicas: dict[str, _Replica] = field(default_factory=dict)
    clock: int = 0

    def take(self, endpoint: Endpoint, ticket: Ticket, trusted_from: float) -> Lease | None:
        """A free slot of endpoint: its partition's holding the longest run of the prompt's
        leading blocks, else one nobody is known to have filled, else the least recently used
        (reused only if its partition's, else overwritten). None: no free slot known."""
        rep = self._replica(endpoint)
        free = [i for i, s in enumerate(rep.slots) if not s.busy]
        if not free:
            return None
        part, chain = ticket.partition, ticket.chain
        mine = {i for i in free if part and rep.slots[i].owner == part}
        mine = {i for i in mine if rep.slots[i].since >= trusted_from}
        held = {i: _common(rep.slots[i].chain, chain) for i in mine}
        if any(held.values()):
            i = max(mine, key=lambda j: (held[j], rep.slots[j].used))
        else:
            i = min(free, key=lambda j: (rep.slots[j].owner != "", rep.slots[j].used))
        slot = rep.slots[i]
        self.clock += 1
        slot.busy, slot.used = True, self.clock
        reuse = i in mine
        began = slot.since if reuse else time.monotonic()
        return Lease(i, reuse, rep.gen, part, began, chain)

    def give_back(self, endpoint: Endpoint, lease: Lease, completed: bool) -> None:
        """The request on lease's slot ended: the slot is its partition's when the request
        reused it, or overwrote it to the end; otherwise who filled it is not known."""
        rep = self.replicas.get(endpoint.replica_id)
        if rep is None or lease.slot >= len(rep.slots):
            return
        slot = rep.slots[lease.slot]
        slot.busy = False
        if lease.gen == rep.gen and lease.partition and (lease.reuse or completed):
            slot.owner, slot.since, slot.chain = lease.partition, lease.began, lease.chain
        else:
            slot.owner, slot.chain = "", ()

    def taint(self, endpoint: Endpoint) -> None:
        """Something not pinned may have written any of endpoint's slots."""
        rep = self._replica(endpoint)
        rep.gen += 1
        for slot in rep.slots:
            slot.owner = ""

    def clear(self) -> None:
        """Nothing known of any slot."""
        self.replicas.clear()

    def _replica(self, endpoint: Endpoint) -> _Replica:
        rep = self.replicas.get(endpoint.replica_id)
        if rep is None or len(rep.slots) != endpoint.slots:  # new, or started again
            if len(self.replicas) >= _MAX_REPLICAS:
                self.replicas.clear()
            rep = self.replicas[endpoint.replica_id] = _Replica(
                [_Slot() for _ in range(endpoint.slots)]
            )
        return rep


class CacheIsolation:
    """The router's part: vLLM's cache_salt per partition; llama.cpp's requests pinned to a slot
    (`id_slot`) and `cache_prompt: false` unless that slot holds only their partition's prompts.
    The engines' own prompt cache in RAM, shared by all slots, is off (the agent's
    `--cache-ram 0`). Reuse needs this control plane to be the only one sending requests."""

    def __init__(self, mode: Mode = "org", secret: bytes = b"", *, alone: bool = True) -> None:
        self.mode = mode
        self._secret = secret or secrets.token_bytes(32)
        self.book = SlotBook()
        self._alone = alone
        self._trusted_from = 0.0 if alone else float("inf")
        self._seen_planes = alone

    def wait_for_planes(self) -> None:
        """Reuse no slot until planes() says this control plane is alone."""
        self._alone = self._seen_planes = False
        self._trusted_from = float("inf")

    def planes(self, urls: list[str]) -> None:
        """The live control planes now: slots are reused only while this one is alone, and
        only what it sent REUSE_HOLD_S after another one was last seen."""
        alone = len(urls) <= 1
        if alone == self._alone and self._seen_planes:
            return
        first = not self._seen_planes
        self._seen_planes, self._alone = True, alone
        self.book.clear()
        hold = 0.0 if first else REUSE_HOLD_S
        self._trusted_from = time.monotonic() + hold if alone else float("inf")

    def apply(self, ex: Exchange, key: ApiKey, model: Model, doc: dict[str, Any]) -> None:
        """Mark the request (its exchange, ex) for its engine: vLLM's cache_salt in the body (a
        client's own is refused by router/fields.py), or llama.cpp's ticket for the proxy's
        slot choice."""
        if self.mode == "none":
            return
        part = partition(key, self.mode)
        if model.engine == "vllm":
            doc["cache_salt"] = cache_salt.of(part, self._secret)
        elif model.engine == "llama.cpp":
            if pools_prompts(model):
                part = ""
            chain = prefix.chain(prefix.prompt_text(doc)) if part else ()
            ex.ticket = Ticket(part, _choices(doc) > 1, chain)

    def provider_key(self, key: ApiKey) -> str:
        """OpenAI's prompt_cache_key for key's partition: an HMAC of it under the cluster
        secret (never an organization's name, nor vLLM's salt); "" when isolation is off."""
        if self.mode == "none":
            return ""
        return cache_salt.of("provider:" + partition(key, self.mode), self._secret)

    def lease(
        self, ticket: Ticket, endpoint: Endpoint, slotted: bool, body: bytes
    ) -> tuple[bytes, Lease | None]:
        """The body for endpoint with its slot and whether to reuse it, and the slot taken."""
        lease = None
        if self._alone and slotted and endpoint.slots > 0:
            lease = self.book.take(endpoint, ticket, self._trusted_from)
            if lease is None or ticket.fans_out:  # llama-server fills a slot of its choice
                self.book.taint(endpoint)
        if lease is None:
            return _with(b'"cache_prompt":false,', body), None
        head = b'"id_slot":%d,' % lease.slot
        return _with(head if lease.reuse else head + b'"cache_prompt":false,', body), lease

    def done(self, endpoint: Endpoint, lease: Lease | None, completed: bool) -> None:
        """The request on lease ended (completed: its answer came whole)."""
        if lease is not None:
            self.book.give_back(endpoint, lease, completed)


def _with(fields: bytes, body: bytes) -> bytes:
    """body (a JSON object with at least one member) with fields first."""
    return b"{" + fields + body[1:]


def _common(held: tuple[int, ...], chain: tuple[int, ...]) -> int:
    """How many leading blocks two chains share."""
    n = 0
    for a, b in zip(held, chain, strict=False):
        if a != b:
            break
        n += 1
    return n


def _choices(doc: dict[str, Any]) -> int:
    n = doc.get("n")
    best = doc.get("best_of")
    return max(n if isinstance(n, int) else 1, best if isinstance(best, int) else 1)
