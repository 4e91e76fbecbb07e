"""The sessions `llmgw login` keeps (the server, a key of the person's, until when) in the
user's config dir (0600): one per context, and the one kept before contexts (session.json),
still read for a context of its server and written by a sign-in outside any context."""

from __future__ import annotations

import os
import time
from pathlib import Path
from urllib.parse import quote

import msgspec


class SavedSession(msgspec.Struct, kw_only=True):
    """What `llmgw login` keeps: the server it signed in to, the key, whose, until when."""

    server: str
    key: str
    user: str
    name: str
    expires_at: float


def _config_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "llmgw"


def session_path(context: str = "") -> Path:
    """Where a context's session is kept, $XDG_CONFIG_HOME/llmgw/sessions/CONTEXT.json
    (~/.config by default); context "": the one session outside contexts, session.json."""
    if not context:
        return _config_dir() / "session.json"
    return _config_dir() / "sessions" / f"{quote(context, safe='')}.json"


def save_session(session: SavedSession, context: str = "") -> Path:
    """Write the session readable by its owner only (0600, in 0700 dirs)."""
    path = session_path(context)
    path.parent.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.parent.mkdir(mode=0o700, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        os.fchmod(f.fileno(), 0o600)
        f.write(msgspec.json.encode(session))
    return path


def load_session(context: str = "") -> SavedSession | None:
    """The kept session, if any and not expired."""
    try:
        saved = msgspec.json.decode(session_path(context).read_bytes(), type=SavedSession)
    except (OSError, msgspec.DecodeError):
        return None
    return saved if saved.expires_at > time.time() else None


def drop_session(context: str = "") -> SavedSession | None:
    """Forget the kept session (expired or not); the one that was kept, if readable."""
    path = session_path(context)
    try:
        saved = msgspec.json.decode(path.read_bytes(), type=SavedSession)
    except (OSError, msgspec.DecodeError):
        saved = None
    path.unlink(missing_ok=True)
    return saved


def session_key(url: str, context: str = "") -> str | None:
    """The key of context's session if it was signed in at url, else that of the session
    kept outside contexts if it was (as before contexts had their own), else None."""
    for saved in (load_session(context), load_session()) if context else (load_session(),):
        if saved is not None and saved.server.rstrip("/") == url:
            return saved.key
    return None
