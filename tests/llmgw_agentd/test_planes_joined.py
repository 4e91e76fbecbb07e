"""An agent never forgets the control plane it joined: a leader's list that lacks it (that
plane restarting, or lost) keeps it last, so a cluster restored at that address is found."""

from __future__ import annotations

from pathlib import Path

import msgspec

from llmgw_agentd.planes import Planes

CP1, CP2, CP3 = (f"https://10.0.0.{i}:7710" for i in (11, 12, 13))


def dialled(planes: Planes) -> list[str]:
    """The URLs in the order the link tries them after the current one fails."""
    out = []
    for _ in planes.urls:
        planes.next()
        out.append(planes.url)
    return out


def test_a_list_without_the_joined_plane_keeps_it_last(tmp_path: Path) -> None:
    kept = tmp_path / "control_planes.json"
    planes = Planes(CP1 + "/", kept)
    planes.update([CP1, CP2, CP3])
    planes.follow(CP2)
    planes.update([CP2, CP3])  # cp1 restarting: its record is gone for a while
    assert planes.url == CP2
    assert sorted(msgspec.json.decode(kept.read_bytes(), type=list[str])) == [CP1, CP2, CP3]
    assert sorted(dialled(planes)) == [CP1, CP2, CP3]  # cp1 is dialled in turn
    planes.follow(CP3)
    planes.update([CP3])  # cp2 gone too, and the link on cp3
    assert sorted(dialled(planes)) == [CP1, CP3]


def test_a_restarted_agent_reads_the_joined_plane_back(tmp_path: Path) -> None:
    kept = tmp_path / "control_planes.json"
    planes = Planes(CP1, kept)
    planes.update([CP2, CP3])
    again = Planes(CP1, kept)
    assert again.url == CP1 and sorted(again.urls) == sorted([CP1, CP2, CP3])


def test_a_list_that_names_the_joined_plane_is_kept_as_given(tmp_path: Path) -> None:
    planes = Planes(CP2, tmp_path / "control_planes.json")
    planes.update([CP2, CP3, CP1])
    assert planes.urls == [CP2, CP3, CP1]
