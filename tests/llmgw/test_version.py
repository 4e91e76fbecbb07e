"""`--version` on llmgw, llmgwd and llmgw-agentd: each prints the one release number, the
llmgw distribution's, and exits 0 without reading a config."""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import version

import pytest
from click.testing import CliRunner

from llmgw.cli.main import main as cli
from llmgw_agentd import main as agentd
from llmgwd import main as llmgwd


def run_daemon_version(
    main: Callable[[list[str] | None], None], capsys: pytest.CaptureFixture[str]
) -> tuple[object, str]:
    """MAIN(["--version"]): its exit status and stdout."""
    try:
        main(["--version", "--config", "/nonexistent/llmgw.yaml"])
        code: object = None
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().out


def test_every_program_prints_the_same_release(capsys: pytest.CaptureFixture[str]) -> None:
    release = version("llmgw")
    assert run_daemon_version(llmgwd.main, capsys) == (0, f"llmgwd, version {release}\n")
    assert run_daemon_version(agentd.main, capsys) == (0, f"llmgw-agentd, version {release}\n")
    out = CliRunner().invoke(cli, ["--version"])
    assert (out.exit_code, out.output) == (0, f"llmgw, version {release}\n")
