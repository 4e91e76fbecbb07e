"""The commands read llmgwd's answers as the shared types (llmgw.api_types): an answer that
is not one is a plain refusal naming what is off, never a traceback."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner

from llmgw.cli import common
from llmgw.cli.main import main

COMMANDS = [
    ["nodes"],
    ["node", "remove", "gpu1"],
    ["node", "token"],
    ["status"],
    ["usage"],
    ["usage", "--by", "org"],
    ["slurm", "status"],
    ["slurm", "lend", "n1"],
    ["servers"],
    ["server", "token"],
    ["server", "remove", "cp2"],
    ["server", "leave", "--keep-running"],
    ["mirror", "status"],
    ["mirror", "sweep"],
    ["mirror", "add-peer", "https://m2:7700/hf"],
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
