"""A model's shape (for memory estimates) read from the mirror's copy of its set."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec

from llmgw.blobstore import BlobStore
from llmgw.wire import ModelFile
from llmgwd.placement import gguf_meta, safetensors_meta
from llmgwd.placement.estimate import ModelShape


def shape_of_set(store: BlobStore, files: list[ModelFile]) -> tuple[ModelShape | None, str]:
    """The set's shape, or None and why not (a file not fetched yet, or one that is unreadable).

    GGUF: the headers of every .gguf of the set (a split model's shards, in path order);
    safetensors: config.json with the weight files' sizes (from the listing: their JSON
    headers are a rounding error against gigabytes of weights)."""
    try:
        ggufs = [f for f in files if f.path.endswith(".gguf")]
        if ggufs:
            return _gguf(store, ggufs), ""
        config = next((f for f in files if f.path == "config.json"), None)
        weights = [f.size for f in files if f.path.endswith(".safetensors")]
        if config is None or not weights:
            return None, "the set has neither a .gguf nor config.json with .safetensors files"
        data = json.loads(_path(store, config).read_bytes())
        return safetensors_meta.shape_from_config(data, weights), ""
    except _NotYet as e:
        return None, f"{e} is not fetched yet: placed by count until it is"
    except (OSError, ValueError) as e:
        return None, f"the set's files could not be read ({e}): placed by count only"


class _NotYet(Exception):
    pass


def _path(store: BlobStore, f: ModelFile) -> Path:
    if not f.sha256 or not store.has(f.sha256):
        raise _NotYet(f.path)
    return store.path(f.sha256)


def _gguf(store: BlobStore, ggufs: list[ModelFile]) -> ModelShape:
    headers = [gguf_meta.read_header(_path(store, f)) for f in sorted(ggufs, key=lambda f: f.path)]
    first = headers[0]
    if len(headers) > 1:
        tensors = [t for h in headers for t in h.tensors]
        first = msgspec.structs.replace(first, tensors=tensors)
    return gguf_meta.model_shape(first)
