"""The web console at /console on the client port: pages drawn from /api/v1's own routes."""
