"""A steady /v1 load while a with-block runs: integration/chat_stream.py in a process of its
own (inside a host of the lan, or on this machine), one row per request read at the end."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from typing import Any

from integration.harness import REPO
from integration.llmgw_node import MODEL, VENV


class Stream:
    """workers clients, each one request at a time with the official client (retries off),
    to urls in turn, while in the with-block; run through inside (an nsenter argv) if given."""

    def __init__(
        self, key: str, urls: Sequence[str], *, inside: Sequence[str] = (), workers: int = 2
    ) -> None:
        self.urls = list(urls)
        script = str(REPO / "integration/chat_stream.py")
        self.argv = [*inside, str(VENV / "bin/python"), script, key, MODEL, str(workers),
                     *self.urls]  # fmt: skip
        self.rows: list[dict[str, Any]] = []

    def __enter__(self) -> Stream:
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)  # fmt: skip
        return self

    def __exit__(self, *exc: object) -> None:
        out, _ = self.proc.communicate("", timeout=120)
        self.rows = [json.loads(line) for line in out.splitlines() if line.strip()]

    def failures(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if not r["ok"]]

    def report(self, what: str, t_fault: float) -> None:
        """Print how many requests went out, how many from t_fault on, and the failures."""
        during = [r for r in self.rows if r["t1"] >= t_fault]
        print(f"{what}: /v1 through {len(self.urls)} URLs: {len(self.rows)} requests "
              f"({len(during)} from the fault on), {len(self.failures())} failed "
              f"{self.failures()[:3]}")  # fmt: skip
