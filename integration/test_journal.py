"""llmgw.log's JournalHandler against a real journald: a record too large for one datagram
(sent in a sealed memfd) is kept whole, its fields with it."""

from __future__ import annotations

import json
import time
import uuid

import pytest

from integration.harness import REPO, PrivateSystemd

# Run inside by the checkout's Python: log one record of SIZE bytes tagged with MARK.
SCRIPT = """
import logging, sys
from llmgw.log import JournalHandler
mark, size = sys.argv[1], int(sys.argv[2])
logger = logging.getLogger("llmgw.journal_test")
logger.addHandler(JournalHandler("llmgw-journal-test"))
logger.warning("%s %s", mark, "x" * size, extra={"request": mark})
"""


def _entries(systemd: PrivateSystemd, mark: str) -> list[dict[str, object]]:
    r = systemd.run(["journalctl", "--no-pager", "-o", "json", "--all",
                     "SYSLOG_IDENTIFIER=llmgw-journal-test", f"LLMGW_REQUEST={mark}"],
                    check=False, timeout=60)  # fmt: skip
    return [json.loads(line) for line in r.stdout.splitlines() if line.strip()]


@pytest.mark.parametrize("size", [300_000, 2_000_000])
def test_a_record_over_the_datagram_limit_is_kept_whole(systemd: PrivateSystemd, size: int) -> None:
    mark = f"large-{uuid.uuid4().hex[:12]}"
    python = str(REPO / ".venv/bin/python")
    systemd.run([python, "-c", SCRIPT, mark, str(size)], timeout=60)
    deadline = time.monotonic() + 20
    while not (found := _entries(systemd, mark)) and time.monotonic() < deadline:
        time.sleep(0.3)
    assert len(found) == 1, systemd.journal(lines=20)
    entry = found[0]
    assert entry["MESSAGE"] == f"{mark} {'x' * size}"
    assert (entry["PRIORITY"], entry["LOGGER"]) == ("4", "llmgw.journal_test")
