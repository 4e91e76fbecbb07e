"""vLLM's CPU build as an engine on a real systemd: SmolLM2 as a safetensors set imported into
the mirror, `llmgw model add --engine vllm`, served by the node's agent from its cache, and
answered through llmgwd's /v1 by the official openai client, streamed and not. One model
start for the module (vLLM takes minutes to start on two cores)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from integration.conftest import _name
from integration.harness import REPO, Bind, PrivateSystemd, binds
from integration.llmgw_node import Node, llama_server

CLIENT_PORT, CLUSTER_PORT = 17730, 17740
REPO_NAME = "local/SmolLM2-135M-Instruct"
MODEL = "smol-vllm"
ENV_INSIDE = "/var/cache/llmgw/vllm/0.32.0-x86_64"  # world-reachable, as a dynamic user needs
START_S = 900.0  # vLLM's start-up on the 2-core test machine: 213 s, 110 s with EAGER
# A model's engine argument (on vLLM's list): no torch.compile warm-up or CUDA graphs. On CPUs
# the start is about half (measured with this test) and tokens may come a little
# slower; a site chooses it per model.
EAGER = "--arg=--enforce-eager"


def _script(name: str) -> Path:
    r = subprocess.run([REPO / "scripts" / name], capture_output=True, text=True, timeout=3600)
    if r.returncode != 0:
        pytest.skip(f"scripts/{name} failed, so vLLM's CPU build is not here: {r.stderr[-400:]}")
    return Path(r.stdout.strip())


@pytest.fixture(scope="module")
def served(request: pytest.FixtureRequest) -> Iterator[tuple[Node, str, float]]:
    """A node serving the SmolLM2 safetensors set with vLLM; its key and the start-up's s."""
    env, model_dir = _script("build-vllm-cpu"), _script("make-test-safetensors")
    ps = PrivateSystemd(
        _name(request), binds=[*binds(), Bind(env, Path(ENV_INSIDE), readonly=True)]
    )
    try:
        ps.boot()
        yield _serve(Node(ps, CLIENT_PORT, CLUSTER_PORT), model_dir)
    finally:
        ps.shutdown()


def _serve(node: Node, model_dir: Path) -> tuple[Node, str, float]:
    node.install(llama_server(), agent_extra=f"  vllm:\n    env: {ENV_INSIDE}\n")
    node.join(node.init_server())
    node.ps.run(["cp", "-rL", str(model_dir), "/srv/smol"])
    node.llmgw("mirror", "import", "/srv/smol", "--as", REPO_NAME)
    node.llmgw("model", "add", MODEL, "--from", f"hf:{REPO_NAME}", "--engine", "vllm",
               "--context", "2048", EAGER)  # fmt: skip
    started = time.monotonic()
    node.llmgw("model", "serve", MODEL, "--replicas", "1")
    node.wait(lambda: node.model(MODEL)["ready"] >= 1, "vLLM replica ready", START_S)
    key = node.llmgw("key", "create", "tests", "--json")["key"]
    return node, key, time.monotonic() - started


@pytest.fixture
def client(served: tuple[Node, str, float]) -> openai.OpenAI:
    node, key, _ = served
    return openai.OpenAI(base_url=node.base_url, api_key=key, max_retries=0, timeout=300)


def test_a_chat_is_answered(served: tuple[Node, str, float], client: openai.OpenAI) -> None:
    asked = time.monotonic()
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=24,
    )  # fmt: skip
    took = time.monotonic() - asked
    assert r.model == MODEL and r.choices[0].message.content
    assert r.usage is not None and r.usage.completion_tokens > 0
    print(f"\nvLLM start-up {served[2]:.0f} s; first chat answered in {took:.2f} s")


def test_a_stream_is_answered(client: openai.OpenAI) -> None:
    text = ""
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Count from one to ten."}],
        max_tokens=48, stream=True,
    )  # fmt: skip
    chunks = 0
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            chunks += 1
            text += chunk.choices[0].delta.content
    assert chunks > 3 and text


def test_the_engine_runs_as_planned(served: tuple[Node, str, float]) -> None:
    node = served[0]
    [unit] = node.engine_units()
    show = node.ps.systemctl("show", unit, "-p", "ExecStart", "-p", "Environment").stdout
    assert "vllm.entrypoints.openai.api_server" in show and "--served-model-name" in show
    assert "VLLM_API_KEY=" not in show  # the key is never in the unit's properties
    cmdline = node.ps.run(["cat", f"/proc/{node.main_pid(unit)}/cmdline"]).stdout.split("\0")
    assert "--api-key" not in cmdline and not any("VLLM_API_KEY=" in a for a in cmdline)
    assert any(a.startswith("/run/credentials/") for a in cmdline)  # the key's file only
    assert any("/models/sets/local--SmolLM2-135M-Instruct/" in a for a in cmdline)
    assert "--enforce-eager" in cmdline  # the model's argument, passed on
