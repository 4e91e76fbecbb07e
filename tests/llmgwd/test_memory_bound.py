"""llmgwd.service's memory bound: the unit's MemoryMax and MemoryHigh are what the default
settings call for, and llmgwd warns at start when its own cgroup's limit is under its
settings' (naming the drop-in), and not otherwise."""

from __future__ import annotations

import configparser
from pathlib import Path

import pytest

from llmgw.config import ClientPort
from llmgwd import memory_bound

UNIT = Path(__file__).parents[2] / "units" / "llmgwd.service"


def unit_service() -> configparser.SectionProxy:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.read_string(UNIT.read_text())
    return parser["Service"]


def megabytes(value: str) -> int:
    assert value.endswith("M"), value
    return int(value[:-1]) * memory_bound.MIB


def test_the_units_memory_bound_is_what_the_default_settings_call_for() -> None:
    service = unit_service()
    want = memory_bound.needed(ClientPort())
    assert megabytes(service["MemoryMax"]) == want
    assert megabytes(service["MemoryHigh"]) == memory_bound.high(want) < want
    assert service["MemorySwapMax"] == "0"
    assert "PrivateTmp" in service  # the upload spools' /var/tmp is the unit's own


def fake_cgroup(root: Path, limit: str) -> tuple[Path, Path]:
    proc, cgroups = root / "proc", root / "cgroup"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "cgroup").write_text("0::/system.slice/llmgwd.service\n")
    unit = cgroups / "system.slice" / "llmgwd.service"
    unit.mkdir(parents=True)
    (unit / "memory.max").write_text(limit + "\n")
    return proc, cgroups


@pytest.mark.parametrize(
    ("limit", "settings", "warned"),
    [
        ("1644167168", ClientPort(), False),  # the unit's own 1568M
        ("1644167168", ClientPort(max_uploads_in_flight=64), True),
        ("1644167168", ClientPort(max_body_bytes=16 * 1024 * 1024), True),
        ("max", ClientPort(max_body_bytes=16 * 1024 * 1024), False),  # no bound at all
    ],
)
def test_llmgwd_warns_when_its_limit_is_under_its_settings(
    tmp_path: Path, limit: str, settings: ClientPort, warned: bool
) -> None:
    proc, cgroups = fake_cgroup(tmp_path, limit)
    own = memory_bound.own_limit(proc, cgroups)
    text = memory_bound.warning(settings, own)
    assert (text is not None) == warned
    if text is not None:
        want = memory_bound.needed(settings) // memory_bound.MIB
        assert f"MemoryMax={want}M" in text and "systemctl edit llmgwd.service" in text


def test_no_cgroup_v2_no_check(tmp_path: Path) -> None:
    (tmp_path / "self").mkdir()
    (tmp_path / "self" / "cgroup").write_text("4:memory:/x\n1:cpu:/\n")
    assert memory_bound.own_limit(tmp_path, tmp_path) is None
