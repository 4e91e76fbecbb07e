"""llmgw: shared package of wire messages, config, PKI and the CLI."""
