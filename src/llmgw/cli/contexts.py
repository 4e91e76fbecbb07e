"""The CLI's contexts (kubectl's idea): named control planes reached over HTTPS, kept in
$XDG_CONFIG_HOME/llmgw/contexts.yaml (0600), and which one a command uses."""

from __future__ import annotations

import os
from pathlib import Path

import msgspec
import yaml

from llmgw import pki
from llmgw.cli.https import Remote

LOCAL = "local"  # the reserved name: the local Unix socket, as with no context at all
KEY_ENV = "LLMGW_API_KEY"


class ContextError(Exception):
    """A context that cannot be used; the message says which and why (never a key)."""


class Context(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One control plane: its client port's URL, the CA pinned for it, where its key is."""

    name: str
    url: str
    ca_fingerprint: str = ""  # sha256 of the CA's DER; "" for the system's CAs
    ca_pem: str = ""  # that CA, as it was fetched (or read) and checked when added
    key_file: str = ""  # a file holding an API key; "": the `llmgw login` session


class Contexts(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The file's content."""

    current: str = ""
    contexts: list[Context] = msgspec.field(default_factory=list)

    def get(self, name: str) -> Context:
        """The context called name, or ContextError."""
        for c in self.contexts:
            if c.name == name:
                return c
        raise ContextError(f"no context {name!r} (llmgw context list shows them)")


def config_dir() -> Path:
    """$XDG_CONFIG_HOME/llmgw (~/.config/llmgw by default)."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "llmgw"


def contexts_path() -> Path:
    """Where the contexts are kept."""
    return config_dir() / "contexts.yaml"


def load() -> Contexts:
    """The kept contexts (none if there is no file yet)."""
    path = contexts_path()
    try:
        data = yaml.safe_load(path.read_text())
        return msgspec.convert(data or {}, Contexts)
    except FileNotFoundError:
        return Contexts()
    except (OSError, yaml.YAMLError, msgspec.ValidationError) as e:
        raise ContextError(f"cannot read {path}: {e}") from None


def save(contexts: Contexts) -> Path:
    """Write the contexts readable by their owner only (0600, in a 0700 dir), atomically."""
    path = contexts_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        os.fchmod(f.fileno(), 0o600)
        yaml.safe_dump(msgspec.to_builtins(contexts), f, sort_keys=False)
    tmp.replace(path)
    return path


def chosen(name: str | None) -> Context | None:
    """The context a command uses: name (--context or LLMGW_CONTEXT), else the current one;
    None for the local socket (no context, or the name "local")."""
    kept = load()
    name = name or kept.current
    return None if not name or name == LOCAL else kept.get(name)


def read_key(path: str) -> str:
    """The API key in the file at path (its first line), or ContextError."""
    try:
        key = Path(path).expanduser().read_text().strip().splitlines()
    except OSError as e:
        raise ContextError(f"cannot read the key file {path}: {e.strerror or e}") from None
    if not key or not key[0].strip():
        raise ContextError(f"the key file {path} is empty")
    return key[0].strip()


def remote(context: Context, session_key: str | None) -> Remote:
    """How a command reaches context: its pinned CA, and a key from $LLMGW_API_KEY, else its
    key file, else session_key (its `llmgw login` session), else none."""
    ca = context.ca_pem.encode() if context.ca_pem else None
    if ca is not None and pki.ca_fingerprint(ca) != context.ca_fingerprint:
        raise ContextError(f"context {context.name}: its kept CA is not the pinned one")
    key = os.environ.get(KEY_ENV) or None
    if key is None and context.key_file:
        key = read_key(context.key_file)
    return Remote(url=context.url, ca_pem=ca, key=key or session_key)
