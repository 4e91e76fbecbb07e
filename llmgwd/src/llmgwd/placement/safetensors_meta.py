"""A safetensors model's ModelShape, from its config.json and the sizes of its weight files."""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from llmgwd.placement.estimate import CacheType, ModelShape

# torch_dtype: bytes per weight, and the KV cache type vLLM's "auto" gives it.
DTYPES: dict[str, tuple[int, CacheType]] = {
    "float32": (4, "f32"),
    "float16": (2, "f16"),
    "bfloat16": (2, "bf16"),
}


class ConfigError(ValueError):
    """config.json lacks what an estimate needs (the message names the field)."""


def _text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    # Multimodal models (Gemma 3, Llama 4, Qwen2-VL's newer configs) keep the language
    # model's figures under text_config; anything missing there is taken from the top.
    inner = config.get("text_config")
    return {**config, **inner} if isinstance(inner, Mapping) else config


def _need(c: Mapping[str, Any], key: str) -> int:
    v = c.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        raise ConfigError(f"config.json has no usable {key}")
    return v


def shape_from_config(config: Mapping[str, Any], file_sizes: Sequence[int]) -> ModelShape:
    """The shape of a model from its config.json and its weight files' sizes in bytes.

    Head size: head_dim where the config gives it, else hidden_size / num_attention_heads;
    KV heads: num_key_value_heads, else every attention head (no grouped-query attention).
    A mixture of experts is counted as if every weight were read per token (configs do
    not tell the experts' share of the files), which underestimates its tokens/s.
    """
    c = _text_config(config)
    layers = _need(c, "num_hidden_layers")
    hidden = _need(c, "hidden_size")
    heads = _need(c, "num_attention_heads")
    kv_heads = c.get("num_key_value_heads") or heads
    head = c.get("head_dim") or hidden // heads
    dtype = str(c.get("torch_dtype") or c.get("dtype") or "bfloat16")
    width, cache = DTYPES.get(dtype, (2, "bf16"))
    weights = sum(file_sizes)
    return ModelShape(
        format="safetensors",
        architecture=str(c.get("model_type", "")),
        weights_bytes=weights,
        context_length=int(c.get("max_position_embeddings") or 0),
        layers=layers,
        head_count=heads,
        kv_heads=int(kv_heads),
        key_length=int(head),
        value_length=int(head),
        embedding_length=hidden,
        vocab_size=int(c.get("vocab_size") or 0),
        parameters=weights // width,
        bytes_per_token=weights,
        parameters_per_token=weights // width,
        cache_type=cache,
    )


def tensor_bytes(path: Path) -> int:
    """The bytes of tensor data in one .safetensors file: its size less its JSON header."""
    with open(path, "rb") as f:
        (header,) = struct.unpack("<Q", f.read(8))
    return path.stat().st_size - 8 - int(header)


def shape_of_dir(path: str | Path) -> ModelShape:
    """The shape of a model directory holding config.json and *.safetensors files."""
    d = Path(path)
    config = json.loads((d / "config.json").read_text())
    files = sorted(d.glob("*.safetensors"))
    if not files:
        raise ConfigError(f"no .safetensors files in {d}")
    return shape_from_config(config, [tensor_bytes(f) for f in files])
