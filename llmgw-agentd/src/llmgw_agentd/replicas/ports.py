"""An engine's port: one of the agent's range that no replica holds and nothing listens on."""

from __future__ import annotations

import socket

from llmgw_agentd.engines import EngineError


def allocate(host: str, port_range: tuple[int, int], taken: set[int], prefer: int = 0) -> int:
    """A port of port_range (prefer first, where given) not in taken and free on host;
    raises EngineError when none is left."""
    lo, hi = port_range
    for port in ([prefer] if prefer else []) + list(range(lo, hi + 1)):
        if port not in taken and is_free(host, port):
            return port
    raise EngineError(f"no free port left in {lo}-{hi}")


def is_free(host: str, port: int) -> bool:
    """Whether nothing listens on host:port (a bind succeeds)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        # As servers do: a port with only closed connections (TIME_WAIT) left is free.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True
