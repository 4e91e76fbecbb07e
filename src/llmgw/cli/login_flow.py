"""The browser half of `llmgw login`: the OAuth 2.0 authorization code grant with PKCE (S256)
and a one-shot redirect catcher on 127.0.0.1, which hands back the code (never logged)."""

from __future__ import annotations

import http.server
import secrets
import threading
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlencode, urlsplit

from authlib.common.security import (  # type: ignore[import-untyped]  # authlib has no types
    generate_token,
)
from authlib.oauth2.rfc7636 import (  # type: ignore[import-untyped]  # authlib has no types
    create_s256_code_challenge,
)

from llmgw.api_types import OidcInfo

PAGE = b"<html><body><p>llmgw: signed in, you may close this page.</p></body></html>"


@dataclass
class Request:
    """One sign-in's secrets (kept in memory only) and the URL the person opens."""

    info: OidcInfo
    redirect_uri: str
    verifier: str = field(default_factory=lambda: str(generate_token(64)))
    state: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    nonce: str = field(default_factory=lambda: secrets.token_urlsafe(24))

    def url(self) -> str:
        """The provider's authorization URL for this sign-in."""
        query = {
            "response_type": "code",
            "client_id": self.info.client_id,
            "redirect_uri": self.redirect_uri,
            "scope": " ".join(self.info.scopes),
            "state": self.state,
            "nonce": self.nonce,
            "code_challenge": str(create_s256_code_challenge(self.verifier)),
            "code_challenge_method": "S256",
        }
        sep = "&" if "?" in self.info.authorization_endpoint else "?"
        return self.info.authorization_endpoint + sep + urlencode(query)


class Catcher(http.server.HTTPServer):
    """A loopback server that takes the provider's redirect once: its code, or its error."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.query: dict[str, str] = {}
        self.done = threading.Event()

    @property
    def redirect_uri(self) -> str:
        """Where the provider sends the browser back."""
        return f"http://127.0.0.1:{self.server_address[1]}/callback"

    def wait(self, timeout: float) -> dict[str, str] | None:
        """Serve until the redirect comes or timeout passes; its query, or None."""
        thread = threading.Thread(target=self.serve_forever, args=(0.1,), daemon=True)
        thread.start()
        try:
            return self.query if self.done.wait(timeout) else None
        finally:
            self.shutdown()
            self.server_close()


class _Handler(http.server.BaseHTTPRequestHandler):
    server: Catcher

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        if url.path != "/callback" or self.server.done.is_set():
            self.send_error(404)
            return
        self.server.query = {k: v[0] for k, v in parse_qs(url.query).items()}
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(PAGE)))
        self.end_headers()
        self.wfile.write(PAGE)
        self.server.done.set()

    def log_message(self, format: str, *args: object) -> None:
        """Nothing: the query holds the code."""
