"""bench/router/admission.py: the cost of the /v1 admission check (Meter.admit, then settle)
with a key's own limits only, against five levels (key, user, organization, team, project),
each level with rpm, tpm, a token budget and a spend budget: microseconds and Python calls
(cProfile's count) a request. Prints figures only.

    .venv/bin/python bench/router/admission.py [--n 200000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench (a package), llmgwd

from bench.router.five_levels import BIG, levels_of_five, owned
from llmgwd.catalog import ApiKey, Model
from llmgwd.router.metering import Meter
from llmgwd.router.token_bounds import Estimate

MODEL = Model(name="m", source="file:/m.gguf", price_prompt=1.0, price_completion=2.0)
ASK = Estimate(prompt=200, completion=100)


def per_request_us(meter: Meter, key: ApiKey, n: int) -> float:
    """Microseconds per admit + settle (the engine answered with its usage)."""
    start = time.perf_counter()
    for _ in range(n):
        r = meter.admit(key, MODEL, ASK)
        r.tally.answered, r.tally.usage = True, (150, 50)
        r.settle()
    return (time.perf_counter() - start) / n * 1e6


def calls_per_request(meter: Meter, key: ApiKey, n: int = 2000) -> float:
    """Python function calls per admit + settle, cProfile's count."""
    prof = cProfile.Profile()
    prof.runcall(per_request_us, meter, key, n)
    total: int = pstats.Stats(prof).total_calls  # type: ignore[attr-defined]
    return (total - 3) / n  # less per_request_us itself and its two clock reads


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    cases = {
        "key only (no levels)": (
            Meter(),
            ApiKey(id="k1", name="k", hash="", prefix="", limits=BIG),
        ),
        "five levels": (
            Meter(levels=levels_of_five()),
            owned(ApiKey(id="k5", name="k", hash="", prefix="", limits=BIG)),
        ),
    }
    results: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.rounds):  # interleaved, so the machine's load hits both alike
        for name, (meter, key) in cases.items():
            results[name].append(per_request_us(meter, key, args.n))
    for name, times in results.items():
        calls = calls_per_request(*cases[name])
        print(f"{name:24} median {statistics.median(times):6.2f} us/request "
              f"(min {min(times):.2f}, {args.rounds} rounds of {args.n}), "
              f"{calls:.0f} calls/request")  # fmt: skip


if __name__ == "__main__":
    main()
