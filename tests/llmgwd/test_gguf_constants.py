"""gguf_meta's own copy of the GGUF constants (the magic, the value types, ggml's tensor
types and block sizes) is the `gguf` package's, which llmgwd no longer depends on."""

from __future__ import annotations

import gguf.constants as upstream

from llmgwd.placement import gguf_meta


def test_the_magic_and_value_types_are_gguf_s() -> None:
    assert gguf_meta.GGUF_MAGIC == upstream.GGUF_MAGIC
    ours = {t.name: t.value for t in gguf_meta.GGUFValueType}
    assert ours == {t.name: t.value for t in upstream.GGUFValueType}


def test_every_tensor_type_has_gguf_s_name_and_block_size() -> None:
    theirs = {
        t.value: (t.name, *upstream.GGML_QUANT_SIZES[t]) for t in upstream.GGMLQuantizationType
    }
    ours = gguf_meta.GGML_TYPES
    assert ours == theirs, "a new gguf: copy its GGML_QUANT_SIZES into gguf_meta.GGML_TYPES"
