"""The session `llmgw login` keeps (the server, a key of the person's, until when) in the
user's config dir (0600), read by every command over a context with that server's URL."""

from __future__ import annotations

import os
import time
from pathlib import Path

import msgspec


class SavedSession(msgspec.Struct, kw_only=True):
    """What `llmgw login` keeps: the server it signed in to, the key, whose, until when."""

    server: str
    key: str
    user: str
    name: str
    expires_at: float


def session_path() -> Path:
    """$XDG_CONFIG_HOME/llmgw/session.json (~/.config by default)."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "llmgw" / "session.json"


def save_session(session: SavedSession) -> Path:
    """Write the session readable by its owner only (0600, in a 0700 dir)."""
    path = session_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        os.fchmod(f.fileno(), 0o600)
        f.write(msgspec.json.encode(session))
    return path


def load_session() -> SavedSession | None:
    """The kept session, if any and not expired."""
    try:
        saved = msgspec.json.decode(session_path().read_bytes(), type=SavedSession)
    except (OSError, msgspec.DecodeError):
        return None
    return saved if saved.expires_at > time.time() else None


def session_key(url: str) -> str | None:
    """The kept session's key if it was made by signing in at url, else None."""
    saved = load_session()
    return saved.key if saved is not None and saved.server.rstrip("/") == url else None
