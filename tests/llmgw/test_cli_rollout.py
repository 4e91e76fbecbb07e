"""`llmgw model restart` and `llmgw model context` print how the replicas roll to the new
settings, and `llmgw models` shows a model rolling or its roll halted."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from click.testing import CliRunner

from llmgw.api_types import ModelView
from llmgw.cli import model as model_cli
from llmgw.cli.main import main

IN_PLACE = (
    "replacing 1 replica for the new settings, one at a time (it restarts in place: one replica"
    " and no room for a second, so the model is down until it is ready again)"
)
HALTED = "halted: replica m-1 failed to start with the new settings on a (exit 1)"


def view(rollout: str) -> dict[str, Any]:
    m = ModelView(
        name="m", source="file:/m.gguf", engine="llama.cpp", args=[], context=2048,
        max_tokens=0, price_prompt=0, price_completion=0, replicas=1, ready=1, created_at=0,
        replica_status=[], rollout=rollout,
    )  # fmt: skip
    out: dict[str, Any] = msgspec.to_builtins(m)
    return out


def answering(monkeypatch: pytest.MonkeyPatch, answer: object) -> list[tuple[str, str]]:
    """The daemon's answer to every call; the calls made."""
    asked: list[tuple[str, str]] = []

    def call(settings: object, method: str, path: str, body: object = None) -> object:
        asked.append((method, path))
        return answer

    monkeypatch.setattr(model_cli, "call", call)
    return asked


def test_restart_prints_how_the_replicas_roll(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = answering(monkeypatch, view(IN_PLACE))
    r = CliRunner().invoke(main, ["model", "restart", "m"])
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines() == [
        "Restarting model m: 1 replicas wanted, 1 ready.",
        f"New settings: {IN_PLACE}.",
    ]
    assert asked == [("POST", "/api/v1/models/m/restart")]


def test_a_context_change_prints_its_roll_and_none_when_nothing_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    answering(monkeypatch, view(IN_PLACE))
    r = CliRunner().invoke(main, ["model", "context", "m", "2048"])
    assert r.stdout.splitlines() == ["Model m: context 2048.", f"New settings: {IN_PLACE}."]
    answering(monkeypatch, view(""))
    r = CliRunner().invoke(main, ["model", "context", "m", "2048"])
    assert r.stdout.splitlines() == ["Model m: context 2048."]


def test_models_shows_a_roll_and_why_it_halted(monkeypatch: pytest.MonkeyPatch) -> None:
    answering(monkeypatch, [view(IN_PLACE)])
    assert "rolling to new settings" in CliRunner().invoke(main, ["models"]).stdout
    answering(monkeypatch, [view(HALTED)])
    assert f"roll {HALTED}" in CliRunner().invoke(main, ["models"]).stdout
