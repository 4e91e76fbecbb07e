"""Slurm's and the package manager's commands, run with a bounded time and their error in words."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence

TIMEOUT_S = 10.0


class SlurmError(Exception):
    """A command that failed: its name and the last line it wrote to stderr."""


def run(argv: Sequence[str], timeout: float = TIMEOUT_S) -> str:
    """argv's stdout; SlurmError if it cannot run, fails or runs past timeout."""
    try:
        r = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=timeout,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{argv[0]} did not answer within {timeout:.0f} s") from None
    except OSError as e:
        raise SlurmError(f"{argv[0]}: {e.strerror}") from None
    if r.returncode != 0:
        last = next((x for x in reversed(r.stderr.splitlines()) if x.strip()), "")
        raise SlurmError(f"{' '.join(argv[:3])} failed ({r.returncode}): {last.strip()[:300]}")
    return r.stdout
