"""The model mirror: files from the hub or a peer, kept once, checked, served to nodes."""
