"""Turn DCGM's profiling readings of real cards (captures/*.pydcgm.txt) into the GPM answers the
NVML replay gives (gpm/NAME.json, laid over NAME.json's cards in order by fake_nvml.py).

DCGM's DCGM_FI_PROF_SM_ACTIVE, _SM_OCCUPANCY, _PIPE_TENSOR_ACTIVE and _DRAM_ACTIVE are ratios
of the same hardware counters that NVML's GPM answers in percent as NVML_GPM_METRIC_SM_UTIL (2),
_SM_OCCUPANCY (3), _ANY_TENSOR_UTIL (5) and _DRAM_BW_UTIL (10): each ratio is written times 100.

    python from_dcgm.py captures/CAPTURE "where it came from" > gpm/NAME.json
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

METRIC_OF = {"sm_active": 2, "sm_occupancy": 3, "tensor_active": 5, "dram_active": 10}
_CARD = re.compile(r"'(GPU-[0-9a-f-]+)': \{(.*?)\}", re.S)
_FIELD = re.compile(r"'(\w+)': ([-+0-9.e]+)")


def convert(capture: Path, source: str) -> dict[str, Any]:
    """One device entry per card of the capture, in its order: GPM supported, and the four
    counters of the interval DCGM measured."""
    devices = []
    for uuid, body in _CARD.findall(capture.read_text()):
        fields = dict(_FIELD.findall(body))
        metrics = {str(m): float(fields[k]) * 100 for k, m in METRIC_OF.items()}
        devices.append(
            {
                "dcgm_uuid": uuid,
                "nvmlGpmQueryDeviceSupport": {"isSupportedDevice": 1},
                "nvmlGpmMetricsGet": metrics,
            }
        )
    return {
        "provenance": "converted by tests/llmgw_agentd/nvml/from_dcgm.py from DCGM's profiling "
        f"readings of real cards: {source}",
        "devices": devices,
    }


if __name__ == "__main__":
    print(json.dumps(convert(Path(sys.argv[1]), " ".join(sys.argv[2:])), indent=1))
