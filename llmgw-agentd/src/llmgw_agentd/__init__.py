"""llmgw-agentd: the llmgw node agent."""
