"""vLLM models come from the mirror as safetensors sets: a GGUF set or a file: source is a
clear 400 before anything is fetched; a safetensors set is pinned as for llama.cpp."""

from __future__ import annotations

import hashlib
import json

from tests.llmgwd.mirror import test_mirror as tm
from tests.llmgwd.mirror.test_mirror import REPO, Site, _import

sites = tm.sites  # its fixture, for the tests here

SAFETENSORS = {
    "config.json": json.dumps({"model_type": "llama", "hidden_size": 8}).encode(),
    "model.safetensors": b"\x08\x00\x00\x00\x00\x00\x00\x00{}      " + b"\0" * 2048,
    "tokenizer.json": b"{}",
}


async def test_vllm_on_a_gguf_set_is_refused_before_any_fetch(sites: tuple[Site, Site]) -> None:
    a, b = sites
    await _import(a)
    for source in (f"hf:{REPO}@main", f"hf:{REPO}@main:*Q4_1.gguf"):
        status, out = await b.call(
            "POST", "/models", {"name": "tiny", "engine": "vllm", "source": source}
        )
        assert status == 400, out
        assert out["error"]["param"] == "source"
        assert "safetensors" in out["error"]["message"] and "llama.cpp" in out["error"]["message"]
    assert not list((b.mirror.settings.dir / "blobs").iterdir())  # nothing fetched
    assert b.catalog.get("tiny") is None


async def test_vllm_on_a_file_source_is_refused(sites: tuple[Site, Site]) -> None:
    _, b = sites
    status, out = await b.call(
        "POST", "/models", {"name": "tiny", "engine": "vllm", "source": "file:/m/model.safetensors"}
    )
    assert status == 400 and out["error"]["param"] == "source"
    assert "llmgw mirror import" in out["error"]["message"]


async def test_vllm_on_a_safetensors_set_is_pinned(sites: tuple[Site, Site]) -> None:
    a, b = sites
    files = []
    for path, data in SAFETENSORS.items():
        await a.upload(path, data)
        sha = hashlib.sha256(data).hexdigest()
        files.append({"path": path, "size": len(data), "sha256": sha, "git_oid": ""})
    status, imported = await a.call("POST", "/mirror/import", {"repo": "acme/st", "files": files})
    assert status == 201, imported
    status, m = await b.call(
        "POST", "/models", {"name": "st", "engine": "vllm", "source": "hf:acme/st@main"}
    )
    assert status == 201, m
    assert m["engine"] == "vllm" and m["source"] == f"hf:acme/st@{imported['commit']}"
    assert m["files"] == 3
