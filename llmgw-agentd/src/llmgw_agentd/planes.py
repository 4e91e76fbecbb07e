"""The control planes this agent knows (each one's cluster URL), kept in its state dir so a
restarted agent whose joined control plane is gone still reaches the others."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import msgspec

from llmgw import pki

log = logging.getLogger(__name__)

PLANES_FILE = "control_planes.json"


class Planes:
    """The URLs to dial, and which one the link dials now."""

    def __init__(self, joined: str, path: Path | None = None) -> None:
        self._path = path
        self._joined = _clean(joined)
        self.urls = [self._joined]
        saved = _load(path)
        for url in saved:
            if url not in self.urls:
                self.urls.append(url)
        self._saved = set(saved)  # what the file holds
        self._at = 0

    @property
    def url(self) -> str:
        """The control plane to dial now."""
        return self.urls[self._at]

    def next(self) -> None:
        """Dial the next one (the current one is gone, or is not the leader and knows none)."""
        self._at = (self._at + 1) % len(self.urls)

    def follow(self, url: str) -> None:
        """Dial url next (a standby named it the leader)."""
        url = _clean(url)
        if url not in self.urls:
            self.urls.append(url)
        self._at = self.urls.index(url)

    def update(self, urls: Sequence[str]) -> None:
        """The leader's list of every control plane: kept (in the file too), the current
        one first among them, and the joined one last where the leader does not list it (a
        control plane restarting is missing from the list for a while, and a cluster lost
        and restored from a backup comes back at the address its nodes joined)."""
        new = [_clean(u) for u in urls if u]
        if not new:
            return
        new += [self._joined] if self._joined not in new else []
        if set(new) == set(self.urls) == self._saved:
            return
        current = self.url
        self.urls = [current, *(u for u in new if u != current)]
        self._at = 0
        log.info("control planes known: %s", ", ".join(self.urls))
        if self._path is None:
            self._saved = set(self.urls)
        else:
            try:
                pki.write_pem(self._path, msgspec.json.encode(self.urls) + b"\n")
                self._saved = set(self.urls)
            except OSError as e:
                log.warning("cannot keep the control planes' list in %s: %s", self._path, e)


def _clean(url: str) -> str:
    return url.rstrip("/")


def _load(path: Path | None) -> list[str]:
    if path is None:
        return []
    try:
        return [_clean(u) for u in msgspec.json.decode(path.read_bytes(), type=list[str])]
    except FileNotFoundError:
        return []
    except (OSError, msgspec.DecodeError, msgspec.ValidationError) as e:
        log.warning("%s cannot be read (%s); only the joined control plane is known", path, e)
        return []
