"""Prometheus metrics of llmgwd: the endpoints, the cluster, the GPUs, the engines (the
router's own counters are router/metrics.py, beside what they count)."""
