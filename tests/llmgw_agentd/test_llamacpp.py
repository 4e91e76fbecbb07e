"""llama-server's argv for a replica: the agent's options, the args checked, and the binary."""

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

from llmgw import engine_args
from llmgw.config import AgentConfig, Engines, LlamaCpp
from llmgw.wire import ModelFile, ReplicaSpec
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
        "--jinja",
        "--no-webui",
        "--metrics",  # relayed by llmgwd at /metrics/engines
        "--temp",
        "0.2",
        "--n-gpu-layers",  # the canonical form of what was checked
        "-1",
    ]


def test_the_placements_slots_each_get_the_whole_context() -> None:
    # llama-server splits --ctx-size over its slots: three slots of 4096 tokens are 12288.
    got = argv(spec(context=4096, slots=3))
    assert got[got.index("--ctx-size") + 1 :][:4] == ["12288", "--parallel", "3", "--alias"]
    assert got.count("--parallel") == 1 and got.count("--ctx-size") == 1
    assert "--parallel" not in argv(spec(context=4096))  # none given: llama-server's own


def test_the_prompt_cache_stays_within_the_memory_limit() -> None:
    # A limit of 1.25 x 800 MiB + 512 MiB: an eighth of the 800 MiB estimate for prompts.
    got = argv(spec(memory_max_bytes=(1000 + 512) << 20))
    assert got[got.index("--cache-ram") + 1] == "100"
    assert "--cache-ram" not in argv(spec())  # no limit given: llama-server's own default


def test_an_isolated_cache_keeps_no_prompt_in_ram() -> None:
    # Every slot loads from llama-server's prompt cache in RAM: with organizations kept apart
    # (client.cache_isolation), it is off, whatever the memory limit.
    for limit in (0, (1000 + 512) << 20):
        got = argv(spec(memory_max_bytes=limit, isolated_cache=True))
        assert got.count("--cache-ram") == 1 and got[got.index("--cache-ram") + 1] == "0"


def test_argv_leaves_out_what_is_not_set() -> None:
    got = llamacpp.command(spec(), binary="/b", host="h", port=1, key_file=None)
    assert "--ctx-size" not in got and "--threads" not in got and "--api-key-file" not in got


def test_the_api_key_is_never_on_the_command_line() -> None:
    assert not any("sk-secret" in a for a in argv(spec()))


REFUSED = [
    ["--ctx_size", "99"],
    ["--ctx-size=99"],
    ["-c", "99"],
    ["--host", "0.0.0.0"],
    ["--api_key_file=/etc/shadow"],
    ["--grammar-file", "/etc/shadow"],
    ["--model-url", "http://x"],
]


@pytest.mark.parametrize("args", REFUSED)
def test_the_agent_refuses_what_the_api_refuses(args: list[str]) -> None:
    with pytest.raises(EngineError, match="is not allowed") as e:
        engines.check(spec(args=["--temp", "0.5", *args]))
    with pytest.raises(engine_args.EngineArgError) as api:
        engine_args.check("llama.cpp", ["--temp", "0.5", *args])
    assert str(e.value) == str(api.value)  # one check, in llmgw.engine_args


def test_a_source_that_is_not_a_file_is_refused() -> None:
    with pytest.raises(EngineError, match="file:/ABSOLUTE/PATH"):
        argv(spec(source="hf:org/repo@rev"))


def test_an_hf_set_runs_its_first_gguf_from_the_cache() -> None:
    def files(*paths: str) -> list[ModelFile]:
        return [ModelFile(path=p, size=1, sha256="0" * 64) for p in paths]

    split = files(
        "README.md",
        "q4/m-00002-of-00003.gguf",
        "q4/m-00001-of-00003.gguf",
        "q4/m-00003-of-00003.gguf",
    )
    s = spec(source=f"hf:org/repo@{'c' * 40}", files=split)
    engines.check(s)  # an hf: set with a GGUF is fine before the cache has it
    where = Path("/cache/sets/org--repo") / ("c" * 40)
    assert engines.local_source(s, where) == f"file:{where}/q4/m-00001-of-00003.gguf"
    plain = files("b.gguf", "a.gguf", "config.json")
    assert llamacpp.gguf_in(plain) == "a.gguf"
    with pytest.raises(EngineError, match="no GGUF"):
        engines.check(spec(source=f"hf:org/repo@{'c' * 40}", files=files("model.safetensors")))


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
    rel = Path("llama.cpp") / f"{llamacpp.VERSION}-x86_64-noamx" / "llama-server"
    home_bin = executable(tmp_path / "home" / ".cache" / "llmgw" / rel)
    env = {"HOME": str(tmp_path / "home")}
    assert llamacpp.find_binary(LlamaCpp(), env=env, arch="x86_64") == home_bin
    cache_bin = executable(tmp_path / "cache" / rel)
    env["LLMGW_CACHE"] = str(tmp_path / "cache")
    assert llamacpp.find_binary(LlamaCpp(), env=env, arch="x86_64") == cache_bin


def test_an_x86_cpu_build_that_may_have_amx_kernels_is_never_run(tmp_path: Path) -> None:
    # A VERSION-x86_64 build (before build-llama-server left AMX out) dies of SIGSEGV on the
    # first matrix product on a CPU with AMX: only VERSION-x86_64-noamx is an x86 CPU build.
    env = {"LLMGW_CACHE": str(tmp_path)}
    executable(tmp_path / "llama.cpp" / f"{llamacpp.VERSION}-x86_64" / "llama-server")
    with pytest.raises(EngineError, match=r"-x86_64-noamx/llama-server.*build-llama-server"):
        llamacpp.find_binary(LlamaCpp(), env=env, arch="x86_64")
    noamx = executable(tmp_path / "llama.cpp" / f"{llamacpp.VERSION}-x86_64-noamx" / "llama-server")
    assert llamacpp.find_binary(LlamaCpp(), env=env, arch="x86_64") == noamx
    # Elsewhere there are no AMX kernels: the name is VERSION-ARCH, as it was.
    arm = executable(tmp_path / "llama.cpp" / f"{llamacpp.VERSION}-aarch64" / "llama-server")
    assert llamacpp.find_binary(LlamaCpp(), env=env, arch="aarch64") == arm


def test_a_missing_binary_says_where_it_looked(tmp_path: Path) -> None:
    with pytest.raises(EngineError, match=r"build-llama-server") as e:
        llamacpp.find_binary(LlamaCpp(), env={"HOME": str(tmp_path)}, arch="x86_64")
    assert "/var/cache/llmgw-agent/llama.cpp/" in str(e.value)
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
    s = msgspec.structs.replace(s, engine="strata")  # a newer control plane's engine
    with pytest.raises(EngineError, match="not supported"):
        engines.check(s)


REAL = Path(os.environ.get("HOME", "/root")) / ".cache/llmgw/llama.cpp"


def _help_options(text: str) -> list[tuple[list[str], bool]]:
    """Each option line of llama-server --help: its spellings, and whether a value follows."""
    out = []
    for line in text.splitlines():
        m = re.match(r"(-[\w.-]*\w)", line)
        if m is None:
            continue
        flags = [m.group(1)]
        rest = line[m.end() :]
        while (n := re.match(r",\s*(-[\w.-]+)", rest)) is not None:
            flags.append(n.group(1))
            rest = rest[n.end() :]
        out.append((flags, re.match(r" \S", rest) is not None))
    return out


@pytest.mark.skipif(not list(REAL.glob("*/llama-server")), reason="no built llama-server")
def test_the_list_matches_the_real_servers_options() -> None:
    binary = sorted(REAL.glob("*/llama-server"))[-1]
    assert os.stat(binary).st_mode & stat.S_IXUSR
    text = subprocess.run(
        [str(binary), "--help"], capture_output=True, text=True, timeout=30, check=False
    ).stdout
    options = _help_options(text)
    known = {f for flags, _ in options for f in flags}
    listed = {name: value for names, value in engine_args.LLAMA_CPP for name in names}
    assert set(listed) <= known  # every spelling on the list is one the server reads
    for flags, takes_value in options:
        allowed = [f for f in flags if f in listed]
        # What passes takes exactly the values the server reads: a flag listed as taking a
        # value would hide the next argument from the check.
        for f in allowed:
            assert (listed[f] is not None) == takes_value, f
        # An option is allowed in all its spellings, or only in its negative ones.
        if allowed and len(allowed) != len(flags):
            assert all(f.startswith("--no-") for f in allowed), flags
