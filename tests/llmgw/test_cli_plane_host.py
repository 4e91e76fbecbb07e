"""`llmgw plane join` and `llmgw plane migrate` run llmgwd's host-side steps (`llmgwd join`,
`llmgwd migrate`): what llmgwd refuses reaches the user as the CLI's own refusal, the server
token never rides on a command line, and a host without llmgwd is told to install it."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from llmgw.cli import units
from llmgw.cli.main import main

LLMGW = Path(sys.executable).parent / "llmgw"
TOKEN = "0123456789abcdef0123456789abcdef.s3cr3t-part"


def llmgw(*args: str) -> subprocess.CompletedProcess[str]:
    """The installed llmgw command, as an operator runs it."""
    return subprocess.run([str(LLMGW), *args], capture_output=True, text=True, timeout=60)


def test_migrate_of_a_host_without_server_yaml_is_refused_saying_so(tmp_path: Path) -> None:
    r = llmgw("plane", "migrate", "--to", "etcd", "--config", str(tmp_path / "server.yaml"))
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr == f"Error: {tmp_path}/server.yaml: no such file\n"


def test_join_on_a_host_that_is_a_control_plane_already_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "server.yaml"
    config.write_text("name: a\n")
    r = llmgw("plane", "join", "https://cp1:7710", "--token", TOKEN, "--config", str(config))
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr == (f"Error: {config} exists: this host is set up as a control plane already\n")


@pytest.mark.parametrize(
    ("option", "said"),
    [
        (["--advertise", "http://cp2:7710"], "--advertise: must be https://HOST:PORT"),
        (["--peer-ip", "cp2"], "--peer-ip: 'cp2' is not an IP address"),
    ],
)
def test_a_bad_option_is_a_usage_error_of_llmgw(option: list[str], said: str) -> None:
    r = llmgw("plane", "join", "https://cp1:7710", "--token", TOKEN, *option)
    assert r.returncode == 2
    assert r.stderr.startswith("Usage: llmgw plane join [OPTIONS] URL\n"), r.stderr
    assert said in r.stderr


def test_the_token_reaches_llmgwd_in_its_environment_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ran: list[tuple[list[str], dict[str, str]]] = []

    def run(
        command: list[str], *, env: dict[str, str], **_: Any
    ) -> subprocess.CompletedProcess[str]:
        ran.append((command, env))
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(subprocess, "run", run)
    args = ["plane", "join", "https://cp1:7710", "--token", TOKEN, "--peer-ip", "10.0.0.2"]
    r = CliRunner().invoke(main, ["--socket", "/run/x.sock", *args])
    assert r.exit_code == 0, r.output
    [(command, env)] = ran
    assert command[:4] == [sys.executable, "-I", "-c", units.LLMGWD_MAIN]
    assert command[4:6] == ["join", "https://cp1:7710"]
    assert "--peer-ip" in command and "10.0.0.2" in command
    assert command[command.index("--socket") + 1] == "/run/x.sock"
    assert env["LLMGW_SERVER_TOKEN"] == TOKEN
    assert not any(TOKEN.split(".")[1] in arg for arg in command)


def test_without_llmgwd_the_cli_says_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "llmgwd" else find_spec(name, *a),
    )
    for args in (["migrate", "--to", "etcd"], ["join", "https://cp1:7710", "--token", TOKEN]):
        r = CliRunner().invoke(main, ["plane", *args])
        assert r.exit_code == 1
        assert "llmgwd is not installed on this host: install the llmgwd package" in r.output
