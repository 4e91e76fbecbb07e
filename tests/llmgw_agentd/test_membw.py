"""Memory bandwidth: cache sizes read from sysfs, buffers past them, and a real measurement."""

from __future__ import annotations

from pathlib import Path

from llmgw_agentd.membw import MIB, buffer_sizes, l3_bytes, measure


def fake_sysfs(root: Path, sockets: int, cores_per_socket: int, l3: str) -> Path:
    """/sys/devices/system/cpu of a machine with one shared L3 per socket."""
    for cpu in range(sockets * cores_per_socket):
        socket = cpu // cores_per_socket
        first = socket * cores_per_socket
        shared_l3 = f"{first}-{first + cores_per_socket - 1}"
        for i, (level, size, shared) in enumerate(
            [(1, "48K", str(cpu)), (2, "2048K", str(cpu)), (3, l3, shared_l3)]
        ):
            d = root / f"cpu{cpu}" / "cache" / f"index{i}"
            d.mkdir(parents=True)
            (d / "level").write_text(f"{level}\n")
            (d / "size").write_text(f"{size}\n")
            (d / "shared_cpu_list").write_text(f"{shared}\n")
    return root


def test_each_shared_cache_counts_once(tmp_path: Path) -> None:
    sysfs = fake_sysfs(tmp_path, sockets=2, cores_per_socket=4, l3="32768K")
    one, total = l3_bytes(sysfs)
    assert one == 32 * MIB  # the L3 a single core is served from
    assert total == 64 * MIB  # both sockets' L3, not eight cores' worth


def test_buffers_are_well_past_the_caches_and_stay_under_a_limit(tmp_path: Path) -> None:
    sysfs = fake_sysfs(tmp_path, sockets=2, cores_per_socket=64, l3="262144K")
    single, each = buffer_sizes(128, sysfs)
    assert single >= 4 * 256 * MIB
    assert 128 * each >= 4 * 512 * MIB  # all cores' buffers together dwarf every L3
    single, each = buffer_sizes(128, sysfs, limit=1 << 30)
    assert 2 * single <= 1 << 30 and 2 * 128 * each <= 1 << 30


def test_without_cache_figures_the_minimum_buffers_are_used(tmp_path: Path) -> None:
    assert l3_bytes(tmp_path) == (0, 0)
    assert buffer_sizes(2, tmp_path) == (64 * MIB, 16 * MIB)


def test_this_machine_is_measured_on_one_core_and_on_all() -> None:
    bw = measure(budget_s=0.3)
    assert bw.one_core > 0 and bw.all_cores > 0
