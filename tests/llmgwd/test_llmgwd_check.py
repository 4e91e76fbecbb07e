"""llmgwd --check: a server.yaml it cannot use exits 78 with the file, line and key at fault
and what is wrong, never a traceback; one it can use says "ok"."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgwd import main as llmgwd

EX_CONFIG = 78  # llmgwd(8), EXIT STATUS: the configuration cannot be used


def check(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[object, str, str]:
    """llmgwd --check --config PATH: its exit status, stdout and stderr."""
    try:
        llmgwd.main(["--check", "--config", str(path)])
        code: object = 0
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (b"name: \xc3\n", "server.yaml: not UTF-8 text (byte 6)"),
        (b"client: " + b"{a: " * 3000 + b"1" + b"}" * 3000, "server.yaml: not valid YAML: nested"),
        (b"name: x\nlog_level: verbose\n", "server.yaml:2: log_level: 'verbose' is not debug"),
        (b"client:\n  listen: localhost\n", "server.yaml:2: client.listen: 'localhost' is not"),
        (b"cluster:\n  listen: ':77100'\n", "server.yaml:2: cluster.listen: ':77100' is not"),
    ],
    ids=["not UTF-8", "nested too deeply", "no such log level", "no port", "port too high"],
)
def test_a_config_that_cannot_be_used_is_refused_saying_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, said: str
) -> None:
    path = tmp_path / "server.yaml"
    path.write_bytes(content)
    code, out, err = check(path, capsys)
    assert (code, out) == (EX_CONFIG, "")
    assert err.startswith(f"llmgwd: {tmp_path}/{said}")
    assert "Traceback" not in err


def test_a_config_it_can_use_is_ok(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "server.yaml"
    path.write_text(
        "client:\n  listen: '[::1]:7700'\ncluster:\n  listen: '7710'\nlog_level: DEBUG\n"
    )
    assert check(path, capsys) == (0, f"{path}: ok\n", "")
