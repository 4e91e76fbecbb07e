"""Slurm on llmgw's nodes: its settings, and the files the leader makes for it."""
