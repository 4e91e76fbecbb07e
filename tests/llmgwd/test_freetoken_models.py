"""A FreeToken model in the catalog: served from an hf: safetensors set, on cards by default,
and placed by what one token reads on the card (its experts stay in RAM)."""

from __future__ import annotations

import msgspec
import pytest

from llmgw.api_types import ModelIn
from llmgw.errors import ApiError
from llmgw.wire import Inventory
from llmgwd.api.models import validate_model
from llmgwd.catalog import profiles_of
from llmgwd.placement.estimate import ModelShape, memory_bytes, on_card
from llmgwd.placement.profiles import Profile, problems
from llmgwd.placement.scheduler import Demand, Node, explain, schedule
from tests.llmgw_agentd.nvml_inventory import load, pascal, recorded
from tests.llmgwd.test_scheduler import ids

GiB = 1 << 30
# A mixture of experts of 60 GiB whose token reads 6 GiB (its dense part and 8 experts).
MOE = ModelShape(
    format="safetensors", architecture="qwen3_moe", weights_bytes=60 * GiB,
    context_length=32768, layers=48, head_count=32, kv_heads=4, key_length=128,
    value_length=128, vocab_size=151936, bytes_per_token=6 * GiB,
)  # fmt: skip


def test_a_freetoken_model_is_an_hf_set_on_cards() -> None:
    with pytest.raises(ApiError, match="freetoken serves a safetensors set"):
        validate_model(ModelIn(name="q", source="file:/m/q.gguf", engine="freetoken"))
    with pytest.raises(ApiError, match="names a path"):
        validate_model(ModelIn(name="q", source="hf:Qwen/Q", engine="freetoken",
                               args=["FREETOKEN_API_LOG_DIR=/var/log"]))  # fmt: skip
    model = validate_model(ModelIn(name="q", source="hf:Qwen/Q", engine="freetoken",
                                   args=["--moe-strategy", "hybrid"]))  # fmt: skip
    assert model.engine == "freetoken"
    [profile] = profiles_of(model)
    assert (profile.kind, profile.engine, profile.cores) == ("gpu", "freetoken", 0)


def test_a_card_holds_what_one_token_reads_of_a_freetoken_moe() -> None:
    card = on_card(MOE, "freetoken")
    assert card.weights_bytes == 6 * GiB
    assert memory_bytes(card, 4096) < 24 * GiB < memory_bytes(MOE, 4096)
    assert on_card(MOE, "vllm") is MOE  # every other engine holds all of it
    dense = ModelShape(**{**{f: getattr(MOE, f) for f in MOE.__struct_fields__},
                          "bytes_per_token": 0})  # fmt: skip
    assert on_card(dense, "freetoken") is dense  # not known: all of it


def test_a_freetoken_profile_is_one_card_a_replica() -> None:
    model = validate_model(ModelIn(name="q", source="hf:Qwen/Q", engine="freetoken"))
    [default] = profiles_of(model)
    assert problems([default]) == []
    split = msgspec.structs.replace(default, gpus=2)
    on_cpus = msgspec.structs.replace(default, kind="cpu", gpus=1)
    want = "profile 'default': FreeToken runs a replica on one card (gpus 1)"
    assert problems([split]) == problems([on_cpus]) == [want]


GPU_FT = Profile(name="gpu", kind="gpu", engine="freetoken", replicas=1, context=4096)


def freetoken_node(name: str, inv: Inventory) -> Node:
    """inv with a driver for CUDA 13.0 and FreeToken among its agent's engines."""
    inv = msgspec.structs.replace(inv, cuda_version="13.0", gpu_driver_version="580.65.06",
                                  engines=[*inv.engines, "freetoken:gpu"])  # fmt: skip
    return Node(name=name, inventory=inv)


def test_a_moe_larger_than_the_card_is_placed_on_one_card_by_freetoken_only() -> None:
    ws = freetoken_node("ws", recorded(load("rtx4090-8x24gb")))  # 24 GiB cards, 8.9
    (p,) = schedule([Demand("moe", GPU_FT, MOE)], [ws], [], new_id=ids).add
    assert len(p.devices) == 1 and p.memory_bytes < 24 * GiB
    on_vllm = msgspec.structs.replace(GPU_FT, engine="vllm")
    assert schedule([Demand("moe", on_vllm, MOE)], [ws], [], new_id=ids).add == []
    old = freetoken_node("pascal", recorded(pascal(), toolkit="13.0"))  # GTX 1080 Ti: 6.1
    verdicts = explain(Demand("moe", GPU_FT, MOE), [old], [])
    assert {v.reason for v in verdicts} == {
        "compute capability 6.1 < 8.0 that FreeToken (CUDA 13.0) needs"
    }
