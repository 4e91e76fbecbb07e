"""The new host's side of `llmgw plane join`: the cluster's CA pinned by the plane token, the
join asked for over HTTPS trusting only that CA, and what llmgwd and its etcd member read
written: the CA and its key, the cluster secret, the member's certificates and config."""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import os
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp
import msgspec

from llmgw import pinned_ca, pki, wire
from llmgw.config import ServerConfig
from llmgwd.planes import etcd_member
from llmgwd.planes.setup import member_tls
from llmgwd.store.etcd_http import EtcdError, EtcdHttp

CONNECT_TIMEOUT_S = 10.0
RETRY_S = 60.0  # etcd adds a member once every member has been connected for 5 s
RETRY_EVERY_S = 2.0
SECRET_FILE = "secret"  # noqa: S105 (daemon.load_secret's file name in the state dir)


class JoinFailed(Exception):
    """The join cannot go on; the message says why and never holds the token or a key."""


def check_url(url: str) -> str:
    """https://HOST:PORT of the cluster port, or JoinFailed."""
    try:
        return pinned_ca.check_url(url)
    except pinned_ca.PinError as e:
        raise JoinFailed(str(e)) from None


async def ask(
    url: str,
    token: str,
    name: str,
    peer_url: str,
    *,
    retry_s: float = RETRY_S,
    on_retry: Callable[[str], None] = lambda _: None,
) -> wire.PlaneJoinResponse:
    """The CA at url checked against the token, then POST /servers/join over TLS that trusts
    only that CA (again while the store's cluster is not ready for a member, a 503, for up to
    retry_s, on_retry told why); the answer checked (the CA, its own key, this member)."""
    url = check_url(url)
    try:
        pki.split_join_token(token)
    except pki.PKIError as e:
        raise JoinFailed(f"the plane token is malformed ({e})") from None
    timeout = aiohttp.ClientTimeout(total=60, connect=CONNECT_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        try:
            ca_pem = await pinned_ca.fetch_pinned(session, url, token, "plane token")
        except pinned_ca.PinError as e:
            raise JoinFailed(str(e)) from None
        request = wire.PlaneJoinRequest(token=token, name=name, peer_url=peer_url)
        deadline = time.monotonic() + retry_s
        while True:
            body, status = await _post(session, f"{url}/servers/join", request, ca_pem)
            if status != 503 or time.monotonic() >= deadline:
                break
            on_retry(_reason(body))
            await asyncio.sleep(RETRY_EVERY_S)
    if status != 200:
        raise JoinFailed(f"the control plane refused the join: {_reason(body)} (HTTP {status})")
    return _checked(body, ca_pem, name)


async def _post(
    session: aiohttp.ClientSession, url: str, request: wire.PlaneJoinRequest, ca_pem: bytes
) -> tuple[bytes, int]:
    data = msgspec.json.encode(request)
    headers = {"Content-Type": "application/json"}
    ctx = pki.client_context(ca_pem)
    try:
        async with session.post(url, data=data, headers=headers, ssl=ctx) as resp:
            return await resp.read(), resp.status
    except aiohttp.ClientConnectorCertificateError as e:
        raise JoinFailed(f"{url}: its certificate does not fit: {e.certificate_error}") from None
    except (aiohttp.ClientError, TimeoutError) as e:
        raise JoinFailed(f"cannot reach {url}: {e or type(e).__name__}") from None


def _reason(body: bytes) -> str:
    try:
        return msgspec.json.decode(body, type=dict[str, str])["error"][:500]
    except (msgspec.DecodeError, msgspec.ValidationError, KeyError):
        return "no reason given"


def _checked(body: bytes, ca_pem: bytes, name: str) -> wire.PlaneJoinResponse:
    bad = "the control plane's join answer is not valid"
    try:
        answer = msgspec.json.decode(body, type=wire.PlaneJoinResponse)
        base64.b64decode(answer.secret, validate=True)
    except (msgspec.DecodeError, msgspec.ValidationError, binascii.Error):
        raise JoinFailed(bad) from None
    try:
        same = hmac.compare_digest(pki.ca_fingerprint(answer.ca_pem), pki.ca_fingerprint(ca_pem))
        own_key = pki.same_public_key(answer.ca_pem, answer.ca_key_pem)
    except (pki.PKIError, ValueError):
        raise JoinFailed(f"{bad}: its CA or key cannot be read") from None
    if not same or not own_key:
        raise JoinFailed(f"{bad}: it names another CA, or a key that is not the CA's")
    if name not in [m.name for m in answer.members]:
        raise JoinFailed(f"{bad}: it does not list this host's member, {name}")
    return answer


def write_keys(state_dir: Path, answer: wire.PlaneJoinResponse, owner: tuple[int, int]) -> None:
    """STATE_DIR/pki/ca.pem and ca.key, STATE_DIR/secret (keys 0600), all owned by owner
    (llmgw's uid and gid: llmgwd and the member run as llmgw)."""
    pki_dir = state_dir / "pki"
    for d, mode in ((state_dir, 0o750), (pki_dir, 0o700)):
        d.mkdir(mode=mode, parents=True, exist_ok=True)
        _own(d, owner)
    ca_cert, ca_key = pki_dir / etcd_member.CA_CERT, pki_dir / etcd_member.CA_KEY
    pki.write_pair(pki.CertKey(answer.ca_pem.encode(), answer.ca_key_pem.encode()), ca_cert, ca_key)
    pki.write_pem(state_dir / SECRET_FILE, base64.b64decode(answer.secret), private=True)
    for path in (ca_cert, ca_key, state_dir / SECRET_FILE):
        _own(path, owner)


def _own(path: Path, owner: tuple[int, int]) -> None:
    if os.geteuid() == 0:
        os.chown(path, *owner)


def write_member(
    config_path: Path, state_dir: Path, name: str, ip: str, members: list[wire.EtcdMember]
) -> None:
    """This host's etcd certificates and its member's config: it joins the running cluster."""
    etcd_member.ensure_certs(state_dir / "pki", name, ip)
    initial = {m.name: m.peer_urls[0] for m in members if m.name and m.peer_urls}
    etcd_member.write_member_config(
        config_path, name=name, advertise_ip=ip, initial_cluster=initial, state="existing",
        state_dir=state_dir,
    )  # fmt: skip


async def wait_voter(cfg: ServerConfig, timeout_s: float) -> bool:
    """Whether this host's member is a voter (promoted by the control planes once caught up)
    within timeout_s; a learner answers only its status."""
    client = EtcdHttp(cfg.store.endpoint, member_tls(cfg, Path(cfg.state_dir)))
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            try:
                status = await client.call("/v3/maintenance/status", {})
                if not status.get("isLearner"):
                    return True
            except EtcdError:
                pass  # not up yet
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.5)
    finally:
        await client.close()
