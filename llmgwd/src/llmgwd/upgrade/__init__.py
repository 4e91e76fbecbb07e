"""`llmgw upgrade`: staged packages, the roll's state machine and the leader's driver."""
