"""`llmgw login` and `logout`: sign in with the site's OpenID Connect provider through llmgwd's
client port; the session's key is kept in the user's config dir (0600), one per context, for
the commands that follow, until it ends or `llmgw logout` forgets it."""

from __future__ import annotations

import os
import ssl
import time
import webbrowser

import click

from llmgw import ipc
from llmgw.api_types import LoginAnswer, OidcInfo, OidcLogin
from llmgw.cli import contexts, https
from llmgw.cli.common import API, Refused, Settings, decoded, error_message, pass_settings
from llmgw.cli.login_device import device_sign_in
from llmgw.cli.login_flow import Catcher, Request
from llmgw.cli.login_http import call
from llmgw.cli.session import SavedSession, drop_session, save_session

WAIT_S = 300.0  # how long the person has to sign in


def open_browser(url: str) -> None:
    """Open url in the person's browser, if there is one (the URL is printed anyway)."""
    webbrowser.open(url)


def _sign_in(server: str, browser: bool, tls: ssl.SSLContext | None) -> LoginAnswer:
    login = server + "/api/v1/login/oidc"
    info = decoded(call("GET", login, tls=tls), OidcInfo)
    catcher = Catcher()
    req = Request(info=info, redirect_uri=catcher.redirect_uri)
    click.echo(f"Sign in with {info.issuer} by opening:\n\n  {req.url()}\n")
    if not browser or not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        click.echo("(no browser on this machine? llmgw login --device signs in with a code)\n")
    if browser:
        open_browser(req.url())
    query = catcher.wait(WAIT_S)
    if query is None:
        raise Refused(f"no sign-in came back within {WAIT_S:.0f} s")
    if query.get("state") != req.state:
        raise Refused("the provider's answer is not this sign-in's (state differs)")
    if "code" not in query:
        raise Refused(f"the provider refused: {query.get('error', 'no code')}")
    body = OidcLogin(
        nonce=req.nonce,
        code=query["code"],
        code_verifier=req.verifier,
        redirect_uri=req.redirect_uri,
    )
    return decoded(call("POST", login, body, tls=tls), LoginAnswer)


def _chosen(settings: Settings, needed: bool) -> contexts.Context | None:
    """The context in use (None: none), its error a refusal when needed."""
    try:
        return contexts.chosen(settings.context)
    except contexts.ContextError as e:
        if needed:
            raise Refused(str(e)) from None
        return None


def _server(settings: Settings, server: str | None) -> tuple[str, ssl.SSLContext | None, str]:
    """Where to sign in, --server else the context's URL, whom to trust there (the context's
    pinned CA if it is the context's URL, else the system's CAs), and the context whose
    session it is ("": signed in outside the contexts)."""
    chosen = _chosen(settings, needed=server is None)
    if server is None:
        if chosen is None:
            raise click.UsageError("no server: give --server URL, or use a context (llmgw context)")
        server = chosen.url
    server = server.rstrip("/")
    if not server.startswith(("https://", "http://")):
        raise click.BadParameter("must be an http(s):// URL", param_hint="--server")
    if chosen is None or chosen.url != server:
        return server, None, ""
    return server, https.tls_context(chosen.ca_pem.encode()) if chosen.ca_pem else None, chosen.name


@click.command()
@click.option(
    "--server",
    envvar="LLMGW_SERVER",
    help="The cluster's client port, https://HOST:7700 (or $LLMGW_SERVER) [default: the "
    "context's, its CA pinned].",
)
@click.option("--no-browser", is_flag=True, help="Print the sign-in URL only; open no browser.")
@click.option(
    "--device",
    is_flag=True,
    help="Sign in with a user code confirmed on any device (no browser or redirect here).",
)
@pass_settings
def login(settings: Settings, server: str | None, no_browser: bool, device: bool) -> None:
    """Sign in with the site's identity provider (OpenID Connect); the session's key is kept
    for the context in ~/.config/llmgw/sessions/CONTEXT.json (0600) until it ends (the
    server's oidc.session_ttl_s) or `llmgw logout`; signed in with --server at no context's
    URL, in ~/.config/llmgw/session.json.

    By default a browser signs in (the authorization code grant with PKCE) and the provider
    sends it back to a one-shot listener on 127.0.0.1, so the browser must run on this
    machine. On a terminal with no browser (over ssh, on a cluster's login node) use
    --device: llmgw prints a page and a user code, the person confirms the code there on any
    device, and llmgw waits, polling the server as often as it says (the device
    authorization grant); it is never chosen on its own. Either way the server, not llmgw,
    holds the client secret and checks the ID token. Every command over the context then
    sends the session's key (unless $LLMGW_API_KEY or the context's key file); a context
    with no session of its own sends session.json's if it was signed in at its URL."""
    server, tls, context = _server(settings, server)
    answer = device_sign_in(server, tls) if device else _sign_in(server, not no_browser, tls)
    saved = SavedSession(
        server=server,
        key=answer.key,
        user=answer.user,
        name=answer.name,
        expires_at=answer.expires_at,
    )
    path = save_session(saved, context)
    until = time.strftime("%Y-%m-%d %H:%M", time.localtime(answer.expires_at))
    click.echo(f"signed in as {answer.name} until {until} (session kept in {path})")


def _end_on_server(chosen: contexts.Context, saved: SavedSession, timeout: float) -> str:
    """Revoke the session's key at the context's server (DELETE /api/v1/me/key, sent with
    that key, trusting the context's pinned CA); what became of it, said."""
    ca = chosen.ca_pem.encode() if chosen.ca_pem else None
    remote = https.Remote(url=chosen.url, ca_pem=ca, key=saved.key)
    try:
        status, answer = https.request(remote, "DELETE", f"{API}/me/key", timeout=timeout)
    except (ipc.IpcError, https.PinMismatch) as e:
        until = time.strftime("%Y-%m-%d %H:%M", time.localtime(saved.expires_at))
        return f"its key was not revoked ({e}): it works until {until}"
    if status == 200:
        return "its key is revoked"
    if status == 401:
        return "its key had ended already"
    return f"its key was not revoked: {error_message(answer, status)}"


@click.command()
@pass_settings
def logout(settings: Settings) -> None:
    """End the session `llmgw login` kept for the context in use: its key revoked at the
    context's server and the session forgotten here (with no context, the one kept in
    ~/.config/llmgw/session.json is forgotten only)."""
    chosen = _chosen(settings, needed=True)
    name = chosen.name if chosen is not None else ""
    saved = drop_session(name)
    where = f"context {name}" if name else "no context"
    if saved is None:
        click.echo(f"No session was kept for {where}.")
        return
    ended = "the session is forgotten"
    if chosen is not None and saved.server.rstrip("/") == chosen.url:
        ended += "; " + _end_on_server(chosen, saved, settings.timeout)
    click.echo(f"Signed out {saved.name} at {saved.server} ({where}): {ended}.")
