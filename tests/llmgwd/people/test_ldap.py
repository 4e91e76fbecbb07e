"""Groups read from a real LDAP directory (Debian's slapd, a plain process on a private port,
reached by StartTLS) become memberships by oidc.rules, at sign-in and on a timer; a role set by
hand is kept; a directory that cannot be reached keeps what was known and says so once."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from llmgw import pki
from llmgw.config import ClientPort, ClusterPort, GroupRule, Ldap, Oidc, ServerConfig
from llmgwd.daemon import Daemon
from llmgwd.people import ldap
from llmgwd.people.directory import Directory
from llmgwd.people.ldap import LdapGroups
from llmgwd.people.records import Scope
from llmgwd.people.signin import SignIn
from llmgwd.store.sqlite import SqliteStore
from tests.llmgwd.people import slapd

pytestmark = pytest.mark.skipif(not slapd.SLAPD, reason="slapd is not installed (Debian's slapd)")

RULES = (
    GroupRule(group="ml", org="acme", role="member"),
    GroupRule(group="ml-leads", org="acme", role="manager"),
    GroupRule(group="chat", org="acme", project="chat", role="member"),
)
ACME = Scope(org="acme")


@pytest.fixture
def directory(tmp_path: Path) -> Iterator[slapd.Slapd]:
    server = slapd.start(tmp_path)
    yield server
    server.stop()


def settings(server: slapd.Slapd, tmp_path: Path, **changes: Any) -> Ldap:
    """The directory by StartTLS, bound as its admin with the password in a file."""
    password = tmp_path / "bind-password"
    password.write_text(slapd.PASSWORD + "\n")
    fields: dict[str, Any] = {
        "url": f"ldap://localhost:{server.port}",
        "ca_file": str(server.dir / "ca.pem"),
        "bind_dn": slapd.ADMIN,
        "bind_password_file": str(password),
        "user_base": slapd.PEOPLE,
        "group_base": slapd.GROUPS,
        "timeout_s": 3.0,
    }
    return Ldap(**{**fields, **changes})


@pytest.fixture
async def people() -> AsyncIterator[tuple[SqliteStore, Directory]]:
    store = await SqliteStore.open(":memory:")
    people = Directory(store)
    await people.create_org("acme")
    await people.create_project("acme", "chat")
    yield store, people
    await store.close()


async def test_the_directorys_groups_become_memberships_and_go_with_them(
    directory: slapd.Slapd, tmp_path: Path, people: tuple[SqliteStore, Directory]
) -> None:
    store, d = people
    ada = await d.create_user("ada", "ada@acme.example")
    directory.add_person("ada")
    directory.set_group("ml", "ada")
    directory.set_group("chat", "ada")
    groups = LdapGroups(store, settings(directory, tmp_path), Oidc(rules=RULES))
    assert await groups.refresh(ada)
    held = {(m.scope.kind, m.role, m.set_by) for m in await d.members("acme")}
    assert held == {("org", "member", "group"), ("project", "member", "group")}
    directory.set_group("ml-leads", "ada")
    directory.set_group("chat")  # she left chat
    await groups.refresh(ada)
    (m,) = await d.members("acme")
    assert (m.scope, m.role, dict(m.sources)) == (ACME, "manager", {"ldap": "manager"})
    directory.set_group("ml")
    directory.set_group("ml-leads")
    await groups.refresh(ada)
    assert await d.members("acme") == []


async def test_memberuid_groups_and_a_plain_loopback_directory(
    directory: slapd.Slapd, tmp_path: Path, people: tuple[SqliteStore, Directory]
) -> None:
    store, d = people
    ada = await d.create_user("ada", "ada@acme.example")
    directory.add_person("ada")
    posix = {"cn": "ml", "gidNumber": 5000, "memberUid": ["ada"]}
    directory.add(f"cn=ml,{slapd.GROUPS}", ["posixGroup"], posix)
    posix_groups = {"group_filter": "(objectClass=posixGroup)", "member_attribute": "memberUid"}
    plain = settings(directory, tmp_path, url=directory.url, start_tls=False, **posix_groups)
    assert await LdapGroups(store, plain, Oidc(rules=RULES)).refresh(ada)
    assert await d.role_in(ada.id, "acme") == "member"


async def test_a_role_set_by_hand_is_not_rewritten(
    directory: slapd.Slapd, tmp_path: Path, people: tuple[SqliteStore, Directory]
) -> None:
    store, d = people
    ada = await d.create_user("ada", "ada@acme.example")
    await d.set_member("", ada.id, ACME, "admin")
    directory.add_person("ada")
    directory.set_group("ml", "ada")
    groups = LdapGroups(store, settings(directory, tmp_path), Oidc(rules=RULES))
    await groups.refresh(ada)
    directory.set_group("ml")
    await groups.refresh(ada)
    (m,) = await d.members("acme")
    assert (m.role, m.set_by) == ("admin", "hand")


async def test_an_unreachable_directory_keeps_what_was_known_and_says_so_once(
    directory: slapd.Slapd,
    tmp_path: Path,
    people: tuple[SqliteStore, Directory],
    caplog: pytest.LogCaptureFixture,
) -> None:
    store, d = people
    ada = await d.create_user("ada", "ada@acme.example")
    directory.add_person("ada")
    directory.set_group("ml-leads", "ada")
    groups = LdapGroups(store, settings(directory, tmp_path), Oidc(rules=RULES))
    await groups.refresh(ada)
    directory.stop()
    caplog.set_level(logging.INFO, logger="llmgwd.ldap")
    assert not await groups.refresh(ada)
    await groups.refresh_all()
    assert await d.role_in(ada.id, "acme") == "manager"
    said = [r.getMessage() for r in caplog.records if r.name == "llmgwd.ldap"]
    assert len(said) == 1 and "cannot be reached" in said[0]
    assert slapd.PASSWORD not in caplog.text


@pytest.fixture
def hung() -> Iterator[str]:
    """An ldap:// URL whose listener takes connections and never answers."""
    with socket.create_server(("127.0.0.1", 0), backlog=64) as listener:
        yield f"ldap://127.0.0.1:{listener.getsockname()[1]}"


def hung_settings(url: str) -> Ldap:
    return Ldap(url=url, start_tls=False, user_base="o=x", group_base="o=x", timeout_s=1.0)


async def test_a_hung_directory_holds_up_one_sign_in_not_the_next(
    hung: str, people: tuple[SqliteStore, Directory]
) -> None:
    store, d = people
    oidc = Oidc(issuer="https://idp.example", client_id="llmgw", rules=RULES)
    signin = SignIn(store, oidc, after=LdapGroups(store, hung_settings(hung), oidc).signed_in)
    claims = {"sub": "s-ada", "preferred_username": "ada", "email": "ada@acme.example",
              "groups": ["ml"]}  # fmt: skip
    waited = []
    for _ in range(2):
        start = time.monotonic()
        ada = await signin.user_for(claims)
        waited.append(time.monotonic() - start)
    assert 0.5 < waited[0] < 3.0  # the first waits for the directory, at most 2 x timeout_s
    assert waited[1] < 0.3  # the next, within the back-off, does not
    assert await d.role_in(ada.id, "acme") == "member"  # the token's groups hold


async def test_reads_of_a_hung_directory_leave_name_lookups_their_threads(
    hung: str, people: tuple[SqliteStore, Directory]
) -> None:
    store, d = people
    more_than_the_loops = min(32, (os.cpu_count() or 1) + 4) + 1  # its default executor's
    users = [await d.create_user(f"u{i}", f"u{i}@acme.example") for i in range(more_than_the_loops)]
    groups = LdapGroups(store, hung_settings(hung), Oidc(rules=RULES))
    reads = [asyncio.create_task(groups.refresh(u)) for u in users]
    await asyncio.sleep(0.1)
    start = time.monotonic()
    await asyncio.get_running_loop().getaddrinfo("localhost", 80)
    assert time.monotonic() - start < 0.5  # not queued behind the directory's reads
    assert not any(await asyncio.gather(*reads))


async def test_a_wrong_password_is_not_logged_and_changes_nothing(
    directory: slapd.Slapd,
    tmp_path: Path,
    people: tuple[SqliteStore, Directory],
    caplog: pytest.LogCaptureFixture,
) -> None:
    store, d = people
    ada = await d.create_user("ada", "ada@acme.example")
    await d.set_member("", ada.id, ACME, "member")
    directory.add_person("ada")
    wrong = tmp_path / "wrong"
    wrong.write_text("not-the-password-XYZ")
    groups = LdapGroups(store, settings(directory, tmp_path, bind_password_file=str(wrong)),
                        Oidc(rules=RULES))  # fmt: skip
    with caplog.at_level(logging.INFO, logger="llmgwd.ldap"):
        assert not await groups.refresh(ada)
    assert "not-the-password-XYZ" not in caplog.text and "cannot be reached" in caplog.text
    assert await d.role_in(ada.id, "acme") == "member"


async def test_a_directory_whose_certificate_does_not_check_is_not_believed(
    directory: slapd.Slapd,
    tmp_path: Path,
    people: tuple[SqliteStore, Directory],
    caplog: pytest.LogCaptureFixture,
) -> None:
    store, d = people
    ada = await d.create_user("ada", "ada@acme.example")
    directory.add_person("ada")
    directory.set_group("ml", "ada")
    other = tmp_path / "other-ca.pem"
    other.write_bytes(pki.make_ca("another").cert_pem)
    another_ca = settings(directory, tmp_path, ca_file=str(other))
    not_its_name = settings(directory, tmp_path, url=f"ldap://127.0.0.2:{directory.port}")
    for wrong in (another_ca, not_its_name):  # its certificate names localhost and 127.0.0.1
        with caplog.at_level(logging.WARNING, logger="llmgwd.ldap"):
            assert not await LdapGroups(store, wrong, Oidc(rules=RULES)).refresh(ada)
        assert "certificate" in caplog.text
        caplog.clear()
    assert await d.members("acme") == []


async def test_a_sign_in_and_the_timer_read_the_directory(
    directory: slapd.Slapd, tmp_path: Path, people: tuple[SqliteStore, Directory]
) -> None:
    store, d = people
    directory.add_person("ada")
    directory.set_group("ml", "ada")
    oidc = Oidc(issuer="https://idp.example", client_id="llmgw", rules=RULES)
    groups = LdapGroups(store, settings(directory, tmp_path, refresh_s=1), oidc)
    signin = SignIn(store, oidc, after=groups.signed_in)
    ada = await signin.user_for(
        {"sub": "s-ada", "preferred_username": "ada", "email": "ada@acme.example"}
    )
    assert await d.role_in(ada.id, "acme") == "member"  # the directory's, at sign-in
    timer = asyncio.create_task(groups.run())
    try:
        directory.set_group("ml-leads", "ada")
        for _ in range(100):
            if await d.role_in(ada.id, "acme") == "manager":
                break
            await asyncio.sleep(0.1)
        assert await d.role_in(ada.id, "acme") == "manager"  # the timer's
    finally:
        timer.cancel()


async def test_a_guest_named_as_a_directory_person_gets_none_of_their_groups(
    directory: slapd.Slapd,
    tmp_path: Path,
    people: tuple[SqliteStore, Directory],
    caplog: pytest.LogCaptureFixture,
) -> None:
    store, d = people
    directory.add_person("alice")  # alice@acme.example, a manager
    directory.set_group("ml-leads", "alice")
    oidc = Oidc(issuer="https://idp.example", client_id="llmgw", rules=RULES)
    groups = LdapGroups(store, settings(directory, tmp_path), oidc)
    signin = SignIn(store, oidc, after=groups.signed_in)
    with caplog.at_level(logging.WARNING, logger="llmgwd.ldap"):
        guest = await signin.user_for({"sub": "s-guest", "email": "alice@gmail.com"})
        await signin.user_for({"sub": "s-guest", "email": "alice@gmail.com"})
    assert guest.name == "alice"  # the name from the email's local part
    assert await d.role_in(guest.id, "acme") is None
    said = [r.getMessage() for r in caplog.records if r.name == "llmgwd.ldap"]
    assert len(said) == 1 and "alice gets no LDAP groups" in said[0]  # once
    unverified = {"sub": "s-guest", "email": "alice@acme.example", "email_verified": False}
    await signin.user_for(unverified)  # an address the provider has not verified is not hers
    assert await d.role_in(guest.id, "acme") is None


async def test_the_entry_found_by_the_verified_email_gives_its_groups(
    directory: slapd.Slapd, tmp_path: Path, people: tuple[SqliteStore, Directory]
) -> None:
    store, d = people
    directory.add_person("alice")
    directory.set_group("ml", "alice")
    oidc = Oidc(issuer="https://idp.example", client_id="llmgw", rules=RULES)
    by_mail = settings(directory, tmp_path, user_filter="(mail={email})")
    signin = SignIn(store, oidc, after=LdapGroups(store, by_mail, oidc).signed_in)
    claims = {"sub": "s-a", "preferred_username": "a.smith", "email": "Alice@acme.example",
              "email_verified": True}  # fmt: skip
    alice = await signin.user_for(claims)
    assert (alice.name, await d.role_in(alice.id, "acme")) == ("a.smith", "member")


async def test_the_timer_gives_no_membership_to_a_user_waiting_for_approval(
    directory: slapd.Slapd, tmp_path: Path, people: tuple[SqliteStore, Directory]
) -> None:
    store, d = people
    ada = await d.create_user("ada", "ada@acme.example")
    bob = await d.create_user("bob", "bob@acme.example", approved=False)
    for name in ("ada", "bob"):
        directory.add_person(name)
    directory.set_group("ml", "ada", "bob")
    await LdapGroups(store, settings(directory, tmp_path), Oidc(rules=RULES)).refresh_all()
    assert await d.role_in(ada.id, "acme") == "member"
    assert await d.role_in(bob.id, "acme") is None  # staff have not approved him yet


async def test_only_the_leading_control_plane_reads_the_directory_on_its_timer(
    directory: slapd.Slapd,
    tmp_path: Path,
    people: tuple[SqliteStore, Directory],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store, d = people
    monkeypatch.setattr(ldap, "LEAD_CHECK_S", 0.1)
    ada = await d.create_user("ada", "ada@acme.example")
    directory.add_person("ada")
    directory.set_group("ml", "ada")
    leads = False
    groups = LdapGroups(store, settings(directory, tmp_path, refresh_s=600), Oidc(rules=RULES),
                        leading=lambda: leads)  # fmt: skip
    timer = asyncio.create_task(groups.run())
    try:
        await asyncio.sleep(1.0)
        assert await d.members("acme") == []  # a standby: the leader reads it
        leads = True  # it leads now: it reads at once, not after refresh_s
        for _ in range(50):
            if await d.role_in(ada.id, "acme") == "member":
                break
            await asyncio.sleep(0.1)
        assert await d.role_in(ada.id, "acme") == "member"
    finally:
        timer.cancel()


async def test_llmgwd_keeps_the_directorys_groups_on_its_timer(
    directory: slapd.Slapd, tmp_path: Path
) -> None:
    cluster = ClusterPort(listen="127.0.0.1:0", advertise="https://127.0.0.1:17710")
    config = ServerConfig(
        state_dir=str(tmp_path / "state"), socket=str(tmp_path / "sock"),
        client=ClientPort(listen="127.0.0.1:0"), cluster=cluster, oidc=Oidc(rules=RULES),
        ldap=settings(directory, tmp_path, refresh_s=1),
    )  # fmt: skip
    daemon = Daemon(config)
    await daemon.start()
    try:
        people = Directory(daemon.store)
        await people.create_org("acme")
        ada = await people.create_user("ada", "ada@acme.example")
        directory.add_person("ada")
        directory.set_group("ml-leads", "ada")
        for _ in range(100):
            if await people.role_in(ada.id, "acme") == "manager":
                break
            await asyncio.sleep(0.1)
        assert await people.role_in(ada.id, "acme") == "manager"
        local = aiohttp.UnixConnector(config.socket)
        async with (
            aiohttp.ClientSession(connector=local) as http,
            http.get("http://llmgwd/api/v1/orgs/acme/members") as r,
        ):
            assert r.status == 200, await r.text()
            (shown,) = await r.json()  # as `llmgw org members acme` shows it
        assert (shown["role"], shown["sources"]) == ("manager", {"ldap": "manager"})
    finally:
        await daemon.stop()


def test_a_plain_directory_is_refused_off_the_loopback() -> None:
    with pytest.raises(ValueError, match="start_tls"):
        Ldap(url="ldap://ldap.example.org", start_tls=False, user_base="o=x", group_base="o=x")
    with pytest.raises(ValueError, match="ldaps"):
        Ldap(url="https://ldap.example.org", user_base="o=x", group_base="o=x")
    with pytest.raises(ValueError, match="user_filter"):
        Ldap(url="ldaps://ldap.example.org", user_base="o=x", group_base="o=x", user_filter="(x=1)")
