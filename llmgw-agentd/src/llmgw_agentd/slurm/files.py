"""The controller's files under /etc/slurm and Slurm's state directories, written by the agent;
what it wrote is kept by hash, so that only those files go when the node has no part."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pwd
from pathlib import Path

from llmgw.wire import SlurmPart
from llmgw_agentd.slurm.dropins import controller_files

STATE = Path("/var/lib/slurm")  # slurm.conf's StateSaveLocation and SlurmdSpoolDir are under it
WRITTEN = "slurm-files.json"  # in the agent's state directory: file -> sha256 of what it wrote


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _record(path: Path) -> dict[str, str]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def write(part: SlurmPart, etc: Path, record: Path) -> bool:
    """Write the controller's files that differ; whether any did (slurmctld then restarts)."""
    written = _record(record)
    changed = False
    etc.mkdir(parents=True, exist_ok=True)
    for name, text in controller_files(part).items():
        path = etc / name
        with contextlib.suppress(OSError):
            if path.read_text() == text:
                written[str(path)] = _sha(text)
                continue
        tmp = path.with_name(name + ".llmgw")
        tmp.write_text(text)
        tmp.chmod(0o644)
        os.replace(tmp, path)
        written[str(path)] = _sha(text)
        changed = True
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps(written, sort_keys=True))
    return changed


def remove(record: Path) -> list[str]:
    """Remove the files the agent wrote that are still as it wrote them (a site's own, or
    one edited since, stays); the files removed."""
    gone = []
    for name, sha in _record(record).items():
        path = Path(name)
        with contextlib.suppress(OSError):
            if _sha(path.read_text()) == sha:
                path.unlink()
                gone.append(name)
    record.unlink(missing_ok=True)
    return gone


def make_dirs(controller: bool, state: Path = STATE, owner: str = "slurm") -> None:
    """SlurmdSpoolDir (root's) and, on the controller, StateSaveLocation (SlurmUser's)."""
    (state / "slurmd").mkdir(parents=True, exist_ok=True)
    if not controller:
        return
    ctld = state / "slurmctld"
    ctld.mkdir(parents=True, exist_ok=True)
    try:
        user = pwd.getpwnam(owner)
    except KeyError:
        return  # no slurm user (the package is not installed yet)
    os.chown(ctld, user.pw_uid, user.pw_gid)
    ctld.chmod(0o755)
