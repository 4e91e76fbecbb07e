"""A GGUF file's header (metadata and tensor infos) read without its weights, and its ModelShape.

The header is read by a streaming reader rather than the `gguf` package's GGUFReader (whose
constants, below, are all this needs of that package): GGUFReader maps the whole file and builds a
numpy view per vocabulary string (1.3 s for SmolLM2's 49k tokens here, several seconds for a
150k vocabulary) and a view per tensor over its data, so it cannot read a metadata-only
file. This reader stops where the tensor data starts, skips long arrays (the vocabulary)
without decoding them, and agrees with GGUFReader on every figure it keeps (tested).
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterable
from enum import IntEnum
from pathlib import Path
from typing import BinaryIO, cast

import msgspec

from llmgwd.placement.estimate import ModelShape

# Arrays longer than these are counted but not kept (a vocabulary, its merges and scores).
KEEP_NUMBERS = 4096
KEEP_STRINGS = 64
ALIGNMENT = 32  # GGUF's default, unless general.alignment says otherwise
_SPLIT = re.compile(r"(.+)-(\d+)-of-(\d+)\.gguf")

# The GGUF specification (ggml's docs/gguf.md, "File Structure"): the magic "GGUF" read as a
# little-endian uint32, and the type codes of metadata values (enum gguf_metadata_value_type).
GGUF_MAGIC = 0x46554747


class GGUFValueType(IntEnum):
    """gguf_metadata_value_type."""

    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


# ggml's tensor types (the same spec's and ggml.h's enum ggml_type; ids 4, 5, 31-33 and
# 36-38 are retired): id -> (name, elements per block, bytes per block), as ggml.c's
# type_traits and gguf-py's GGML_QUANT_SIZES give them (gguf 0.19.0, a dev dependency:
# tests/llmgwd/test_gguf_constants.py checks this table against it).
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34),
    9: ("Q8_1", 32, 40),
    10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210),
    15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66),
    17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18),
    21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82),
    23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1),
    25: ("I16", 1, 2),
    26: ("I32", 1, 4),
    27: ("I64", 1, 8),
    28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2),
    34: ("TQ1_0", 256, 54),
    35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17),
    40: ("NVFP4", 64, 36),
    41: ("Q1_0", 128, 18),
}

_SCALARS: dict[GGUFValueType, str] = {
    GGUFValueType.UINT8: "B",
    GGUFValueType.INT8: "b",
    GGUFValueType.UINT16: "H",
    GGUFValueType.INT16: "h",
    GGUFValueType.UINT32: "I",
    GGUFValueType.INT32: "i",
    GGUFValueType.FLOAT32: "f",
    GGUFValueType.BOOL: "?",
    GGUFValueType.UINT64: "Q",
    GGUFValueType.INT64: "q",
    GGUFValueType.FLOAT64: "d",
}

Value = int | float | bool | str | list[int] | list[float] | list[bool] | list[str]


class GgufError(ValueError):
    """The file is not a GGUF this reader understands (the message says why)."""


class LongArray(msgspec.Struct, frozen=True):
    """An array too long to keep (a vocabulary): its item type and length only."""

    item_type: int
    count: int


class TensorInfo(msgspec.Struct, frozen=True):
    """One tensor as the header describes it: name, ggml type, shape, and its bytes."""

    name: str
    type: str  # "Q4_K", "F32", ...
    shape: list[int]  # ggml's order: the innermost (row) dimension first
    n_elements: int
    n_bytes: int


class GgufHeader(msgspec.Struct, frozen=True):
    """Everything in a GGUF before its tensor data."""

    version: int
    fields: dict[str, Value | LongArray]
    tensors: list[TensorInfo]
    data_offset: int  # where the tensor data starts in the file


class _Reader:
    def __init__(self, f: BinaryIO) -> None:
        self.f = f

    def exact(self, n: int) -> bytes:
        b = self.f.read(n)
        if len(b) != n:
            raise GgufError("the file ends inside its header")
        return b

    def unpack(self, fmt: str) -> tuple[object, ...]:
        return struct.unpack("<" + fmt, self.exact(struct.calcsize("<" + fmt)))

    def u32(self) -> int:
        return int(struct.unpack("<I", self.exact(4))[0])

    def u64(self) -> int:
        return int(struct.unpack("<Q", self.exact(8))[0])

    def string(self) -> str:
        return self.exact(self.u64()).decode("utf-8", errors="replace")

    def value(self, vtype: int) -> Value | LongArray:
        t = GGUFValueType(vtype)
        if t == GGUFValueType.STRING:
            return self.string()
        if t in _SCALARS:
            v = self.unpack(_SCALARS[t])[0]
            assert isinstance(v, int | float | bool)
            return v
        if t != GGUFValueType.ARRAY:
            raise GgufError(f"unknown value type {vtype}")
        itype = GGUFValueType(self.u32())
        count = self.u64()
        if itype == GGUFValueType.STRING:
            if count > KEEP_STRINGS:
                for _ in range(count):
                    self.f.seek(self.u64(), 1)
                return LongArray(int(itype), count)
            return [self.string() for _ in range(count)]
        if itype not in _SCALARS:
            raise GgufError(f"arrays of {itype.name} are not read")
        code = _SCALARS[itype]
        if count > KEEP_NUMBERS:
            self.f.seek(count * struct.calcsize(code), 1)
            return LongArray(int(itype), count)
        return cast("list[int] | list[float] | list[bool]", list(self.unpack(f"{count}{code}")))


def read_header(path: str | Path) -> GgufHeader:
    """The header of the GGUF at path; reads no tensor data (the file may hold none)."""
    with open(path, "rb") as f:
        r = _Reader(f)
        magic, version = struct.unpack("<II", r.exact(8))
        if magic != GGUF_MAGIC:
            raise GgufError(f"{path}: not a GGUF file")
        if version not in (2, 3):
            raise GgufError(f"{path}: GGUF version {version} (this reader knows 2 and 3)")
        n_tensors, n_fields = r.u64(), r.u64()
        fields: dict[str, Value | LongArray] = {}
        for _ in range(n_fields):
            key = r.string()
            fields[key] = r.value(r.u32())
        tensors: list[TensorInfo] = []
        for _ in range(n_tensors):
            name = r.string()
            dims = [r.u64() for _ in range(r.u32())]
            qtype = r.u32()
            if qtype not in GGML_TYPES:
                raise GgufError(f"{path}: tensor {name} has an unknown type ({qtype})")
            r.u64()  # the tensor's offset in the data: not needed for its size
            n = 1
            for d in dims:
                n *= d
            type_name, block, size = GGML_TYPES[qtype]
            tensors.append(TensorInfo(name, type_name, dims, n, n * size // block))
        align = fields.get("general.alignment", ALIGNMENT)
        align = align if isinstance(align, int) and align > 0 else ALIGNMENT
        data = -(-f.tell() // align) * align
    return GgufHeader(version=version, fields=fields, tensors=tensors, data_offset=data)


def _int(fields: dict[str, Value | LongArray], key: str, default: int = 0) -> int:
    v = fields.get(key, default)
    if isinstance(v, list):
        return max((int(x) for x in v), default=default)
    return int(v) if isinstance(v, int | float) else default


def _per_layer(fields: dict[str, Value | LongArray], key: str) -> list[int]:
    v = fields.get(key)
    return [int(x) for x in v] if isinstance(v, list) else []


def model_shape(h: GgufHeader) -> ModelShape:
    """The figures the estimates need, from a GGUF header (llama.cpp's key names)."""
    f = h.fields
    arch = f.get("general.architecture")
    if not isinstance(arch, str):
        raise GgufError("no general.architecture in the header")
    layers = _int(f, f"{arch}.block_count")
    embd = _int(f, f"{arch}.embedding_length")
    heads = _int(f, f"{arch}.attention.head_count")
    kv_heads = _int(f, f"{arch}.attention.head_count_kv", heads)
    per_layer = _per_layer(f, f"{arch}.attention.head_count_kv")
    # The head size: key_length/value_length where the model says (Gemma 2's 256 is not
    # 3584 / 16), otherwise the embedding split over the query heads.
    head = embd // heads if heads else 0
    key = _int(f, f"{arch}.attention.key_length", head)
    value = _int(f, f"{arch}.attention.value_length", key)
    by_name = {t.name: t for t in h.tensors}
    vocab = _int(f, f"{arch}.vocab_size")
    tokens = f.get("tokenizer.ggml.tokens")
    if not vocab and isinstance(tokens, LongArray | list):
        vocab = tokens.count if isinstance(tokens, LongArray) else len(tokens)
    embd_table = by_name.get("token_embd.weight")
    if not vocab and embd_table is not None and len(embd_table.shape) == 2:
        vocab = embd_table.shape[1]
    experts = _int(f, f"{arch}.expert_count")
    used = _int(f, f"{arch}.expert_used_count")
    read_bytes = read_params = 0
    for t in h.tensors:
        share = 1.0
        if "_exps." in t.name and experts and used:
            share = used / experts  # only the experts a token is routed to are read
        elif t.name == "token_embd.weight" and "output.weight" in by_name:
            share = 0.0  # one row per token; the output matrix is read instead
        read_bytes += int(t.n_bytes * share)
        read_params += int(t.n_elements * share)
    return ModelShape(
        format="gguf",
        architecture=arch,
        weights_bytes=sum(t.n_bytes for t in h.tensors),
        context_length=_int(f, f"{arch}.context_length"),
        layers=layers,
        head_count=heads,
        kv_heads=kv_heads,
        key_length=key,
        value_length=value,
        embedding_length=embd,
        vocab_size=vocab,
        parameters=sum(t.n_elements for t in h.tensors),
        bytes_per_token=read_bytes,
        parameters_per_token=read_params,
        kv_heads_per_layer=per_layer if len(set(per_layer)) > 1 else [],
    )


def shards(path: str | Path, header: GgufHeader) -> list[Path]:
    """Every file of a split GGUF (llama.cpp's NAME-00001-of-00003.gguf), in order; [path]
    for a file that is not split."""
    p = Path(path)
    count = header.fields.get("split.count", 1)
    m = _SPLIT.fullmatch(p.name)
    if not isinstance(count, int) or count <= 1 or m is None:
        return [p]
    width = len(m.group(2))
    return [
        p.with_name(f"{m.group(1)}-{i:0{width}d}-of-{m.group(3)}.gguf") for i in range(1, count + 1)
    ]


def joined(headers: Iterable[GgufHeader]) -> GgufHeader:
    """One header for a split GGUF's files, in order: the first's metadata (llama.cpp keeps
    it there) with the tensors of them all."""
    first, *rest = headers
    if not rest:
        return first
    return msgspec.structs.replace(first, tensors=[t for h in (first, *rest) for t in h.tensors])


def shape_of(path: str | Path) -> ModelShape:
    """The ModelShape of the GGUF at path (all of its files, where it is split)."""
    header = read_header(path)
    files = shards(path, header)
    return model_shape(joined(header if f == Path(path) else read_header(f) for f in files))
