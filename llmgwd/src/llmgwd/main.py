"""llmgwd's command line: read server.yaml and run the control plane."""

from __future__ import annotations

from llmgw.config import SERVER_CONFIG, ServerConfig
from llmgw.entry import run_daemon


def main(argv: list[str] | None = None) -> None:
    """Entry point of /usr/bin/llmgwd."""
    from llmgwd.daemon import run

    run_daemon("llmgwd", "the llmgw control plane", SERVER_CONFIG, ServerConfig, run, argv)
