"""schemathesis's own runner (`st run`: examples, coverage, fuzzing and stateful phases, all
checks) against llmgwd's /api/v1/openapi.json served in-process (bench/api/fuzz_app.py) for a
bounded time; prints st's summary. The fast suite's tests/llmgwd/test_api_schemathesis.py is a
short pass of the same.

    .venv/bin/python bench/api/schemathesis_run.py --max-time 180
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.api.fuzz_app import serving


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-time", type=int, default=180, help="seconds for the whole run")
    parser.add_argument("--max-examples", type=int, default=200, help="per operation")
    parser.add_argument("--checks", default="all")
    args = parser.parse_args()
    st = Path(sys.executable).with_name("st")
    with tempfile.TemporaryDirectory() as state, serving(Path(state)) as served:
        return subprocess.call(
            [
                str(st), "run", served.url + "/api/v1/openapi.json",
                "-H", f"Authorization: Bearer {served.key}",
                "--max-time", str(args.max_time), "-n", str(args.max_examples),
                "--checks", args.checks, "--workers", "1", "--no-color",
                "--request-timeout", "10", "--continue-on-failure",
            ],
            cwd=state,  # st's cache (.schemathesis/) goes there
        )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
