"""The disks a node reports: its state directory's, its model cache's and /'s, each filesystem
once (the console flags one nearly full; a cache on a disk of its own is among them)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from llmgw_agentd import inventory


def _elsewhere(*than: str) -> str | None:
    """A mounted directory on a filesystem none of `than` is on (a tmpfs, most often)."""
    devs = {os.stat(p).st_dev for p in than}
    for p in ("/dev/shm", "/run", "/sys/fs/cgroup", "/proc"):
        if os.path.isdir(p) and os.stat(p).st_dev not in devs:
            return p
    return None


def test_a_model_cache_on_a_disk_of_its_own_is_reported(tmp_path: Path) -> None:
    other = _elsewhere(str(tmp_path), "/")
    if other is None:
        pytest.skip("no second filesystem mounted here to put a model cache on")
    found = inventory.collect(str(tmp_path), vllm=False, toolkit="", models_dir=other)
    paths = [d.path for d in found.disks]
    assert other in paths
    assert len(paths) == len({os.stat(p).st_dev for p in paths})  # each filesystem once


def test_a_model_cache_beside_the_state_directory_is_not_counted_twice(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    with_cache = inventory.collect(
        str(tmp_path), vllm=False, toolkit="", models_dir=str(tmp_path / "models")
    )
    without = inventory.collect(str(tmp_path), vllm=False, toolkit="")
    assert [d.path for d in with_cache.disks] == [d.path for d in without.disks]
