"""A history of admin writes made through every control plane at once (one writer thread
each, over its llmgwd socket): keys created, models added, then priced. Every write is
recorded with its outcome (acknowledged: a 2xx; refused: an error answer, or llmgwd not
running; unknown: no answer), and the store checked afterwards against the record."""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from integration.cp_cluster import api
from integration.llmgw_node import Node, gguf
from llmgw import ipc

PAUSE_S = 0.3  # between one writer's writes
TIMEOUT_S = 10.0  # a write unanswered this long is an unknown outcome


@dataclass
class Write:
    """One write and what came of it."""

    cp: str
    kind: str  # "key", "model", "price"
    name: str
    value: float = 0.0  # a price's prompt price
    outcome: str = ""  # "ack", "refused", "unknown"
    detail: str = ""


@dataclass
class History:
    """Writers over the control planes, by name, until stop()."""

    cps: dict[str, Node]
    writes: list[Write] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        for name in self.cps:
            t = threading.Thread(target=self._writer, args=(name,), daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(TIMEOUT_S * 3)

    def _writer(self, cp: str) -> None:
        n, last_model = 0, ""
        while not self._stop.is_set():
            n += 1
            if n % 3 == 1:
                w = self._write(cp, "key", f"h-{cp}-{n}", "POST", "/keys", {"name": f"h-{cp}-{n}"})
            elif n % 3 == 2:
                body = {"name": f"h-{cp}-{n}", "source": f"file:{gguf()}", "engine": "llama.cpp"}
                w = self._write(cp, "model", body["name"], "POST", "/models", body)
                last_model = w.name if w.outcome == "ack" else ""
            elif last_model:
                price = {"prompt": n + 0.5, "completion": 1.0}
                w = self._write(cp, "price", last_model, "PUT", f"/models/{last_model}/price",
                                price, value=n + 0.5)  # fmt: skip
            time.sleep(PAUSE_S)

    def _write(self, cp: str, kind: str, name: str, method: str, path: str, body: object,
               value: float = 0.0) -> Write:  # fmt: skip
        w = Write(cp, kind, name, value)
        try:
            status, answer = api(self.cps[cp], method, path, body, timeout=TIMEOUT_S)
            w.outcome = "ack" if 200 <= status < 300 else "refused"
            w.detail = "" if w.outcome == "ack" else f"{status} {str(answer)[:200]}"
        except ipc.IpcError as e:  # not running: never sent; else sent, no answer
            w.outcome = "refused" if "is not running" in str(e) else "unknown"
            w.detail = str(e)[:200]
        self.writes.append(w)
        return w

    def counts(self) -> dict[str, int]:
        return dict(Counter(w.outcome for w in self.writes))


def store_view(node: Node) -> dict[str, Any]:
    """The keys' names and ids and the models' prompt prices, as node's API lists them."""
    _, keys = api(node, "GET", "/keys")
    _, models = api(node, "GET", "/models")
    return {
        "key_names": sorted(k["name"] for k in keys),
        "key_ids": sorted(k["id"] for k in keys),
        "models": sorted((m["name"], m["price_prompt"]) for m in models),
    }


def problems(history: History, view: dict[str, Any]) -> list[str]:
    """What the store lost or doubled of the history (nothing, when all went right)."""
    names = Counter(view["key_names"])
    models = Counter(name for name, _ in view["models"])
    prices = dict(view["models"])
    found = []
    if len(set(view["key_ids"])) != len(view["key_ids"]):
        found.append("a key id listed twice")
    found += [f"key name {n} {c} times" for n, c in names.items() if c > 1]
    found += [f"model {n} {c} times" for n, c in models.items() if c > 1]
    for w in history.writes:
        there = names[w.name] if w.kind == "key" else models[w.name]
        if w.outcome == "ack" and w.kind in ("key", "model") and there != 1:
            found.append(f"acknowledged {w.kind} {w.name} ({w.cp}) is not there")
        if w.outcome == "ack" and w.kind == "price" and prices.get(w.name) != w.value:
            found.append(f"acknowledged price {w.value} of {w.name} is {prices.get(w.name)}")
    return found
