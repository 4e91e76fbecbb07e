"""Nodes: membership, the cluster port the agents talk to, and the pool the router sends to."""
