"""Signing in to the console through the site's OpenID Connect provider, as `llmgw login` does:
the authorization code grant with PKCE (S256), the browser sent to the provider and back to
/console/login/oidc/callback; the ID token checked and the user's session key made by the very
functions /api/v1/login uses, and the console's cookie naming that key's id."""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import secrets
from urllib.parse import urlencode, urlsplit

from aiohttp import web

from llmgwd.api.login_session import KEYS, OIDC, SIGNIN, new_session
from llmgwd.console.base import PREFIX, Console, ConsoleError, OidcSignIn, console, render
from llmgwd.console.session import BY_OIDC, PENDING, Pending
from llmgwd.people.oidc import SignInError

log = logging.getLogger(__name__)

START = PREFIX + "/login/oidc"
CALLBACK = START + "/callback"


def of_login(login: web.Application, public_url: str) -> OidcSignIn | None:
    """The provider and sign-in /api/v1/login's application holds (the same objects), if
    OIDC is set up; public_url, the client port's (client.public_url)."""
    provider, signin = login.get(OIDC), login.get(SIGNIN)
    if provider is None or signin is None:
        return None
    return OidcSignIn(provider, signin, login[KEYS], public_url.rstrip("/"))


def provider_name(c: Console) -> str:
    """The provider as the sign-in page names it (its issuer's host); "": OIDC is off."""
    return urlsplit(c.oidc.provider.settings.issuer).netloc if c.oidc else ""


def redirect_uri(request: web.Request, oidc: OidcSignIn) -> str:
    """Where the provider sends the browser back: CALLBACK under the client port's public URL,
    else under the address this request came to (to register at the provider)."""
    return (oidc.public_url or f"{request.scheme}://{request.host}") + CALLBACK


def _on(c: Console) -> OidcSignIn:
    if c.oidc is None:
        raise ConsoleError(404, "sign-in with OIDC is not set up here (oidc.issuer)")
    return c.oidc


def challenge(verifier: str) -> str:
    """PKCE's S256 code challenge of a verifier (RFC 7636)."""
    digest = hashlib.sha256(verifier.encode()).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


async def start(request: web.Request) -> web.Response:
    """GET /console/login/oidc: a sign-in begun, its state, nonce and PKCE verifier kept in a
    signed cookie, the browser sent to the provider. A link, not a form: the policy's
    form-action 'self' would stop a form's redirect to another site."""
    c = console(request)
    oidc = _on(c)
    try:
        endpoint = str((await oidc.provider.metadata())["authorization_endpoint"])
    except (SignInError, KeyError):
        raise ConsoleError(502, "the provider cannot be reached or names no sign-in page") from None
    p = Pending(secrets.token_urlsafe(24), secrets.token_urlsafe(24), secrets.token_urlsafe(48))
    settings = oidc.provider.settings
    query = {
        "response_type": "code",
        "client_id": settings.client_id,
        "redirect_uri": redirect_uri(request, oidc),
        "scope": " ".join(settings.scopes),
        "state": p.state,
        "nonce": p.nonce,
        "code_challenge": challenge(p.verifier),
        "code_challenge_method": "S256",
    }
    sep = "&" if "?" in endpoint else "?"
    response = web.Response(status=303, headers={"Location": endpoint + sep + urlencode(query)})
    c.sessions.pend(response, p)
    return response


def _pending_of(request: web.Request) -> Pending:
    """The sign-in this browser began, if the answer's state is its; else a 400 (an answer
    replayed, another browser's, or one this browser never asked for)."""
    pending = console(request).sessions.pending(request.cookies.get(PENDING, ""))
    state = request.query.get("state", "").encode()
    if pending is None or not hmac.compare_digest(state, pending.state.encode()):
        log.warning("console: an OIDC answer that is not the sign-in this browser began")
        raise ConsoleError(400, "this sign-in's answer is not the one begun here: sign in again")
    return pending


def _refused(request: web.Request, status: int, message: str) -> web.Response:
    """The error page, the pending sign-in dropped (its code is no good twice)."""
    response = render(request, "error.html", None, status, code=status, message=message)
    console(request).sessions.unpend(response)
    return response


async def callback(request: web.Request) -> web.Response:
    """GET /console/login/oidc/callback?code&state: the code redeemed with the verifier, the
    ID token checked with the nonce, and the user's session key made, as /api/v1/login does;
    the session's cookie names that key, so a user deactivated, or the key revoked, ends it."""
    c = console(request)
    oidc = _on(c)
    pending = _pending_of(request)
    code = request.query.get("code", "")
    if not code:
        error = request.query.get("error", "no code")[:64]
        log.info("console: the provider refused a sign-in (%r)", error)  # %r: no forged line
        return _refused(request, 403, f"the provider refused the sign-in: {error}")
    try:
        token = await oidc.provider.redeem(code, pending.verifier, redirect_uri(request, oidc))
        claims = await oidc.provider.verify(token, pending.nonce)
        key, answer = await new_session(oidc.provider, oidc.signin, oidc.keys, claims)
    except SignInError as e:
        return _refused(request, e.status, str(e))
    # A page, not a redirect: after the provider's cross-site redirect, a browser would not
    # send the session's SameSite=Strict cookie on a redirect onward; the page's own refresh
    # is a navigation from this site, which sends it.
    response = render(request, "signed_in.html", None, name=answer.name, to=PREFIX + "/")
    c.sessions.set(response, key.id, BY_OIDC)
    c.sessions.unpend(response)
    return response
