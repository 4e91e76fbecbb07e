"""A small synchronous HTTP client over the daemons' Unix sockets, for the CLI."""

from __future__ import annotations

import http.client
import socket
from typing import Any

import msgspec

DEFAULT_TIMEOUT_S = 30.0


class IpcError(Exception):
    """The daemon cannot be reached; the message says why and what to do."""


class UnixHTTPConnection(http.client.HTTPConnection):
    """http.client's connection, dialling a Unix socket instead of TCP."""

    def __init__(self, socket_path: str, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = socket_path

    def connect(self) -> None:
        """Open the Unix socket (http.client calls this on the first request)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.socket_path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


def _reach_error(e: OSError, socket_path: str, daemon: str) -> IpcError:
    """What an OSError on connect means for the person at the terminal."""
    if isinstance(e, FileNotFoundError):
        return IpcError(f"{daemon} is not running: no {socket_path}")
    if isinstance(e, PermissionError):
        return IpcError(
            f"permission denied on {socket_path}: talking to {daemon} needs root or the llmgw group"
        )
    if isinstance(e, ConnectionRefusedError):
        return IpcError(f"{daemon} is not running: nothing answers on {socket_path}")
    if isinstance(e, TimeoutError):
        return IpcError(f"{daemon} did not answer on {socket_path} in time")
    return IpcError(f"cannot reach {daemon} on {socket_path}: {e.strerror or e}")


def request(
    socket_path: str,
    method: str,
    path: str,
    body: object = None,
    *,
    daemon: str = "llmgwd",
    timeout: float = DEFAULT_TIMEOUT_S,
) -> tuple[int, Any]:
    """Send one request; returns the HTTP status and the decoded JSON answer (None if empty).

    Raises IpcError when the daemon cannot be reached or answers something that is not JSON.
    """
    conn = UnixHTTPConnection(socket_path, timeout)
    headers = {"Accept": "application/json"}
    payload = None
    if body is not None:
        payload = msgspec.json.encode(body)
        headers["Content-Type"] = "application/json"
    try:
        conn.request(method, path, body=payload, headers=headers)
        resp = conn.getresponse()
        status, raw = resp.status, resp.read()
    except OSError as e:
        raise _reach_error(e, socket_path, daemon) from None
    except http.client.HTTPException as e:
        why = type(e).__name__
        raise IpcError(f"{daemon} on {socket_path} broke off its answer ({why})") from None
    finally:
        conn.close()
    try:
        return status, msgspec.json.decode(raw) if raw else None
    except msgspec.DecodeError:
        raise IpcError(f"{daemon} answered {status} with a body that is not JSON") from None
