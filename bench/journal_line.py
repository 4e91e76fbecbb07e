"""bench/journal_line.py: process CPU a log line through llmgw's JournalHandler (what every
/v1 request's access line costs under systemd) beside logging's StreamHandler to /dev/null,
in the same run, rounds alternating, best of each. journald is stood in for by a datagram
socket read in a child process (its CPU is not counted).

    PYTHONPATH=TREE/src .venv/bin/python bench/journal_line.py [--n 20000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import tempfile
import time
from pathlib import Path

from llmgw.log import JournalHandler

LINE = (
    "POST /v1/chat/completions status=200 ms=3 model=tiny key=abcdef123456 replica=r1 "
    "rid=0123456789abcdef01234567"
)
FIELDS = {"request": "0123456789abcdef01234567", "key_id": "abcdef123456", "model": "tiny",
          "replica": "r1"}  # fmt: skip


def per_line_us(logger: logging.Logger, n: int) -> float:
    start = time.process_time()
    for _ in range(n):
        logger.log(logging.INFO, LINE, extra=FIELDS)
    return (time.process_time() - start) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    path = str(Path(tempfile.mkdtemp()) / "journal")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(path)
    child = os.fork()
    if child == 0:
        while True:
            server.recv(65536)
    journal = JournalHandler("llmgwd", path)
    devnull = open(os.devnull, "w")  # noqa: SIM115
    stream = logging.StreamHandler(devnull)
    stream.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger = logging.getLogger("llmgwd.router.errors")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    best = {"journal": float("inf"), "stderr": float("inf")}
    try:
        for r in range(args.rounds):
            order = ["journal", "stderr"] if r % 2 == 0 else ["stderr", "journal"]
            for name in order:
                logger.handlers[:] = [journal if name == "journal" else stream]
                best[name] = min(best[name], per_line_us(logger, args.n))
    finally:
        os.kill(child, signal.SIGKILL)
    print(f"llmgw.log from {Path(__import__(JournalHandler.__module__).__file__).parent}")
    print(f"a log line, best of {args.rounds} rounds of {args.n}: JournalHandler "
          f"{best['journal']:.1f} us, StreamHandler to /dev/null {best['stderr']:.1f} us, "
          f"ratio {best['journal'] / best['stderr']:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
