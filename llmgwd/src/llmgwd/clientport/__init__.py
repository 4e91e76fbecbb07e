"""The client port: its HTTP server and who may hold its connections."""
