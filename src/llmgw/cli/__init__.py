"""The llmgw command line: talks to llmgwd (and llmgw-agentd) over their Unix sockets."""
