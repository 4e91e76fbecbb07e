"""The cluster's munge key, derived from the cluster secret (HKDF-SHA256 with its own label),
so every control plane makes the same one and none is stored."""

from __future__ import annotations

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

KEY_BYTES = 1024  # munge's own mungekey makes 1024 bytes by default (32 is its least)
LABEL = b"llmgw slurm munge key v1"


def munge_key(secret: bytes) -> bytes:
    """The munge key of the cluster with this secret."""
    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None, info=LABEL).derive(secret)
