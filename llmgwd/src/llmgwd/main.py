"""llmgwd's command line: read server.yaml and run the control plane; or, as `llmgwd join` and
`llmgwd migrate`, this host's side of `llmgw plane join` and `migrate`, which run them."""

from __future__ import annotations

import sys

from llmgw.config import SERVER_CONFIG, ServerConfig
from llmgw.entry import run_daemon

HOST_COMMANDS = ("join", "migrate", "restore")  # llmgwd.planes.host_commands: the CLI runs them
DESCRIPTION = (
    "the llmgw control plane (`llmgwd join`, `llmgwd migrate` and `llmgwd restore` are this "
    "host's side of `llmgw plane join`, `llmgw plane migrate` and `llmgw restore`, which run them)"
)


def main(argv: list[str] | None = None) -> None:
    """Entry point of /usr/bin/llmgwd."""
    args = sys.argv[1:] if argv is None else argv
    if args[:1] and args[0] in HOST_COMMANDS:
        from llmgwd.planes.host_commands import run as run_host_command

        run_host_command(args)
        return
    from llmgwd.mirror_only import run  # the whole control plane, or the mirror alone

    run_daemon("llmgwd", DESCRIPTION, SERVER_CONFIG, ServerConfig, run, argv)
