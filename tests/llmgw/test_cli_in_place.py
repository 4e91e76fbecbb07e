"""A served model changed in place through the CLI against the real admin API: its longest
answer by `llmgw model context --max-output` (alone, no replica started again; with a
context, set with it), `llmgw models` showing replicas per profile, and a profile whose
reply would take minutes on CPUs warned of by `llmgw model plan` and served only with
--cpu-ok (the console's serve form asks by the same rule: llmgw.reply_time)."""

from __future__ import annotations

import functools
from collections.abc import Iterator

import pytest

from llmgwd.api.base import ApiContext
from llmgwd.catalog import Model, profiles_of
from llmgwd.placement.profiles import Profile
from llmgwd.placement.scheduler import Verdict
from tests.llmgw import test_cli
from tests.llmgw.test_cli import Daemon, daemon, rows  # noqa: F401 (daemon: a fixture)
from tests.llmgw.test_cli_wait import Scheduling

# On n1's CPUs at 4 tokens/s, a 1024-token reply takes 256 s (4.3 minutes); at 40, 26 s.
SLOW = Verdict("n1", "", True, 4096, 1 << 30, 4.0, "fits", slots=1)
FAST = Verdict("n1", "", True, 4096, 1 << 30, 40.0, "fits", slots=1)


class Timed(Scheduling):
    """Nothing placed; one more replica of each profile would go where verdict says."""

    verdict = SLOW

    def explain(self, model: Model) -> list[tuple[Profile, list[Verdict]]]:
        return [(p, [self.verdict]) for p in profiles_of(model)]


@pytest.fixture
def timed(monkeypatch: pytest.MonkeyPatch) -> Timed:
    made = Timed()
    monkeypatch.setattr(test_cli, "ApiContext", functools.partial(ApiContext, scheduling=made))
    return made


@pytest.fixture
def smol(daemon: Daemon) -> Iterator[Daemon]:  # noqa: F811
    assert daemon.cli("model", "add", "smol", "--from", "file:/m/smol.gguf").exit_code == 0
    yield daemon


def generation(d: Daemon) -> tuple[int, int, int]:
    m = d.catalog.get("smol")
    assert m is not None
    return m.context, m.max_tokens, m.generation


def test_max_output_alone_changes_the_longest_answer_only(smol: Daemon) -> None:
    assert smol.cli("model", "context", "smol", "8192").exit_code == 0
    r = smol.cli("model", "context", "smol", "--max-output", "500")
    assert (r.exit_code, r.stdout.strip()) == (0, "Model smol: longest answer 500 tokens.")
    assert generation(smol) == (8192, 500, 0)  # no new settings for the replicas to roll to
    r = smol.cli("model", "context", "smol", "--max-output", "9000")
    assert r.exit_code == 1 and "max_tokens" in r.stderr
    assert generation(smol) == (8192, 500, 0)
    assert smol.cli("model", "context", "smol").exit_code == 2


def test_max_output_with_a_context_is_set_with_it_never_past_it(smol: Daemon) -> None:
    assert smol.cli("model", "context", "smol", "--max-output", "3000").exit_code == 0
    r = smol.cli("model", "context", "smol", "2048")
    assert r.exit_code == 1 and "below the model's max_tokens (3000)" in r.stderr
    r = smol.cli("model", "context", "smol", "2048", "--max-output", "1000")
    assert r.exit_code == 0, r.stderr
    assert r.stdout.splitlines() == [
        "Model smol: context 2048.",
        "Model smol: longest answer 1000 tokens.",
    ]
    assert generation(smol)[:2] == (2048, 1000)
    r = smol.cli("model", "context", "smol", "1024", "--max-output", "1500")
    assert r.exit_code == 1 and "max_tokens" in r.stderr
    assert generation(smol)[:2] == (2048, 1000)


def test_models_shows_the_replicas_of_each_profile(smol: Daemon) -> None:
    assert smol.cli("model", "replicas", "smol", "7", "--profile", "default").exit_code == 0
    r = smol.cli("model", "replicas", "smol", "4", "--profile", "cpu", "--priority", "-1")
    assert r.exit_code == 0, r.stderr
    [header, line] = rows(smol.cli("models").stdout)
    assert line[header.index("READY")] == "0/11"
    assert line[header.index("REPLICAS")] == "default 7, cpu 4"


def test_plan_warns_of_a_slow_cpu_reply_and_serve_needs_cpu_ok(
    timed: Timed,
    smol: Daemon,
) -> None:
    r = smol.cli("model", "plan", "smol")
    assert r.exit_code == 0, r.stderr
    warning = "A reply of 1024 tokens would take about 4.3 minutes on n1 (4.0 tokens/s on its CPUs)"
    assert f"Warning: {warning}: `llmgw model serve` asks for --cpu-ok." in r.stdout
    r = smol.cli("model", "serve", "smol", "--replicas", "1")
    assert r.exit_code == 1 and warning in r.stderr and "--cpu-ok" in r.stderr
    assert generation(smol) == (0, 0, 0) and smol.catalog.get("smol").replicas == 0  # type: ignore[union-attr]
    r = smol.cli("model", "serve", "smol", "--replicas", "1", "--cpu-ok")
    assert r.exit_code == 0, r.stderr
    assert smol.catalog.get("smol").replicas == 1  # type: ignore[union-attr]


def test_a_slow_profile_s_replicas_need_cpu_ok_too(timed: Timed, smol: Daemon) -> None:
    r = smol.cli("model", "replicas", "smol", "2", "--profile", "default")
    assert r.exit_code == 1 and "4.3 minutes on n1" in r.stderr
    assert smol.catalog.get("smol").replicas == 0  # type: ignore[union-attr]
    r = smol.cli("model", "replicas", "smol", "2", "--profile", "default", "--cpu-ok")
    assert r.exit_code == 0, r.stderr
    assert smol.catalog.get("smol").replicas == 2  # type: ignore[union-attr]
    assert smol.cli("model", "replicas", "smol", "0", "--profile", "default").exit_code == 0


def test_a_short_longest_answer_or_a_fast_place_needs_no_cpu_ok(
    timed: Timed,
    smol: Daemon,
) -> None:
    assert smol.cli("model", "max-tokens", "smol", "200").exit_code == 0  # 50 s at 4 tokens/s
    assert "Warning" not in smol.cli("model", "plan", "smol").stdout
    assert smol.cli("model", "serve", "smol", "--replicas", "1").exit_code == 0
    assert smol.cli("model", "max-tokens", "smol", "0").exit_code == 0
    timed.verdict = FAST
    assert "Warning" not in smol.cli("model", "plan", "smol").stdout
    assert smol.cli("model", "serve", "smol", "--replicas", "2").exit_code == 0
