"""llmgw-agentd's command line: read agent.yaml and run the node agent."""

from __future__ import annotations

from llmgw.config import AGENT_CONFIG, AgentConfig
from llmgw.entry import run_daemon


def main(argv: list[str] | None = None) -> None:
    """Entry point of /usr/bin/llmgw-agentd."""
    from llmgw_agentd.daemon import run

    # The agent runs with defaults until a site writes agent.yaml.
    run_daemon(
        "llmgw-agentd", "the llmgw node agent", AGENT_CONFIG, AgentConfig, run, argv,
        missing_ok=True,
    )  # fmt: skip
