"""What an engine says of itself over HTTP: /health as readiness, whether it lists its model,
its slots and context (/props), and the requests it holds (/metrics)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import aiohttp
import msgspec

from llmgw.wire import ReplicaSpec
from llmgw_agentd import engines
from llmgw_agentd.engines import HEALTH_PATH, PROPS_PATH


class Settings(msgspec.Struct):
    """The part of /props' default_generation_settings the agent reads."""

    n_ctx: int = 0  # a slot's context: the most tokens one request may hold


class Props(msgspec.Struct):
    """The part of llama.cpp's GET /props the agent reads."""

    total_slots: int = 0
    default_generation_settings: Settings = msgspec.field(default_factory=Settings)


class _Health(msgspec.Struct):
    """The part of a /health body the agent reads."""

    status: str | None = None


def health_code(status: int, body: bytes) -> int:
    """/health's answer as readiness: a 200 is ready when its body is empty (vLLM), not JSON,
    or JSON whose "status" is absent or "ok" (llama.cpp 11434.0.0 answers {"status":"ok"}
    once loaded, 503 {"error":{"message":"Loading model"}} before); a 200 whose status is
    anything else ({"status":"loading model"}, as some engine versions answer) counts as a
    503: still loading."""
    if status != 200 or not body.strip():
        return status
    try:
        said = msgspec.json.decode(body, type=_Health).status
    except (msgspec.DecodeError, msgspec.ValidationError):
        return status
    return status if said is None or said.lower() == "ok" else 503


def probe_host(host: str) -> str:
    """Where to reach an engine bound to host from this node."""
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def auth(key_file: Path) -> dict[str, str]:
    """The header with the replica's key, as the router sends it (none without a key)."""
    if not key_file.exists():
        return {}
    return {"Authorization": f"Bearer {key_file.read_text().strip()}"}


@dataclass(frozen=True)
class EngineProbe:
    """One engine as the agent asks it: over a shared session, at its address, with its key."""

    http: aiohttp.ClientSession
    spec: ReplicaSpec
    host: str  # the address it listens on
    port: int
    key_file: Path  # its key (asked with it where it exists)

    def url(self, path: str) -> str:
        return f"http://{probe_host(self.host)}:{self.port}{path}"

    async def health(self) -> int:
        """/health's status code (503 for a 200 whose body says it still loads), 0 when
        nothing answered."""
        try:
            async with self.http.get(self.url(HEALTH_PATH)) as resp:
                return health_code(resp.status, await resp.read())
        except (aiohttp.ClientError, TimeoutError, OSError):
            return 0

    async def lists_model(self) -> bool:
        """Whether the engine lists its model where it says so (asked with its key); True
        for an engine whose /health is enough."""
        path = engines.models_path(self.spec)
        if path is None:
            return True
        try:
            async with self.http.get(self.url(path), headers=auth(self.key_file)) as resp:
                return resp.status == 200 and engines.lists_model(self.spec, await resp.read())
        except (aiohttp.ClientError, TimeoutError, OSError):
            return False

    async def props(self) -> Props:
        """The engine's slots and context from /props (asked with its key); 0 for what it does
        not say."""
        try:
            async with self.http.get(self.url(PROPS_PATH), headers=auth(self.key_file)) as resp:
                if resp.status != 200:
                    return Props()
                return msgspec.json.decode(await resp.read(), type=Props)
        except (aiohttp.ClientError, TimeoutError, OSError, msgspec.DecodeError,
                msgspec.ValidationError):  # fmt: skip
            return Props()

    async def requests_held(self) -> int:
        """The requests the engine holds now, from its /metrics (asked with its key); 0 when
        it does not answer."""
        url = self.url(engines.METRICS_PATH)
        try:
            async with self.http.get(url, headers=auth(self.key_file)) as resp:
                if resp.status != 200:
                    return 0
                return engines.requests_held(self.spec, await resp.text())
        except (aiohttp.ClientError, TimeoutError, OSError, UnicodeDecodeError):
            return 0
