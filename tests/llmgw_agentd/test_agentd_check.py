"""llmgw-agentd --check: a config it cannot use exits 78 saying the file and what is wrong;
only the default agent.yaml may be absent (the agent then runs with the defaults)."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw_agentd import main as agentd

EX_CONFIG = 78  # llmgw-agentd(8), EXIT STATUS: the configuration cannot be used


def check(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[object, str, str]:
    """llmgw-agentd --check ARGV: its exit status, stdout and stderr."""
    try:
        agentd.main(["--check", *argv])
        code: object = 0
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


def test_a_config_named_that_is_not_there_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "agnet.yaml"
    code, out, err = check(["--config", str(missing)], capsys)
    assert (code, out) == (EX_CONFIG, "")
    assert err == f"llmgw-agentd: {missing}: no such file\n"


def test_the_default_config_may_be_absent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    default = tmp_path / "agent.yaml"
    monkeypatch.setattr(agentd, "AGENT_CONFIG", default)
    assert check([], capsys) == (0, f"{default}: ok (no such file: the defaults)\n", "")
    default.write_text("heartbeat_s: 2\n")
    assert check([], capsys) == (0, f"{default}: ok\n", "")


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (b"node_name: \xff\xfe\n", "agent.yaml: not UTF-8 text (byte 11)"),
        (b"engines: " + b"[" * 5000 + b"]" * 5000, "agent.yaml: not valid YAML: nested too deeply"),
        (b"node_name: n1\nlog_level: loud\n", "agent.yaml:2: log_level: 'loud' is not debug"),
    ],
    ids=["not UTF-8", "nested too deeply", "no such log level"],
)
def test_a_config_that_cannot_be_used_is_refused_saying_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, said: str
) -> None:
    path = tmp_path / "agent.yaml"
    path.write_bytes(content)
    code, out, err = check(["--config", str(path)], capsys)
    assert (code, out) == (EX_CONFIG, "")
    assert err.startswith(f"llmgw-agentd: {tmp_path}/{said}")
    assert "Traceback" not in err
