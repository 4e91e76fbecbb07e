"""STATE_DIR/engines/<id>.json: what the agent started, read back by a later agent to adopt."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import msgspec

from llmgw.wire import ReplicaSpec
from llmgw_agentd.replicas.admission import valid_id

log = logging.getLogger(__name__)


class EngineRecord(msgspec.Struct):
    """STATE_DIR/engines/<id>.json: what the agent started, for a later agent to adopt."""

    fingerprint: str
    port: int
    spec: ReplicaSpec  # with api_key blanked: the key lives only in its 0600 file
    host: str = ""  # where it listens; "": every address (an agent older than this field)
    cpus: list[int] = []  # the CPU ids of its AllowedCPUs; []: not pinned


class Records:
    """The records of one directory, one file a replica, each replaced whole."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def read_all(self) -> Iterator[EngineRecord]:
        """The records in file name order; one that cannot be read, or whose replica id does
        not match its name, is logged and left out."""
        for path in sorted(self.directory.glob("*.json")):
            record = read(path)
            if record is not None:
                yield record

    def write(self, record: EngineRecord) -> None:
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = self.directory / f"{record.spec.id}.json"
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_bytes(msgspec.json.encode(record))
        os.replace(tmp, path)

    def remove(self, replica_id: str) -> None:
        (self.directory / f"{replica_id}.json").unlink(missing_ok=True)


def read(path: Path) -> EngineRecord | None:
    """The record in path; None (logged) when it cannot be read or is not its replica's."""
    try:
        record = msgspec.json.decode(path.read_bytes(), type=EngineRecord)
    except (OSError, msgspec.DecodeError) as e:
        log.warning("%s: ignored, cannot be read: %s", path, e)
        return None
    if f"{record.spec.id}.json" != path.name or not valid_id(record.spec.id):
        log.warning("%s: ignored, its replica id does not match its name", path)
        return None
    return record
