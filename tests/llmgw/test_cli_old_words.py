"""The old words of the control plane's commands, `llmgw server ...` and `llmgw servers`,
still work as `llmgw plane ...` and `llmgw planes` do, calling the same routes, and are
listed nowhere; the old LLMGW_SERVER_TOKEN is still read."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from llmgw import config
from llmgw.cli.main import main

VIEW = {"name": "cp1", "url": "https://cp1:7710", "member": "1", "health": "healthy",
        "role": "leader", "self": True}  # fmt: skip
TOKEN = {"token": "t", "expires_in": 900, "url": "https://cp1:7710",
         "command": "llmgw plane join https://cp1:7710 --token t"}  # fmt: skip
REMOVED = {"name": "cp2", "member": "2", "removed": True}


def _run(monkeypatch: pytest.MonkeyPatch, answer: Any, *args: str) -> tuple[Result, list[str]]:
    """The command run against an llmgwd that answers answer; the calls it made."""
    calls: list[str] = []

    def request(_sock: str, method: str, path: str, *_a: Any, **_k: Any) -> tuple[int, Any]:
        calls.append(f"{method} {path}")
        return 200, answer

    monkeypatch.setattr("llmgw.cli.common.ipc.request", request)
    return CliRunner().invoke(main, ["--socket", "/x.sock", *args]), calls


@pytest.mark.parametrize(
    ("old", "answer"),
    [
        pytest.param(["servers"], [VIEW], id="servers"),
        pytest.param(["server", "token"], TOKEN, id="server token"),
        pytest.param(["server", "remove", "cp2"], REMOVED, id="server remove"),
        pytest.param(["server", "leave", "--keep-running"], REMOVED, id="server leave"),
    ],
)
def test_an_old_word_runs_the_same_command(
    monkeypatch: pytest.MonkeyPatch, old: list[str], answer: Any
) -> None:
    new = ["planes"] if old == ["servers"] else ["plane", *old[1:]]
    done, calls = _run(monkeypatch, answer, *new)
    assert done.exit_code == 0, done.output
    assert calls[0].split()[1].startswith("/api/v1/planes")
    again, old_calls = _run(monkeypatch, answer, *old)
    assert (again.exit_code, again.output, old_calls) == (0, done.output, calls)


def test_server_init_still_writes_the_config(tmp_path: Path) -> None:
    path = tmp_path / "server.yaml"
    args = ["server", "init", "--config", str(path), "--state-dir", str(tmp_path / "s")]
    r = CliRunner().invoke(main, [*args, "--no-start", "--advertise", "https://cp:7710"])
    assert r.exit_code == 0, r.output
    assert config.load(path, config.ServerConfig).cluster.advertise == "https://cp:7710"


def test_the_old_words_are_listed_nowhere() -> None:
    listed = CliRunner().invoke(main, ["--help"]).output
    assert "  plane " in listed and "  planes " in listed
    assert "  server " not in listed and "  servers " not in listed
    r = CliRunner().invoke(main, ["server", "join", "--help"])
    assert r.exit_code == 0 and r.output.startswith("Usage: llmgw server join [OPTIONS] URL")


@pytest.mark.parametrize("variable", ["LLMGW_PLANE_TOKEN", "LLMGW_SERVER_TOKEN"])
def test_the_token_is_read_from_either_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str
) -> None:
    ran: list[dict[str, str]] = []

    def run(
        command: list[str], *, env: dict[str, str], **_: Any
    ) -> subprocess.CompletedProcess[str]:
        ran.append(env)
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(subprocess, "run", run)
    args = ["--socket", "/x.sock", "plane", "join", "https://cp1:7710"]
    r = CliRunner().invoke(main, args, env={variable: "a.b"})
    assert r.exit_code == 0, r.output
    assert ran[0]["LLMGW_SERVER_TOKEN"] == "a.b"  # what llmgwd join reads
