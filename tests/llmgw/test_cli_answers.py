"""The commands read llmgwd's answers as the shared types (llmgw.api_types): an answer that
is not one is a plain refusal naming what is off, never a traceback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
from click.testing import CliRunner, Result

from llmgw.api_types import (
    DeviceAuthorization,
    DevicePending,
    KeyLimits,
    LoginAnswer,
    MembershipView,
    MirrorStatus,
    ModelRemoved,
    ModelView,
    NodeSweep,
    PlaceView,
    PlanView,
    ProfilePlan,
    ScimTokenView,
    ScopeView,
    SetStatus,
    StaffView,
    SweepOut,
    Verdict,
)
from llmgw.cli import common, login_device
from llmgw.cli.main import main

COMMANDS = [
    ["nodes"],
    ["node", "remove", "gpu1", "--yes"],
    ["node", "token"],
    ["status"],
    ["usage"],
    ["usage", "--by", "org"],
    ["slurm", "status"],
    ["slurm", "lend", "n1"],
    ["planes"],
    ["plane", "token"],
    ["plane", "remove", "cp2"],
    ["plane", "leave", "--keep-running"],
    ["mirror", "status"],
    ["mirror", "sweep"],
    ["mirror", "add-peer", "https://m2:7700/hf"],
    ["model", "remove", "m"],
    ["model", "remove", "m", "--files", "--yes"],
    ["model", "plan", "m"],
    ["key", "list"],
    ["key", "limits", "k1", "--rpm", "5"],
    ["limits", "show", "--org", "o"],
    ["limits", "show", "--user", "u"],
    ["limits", "set", "--org", "o", "--rpm", "5"],
    ["scim", "token"],
    ["user", "create", "ann"],
    ["user", "list"],
    ["user", "set", "ann", "--email", "a@acme.org"],
    ["user", "delete", "ann", "--yes"],
    ["user", "staff", "ann", "viewer"],
    ["org", "create", "acme"],
    ["org", "list"],
    ["org", "show", "acme"],
    ["org", "delete", "acme", "--yes"],
    ["org", "team", "acme", "ml"],
    ["org", "team", "acme", "ml", "--delete", "--yes"],
    ["org", "project", "acme", "chat"],
    ["org", "project", "acme", "chat", "--delete", "--yes"],
    ["org", "member", "acme", "ann", "member", "--team", "ml"],
    ["org", "unmember", "acme", "ann"],
]


@pytest.mark.parametrize("args", COMMANDS, ids=" ".join)
@pytest.mark.parametrize("answer", [[1], {"name": 7, "rows": "?", "enabled": "yes"}])
def test_an_answer_not_of_its_type_is_a_refusal(
    monkeypatch: pytest.MonkeyPatch, args: list[str], answer: Any
) -> None:
    monkeypatch.setattr("llmgw.cli.common.ipc.request", lambda *a, **k: (200, answer))
    result = CliRunner().invoke(main, ["--socket", "/nonexistent.sock", *args])
    assert isinstance(result.exception, SystemExit), result.output
    assert result.exit_code == common.EXIT_REFUSED
    assert "the daemon's answer is not what this llmgw reads" in result.output


def test_the_json_flag_prints_the_answer_as_it_came(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("llmgw.cli.common.ipc.request", lambda *a, **k: (200, {"new_field": 1}))
    result = CliRunner().invoke(main, ["--socket", "/x.sock", "status", "--json"])
    assert result.exit_code == 0 and '"new_field": 1' in result.output


def _answering(monkeypatch: pytest.MonkeyPatch, *answers: Any) -> list[tuple[str, str]]:
    """llmgwd answers these, one a call, as JSON would carry them; the calls made, returned."""
    calls: list[tuple[str, str]] = []
    queue = [msgspec.to_builtins(a) for a in answers]

    def request(_sock: str, method: str, path: str, *_a: Any, **_k: Any) -> tuple[int, Any]:
        calls.append((method, path))
        return 200, queue.pop(0) if len(queue) > 1 else queue[0]

    monkeypatch.setattr("llmgw.cli.common.ipc.request", request)
    return calls


def _run(*args: str) -> Result:
    return CliRunner().invoke(main, ["--socket", "/x.sock", *args])


FETCHING = SetStatus(
    repo="up/tiny", commit="c" * 40, files=2, files_done=1, bytes_total=4096, bytes_done=1024
)
MODEL = ModelView(
    name="tiny", source="hf:up/tiny@" + "c" * 40, engine="llama.cpp", args=[], context=0,
    max_tokens=0, price_prompt=0.0, price_completion=0.0, replicas=0, ready=0, created_at=0.0,
    replica_status=[], files=2, bytes=4096, mirror=FETCHING,
)  # fmt: skip


def test_model_add_refuses_a_mirror_progress_not_of_its_type(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # POST /models answers a model whose set is fetching; GET /models/tiny then answers junk
    _answering(monkeypatch, MODEL, {"mirror": {"state": 5}})
    r = _run("model", "add", "tiny", "--from", "hf:up/tiny")
    assert isinstance(r.exception, SystemExit) and r.exit_code == common.EXIT_REFUSED
    assert "the daemon's answer is not what this llmgw reads" in r.output


def test_model_add_says_why_the_mirror_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    failed = msgspec.structs.replace(FETCHING, state="failed", error="upstream said 404")
    _answering(monkeypatch, MODEL, msgspec.structs.replace(MODEL, mirror=failed))
    r = _run("model", "add", "tiny", "--from", "hf:up/tiny")
    assert r.exit_code == common.EXIT_REFUSED
    assert f"the mirror could not fetch {MODEL.source}: upstream said 404" in r.output
    assert "up/tiny:  25.0%" in r.stderr and "1/2 files" in r.stderr


def test_mirror_status_shows_a_fetching_sets_progress(monkeypatch: pytest.MonkeyPatch) -> None:
    status = MirrorStatus(
        dir="/m", upstream="https://hf", files_held=1, bytes_held=1024, free_bytes=1 << 30,
        sets=[FETCHING],
    )  # fmt: skip
    _answering(monkeypatch, status)
    r = _run("mirror", "status")
    assert r.exit_code == 0, r.output
    assert "  up/tiny:  25.0%, 1.0 KiB of 4.0 KiB, 1/2 files" in r.stdout


def test_model_remove_files_shows_each_nodes_sweep(monkeypatch: pytest.MonkeyPatch) -> None:
    swept = SweepOut(
        files=1, bytes=4096, dry_run=False,
        nodes=[
            NodeSweep(node="n1", files=1, bytes=4096, kept=0, answered=True),
            NodeSweep(node="n2", files=0, bytes=0, kept=0, answered=False),
        ],
    )  # fmt: skip
    _answering(monkeypatch, ModelRemoved(name="tiny", removed=True, files=swept))
    r = _run("model", "remove", "tiny", "--files", "--yes")
    assert r.exit_code == 0, r.output
    assert "Removed model tiny.\nmirror: 1 files deleted, 4.0 KiB freed" in r.stdout
    assert "n1: 1 files deleted, 4.0 KiB freed" in r.stdout
    assert "n2: did not list its files again; run llmgw mirror sweep" in r.stdout


def test_model_plan_shows_places_and_verdicts(monkeypatch: pytest.MonkeyPatch) -> None:
    plan = PlanView(
        model="tiny", estimates=True, note="", parked=False, failed_on=["n3"],
        profiles=[
            ProfilePlan(
                name="gpu", kind="gpu", replicas=2, priority=1,
                placed=[PlaceView(id="r1", node="n1", devices=["0"], context=4096, memory="1.2",
                                  slots=2)],
                verdicts=[
                    Verdict("n1", "GPU1", True, 4096, 1 << 30, 0.0, "fits", slots=4),
                    Verdict("n2", "", False, reason="cordoned: it takes no new replicas"),
                ],
            )
        ],
    )  # fmt: skip
    _answering(monkeypatch, plan)
    r = _run("model", "plan", "tiny")
    assert r.exit_code == 0, r.output
    assert "Failed to start on: n3." in r.stdout
    assert "Profile gpu (gpu, priority 1): 1 of 2 replicas placed" in r.stdout
    assert "  r1: node n1 on 0, context 4096, 2 slots, memory 1.2" in r.stdout
    header, n1 = (
        line.split() for line in r.stdout.splitlines() if line.split()[:1] in (["NODE"], ["n1"])
    )
    assert header[:5] == ["NODE", "PLACE", "FITS", "CONTEXT", "SLOTS"]
    assert n1[:5] == ["n1", "GPU1", "fits", "4096", "4"]
    assert "cordoned: it takes no new replicas" in r.stdout


def test_model_plan_from_a_source_asks_for_a_model_not_added(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sent: list[tuple[str, str, Any]] = []

    def request(_sock: str, method: str, path: str, body: Any, **_k: Any) -> tuple[int, Any]:
        sent.append((method, path, msgspec.to_builtins(body)))
        plan = PlanView(model="qwen", estimates=False, note="x is not fetched yet", parked=False,
                        failed_on=[], profiles=[])  # fmt: skip
        return 200, msgspec.to_builtins(plan)

    monkeypatch.setattr("llmgw.cli.common.ipc.request", request)
    r = _run("model", "plan", "qwen", "--from", "hf:Qwen/Q-GGUF", "--context", "8192")
    assert r.exit_code == 0, r.output
    assert "No estimates: x is not fetched yet." in r.stdout
    [(method, path, body)] = sent
    assert (method, path) == ("POST", "/api/v1/models/plan")
    assert (body["name"], body["source"], body["context"]) == ("qwen", "hf:Qwen/Q-GGUF", 8192)
    assert _run("model", "plan", "qwen", "--context", "8192").exit_code == 2


def test_scim_token_prints_the_token_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    _answering(monkeypatch, ScimTokenView(token="scim-secret"))
    r = _run("scim", "token")
    assert r.exit_code == 0 and r.stdout == "scim-secret\n"
    assert "https://HOST:PORT/scim/v2" in r.stderr


def test_a_users_limits_are_shown_from_its_level(monkeypatch: pytest.MonkeyPatch) -> None:
    limits = KeyLimits(rpm=60, budget_spend=20.0, budget_spend_per="month")
    calls = _answering(monkeypatch, {"level": "user:u1", "limits": limits, "models": ["a"]})
    r = _run("limits", "show", "--user", "u1")
    assert r.exit_code == 0, r.output
    assert calls == [("GET", "/api/v1/users/u1/limits")]
    assert "user:u1  60 rpm, 20 spend/month  a" in r.stdout


def test_org_member_says_the_role_and_where_from_the_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kept = MembershipView(user="u1", scope=ScopeView(org="acme", kind="team", name="ml"),
                          role="manager")  # fmt: skip
    calls = _answering(monkeypatch, kept)
    r = _run("org", "member", "acme", "ann", "manager", "--team", "ml")
    assert r.exit_code == 0, r.output
    assert calls == [("PUT", "/api/v1/orgs/acme/teams/ml/members/ann")]
    assert r.stdout == "ann is manager of team ml.\n"


def test_user_staff_none_says_none(monkeypatch: pytest.MonkeyPatch) -> None:
    _answering(monkeypatch, StaffView(user="u1", staff=None))
    r = _run("user", "staff", "ann", "none")
    assert r.exit_code == 0 and r.stdout == "ann: staff role none.\n", r.output


AUTH = DeviceAuthorization(device_code="d", user_code="ABCD-EFGH", verification_uri="https://idp/d",
                           expires_in=60, interval=1)  # fmt: skip
SIGNED_IN = LoginAnswer(user="u1", name="ann", key="sk-session", expires_at=4e9)


def _login_answering(monkeypatch: pytest.MonkeyPatch, *answers: Any) -> None:
    """The client port answers these to `llmgw login --device`, one a call."""
    queue = [msgspec.to_builtins(a) for a in answers]
    monkeypatch.setattr(login_device, "call", lambda *_a, **_k: queue.pop(0))
    monkeypatch.setattr(login_device, "pause", lambda _s: None)


def _login(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *args: str) -> Result:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    return CliRunner().invoke(main, ["login", *args, "--server", "https://gw:7700"])


@pytest.mark.parametrize(
    "poll", [{"status": 5, "interval": 1}, {"status": "slow_down"}, {"user": "u1"}, ["?"]]
)
def test_login_device_refuses_a_poll_answer_not_of_its_type(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, poll: Any
) -> None:
    _login_answering(monkeypatch, AUTH, poll)
    r = _login(tmp_path, monkeypatch, "--device")
    assert isinstance(r.exception, SystemExit) and r.exit_code == common.EXIT_REFUSED, r.output
    assert "the daemon's answer is not what this llmgw reads" in r.output
    assert not (tmp_path / "llmgw" / "session.json").exists()


def test_login_device_refuses_a_start_answer_not_of_its_type(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _login_answering(monkeypatch, {"device_code": "d", "interval": "soon"})
    r = _login(tmp_path, monkeypatch, "--device")
    assert isinstance(r.exception, SystemExit) and r.exit_code == common.EXIT_REFUSED, r.output
    assert "the daemon's answer is not what this llmgw reads" in r.output


def test_login_device_waits_while_pending_then_keeps_the_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pending = DevicePending(status="authorization_pending", interval=1)
    _login_answering(monkeypatch, AUTH, pending, pending, SIGNED_IN)
    r = _login(tmp_path, monkeypatch, "--device")
    assert r.exit_code == 0, r.output
    assert "signed in as ann" in r.stdout and "ABCD-EFGH" in r.stdout
    saved = msgspec.json.decode((tmp_path / "llmgw" / "session.json").read_bytes())
    assert saved["key"] == "sk-session" and saved["user"] == "u1"


@pytest.mark.parametrize("info", [{"issuer": ["x"]}, "?"])
def test_login_refuses_an_oidc_info_not_of_its_type(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, info: Any
) -> None:
    monkeypatch.setattr("llmgw.cli.login.call", lambda *_a, **_k: info)
    r = _login(tmp_path, monkeypatch, "--no-browser")
    assert isinstance(r.exception, SystemExit) and r.exit_code == common.EXIT_REFUSED, r.output
    assert "the daemon's answer is not what this llmgw reads" in r.output
