"""The mirror for real: mirror A filled by `llmgw mirror import`, a second llmgwd B with A as
its upstream adds `hf:ORG/REPO@main`, B's node fetches the set over the cluster port and
serves it through /v1; the official huggingface_hub client downloads the set from A's /hf
byte for byte; removing the model with its files frees what `du` sees."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator

import pytest

from integration.harness import MakeLan, MakeSystemd
from integration.llmgw_node import VENV, Node
from integration.mirror_setup import MIRROR_DIR, MODELS_DIR, REPO_NAME, Mirrors, boot, sha

PREFIX = "10.231.1"
A, B, N1 = f"{PREFIX}.10", f"{PREFIX}.20", f"{PREFIX}.21"
# du counts a directory's own blocks and a link's length as well: the figures are compared
# with the directories where the files themselves are, which stay.
NODE_BLOBS, MIRROR_BLOBS = f"{MODELS_DIR}/blobs", f"{MIRROR_DIR}/blobs"

# Run inside A's namespace: the official client against A's /hf. Prints each file's sha256.
HF_CLIENT = """
import hashlib, json, os, pathlib, sys
from huggingface_hub import HfApi, hf_hub_download, snapshot_download
repo, out = sys.argv[1], pathlib.Path(sys.argv[2])
d = pathlib.Path(snapshot_download(repo, revision="main", local_dir=out / "snap"))
one = hf_hub_download(repo, "notes/params.json", local_dir=out / "one")
info = HfApi().model_info(repo, files_metadata=True)
sums = {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(d.rglob("*")) if p.is_file() and ".cache" not in p.parts}
print(json.dumps({"sums": sums, "sha": info.sha,
                  "one": hashlib.sha256(pathlib.Path(one).read_bytes()).hexdigest(),
                  "sizes": {s.rfilename: s.size for s in info.siblings}}))
"""


@pytest.fixture
def mirrors(make_systemd: MakeSystemd, make_lan: MakeLan) -> Iterator[Mirrors]:
    yield boot(make_systemd, make_lan, "mr", PREFIX)


def _du(node: Node, path: str) -> int:
    out = node.ps.run(["du", "-sb", path]).stdout.split()[0]
    return int(out)


def official_client_downloads_the_imported_set_byte_for_byte(mirrors: Mirrors) -> None:
    a = mirrors.a
    argv = [*a.ps.nsenter(), "env", f"HF_ENDPOINT=http://{A}:7700/hf", f"HF_TOKEN={mirrors.a_key}",
            "HF_HUB_DISABLE_TELEMETRY=1", "HF_HOME=/tmp/hf-home",
            str(VENV / "bin/python"), "-c", HF_CLIENT, REPO_NAME, "/tmp/hf-out"]  # fmt: skip
    r = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["sums"] == {p: sha(d) for p, d in mirrors.files.items()}
    assert got["one"] == sha(mirrors.files["notes/params.json"])
    assert got["sizes"] == {p: len(d) for p, d in mirrors.files.items()}
    # `hf download`, the command people type.
    cli = [*a.ps.nsenter(), "env", f"HF_ENDPOINT=http://{A}:7700/hf", f"HF_TOKEN={mirrors.a_key}",
           "HF_HUB_DISABLE_TELEMETRY=1", "HF_HOME=/tmp/hf-home2", str(VENV / "bin/hf"),
           "download", REPO_NAME, "--local-dir", "/tmp/hf-cli"]  # fmt: skip
    r = subprocess.run(cli, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    gguf_name = "SmolLM2-135M-Instruct.Q4_1.gguf"
    copied = a.ps.run(["sha256sum", f"/tmp/hf-cli/{gguf_name}"]).stdout.split()[0]
    assert copied == sha(mirrors.files[gguf_name])
    # A wrong key is refused.
    bad = [*cli[: cli.index(f"HF_TOKEN={mirrors.a_key}")], "HF_TOKEN=sk-llmgw-wrong",
           *cli[cli.index(f"HF_TOKEN={mirrors.a_key}") + 1 :]]  # fmt: skip
    bad[-1] = "/tmp/hf-bad"
    assert subprocess.run(bad, capture_output=True, text=True, timeout=120).returncode != 0


def second_mirror_pins_fetches_and_its_node_serves(mirrors: Mirrors) -> None:
    b, n1 = mirrors.b, mirrors.n1
    r = b.llmgw("model", "add", "smol", "--from", f"hf:{REPO_NAME}@main")
    assert r.returncode == 0, r.stderr
    model = b.model("smol")
    assert model["source"].startswith(f"hf:{REPO_NAME}@") and len(model["source"]) >= 40
    assert model["files"] == 1  # the GGUF only: a repository of GGUFs needs nothing else
    assert model["bytes"] == len(mirrors.files["SmolLM2-135M-Instruct.Q4_1.gguf"])
    b.llmgw("model", "serve", "smol", "--replicas", "1")
    b.wait(lambda: b.model("smol")["ready"] >= 1, "smol ready on mn1", 300)
    want = sha(mirrors.files["SmolLM2-135M-Instruct.Q4_1.gguf"])
    held = n1.ps.run(["sha256sum", f"{MODELS_DIR}/blobs/{want}"]).stdout.split()[0]
    assert held == want
    chat = [*b.ps.nsenter(), "curl", "-sS", "--max-time", "120", f"http://{B}:7700/v1/chat/completions",
            "-H", f"Authorization: Bearer {mirrors.b_key}", "-H", "Content-Type: application/json",
            "-d", json.dumps({"model": "smol", "max_tokens": 8,
                              "messages": [{"role": "user", "content": "Say hi."}]})]  # fmt: skip
    answer = json.loads(subprocess.run(chat, capture_output=True, text=True, timeout=150).stdout)
    assert answer["choices"][0]["message"]["content"]


def remove_with_files_frees_what_du_sees(mirrors: Mirrors) -> None:
    b, n1 = mirrors.b, mirrors.n1
    b.llmgw("model", "stop", "smol")
    b.wait(lambda: not n1.engine_units(), "the engine stopped", 60)
    mirror_before, node_before = _du(b, MIRROR_BLOBS), _du(n1, NODE_BLOBS)
    out = b.llmgw("model", "remove", "smol", "--files", "--yes", "--json")
    files = out["files"]
    assert files["files"] >= 1
    assert mirror_before - _du(b, MIRROR_BLOBS) == files["bytes"]
    (node,) = files["nodes"]
    assert node["answered"] and node["node"] == "mn1"
    assert node_before - _du(n1, NODE_BLOBS) == node["bytes"] > 0
    # Nothing is left to sweep, on the mirror or the node.
    again = b.llmgw("mirror", "sweep", "--dry-run", "--json")
    assert again["bytes"] == 0 and all(n["bytes"] == 0 for n in again["nodes"])


def mirror_status_and_sweep_of_the_upstream(mirrors: Mirrors) -> None:
    a = mirrors.a
    status = a.llmgw("mirror", "status", "--json")
    total = sum(len(d) for d in mirrors.files.values())
    assert status["files_held"] == len(mirrors.files) and status["bytes_held"] == total
    dry = a.llmgw("mirror", "sweep", "--dry-run", "--json")
    assert dry["files"] == len(mirrors.files) and dry["bytes"] == total  # no model uses them
    before = _du(a, MIRROR_BLOBS)
    done = a.llmgw("mirror", "sweep", "--json")
    assert done["bytes"] == total == before - _du(a, MIRROR_BLOBS)


def test_mirror_end_to_end(mirrors: Mirrors) -> None:
    """One cluster of three private systemds for every step (they take a while to boot)."""
    official_client_downloads_the_imported_set_byte_for_byte(mirrors)
    second_mirror_pins_fetches_and_its_node_serves(mirrors)
    remove_with_files_frees_what_du_sees(mirrors)
    mirror_status_and_sweep_of_the_upstream(mirrors)
