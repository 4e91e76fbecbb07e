"""llmgwd: the llmgw control plane."""
