"""Lending a node to Slurm and taking it back, as the leader decides it: replicas move away
before Slurm gets the node, a node taken back stays cordoned while a job runs, and a broken
Slurm never keeps a node from llmgw."""

from __future__ import annotations

from llmgw.wire import SlurmReport
from llmgwd.reconciler import NodeFlags
from llmgwd.slurm import lending
from llmgwd.slurm.lending import IN_LLMGW, LENDING, LENT, RECLAIMING, standing
from llmgwd.slurm.settings import SlurmSettings

ON = SlurmSettings(enabled=True, controller="cp", nodes=["n1", "n2"], lent=["n1"])
DRAINED = SlurmReport(version="22.05.8", state="drained", reason="llmgw: not lent to Slurm")
IDLE = SlurmReport(version="22.05.8", state="idle")


def test_a_lent_node_waits_for_its_replicas_to_move_before_slurm_gets_it() -> None:
    lending_n1 = standing("n1", ON, True, DRAINED)
    lent_n1 = standing("n1", ON, False, DRAINED)

    assert (lending_n1.phase, lending_n1.why) == (LENDING, "moving replicas")
    assert lent_n1.phase == LENT
    by_node = {"n1": lending_n1, "n2": standing("n2", ON, True, DRAINED)}
    assert lending.lent_now(by_node) == []  # the controller does not resume it yet
    assert lending.held(by_node) == {"n1": NodeFlags(cordoned=True, draining=True)}
    assert lending.lent_now({"n1": lent_n1}) == ["n1"]


def test_a_node_taken_back_stays_cordoned_until_slurm_has_it_drained_with_no_job() -> None:
    back = SlurmSettings(enabled=True, controller="cp", nodes=["n1", "n2"], lent=[])
    running = SlurmReport(state="draining", jobs=["41", "42"])

    s = standing("n1", back, False, running)
    assert (s.phase, s.why) == (RECLAIMING, "2 jobs running")
    assert lending.held({"n1": s}) == {"n1": NodeFlags(cordoned=True)}
    # Not drained yet (the controller has not drained it): still held.
    assert standing("n1", back, False, IDLE).phase == RECLAIMING
    # Drained, no job: llmgw's again.
    assert standing("n1", back, False, DRAINED).phase == IN_LLMGW
    assert lending.held({"n1": standing("n1", back, False, DRAINED)}) == {}


def test_a_job_keeps_a_node_held_whatever_slurm_says_of_its_state() -> None:
    back = SlurmSettings(enabled=True, controller="cp", nodes=["n1"])

    assert standing("n1", back, False, SlurmReport(state="down*", jobs=["7"])).phase == RECLAIMING


def test_a_broken_slurm_never_keeps_a_node_from_llmgw() -> None:
    off = SlurmSettings(enabled=False, controller="cp", nodes=["n1"], lent=["n1"])
    no_state = SlurmReport(version="22.05.8", message="sinfo: cannot reach slurmctld")

    assert standing("n1", off, False, DRAINED) == lending.Standing(IN_LLMGW, "Slurm is off")
    assert standing("n3", ON, False, IDLE).phase == IN_LLMGW  # not in Slurm
    assert standing("n1", ON, False, None).phase == IN_LLMGW  # its agent reports no Slurm
    gone = standing("n1", ON, False, no_state)
    assert gone.phase == IN_LLMGW and "cannot reach slurmctld" in gone.why
    assert standing("n1", ON, False, SlurmReport(state="down*")).phase == IN_LLMGW


def test_an_admins_drain_keeps_a_lent_node_lent() -> None:
    admin = SlurmReport(state="drained", reason="bad fan")

    assert standing("n1", ON, False, admin).phase == LENT


def test_slurms_state_is_read_without_its_flags() -> None:
    assert lending.base_state("IDLE*") == "idle"
    assert lending.base_state("drained+reserved") == "drained"
    assert lending.base_state("mixed~") == "mixed"


def test_the_status_people_see() -> None:
    running = SlurmReport(version="22.05.8", state="draining", jobs=["41"])
    s = lending.node_status("n1", standing("n1", ON, True, DRAINED), DRAINED)
    back = SlurmSettings(enabled=True, controller="cp", nodes=["n1"])
    r = lending.node_status("n1", standing("n1", back, False, running), running)

    assert (s.status, s.held, s.state, s.version) == ("lending: moving replicas", True,
                                                      "drained", "22.05.8")  # fmt: skip
    assert (r.status, r.jobs) == ("reclaiming: 1 jobs running", ["41"])
    free = lending.node_status("n2", standing("n2", ON, False, None), None)
    assert (free.status, free.held, free.message) == ("in llmgw", False,
                                                      "its agent reports no Slurm")  # fmt: skip
