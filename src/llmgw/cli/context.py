"""`llmgw context`: the control planes this CLI reaches over HTTPS (add, use, list, remove),
their CA pinned by fingerprint when added."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlsplit

import click

from llmgw import ipc, pki
from llmgw.cli import contexts, https
from llmgw.cli.common import PinRefused, Refused, Unreachable
from llmgw.cli.output import Listing, listing_options
from llmgw.cli.session import drop_session


def _url(url: str) -> str:
    parts = urlsplit(url.strip())
    if parts.scheme != "https" or not parts.hostname or parts.path.strip("/") or parts.query:
        raise click.BadParameter(f"must look like https://HOST:7700, not {url!r}")
    return f"https://{parts.netloc}"


def _pin(value: str | None) -> str:
    if value is None:
        return ""
    pin = value.lower().removeprefix("sha256:").replace(":", "").strip()
    if not re.fullmatch("[0-9a-f]{64}", pin):
        raise click.BadParameter("must be a sha256: 64 hex digits (colons allowed)")
    return pin


def _ca(url: str, pin: str, ca_file: Path | None) -> str:
    """The CA to pin: read from ca_file (its fingerprint pin, if given) or fetched from the
    server's handshake (its fingerprint pin); "" when neither is given."""
    if ca_file is not None:
        pem = ca_file.read_bytes()
        try:
            pki.check_ca(pem)
        except pki.PKIError as e:
            raise Refused(f"{ca_file} is not a CA certificate: {e}") from None
        if pin and pki.ca_fingerprint(pem) != pin:
            got = pki.ca_fingerprint(pem)
            raise PinRefused(f"{ca_file} is the CA sha256 {got}, not the pinned sha256 {pin}")
        return pem.decode()
    try:
        if not pin:
            return _first_use(url)
        return https.pinned_ca(url, pin).decode()
    except https.PinMismatch as e:
        raise PinRefused(f"{e}; nothing saved") from None
    except ipc.IpcError as e:
        raise Unreachable(str(e)) from None


def _first_use(url: str) -> str:
    """With no fingerprint given: "" when the system's CAs trust the server, else the CA its
    chain ends with, once the person has checked its fingerprint and said yes."""
    if https.system_trusts(url):
        return ""
    ca = https.offered_ca(url)
    if ca is None:
        raise PinRefused(
            f"the server at {url} is not signed by a CA this system trusts and sends no CA "
            "certificate: give it with --ca-file; nothing saved"
        )
    click.echo(
        f"The server at {url} is signed by a CA this system does not trust:\n"
        f"  {pki.common_name(ca)}, sha256 {pki.ca_fingerprint(ca)}\n"
        "Check that fingerprint with the cluster's operator (`llmgw status` on a control "
        "plane prints it).",
        err=True,
    )
    try:
        trusted = click.confirm("Pin this CA for the context?", default=False, err=True)
    except click.Abort:
        trusted = False
    if not trusted:
        raise Refused("nothing saved (--ca-fingerprint SHA256 pins a CA without asking)")
    return ca.decode()


@click.group()
def context() -> None:
    """The control planes this llmgw reaches over HTTPS, and which one commands use.

    A command uses --context NAME, else $LLMGW_CONTEXT, else the context `llmgw context use`
    chose; with none (or the name "local") it talks to the local llmgwd's Unix socket. Over
    HTTPS a command sends the key in $LLMGW_API_KEY, else the context's key file, else the
    session `llmgw login` kept for it. Kept in ~/.config/llmgw/contexts.yaml (0600).
    """


@context.command()
@click.argument("name")
@click.argument("url")
@click.option(
    "--ca-fingerprint",
    metavar="SHA256",
    help="Pin the CA whose certificate has this sha256 (`llmgw status` on a control plane "
    "prints it); without it, the system's CAs, else the CA the server sends once you "
    "confirm its fingerprint.",
)
@click.option(
    "--ca-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="The CA's certificate, for a server that does not send it.",
)
@click.option(
    "--key-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="A file holding the API key to send (never the key itself on the "
    "command line); without it, the `llmgw login` session.",
)
def add(
    name: str, url: str, ca_fingerprint: str | None, ca_file: Path | None, key_file: Path | None
) -> None:
    """Add (or replace) the context NAME: the client port at URL, https://HOST:7700.

    With --ca-fingerprint, the server's CA is fetched from its TLS handshake (or read from
    --ca-file) and kept only if its sha256 is the one given; every later command trusts it
    alone. A mismatch names both fingerprints and saves nothing (exit status 3). Without
    it, a server the system's CAs trust is trusted through them; any other is asked about:
    the CA its handshake sends is shown with its sha256 (llmgwd's own is the cluster CA,
    which `llmgw status` prints on a control plane) and pinned once you say yes."""
    if name == contexts.LOCAL:
        raise click.BadParameter(f"{contexts.LOCAL!r} is the local socket's name")
    url, pin = _url(url), _pin(ca_fingerprint)
    ca = _ca(url, pin, ca_file)
    made = contexts.Context(
        name=name,
        url=url,
        ca_fingerprint=pki.ca_fingerprint(ca) if ca else "",
        ca_pem=ca,
        key_file=str(key_file.resolve()) if key_file else "",
    )
    kept = _loaded()
    kept.contexts = [c for c in kept.contexts if c.name != name] + [made]
    path = contexts.save(kept)
    pinned = f"CA sha256 {made.ca_fingerprint} pinned" if ca else "the system's CAs trusted"
    click.echo(f"Context {name}: {url}, {pinned} (kept in {path}).")


@context.command()
@click.argument("name")
def use(name: str) -> None:
    """Make NAME the context commands use ("local": the local Unix socket)."""
    kept = _loaded()
    if name != contexts.LOCAL:
        _get(kept, name)
    kept.current = "" if name == contexts.LOCAL else name
    contexts.save(kept)
    click.echo(f"Commands now use {'the local socket' if not kept.current else name}.")


@context.command("list")
@listing_options
def list_(out: Listing) -> None:
    """List the contexts; * marks the one in use (-o wide: the CA's whole fingerprint)."""
    kept = _loaded()
    listed = [
        {"name": c.name, "url": c.url, "ca_fingerprint": c.ca_fingerprint,
         "key_file": c.key_file, "current": c.name == kept.current}
        for c in kept.contexts
    ]  # fmt: skip
    if out.raw(listed):
        return
    rows = [
        ["*" if c.name == kept.current else "", c.name, c.url, c.ca_fingerprint[:16] or "system",
         c.key_file or "login session", c.ca_fingerprint or "-"]
        for c in kept.contexts
    ]  # fmt: skip
    empty = "No contexts: commands use the local socket (llmgw context add NAME URL)."
    out.table(["CURRENT", "NAME", "URL", "CA", "KEY", "CA SHA256"], rows, empty, shown=5)


@context.command()
@click.argument("name")
def remove(name: str) -> None:
    """Forget the context NAME and its `llmgw login` session (its key file is left)."""
    kept = _loaded()
    _get(kept, name)
    drop_session(name)
    kept.contexts = [c for c in kept.contexts if c.name != name]
    if kept.current == name:
        kept.current = ""
    contexts.save(kept)
    click.echo(f"Removed context {name}.")


def _loaded() -> contexts.Contexts:
    try:
        return contexts.load()
    except contexts.ContextError as e:
        raise Refused(str(e)) from None


def _get(kept: contexts.Contexts, name: str) -> contexts.Context:
    try:
        return kept.get(name)
    except contexts.ContextError as e:
        raise click.BadParameter(str(e), param_hint="NAME") from None
