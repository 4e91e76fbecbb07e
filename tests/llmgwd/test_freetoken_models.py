"""A FreeToken model in the catalog: served from an hf: safetensors set, on cards by default,
and placed by what one token reads on the card (its experts stay in RAM)."""

from __future__ import annotations

import msgspec
import pytest

from llmgw.api_types import ModelIn
from llmgw.errors import ApiError
from llmgwd.api.models import validate_model
from llmgwd.catalog import profiles_of
from llmgwd.placement.estimate import ModelShape, memory_bytes, on_card
from llmgwd.placement.profiles import problems

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
