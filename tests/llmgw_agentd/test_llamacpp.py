"""llama-server's argv for a replica: the agent's options, the refused ones, and the binary."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from llmgw.config import AgentConfig, Engines, LlamaCpp
from llmgw.wire import ReplicaSpec
from llmgw_agentd import engines
from llmgw_agentd.engines import EngineError, llamacpp

KEY_ARG = "${CREDENTIALS_DIRECTORY}/key"


def spec(**kw: object) -> ReplicaSpec:
    base: dict[str, object] = {
        "id": "r1",
        "model": "smollm2",
        "engine": "llama.cpp",
        "source": "file:/models/m.gguf",
        "api_key": "sk-secret",
    }
    base.update(kw)
    return ReplicaSpec(**base)  # type: ignore[arg-type]


def argv(s: ReplicaSpec, threads: int = 0) -> list[str]:
    return llamacpp.command(
        s,
        binary="/bin/llama-server",
        host="10.0.0.5",
        port=20001,
        key_file=KEY_ARG,
        threads=threads,
    )


def test_argv_has_the_agents_options_then_the_specs_args() -> None:
    got = argv(spec(context=4096, args=["--temp", "0.2", "-ngl", "-1"]), threads=2)
    assert got == [
        "/bin/llama-server",
        "--model",
        "/models/m.gguf",
        "--host",
        "10.0.0.5",
        "--port",
        "20001",
        "--api-key-file",
        KEY_ARG,
        "--ctx-size",
        "4096",
        "--threads",
        "2",
        "--alias",
        "smollm2",
        "--no-webui",
        "--temp",
        "0.2",
        "-ngl",
        "-1",
    ]


def test_argv_leaves_out_what_is_not_set() -> None:
    got = llamacpp.command(spec(), binary="/b", host="h", port=1, key_file=None)
    assert "--ctx-size" not in got and "--threads" not in got and "--api-key-file" not in got


def test_the_api_key_is_never_on_the_command_line() -> None:
    assert not any("sk-secret" in a for a in argv(spec()))


REFUSED = [
    "-m",
    "--model",
    "--model=/etc/passwd",
    "-mu",
    "--model-url",
    "-hf",
    "-hfr",
    "--hf-repo",
    "--hf_repo=org/x",
    "-hff",
    "--hf-file",
    "-hft",
    "--hf-token",
    "-dr",
    "--lora",
    "--lora-scaled",
    "--control-vector",
    "--control-vector-scaled",
    "-mm",
    "--mmproj",
    "-mmu",
    "--mmproj-url",
    "--grammar-file",
    "-jf",
    "--json-schema-file",
    "--chat-template-file",
    "-sysf",
    "--system-prompt-file",
    "-f",
    "--file",
    "--api-key",
    "--api-key=k",
    "--api-key-file",
    "--api_key_file",
    "--ssl-key-file",
    "--ssl-cert-file",
    "--ssl-ciphers-of-the-future",
    "--path",
    "--log-file",
    "--slot-save-path",
    "--host",
    "--host=0.0.0.0",
    "--port",
    "--port=1",
    "--webui",
    "--no-webui",
    "--ui",
    "--no-ui",
    "--media-path",
    "-md",
    "--model-draft",
    "--hf-repo-draft",
    "--models-dir",
    "--rpc",
    "--tools",
    "--agent",
    "-a",
    "--alias",
    "--gpt-oss-20b-default",
    "--some-new-thing-file",
]


@pytest.mark.parametrize("arg", REFUSED)
def test_refused_args_are_named_in_the_error(arg: str) -> None:
    with pytest.raises(EngineError) as e:
        argv(spec(args=["--temp", "0.5", arg, "value"]))
    assert arg.split("=")[0] in str(e.value)
    assert "not allowed" in str(e.value)


def test_an_underscore_spelling_names_the_option_it_means() -> None:
    with pytest.raises(EngineError, match=r"--api_key_file \(--api-key-file\)"):
        llamacpp.validate_args(["--api_key_file", "/x"])


ALLOWED = [
    "--temp",
    "0.7",
    "-ngl",
    "-1",
    "--parallel",
    "4",
    "--no-mmproj",
    "--json-schema",
    "{}",
    "--grammar",
    "root ::= x",
    "-c",
    "--reverse-prompt",
    "--cont-batching",
    "--metrics",
    "--chat-template",
    "chatml",
    "--no-host",
    "-fa",
    "on",
]


def test_engine_tuning_args_pass() -> None:
    assert llamacpp.validate_args(ALLOWED) == ALLOWED


def test_a_source_that_is_not_a_file_is_refused() -> None:
    with pytest.raises(EngineError, match="file:/ABSOLUTE/PATH"):
        argv(spec(source="hf:org/repo@rev"))


def executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_configured_binary_wins(tmp_path: Path) -> None:
    b = executable(tmp_path / "llama-server")
    assert llamacpp.find_binary(LlamaCpp(binary=str(b)), env={}) == b


def test_configured_binary_must_exist(tmp_path: Path) -> None:
    with pytest.raises(EngineError, match="not an executable"):
        llamacpp.find_binary(LlamaCpp(binary=str(tmp_path / "nope")), env={})


def test_binary_from_the_build_scripts_cache(tmp_path: Path) -> None:
    rel = Path("llama.cpp") / f"{llamacpp.VERSION}-x86_64" / "llama-server"
    home_bin = executable(tmp_path / "home" / ".cache" / "llmgw" / rel)
    env = {"HOME": str(tmp_path / "home")}
    assert llamacpp.find_binary(LlamaCpp(), env=env, arch="x86_64") == home_bin
    cache_bin = executable(tmp_path / "cache" / rel)
    env["LLMGW_CACHE"] = str(tmp_path / "cache")
    assert llamacpp.find_binary(LlamaCpp(), env=env, arch="x86_64") == cache_bin


def test_a_missing_binary_says_where_it_looked(tmp_path: Path) -> None:
    with pytest.raises(EngineError, match=r"build-llama-server") as e:
        llamacpp.find_binary(LlamaCpp(), env={"HOME": str(tmp_path)}, arch="x86_64")
    assert "/var/cache/llmgw/llama.cpp/" in str(e.value)
    assert str(tmp_path / ".cache" / "llmgw" / "llama.cpp") in str(e.value)


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory others can search (pytest's tmp_path is 0700)."""
    d = Path(tempfile.mkdtemp(prefix="llmgw-test-"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        subprocess.run(["rm", "-rf", str(d)], check=False)


def test_command_refuses_files_a_dynamic_user_cannot_reach(open_dir: Path) -> None:
    binary = executable(open_dir / "bin" / "llama-server")
    model = open_dir / "private" / "m.gguf"
    model.parent.mkdir()
    model.write_bytes(b"GGUF")
    model.chmod(0o644)
    model.parent.chmod(0o700)
    config = AgentConfig(engines=Engines(llama_cpp=LlamaCpp(binary=str(binary))))
    s = spec(source=f"file:{model}")
    with pytest.raises(EngineError, match="not searchable by others"):
        engines.command(s, config, host="h", port=1, key_file=KEY_ARG)
    model.parent.chmod(0o755)
    got = engines.command(s, config, host="h", port=1, key_file=KEY_ARG)
    assert got[:3] == [str(binary), "--model", str(model)]
    model.chmod(0o600)
    with pytest.raises(EngineError, match="others may not read"):
        engines.command(s, config, host="h", port=1, key_file=KEY_ARG)


def test_an_unknown_engine_is_refused() -> None:
    s = spec()
    s = msgspec.structs.replace(s, engine="vllm")  # a newer control plane's engine
    with pytest.raises(EngineError, match="not supported"):
        engines.check(s)


REAL = Path(os.environ.get("HOME", "/root")) / ".cache/llmgw/llama.cpp"


@pytest.mark.skipif(not list(REAL.glob("*/llama-server")), reason="no built llama-server")
def test_every_spelling_of_a_refused_option_of_the_real_server_is_refused() -> None:
    binary = sorted(REAL.glob("*/llama-server"))[-1]
    assert os.stat(binary).st_mode & stat.S_IXUSR
    text = subprocess.run(
        [str(binary), "--help"], capture_output=True, text=True, timeout=30, check=False
    ).stdout
    partial = []
    for line in text.splitlines():
        m = re.match(r"(-[\w.-]+)", line)
        if m is None:
            continue
        flags = [m.group(1)]
        rest = line[m.end() :]
        while (n := re.match(r",\s*(-[\w.-]+)", rest)) is not None:
            flags.append(n.group(1))
            rest = rest[n.end() :]
        refused = [f for f in flags if llamacpp.refusal(f) is not None]
        if refused and len(refused) != len(flags) and not any(f.startswith("--no-") for f in flags):
            partial.append(flags)
    assert partial == []
