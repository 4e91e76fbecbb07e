"""The cards' profiling counters from a dcgm-exporter on the node (agent.yaml's dcgm_exporter),
for the cards NVML's GPM gives none: DCGM_FI_PROF_SM_ACTIVE, _SM_OCCUPANCY,
_PIPE_TENSOR_ACTIVE and _DRAM_ACTIVE by card UUID and, on a card in MIG mode, GPU instance."""

from __future__ import annotations

import asyncio
import logging
import re

import aiohttp
import msgspec

from llmgw.wire import Gpu, GpuCounters

log = logging.getLogger(__name__)

FIELDS = {
    "DCGM_FI_PROF_SM_ACTIVE": "sm_active_percent",
    "DCGM_FI_PROF_SM_OCCUPANCY": "sm_occupancy_percent",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "tensor_active_percent",
    "DCGM_FI_PROF_DRAM_ACTIVE": "dram_active_percent",
}
_SAMPLE = re.compile(r"^(DCGM_FI_PROF_\w+)\{([^}]*)\}\s+(\S+)", re.M)
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
TIMEOUT_S = 5.0

# A card's UUID and, on a card in MIG mode, the GPU instance's id (None: the whole card).
Key = tuple[str, int | None]


def parse(text: str) -> dict[Key, GpuCounters]:
    """dcgm-exporter's /metrics as counters (DCGM's ratios made percentages) by card and
    GPU instance."""
    found: dict[Key, dict[str, float]] = {}
    for name, labels, value in _SAMPLE.findall(text):
        field = FIELDS.get(name)
        if field is None:
            continue
        tags = dict(_LABEL.findall(labels))
        gi = tags.get("GPU_I_ID", "")
        key = (tags.get("UUID", ""), int(gi) if gi.isdigit() else None)
        try:
            found.setdefault(key, {})[field] = float(value) * 100
        except ValueError:
            continue
    return {key: GpuCounters(**fields) for key, fields in found.items()}


def fill(gpus: list[Gpu], counters: dict[Key, GpuCounters]) -> list[Gpu]:
    """The cards with DCGM's counters where GPM gave none: a card in MIG mode through its
    instances only, never as the whole card."""
    out: list[Gpu] = []
    for g in gpus:
        if g.mig:
            instances = [
                i if i.counters else msgspec.structs.replace(
                    i, counters=counters.get((g.uuid, i.gpu_instance_id)))
                for i in g.instances
            ]  # fmt: skip
            out.append(msgspec.structs.replace(g, instances=instances))
        elif g.counters is None:
            out.append(msgspec.structs.replace(g, counters=counters.get((g.uuid, None))))
        else:
            out.append(g)
    return out


class Exporter:
    """Reads the node's dcgm-exporter every few seconds and keeps what it last said; while
    it does not answer, no counters (said once in the log until it answers again)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.counters: dict[Key, GpuCounters] = {}
        self._failing = False

    async def run(self, every_s: float) -> None:
        """Read until cancelled."""
        timeout = aiohttp.ClientTimeout(total=TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            while True:
                await self.read(http)
                await asyncio.sleep(every_s)

    async def read(self, http: aiohttp.ClientSession) -> None:
        """One read of the exporter."""
        try:
            async with http.get(self.url) as r:
                r.raise_for_status()
                self.counters = parse(await r.text())
        except (aiohttp.ClientError, TimeoutError) as e:
            if not self._failing:
                log.warning("dcgm-exporter at %s did not answer: %s", self.url, e)
            self._failing, self.counters = True, {}
            return
        if self._failing:
            log.info("dcgm-exporter at %s answers again", self.url)
        self._failing = False
