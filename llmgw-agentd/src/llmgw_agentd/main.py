"""llmgw-agentd's command line: read the config and run the agent."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import uvloop

from llmgw import log
from llmgw.config import AGENT_CONFIG, AgentConfig, ConfigError, load


def main(argv: list[str] | None = None) -> None:
    """Entry point of /usr/bin/llmgw-agentd."""
    parser = argparse.ArgumentParser(prog="llmgw-agentd", description="the llmgw node agent")
    parser.add_argument("--config", type=Path, default=AGENT_CONFIG, help="agent.yaml to read")
    parser.add_argument("--check", action="store_true", help="check the config and exit")
    args = parser.parse_args(argv)
    try:
        # The agent runs with defaults until a site writes agent.yaml.
        config = load(args.config, AgentConfig, missing_ok=True)
    except ConfigError as e:
        print(f"llmgw-agentd: {e}", file=sys.stderr)
        sys.exit(78)  # EX_CONFIG
    if args.check:
        print(f"{args.config}: ok")
        return
    log.setup("llmgw-agentd", config.log_level)
    from llmgw_agentd.daemon import run

    try:
        uvloop.run(run(config))
    except KeyboardInterrupt:
        pass
    except Exception:
        logging.getLogger("llmgw-agentd").exception("llmgw-agentd stopped on an error")
        sys.exit(1)
