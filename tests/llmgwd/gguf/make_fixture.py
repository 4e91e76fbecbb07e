"""Make metadata-only GGUF fixtures: a real file's header without its weights, or a synthesized one.

  python tests/llmgwd/gguf/make_fixture.py copy SRC.gguf DST.gguf [--keep-vocab]
      copies SRC's metadata and tensor infos (names, types, shapes) into DST with no tensor
      data; the vocabulary arrays are left out unless --keep-vocab (they are most of a
      header and no estimate reads them).
  python tests/llmgwd/gguf/make_fixture.py synth NAME DST.gguf
      writes the header a llama.cpp Q4_K_M conversion of NAME would have, from the model's
      published config (SHAPES below) and llama.cpp's Q4_K_M type choices per tensor.

Fixtures named *.copied.gguf come from real files; *.synth.gguf are synthesized.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

Q = GGMLQuantizationType
VOCAB_KEYS = {
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.scores",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.merges",
}


def copy(src: Path, dst: Path, keep_vocab: bool = False) -> None:
    """DST: SRC's header (fields and tensor infos), and no tensor data."""
    r = GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    w = GGUFWriter(dst, arch)
    align = r.fields.get("general.alignment")
    if align is not None:
        w.data_alignment = int(align.contents())
    for key, field in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        if key in VOCAB_KEYS and not keep_vocab:
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        w.add_key_value(key, field.contents(), vtype, sub)
    w.add_string("llmgw.fixture", f"metadata-only copy of {src.name}: no tensor data")
    for t in r.tensors:
        # GGUFReader gives ggml's order (innermost first); the writer takes numpy's.
        shape = [int(d) for d in reversed(t.shape.tolist())]
        w.add_tensor_info(t.name, shape, np.dtype(np.float32), int(t.n_bytes), t.tensor_type)
    _write(w)


def _write(w: GGUFWriter) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()


@dataclass(frozen=True)
class Shape:
    """A model's published config (its config.json on the Hugging Face hub) and its Q4_K_M
    file's published size, in bytes as the file list shows it (rounded to 10 MB)."""

    name: str
    arch: str
    layers: int
    embd: int
    ff: int
    heads: int
    kv_heads: int
    vocab: int
    context: int
    head_dim: int = 0  # 0: embd // heads
    tied: bool = False  # the output reuses the embedding table
    qkv_bias: bool = False
    post_norms: bool = False  # Gemma 2's extra norms after attention and FFN
    rope_freqs: int = 0  # Llama 3.1's rope_freqs tensor length
    big: bool = False  # llama.cpp counts it as a 70B model (attn_v gets Q5_K)
    file_bytes: int = 0
    fields: tuple[tuple[str, Any, GGUFValueType], ...] = ()


SHAPES = {
    # meta-llama/Llama-3.1-8B-Instruct; Q4_K_M file 4.92 GB
    "llama-3.1-8b-instruct-q4_k_m": Shape(
        name="Llama 3.1 8B Instruct",
        arch="llama",
        layers=32,
        embd=4096,
        ff=14336,
        heads=32,
        kv_heads=8,
        vocab=128256,
        context=131072,
        rope_freqs=64,
        file_bytes=4_920_000_000,
        fields=(("llama.rope.freq_base", 500000.0, GGUFValueType.FLOAT32),),
    ),
    # Qwen/Qwen2.5-72B-Instruct; Q4_K_M file 47.42 GB
    "qwen2.5-72b-instruct-q4_k_m": Shape(
        name="Qwen2.5 72B Instruct",
        arch="qwen2",
        layers=80,
        embd=8192,
        ff=29568,
        heads=64,
        kv_heads=8,
        vocab=152064,
        context=32768,
        qkv_bias=True,
        big=True,
        file_bytes=47_420_000_000,
        fields=(("qwen2.rope.freq_base", 1000000.0, GGUFValueType.FLOAT32),),
    ),
    # google/gemma-2-9b-it: head_dim 256 while 3584 / 16 is 224; Q4_K_M file 5.76 GB
    "gemma-2-9b-it-q4_k_m": Shape(
        name="Gemma 2 9B It",
        arch="gemma2",
        layers=42,
        embd=3584,
        ff=14336,
        heads=16,
        kv_heads=8,
        vocab=256000,
        context=8192,
        head_dim=256,
        tied=True,
        post_norms=True,
        file_bytes=5_760_000_000,
        fields=(("gemma2.attention.sliding_window", 4096, GGUFValueType.UINT32),),
    ),
}


def _more_bits(i: int, n: int) -> bool:
    # llama.cpp's use_more_bits(): the first and last eighth of the layers, and every third.
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _fit(qtype: Q, ne0: int) -> Q:
    # llama.cpp's fallback where a row is no multiple of a k-quant's 256-value block.
    if qtype in (Q.Q4_K, Q.Q5_K, Q.Q6_K) and ne0 % 256:
        return {Q.Q4_K: Q.Q5_0, Q.Q5_K: Q.Q5_1, Q.Q6_K: Q.Q8_0}[qtype]
    return qtype


def tensors(s: Shape) -> list[tuple[str, list[int], Q]]:
    """(name, ggml shape, type) of every tensor of a Q4_K_M conversion of s."""
    hd = s.head_dim or s.embd // s.heads
    q_out, kv_out = s.heads * hd, s.kv_heads * hd
    out: list[tuple[str, list[int], Q]] = [
        ("token_embd.weight", [s.embd, s.vocab], Q.Q6_K if s.tied else Q.Q4_K),
        ("output_norm.weight", [s.embd], Q.F32),
    ]
    if not s.tied:
        out.append(("output.weight", [s.embd, s.vocab], Q.Q6_K))
    if s.rope_freqs:
        out.append(("rope_freqs.weight", [s.rope_freqs], Q.F32))
    for i in range(s.layers):
        more = _more_bits(i, s.layers)
        v_type = Q.Q6_K if more else (Q.Q5_K if s.big else Q.Q4_K)
        b = f"blk.{i}."
        layer: list[tuple[str, list[int], Q]] = [
            (b + "attn_norm.weight", [s.embd], Q.F32),
            (b + "attn_q.weight", [s.embd, q_out], Q.Q4_K),
            (b + "attn_k.weight", [s.embd, kv_out], Q.Q4_K),
            (b + "attn_v.weight", [s.embd, kv_out], v_type),
            (b + "attn_output.weight", [q_out, s.embd], Q.Q4_K),
            (b + "ffn_norm.weight", [s.embd], Q.F32),
            (b + "ffn_gate.weight", [s.embd, s.ff], Q.Q4_K),
            (b + "ffn_up.weight", [s.embd, s.ff], Q.Q4_K),
            (b + "ffn_down.weight", [s.ff, s.embd], Q.Q6_K if more else Q.Q4_K),
        ]
        if s.qkv_bias:
            layer += [
                (b + "attn_q.bias", [q_out], Q.F32),
                (b + "attn_k.bias", [kv_out], Q.F32),
                (b + "attn_v.bias", [kv_out], Q.F32),
            ]
        if s.post_norms:
            layer += [
                (b + "post_attention_norm.weight", [s.embd], Q.F32),
                (b + "post_ffw_norm.weight", [s.embd], Q.F32),
            ]
        out += [(n, shape, _fit(t, shape[0])) for n, shape, t in layer]
    return out


def nbytes(shape: list[int], qtype: Q) -> int:
    """A tensor's bytes in a ggml type."""
    block, size = GGML_QUANT_SIZES[qtype]
    return int(np.prod(shape)) * size // block


def synth(key: str, dst: Path) -> None:
    """DST: the header a Q4_K_M conversion of SHAPES[key] would have, with no tensor data."""
    s = SHAPES[key]
    w = GGUFWriter(dst, s.arch)
    a = s.arch
    w.add_string("general.name", s.name)
    w.add_string("llmgw.fixture", f"synthesized from {s.name}'s published config: no data")
    w.add_uint32("general.file_type", 15)  # LLAMA_FTYPE_MOSTLY_Q4_K_M
    w.add_uint32("general.quantization_version", 2)
    w.add_uint32(f"{a}.context_length", s.context)
    w.add_uint32(f"{a}.embedding_length", s.embd)
    w.add_uint32(f"{a}.block_count", s.layers)
    w.add_uint32(f"{a}.feed_forward_length", s.ff)
    w.add_uint32(f"{a}.attention.head_count", s.heads)
    w.add_uint32(f"{a}.attention.head_count_kv", s.kv_heads)
    if s.head_dim:
        w.add_uint32(f"{a}.attention.key_length", s.head_dim)
        w.add_uint32(f"{a}.attention.value_length", s.head_dim)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)
    for k, v, t in s.fields:
        w.add_key_value(k, v, t)
    w.add_string("tokenizer.ggml.model", "gpt2")
    for name, shape, qtype in tensors(s):
        w.add_tensor_info(
            name, list(reversed(shape)), np.dtype(np.float32), nbytes(shape, qtype), qtype
        )
    _write(w)


def main() -> None:
    """The command line (see the module's docstring)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("copy")
    c.add_argument("src", type=Path)
    c.add_argument("dst", type=Path)
    c.add_argument("--keep-vocab", action="store_true")
    s = sub.add_parser("synth")
    s.add_argument("name", choices=sorted(SHAPES))
    s.add_argument("dst", type=Path)
    args = p.parse_args()
    if args.cmd == "copy":
        copy(args.src, args.dst, args.keep_vocab)
    else:
        synth(args.name, args.dst)


if __name__ == "__main__":
    main()
