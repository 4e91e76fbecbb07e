"""What every llmgw command shares: the sockets, the daemon calls and the exit codes."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import quote

import click
import msgspec

from llmgw import ipc
from llmgw.api_types import ErrorAnswer
from llmgw.cli import contexts, https
from llmgw.cli.session import session_key

API = "/api/v1"
T = TypeVar("T")

# The commands that act on this host (its llmgwd or agent, its files, the CLI's own config)
# whatever the context, with why; every other command works over the local socket and over a
# context's HTTPS alike (tests/llmgw/test_cli_every_command.py runs each one over HTTPS).
HOST_LOCAL: dict[str, str] = {
    "plane init": "writes this host's server.yaml and starts its llmgwd",
    "plane join": "makes this host's llmgwd and etcd member a control plane",
    "plane leave": "takes this host's control plane out and stops its units",
    "plane migrate": "moves this host's SQLite store into its own etcd member",
    "node join": "joins this host's llmgw-agentd (its Unix socket)",
    "restore": "writes a fresh control plane's state on this host (llmgwd restore)",
    "context add": "the CLI's own contexts file on this machine",
    "context list": "the CLI's own contexts file on this machine",
    "context remove": "the CLI's own contexts file on this machine",
    "context use": "the CLI's own contexts file on this machine",
}

# Exit codes a script can tell apart (2 is click's usage error).
EXIT_REFUSED = 1
EXIT_UNREACHABLE = 3
EXIT_NOT_FOUND = 4


class Refused(click.ClickException):
    """The daemon said no; its message goes to stderr."""

    exit_code = EXIT_REFUSED


class Unreachable(click.ClickException):
    """The daemon cannot be reached."""

    exit_code = EXIT_UNREACHABLE


class PinRefused(click.ClickException):
    """The server is not signed by the CA pinned for it: not the daemon meant."""

    exit_code = EXIT_UNREACHABLE


class NotFound(click.ClickException):
    """The model, key or other thing named does not exist."""

    exit_code = EXIT_NOT_FOUND


@dataclass(frozen=True, slots=True)
class Settings:
    """The global options."""

    socket: str
    agent_socket: str
    timeout: float = ipc.DEFAULT_TIMEOUT_S
    context: str | None = None  # --context or $LLMGW_CONTEXT; None: the current one, if any

    def remote(self) -> https.Remote | None:
        """The control plane the context names, over HTTPS; None for the local socket."""
        try:
            chosen = contexts.chosen(self.context)
            if chosen is None:
                return None
            return contexts.remote(chosen, session_key(chosen.url, chosen.name))
        except contexts.ContextError as e:
            raise Refused(str(e)) from None


pass_settings = click.make_pass_decorator(Settings)


def local(settings: Settings) -> Settings:
    """settings for this host's own llmgwd, whatever the context (its Unix socket)."""
    return dataclasses.replace(settings, context=contexts.LOCAL)


def api_path(*parts: str) -> str:
    """/api/v1/a/b with each part quoted (a key's name may hold a space or a slash)."""
    return "/".join([API, *(quote(p, safe="") for p in parts)])


def error_message(answer: Any, status: int) -> str:
    """The message of an /api/v1 error answer (api_types.ErrorAnswer), or a plain fallback."""
    try:
        return msgspec.convert(answer, ErrorAnswer).error.message
    except msgspec.ValidationError:
        return f"the daemon answered HTTP {status}"


def decoded(answer: Any, kind: type[T]) -> T:
    """An /api/v1 answer as its type (llmgw.api_types), or a refusal naming what is off."""
    try:
        return msgspec.convert(answer, kind)
    except msgspec.ValidationError as e:
        raise Refused(f"the daemon's answer is not what this llmgw reads: {e}") from None


def call(
    settings: Settings, method: str, path: str, body: object = None, *, agent: bool = False
) -> Any:
    """One API call, over the local socket or the context's HTTPS (the agent's: always its
    local socket); a refusal, an unknown name or an unreachable daemon ends the command."""
    remote = None if agent else settings.remote()
    sock, daemon = (settings.agent_socket, "llmgw-agentd") if agent else (settings.socket, "llmgwd")
    try:
        if remote is not None:
            status, answer = https.request(remote, method, path, body, timeout=settings.timeout)
        else:
            status, answer = ipc.request(
                sock, method, path, body, daemon=daemon, timeout=settings.timeout
            )
    except ipc.IpcError as e:
        raise Unreachable(str(e)) from None
    except https.PinMismatch as e:
        raise PinRefused(str(e)) from None
    if status == 404:
        raise NotFound(error_message(answer, status))
    if status >= 400:
        raise Refused(error_message(answer, status))
    return answer
