"""libnftables through ctypes: run one JSON batch of nftables commands, errors as NftError."""

from __future__ import annotations

import ctypes
import json
import threading
from typing import Any

LIBRARY = "libnftables.so.1"
_OUTPUT_JSON = 1 << 4  # NFT_CTX_OUTPUT_JSON: JSON in and out


class NftError(Exception):
    """libnftables is missing, or refused a batch; the message says why."""


class Nft:
    """One libnftables context (not thread-safe: calls are serialised here)."""

    def __init__(self, library: str = LIBRARY) -> None:
        try:
            lib = ctypes.CDLL(library)
        except OSError as e:
            raise NftError(f"cannot load {library} (is libnftables1 installed?): {e}") from None
        _declare(lib)
        self._lib = lib
        self._ctx = lib.nft_ctx_new(0)
        if not self._ctx:
            raise NftError("nft_ctx_new failed")
        lib.nft_ctx_output_set_flags(self._ctx, _OUTPUT_JSON)
        lib.nft_ctx_buffer_output(self._ctx)
        lib.nft_ctx_buffer_error(self._ctx)
        self._lock = threading.Lock()

    def run(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Run a JSON batch ({"nftables": [...]}) as one transaction: all of it or none.
        Returns libnftables' JSON answer ({} where it printed nothing)."""
        text = json.dumps(batch).encode()
        with self._lock:
            if not self._ctx:
                raise NftError("the nftables context is closed")
            rc = self._lib.nft_run_cmd_from_buffer(self._ctx, text)
            out = (self._lib.nft_ctx_get_output_buffer(self._ctx) or b"").decode(errors="replace")
            err = (self._lib.nft_ctx_get_error_buffer(self._ctx) or b"").decode(errors="replace")
        if rc != 0:
            raise NftError(f"nftables refused the batch: {err.strip() or f'error {rc}'}")
        if not out.strip():
            return {}
        try:
            answer: dict[str, Any] = json.loads(out)
        except ValueError as e:
            raise NftError(f"nftables answered something that is not JSON: {e}") from None
        return answer

    def close(self) -> None:
        """Free the context."""
        with self._lock:
            if self._ctx:
                self._lib.nft_ctx_free(self._ctx)
                self._ctx = None


def _declare(lib: ctypes.CDLL) -> None:
    """The C signatures of the calls used (libnftables.h)."""
    p, i, s = ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p
    lib.nft_ctx_new.restype, lib.nft_ctx_new.argtypes = p, [ctypes.c_uint32]
    lib.nft_ctx_free.restype, lib.nft_ctx_free.argtypes = None, [p]
    lib.nft_ctx_output_set_flags.restype = None
    lib.nft_ctx_output_set_flags.argtypes = [p, ctypes.c_uint]
    lib.nft_ctx_buffer_output.restype, lib.nft_ctx_buffer_output.argtypes = i, [p]
    lib.nft_ctx_buffer_error.restype, lib.nft_ctx_buffer_error.argtypes = i, [p]
    lib.nft_ctx_get_output_buffer.restype, lib.nft_ctx_get_output_buffer.argtypes = s, [p]
    lib.nft_ctx_get_error_buffer.restype, lib.nft_ctx_get_error_buffer.argtypes = s, [p]
    lib.nft_run_cmd_from_buffer.restype, lib.nft_run_cmd_from_buffer.argtypes = i, [p, s]
