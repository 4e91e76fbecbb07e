"""Lending a node to Slurm and taking it back, as the leader decides it: replicas move away
before Slurm gets the node, a node taken back stays cordoned while a job runs, and a node
is llmgw's only on evidence that Slurm runs nothing there (a node not heard from, or a
Slurm that does not answer, is held)."""

from __future__ import annotations

from llmgw.wire import SlurmReport
from llmgwd.placement.reconciler import NodeFlags
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


def test_a_node_is_llmgws_only_on_evidence_that_slurm_runs_nothing_there() -> None:
    off = SlurmSettings(enabled=False, controller="cp", nodes=["n1"], lent=["n1"])
    back = SlurmSettings(enabled=True, controller="cp", nodes=["n1", "n2"], lent=[])

    # Evidence: Slurm off, the node not in it, its agent running no Slurm, or Slurm having
    # it drained (llmgw's reason or an administrator's) with no job.
    assert standing("n1", off, False, DRAINED) == lending.Standing(IN_LLMGW, "Slurm is off")
    assert standing("n3", ON, False, IDLE).phase == IN_LLMGW  # not in Slurm
    assert standing("n1", ON, False, None).phase == IN_LLMGW  # its agent reports no Slurm
    assert standing("n1", back, False, DRAINED).phase == IN_LLMGW
    admin = SlurmReport(state="drained", reason="disk swap")
    assert standing("n1", back, False, admin).phase == IN_LLMGW
    assert standing("n1", back, False, SlurmReport(state="drained*")).phase == IN_LLMGW
    # Anything else is held: Slurm not answering, the node down but not drained.
    no_state = SlurmReport(version="22.05.8", message="sinfo: cannot reach slurmctld")
    gone = standing("n1", back, False, no_state)
    assert gone.phase == RECLAIMING and "cannot reach slurmctld" in gone.why
    assert standing("n1", back, False, SlurmReport(state="down*")).phase == RECLAIMING
    # A lent node stays lent whatever Slurm says: only a reclaim gives it back.
    assert standing("n1", ON, False, no_state).phase == LENT
    assert standing("n1", ON, False, SlurmReport(state="down*")).phase == LENT


def test_a_node_not_heard_from_is_held_not_llmgws() -> None:
    back = SlurmSettings(enabled=True, controller="cp", nodes=["n1", "n2"], lent=["n2"])

    by_node = lending.standings(back, ["n1", "n2"], set(), {})  # neither has registered

    assert by_node["n1"].phase == RECLAIMING
    assert by_node["n2"].phase == LENT
    assert lending.held(by_node) == {"n1": NodeFlags(cordoned=True),
                                     "n2": NodeFlags(cordoned=True, draining=True)}  # fmt: skip
    heard = lending.standings(back, ["n1"], set(), {"n1": None})
    assert heard["n1"].phase == IN_LLMGW  # registered, and its agent runs no Slurm


def test_a_job_holds_a_node_even_out_of_slurms_settings() -> None:
    off = SlurmSettings(enabled=False, controller="cp", nodes=["n1"])
    running = SlurmReport(state="draining", jobs=["41"])

    assert standing("n1", off, False, running).phase == RECLAIMING
    assert standing("n9", ON, False, running).phase == RECLAIMING


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
