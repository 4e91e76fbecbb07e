"""FreeToken's `ft serve` for a replica: the model, address, card and served name; the key in
FREETOKEN_API_KEY, never on the command line; flags that read files or fetch refused, as are
FREETOKEN_ variables naming paths; ready once /health's body no longer says "loading"; and
the nodes it is offered on. On answers recorded from freetoken 0.2.1 (freetoken/README.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmgw import engine_args, engine_cards
from llmgw.config import AgentConfig, Engines, Freetoken
from llmgw.wire import Gpu, ModelFile, ReplicaSpec
from llmgw_agentd import engines, inventory
from llmgw_agentd.engines import EngineError, freetoken, install
from llmgw_agentd.replicas.health import health_code

RECORDED = Path(__file__).parent / "freetoken"
KEY_ARG = "${CREDENTIALS_DIRECTORY}/key"
SET = "/var/cache/llmgw-agent/models/sets/qwen--qwen3-30b-a3b/abc"
CARD = "GPU-5d1c9a3e-0000-4000-8000-000000000001"
SAFETENSORS = [
    ModelFile(path=p, size=1000, sha256="0" * 64)
    for p in ("config.json", "model-00001-of-00002.safetensors", "tokenizer.json")
]


def spec(**kw: object) -> ReplicaSpec:
    base: dict[str, object] = {
        "id": "r1", "model": "qwen3-moe", "engine": "freetoken", "source": f"file:{SET}",
        "api_key": "sk-secret", "files": SAFETENSORS, "devices": [CARD],
    }  # fmt: skip
    base.update(kw)
    return ReplicaSpec(**base)  # type: ignore[arg-type]


def argv(s: ReplicaSpec) -> list[str]:
    return freetoken.command(s, python="/env/bin/python", host="10.0.0.5", port=20001,
                             key_file=KEY_ARG)  # fmt: skip


def serve_args(got: list[str]) -> list[str]:
    """What `ft` sees: the words after the launcher's key file argument."""
    return got[got.index(freetoken.LAUNCH) + 2 :]


def env_of(got: list[str]) -> dict[str, str]:
    words = got[1 : got.index("/env/bin/python")]
    return dict(w.split("=", 1) for w in words)


def recorded_options() -> dict[str, str]:
    """Every spelling of `ft serve`'s options -> flag, value or values."""
    out: dict[str, str] = {}
    for line in (RECORDED / "serve-options-0.2.1.txt").read_text().splitlines():
        names, kind = line.split("\t")
        out.update((n, kind) for n in names.split())
    return out


def test_ft_serve_gets_the_model_address_card_and_served_name() -> None:
    got = argv(spec(context=32768, slots=2, args=["--moe-strategy", "hybrid"]))
    assert serve_args(got) == [
        "serve", "--model", SET, "--host", "10.0.0.5", "--port", "20001", "--gpu", CARD,
        "--served-model-name", "qwen3-moe", "--max-seq-len-override", "32768",
        "--max-running-requests", "2", "--moe-strategy", "hybrid",
    ]  # fmt: skip
    assert "--max-seq-len-override" not in argv(spec())  # no context: FreeToken's own


def test_the_key_is_never_on_the_command_line_and_nothing_is_fetched() -> None:
    got = argv(spec())
    assert not any("sk-secret" in a for a in got) and "--api-key" not in got
    env = env_of(got)
    assert env["HF_HUB_OFFLINE"] == "1" and env["TRANSFORMERS_OFFLINE"] == "1"
    assert all(env[k].startswith("/tmp") for k in ("HOME", "HF_HOME", "TRITON_CACHE_DIR"))
    assert env["CUDA_HOME"] == "/usr/local/cuda"


def test_a_models_freetoken_settings_go_to_its_environment() -> None:
    got = argv(spec(args=["FREETOKEN_CPU_MOE_ISA=avx2", "--tool-call-parser", "FREETOKEN_X"]))
    assert env_of(got)["FREETOKEN_CPU_MOE_ISA"] == "avx2"
    assert serve_args(got)[-2:] == ["--tool-call-parser", "FREETOKEN_X"]  # a value stays


REFUSED = [
    (["--mmproj", "/srv/mmproj.gguf"], "reads or writes files"),
    (["--allowed-local-media-path", "/"], "reads or writes files"),
    (["--model-source", "modelscope"], "fetches"),
    (["--allowed-media-domains", "example.com"], "fetches"),
    (["--max-seq-len-override", "4096"], "the scheduler sets the context"),
    (["--api-key", "k"], "never on the command line"),
    (["--gpu", "0"], "placement"),
    (["--served-model-name", "x"], "the model's name"),
    (["FREETOKEN_API_LOG_DIR=/var/log/ft"], "names a path"),
    (["FREETOKEN_KERNEL_CACHE_DIR=/tmp/k"], "names a path"),
    (["FREETOKEN_MMPROJ=mm.gguf"], "names a path"),
    (["FREETOKEN_PIN_BUDGET_GB=/etc"], "names a path"),
    (["FREETOKEN_API_KEY=k"], "llmgw sets it"),
    (["FREETOKEN_DAEMON_URL=http:x"], "llmgw sets it"),
    (["FREETOKEN_PORT=9"], "not one of the FreeToken settings"),
    (["FREETOKEN_MODEL_SOURCE=modelscope"], "not one of the FreeToken settings"),
    (["FREETOKEN_ALLOWED_MEDIA_DOMAINS=evil.example"], "not one of the FreeToken settings"),
    (["FREETOKEN_CPU_MOE_ISA=--help"], "starts with '-'"),
]


@pytest.mark.parametrize(("args", "why"), REFUSED)
def test_the_agent_refuses_what_the_api_refuses(args: list[str], why: str) -> None:
    with pytest.raises(EngineError, match=why) as e:
        engines.check(spec(args=args))
    with pytest.raises(engine_args.EngineArgError) as api:
        engine_args.check("freetoken", args)
    assert str(e.value) == str(api.value)


def test_every_variable_allowed_is_one_freetoken_reads_and_names_no_path() -> None:
    recorded = set((RECORDED / "env-0.2.1.txt").read_text().split())
    assert recorded >= engine_args.FREETOKEN_ENV
    for name in recorded - engine_args.FREETOKEN_ENV:  # the agent's, or a path's
        assert name.startswith(engine_args.FREETOKEN_ENV_OWNED) or name.endswith(
            engine_args.FREETOKEN_ENV_PATHS
        ), name


def test_every_option_on_the_list_is_ft_serves_and_takes_a_value_as_it_does() -> None:
    options = recorded_options()
    for names, rule in engine_args.FREETOKEN:
        for name in names:
            assert options.get(name) == ("flag" if rule is None else "value"), name
    for names in engine_args.FREETOKEN_REFUSED:
        assert all(n in options for n in names), names


def test_one_card_and_a_safetensors_set_only() -> None:
    with pytest.raises(EngineError, match="one card"):
        engines.check(spec(devices=[CARD, "GPU-other"]))
    with pytest.raises(EngineError, match="safetensors set"):
        engines.check(spec(source="file:/m.gguf", files=[]))
    with pytest.raises(EngineError, match="runs on a card"):
        argv(spec(devices=[]))
    engines.check(spec())
    assert engines.local_source(spec(), Path(SET)) == f"file:{SET}"


@pytest.mark.parametrize(
    ("answer", "code"), [("health-loading.json", 503), ("health-ok.json", 200),
                         ("health-error.json", 503)],
)  # fmt: skip
def test_ready_only_once_health_no_longer_says_loading(answer: str, code: int) -> None:
    body = (RECORDED / answer).read_bytes()
    assert json.loads(body)["status"] in ("loading", "ok", "error")
    assert health_code(200, body) == code
    assert engines.models_path(spec()) is None  # /health's body is enough


def gpu(cc: str) -> Gpu:
    return Gpu(index=0, uuid=CARD, name="card", memory_total_bytes=80 << 30,
               memory_free_bytes=80 << 30, compute_capability=cc)  # fmt: skip


def test_offered_on_x86_64_with_cuda_13_a_580_driver_and_an_ampere_card() -> None:
    good = ([gpu("8.0")], "13.0", "580.65.06", "x86_64")
    assert inventory.freetoken_runs(*good)
    assert "freetoken:gpu" in inventory.engines(
        [gpu("9.0")], "13.0", False, can_build=False, driver="580.95", machine="x86_64"
    )
    assert not inventory.freetoken_runs([gpu("7.5")], *good[1:])
    assert not inventory.freetoken_runs(good[0], "12.8", *good[2:])
    assert not inventory.freetoken_runs(good[0], "13.0", "575.57.08", "x86_64")
    assert not inventory.freetoken_runs(good[0], "13.0", "", "x86_64")  # driver not known
    assert not inventory.freetoken_runs(good[0], "13.0", "580.65.06", "aarch64")
    assert not inventory.freetoken_runs([], "13.0", "580.65.06", "x86_64")


def test_the_scheduler_passes_over_cards_below_8_0_and_drivers_before_cuda_13() -> None:
    needs = engine_cards.needs("freetoken", "0.2.1")
    assert engine_cards.card_refusal(needs, "7.5") == (
        "compute capability 7.5 < 8.0 that FreeToken 0.2.1 (CUDA 13.0) needs"
    )
    assert engine_cards.card_refusal(needs, "8.0") == ""
    assert "supports CUDA 12.9 < 13.0" in engine_cards.driver_refusal(needs, "12.9", "575.57")
    assert engine_cards.driver_refusal(needs, "13.0", "580.65.06") == ""


def test_installed_by_uv_per_node_at_the_pinned_version(tmp_path: Path) -> None:
    own = AgentConfig(engines=Engines(dir=str(tmp_path)))
    assert install.DISTRIBUTIONS["freetoken:gpu"] == "freetoken"
    assert install.site_of(own, "freetoken:gpu") is own.engines.freetoken
    assert freetoken.env_dir(own) == tmp_path / f"freetoken-{Freetoken().version}"
    site = AgentConfig(engines=Engines(freetoken=Freetoken(env="/srv/ft")))
    assert freetoken.env_dir(site) == Path("/srv/ft")
    with pytest.raises(EngineError, match="FreeToken's python"):  # not installed there
        engines.command(spec(), own, host="h", port=1, key_file=None)


def test_the_launcher_gives_ft_the_key_from_the_file_and_its_own_argv(tmp_path: Path) -> None:
    # A stand-in for freetoken.cli (the `ft` script's main): prints what `ft serve` would read.
    (tmp_path / "freetoken").mkdir()
    (tmp_path / "freetoken" / "__init__.py").write_text("")
    (tmp_path / "freetoken" / "cli.py").write_text(
        "import os\n"
        "def main(argv):\n"
        "    print(os.environ.get('FREETOKEN_API_KEY', '-'), os.environ.get("
        "'FREETOKEN_CPU_MOE_ISA', '-'), argv)\n"
        "    return 0\n"
    )
    key = tmp_path / "key"
    key.write_text("sk-secret\n")
    s = spec(args=["FREETOKEN_CPU_MOE_ISA=avx2"])
    got = freetoken.command(s, python=sys.executable, host="h", port=1, key_file=str(key))
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    out = subprocess.run(got, env=env, capture_output=True, text=True, check=True).stdout
    printed_key, isa, printed_argv = out.strip().split(" ", 2)
    assert (printed_key, isa) == ("sk-secret", "avx2")
    assert printed_argv == repr(serve_args(got))


def test_where_accounts_prompts_are_kept_apart_no_prefix_is_shared() -> None:
    got = serve_args(argv(spec(isolated_cache=True, args=["--cache-type", "radix"])))
    assert got[-2:] == ["--cache-type", "naive"]  # argparse: the last one wins
    assert "naive" not in serve_args(argv(spec(args=["--cache-type", "radix"])))
