"""/api/v1's backup: what POST /backup answers, a control plane's whole state (the store, the
cluster CA and secret, the settings), which `llmgw backup` seals with a passphrase."""

from __future__ import annotations

import msgspec

BUNDLE_FORMAT = 1


class SiteFile(msgspec.Struct, frozen=True, kw_only=True):
    """A file the settings name outside the state dir (the OIDC client secret, the client
    port's certificate and key, LDAP's bind password), as it was on the control plane."""

    path: str  # absolute
    data: bytes
    mode: int  # its permission bits
    owner: str  # its user's name (a number where it had none)
    group: str  # its group's name (likewise)


class BackupBundle(msgspec.Struct, frozen=True, kw_only=True):
    """POST /backup (admins only): everything `llmgw restore` brings a cluster back from.
    Secret as a whole: the CLI seals it before it touches a disk, and no log shows it."""

    format: int = BUNDLE_FORMAT
    made_at: float  # unix time
    cluster: str  # server.yaml's name
    plane: str  # the control plane that made it
    version: str  # its llmgwd's release
    schema: int  # the store's schema (llmgwd.store.schema)
    backend: str  # the store it was made from: sqlite or etcd
    keys: int  # keys in the store copy
    # A SQLite store file (state.db): SQLite's online backup of a one-plane store, or every
    # unleased key of an etcd store at one revision, copied into one.
    store: bytes
    ca_cert_pem: str
    ca_key_pem: str
    secret: bytes  # the cluster secret (engine keys, Slurm's munge key derive from it)
    settings: str  # the control plane's server.yaml, as YAML
    files: tuple[SiteFile, ...] = ()  # the files the settings name (planes/site_files.py)
