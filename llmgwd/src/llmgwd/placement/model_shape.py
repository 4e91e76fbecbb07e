"""A model's shape (estimate.ModelShape) read from where its files are, or why it could not be:
a file: source on the control plane, or a set of files in a blob store (the mirror's copy)."""

from __future__ import annotations

import json
from pathlib import Path

from llmgw.blobstore import BlobStore
from llmgw.wire import ModelFile
from llmgwd.placement import gguf_meta, safetensors_meta
from llmgwd.placement.estimate import ModelShape


def shape_of_source(source: str) -> tuple[ModelShape | None, str]:
    """The shape of file:PATH (a GGUF, or a directory with config.json), or None and why not.

    llmgwd reads the file as its own user: where it may not, the model is placed by count
    only, and `llmgw model plan` says so.
    """
    path = Path(source.removeprefix("file:"))
    try:
        if path.is_dir():
            return safetensors_meta.shape_of_dir(path), ""
        return gguf_meta.shape_of(path), ""
    except PermissionError:
        return None, f"llmgwd may not read {path}: placed by count only, without estimates"
    except FileNotFoundError:
        return None, f"{path} is not on the control plane: placed by count only"
    except (OSError, ValueError) as e:
        return None, f"{path} could not be read ({e}): placed by count only"


def shape_of_set(store: BlobStore, files: list[ModelFile]) -> tuple[ModelShape | None, str]:
    """The shape of a set held in store, or None and why not (a file not fetched yet, or one
    that is unreadable).

    GGUF: the headers of every .gguf of the set (a split model's shards, in path order);
    safetensors: config.json with the weight files' sizes (from the listing: their JSON
    headers are a rounding error against gigabytes of weights)."""
    try:
        ggufs = sorted((f for f in files if f.path.endswith(".gguf")), key=lambda f: f.path)
        if ggufs:
            headers = (gguf_meta.read_header(_stored(store, f)) for f in ggufs)
            return gguf_meta.model_shape(gguf_meta.joined(headers)), ""
        config = next((f for f in files if f.path == "config.json"), None)
        weights = [f.size for f in files if f.path.endswith(".safetensors")]
        if config is None or not weights:
            return None, "the set has neither a .gguf nor config.json with .safetensors files"
        data = json.loads(_stored(store, config).read_bytes())
        return safetensors_meta.shape_from_config(data, weights), ""
    except _NotFetched as e:
        return None, f"{e} is not fetched yet: placed by count until it is"
    except (OSError, ValueError) as e:
        return None, f"the set's files could not be read ({e}): placed by count only"


class _NotFetched(Exception):
    """A file of the set is not in the store (yet): its path."""


def _stored(store: BlobStore, f: ModelFile) -> Path:
    if not f.sha256 or not store.has(f.sha256):
        raise _NotFetched(f.path)
    return store.path(f.sha256)
