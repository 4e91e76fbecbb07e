"""Prometheus metrics of llmgwd: the router's counters, the cluster's and the GPUs' state."""
