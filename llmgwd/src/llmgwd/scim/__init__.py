"""SCIM 2.0 (RFC 7643, 7644) on the client port: an identity provider's users and groups."""
