"""A model's shape (estimate.ModelShape) read from its source, or why it could not be."""

from __future__ import annotations

from pathlib import Path

from llmgwd.placement import gguf_meta, safetensors_meta
from llmgwd.placement.estimate import ModelShape


def read_shape(source: str) -> tuple[ModelShape | None, str]:
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
