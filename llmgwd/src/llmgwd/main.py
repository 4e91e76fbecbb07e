"""llmgwd's command line: read the config, run the daemon; a bad config is a clear message."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import uvloop

from llmgw import log
from llmgw.config import SERVER_CONFIG, ConfigError, ServerConfig, load


def main(argv: list[str] | None = None) -> None:
    """Entry point of /usr/bin/llmgwd."""
    parser = argparse.ArgumentParser(prog="llmgwd", description="the llmgw control plane")
    parser.add_argument("--config", type=Path, default=SERVER_CONFIG, help="server.yaml to read")
    parser.add_argument("--check", action="store_true", help="check the config and exit")
    args = parser.parse_args(argv)
    try:
        config = load(args.config, ServerConfig)
    except ConfigError as e:
        print(f"llmgwd: {e}", file=sys.stderr)
        sys.exit(78)  # EX_CONFIG: systemd shows it as a config failure
    if args.check:
        print(f"{args.config}: ok")
        return
    log.setup("llmgwd", config.log_level)
    from llmgwd.daemon import run  # after logging: importing it pulls in the heavy parts

    try:
        uvloop.run(run(config))
    except KeyboardInterrupt:
        pass
    except Exception:
        logging.getLogger("llmgwd").exception("llmgwd stopped on an error")
        sys.exit(1)
