"""scripts/gpu-check where there is no GPU (this machine): it stops at once and says why."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[2] / "scripts" / "gpu-check"


def run(tmp: Path) -> subprocess.CompletedProcess[str]:
    env = {"PATH": f"{tmp}:/usr/bin:/bin", "OUT": str(tmp / "out"), "HOME": str(tmp)}
    return subprocess.run([str(SCRIPT)], env=env, capture_output=True, text=True, timeout=30)


def test_its_syntax_is_sound() -> None:
    assert subprocess.run(["bash", "-n", str(SCRIPT)], check=False).returncode == 0


def test_without_nvidia_smi_it_fails_at_once_saying_so(tmp_path: Path) -> None:
    out = run(tmp_path)
    assert out.returncode == 1
    assert "no nvidia-smi here: this check needs a machine with an NVIDIA GPU" in out.stderr
    assert not (tmp_path / "out").exists()  # nothing recorded, built or booted


def test_with_a_driver_but_no_card_it_fails_at_once_saying_so(tmp_path: Path) -> None:
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'No devices were found'; exit 6\n")
    smi.chmod(0o755)
    out = run(tmp_path)
    assert out.returncode == 1 and "nvidia-smi answers no cards" in out.stderr


MAKE_MOE = SCRIPT.parent / "make-test-moe"
# An environment with torch, transformers and tokenizers: the vLLM CPU build the tests make
# (scripts/build-vllm-cpu), as FreeToken's would have them on a card's machine.
TORCH_ENV = Path.home() / ".cache" / "llmgw" / "vllm" / "0.32.0-x86_64"


def test_the_freetoken_step_s_scripts_syntax_is_sound() -> None:
    assert subprocess.run(["bash", "-n", str(MAKE_MOE)], check=False).returncode == 0


@pytest.mark.skipif(not (TORCH_ENV / "bin" / "python").exists(), reason="no torch environment")
def test_the_tiny_moe_is_a_qwen3_moe_set_freetoken_reads(tmp_path: Path) -> None:
    made = subprocess.run([str(MAKE_MOE), str(TORCH_ENV), str(tmp_path / "moe")],
                          capture_output=True, text=True, timeout=600, check=True)  # fmt: skip
    out = Path(made.stdout.strip())
    config = json.loads((out / "config.json").read_text())
    assert (config["model_type"], config["num_experts_per_tok"]) == ("qwen3_moe", 2)
    assert config.get("num_local_experts", config.get("num_experts")) == 8
    assert (out / "model.safetensors").stat().st_mode & 0o004  # engines run as dynamic users
    check = (
        "import sys; from transformers import AutoTokenizer\n"
        "t = AutoTokenizer.from_pretrained(sys.argv[1])\n"
        "print(t.apply_chat_template([{'role': 'user', 'content': 'Hello'}],"
        " tokenize=False, add_generation_prompt=True))"
    )
    said = subprocess.run([str(TORCH_ENV / "bin" / "python"), "-c", check, str(out)],
                          capture_output=True, text=True, timeout=120, check=True)  # fmt: skip
    assert said.stdout == "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n\n"
