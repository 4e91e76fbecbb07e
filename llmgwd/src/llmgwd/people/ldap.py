"""A person's groups read from the site's LDAP directory (ldap3, in a thread) and mapped to
memberships by oidc.rules as OIDC's and SCIM's groups are (source ldap: a role set by hand is
never rewritten), only when the entry's mail is the user's email; read at each sign-in and
every ldap.refresh_s; a directory that cannot be reached keeps what was known, and says so once
until it answers again."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

import ldap3
from ldap3.core.exceptions import LDAPException
from ldap3.utils.conv import escape_filter_chars

from llmgw.config import Ldap, Oidc
from llmgwd.people.directory import Directory
from llmgwd.people.records import User
from llmgwd.people.signin import SignIn
from llmgwd.store import Store

log = logging.getLogger("llmgwd.ldap")

DN_ATTRIBUTES = ("member", "uniquemember")  # these hold a member's DN; any other their name
MAIL = "mail"  # the entry's addresses: one must be the user's email for its groups to count
LEAD_CHECK_S = 5.0  # how often a control plane that does not lead looks whether it leads now
BACKOFF_S = 60.0  # after a failed read, sign-ins read no more for this long (the timer still does)
THREADS = 4  # LDAP's own threads: a hung directory holds these, not the loop's (DNS's)


class Unreachable(Exception):
    """The directory could not be asked (its message carries no password)."""


class NotTheirs(Exception):
    """The entry found is not the user's: its mail is not their (verified) email."""


class Reader:
    """Reads one person's groups from the directory, blocking: run it in a thread."""

    def __init__(self, settings: Ldap) -> None:
        self._s = settings
        url = urlsplit(settings.url)
        tls = ldap3.Tls(validate=ssl.CERT_REQUIRED, ca_certs_file=settings.ca_file or None)
        secure = url.scheme == "ldaps" or settings.start_tls
        self._server = ldap3.Server(
            url.hostname or "",
            port=url.port,
            use_ssl=url.scheme == "ldaps",
            tls=tls if secure else None,
            connect_timeout=settings.timeout_s,
            get_info=ldap3.NONE,
        )
        self._start_tls = url.scheme == "ldap" and settings.start_tls

    def _connect(self) -> ldap3.Connection:
        s = self._s
        password = Path(s.bind_password_file).read_text().strip() if s.bind_dn else None
        conn = ldap3.Connection(
            self._server,
            user=s.bind_dn or None,
            password=password,
            receive_timeout=int(s.timeout_s) or 1,
            raise_exceptions=True,
            read_only=True,
        )
        try:
            conn.open()
            if self._start_tls:
                conn.start_tls()
            conn.bind()
        except BaseException:
            with contextlib.suppress(LDAPException, OSError):  # the first failure is the one
                conn.unbind()
            raise
        return conn

    def groups(self, name: str, email: str) -> set[str]:
        """The names of the groups of the person user_filter finds by name or email: none when
        the directory does not know them; NotTheirs when their entry's mail is not email (or
        they have none); Unreachable when it cannot be asked."""
        s = self._s
        if not email:
            raise NotTheirs("no email to match the directory's entry with")
        try:
            conn = self._connect()
        except (LDAPException, OSError) as e:
            raise Unreachable(f"{s.url}: {type(e).__name__}: {e}") from None
        try:
            wanted = s.user_filter.replace("{name}", escape_filter_chars(name))
            wanted = wanted.replace("{email}", escape_filter_chars(email))
            conn.search(s.user_base, wanted, attributes=[MAIL])
            if len(conn.entries) != 1:
                return set()  # not in the directory (or not one person): in no group
            mails = conn.entries[0].entry_attributes_as_dict.get(MAIL, [])
            if email.casefold() not in {str(m).casefold() for m in mails}:
                raise NotTheirs(f"the entry {conn.entries[0].entry_dn} is not {email}'s")
            dn = str(conn.entries[0].entry_dn)
            attr = s.member_attribute
            value = dn if attr.lower() in DN_ATTRIBUTES else name
            wanted = f"(&{s.group_filter}({attr}={escape_filter_chars(value)}))"
            conn.search(s.group_base, wanted, attributes=[s.group_name_attribute])
            return {str(v) for e in conn.entries for v in e[s.group_name_attribute].values}
        except (LDAPException, OSError) as e:
            raise Unreachable(f"{s.url}: {type(e).__name__}: {e}") from None
        finally:
            conn.unbind()


class LdapGroups:
    """The directory's groups of each active user kept as their memberships (source ldap)."""

    def __init__(
        self, store: Store, settings: Ldap, oidc: Oidc, leading: Callable[[], bool] = lambda: True
    ) -> None:
        self._settings = settings
        self._leading = leading  # the timer's reads on the leader only (sign-ins: everywhere)
        self._reader = Reader(settings)
        self._people = Directory(store)
        self._signin = SignIn(store, Oidc(rules=oidc.rules))  # groups by oidc.rules
        self._down = False  # the directory failed last time (said once until it answers)
        self._refused: set[str] = set()  # users whose entry is not theirs (said once each)
        self._retry_at = 0.0  # the monotonic time before which sign-ins do not read
        self._threads = ThreadPoolExecutor(THREADS, thread_name_prefix="llmgwd-ldap")

    async def _groups(self, user: User) -> set[str]:
        """Reader.groups in LDAP's threads, the whole read bounded by twice timeout_s."""
        s = self._settings
        loop = asyncio.get_running_loop()
        read = loop.run_in_executor(self._threads, self._reader.groups, user.name, user.email)
        try:
            return await asyncio.wait_for(read, 2 * s.timeout_s)
        except TimeoutError:
            raise Unreachable(f"{s.url}: no answer in {2 * s.timeout_s:g}s") from None

    async def refresh(self, user: User) -> bool:
        """user's memberships by the directory's groups now (none when the entry found is not
        theirs); False (what was known kept) when it cannot be reached."""
        try:
            groups = await self._groups(user)
        except NotTheirs as e:
            if user.id not in self._refused:
                log.warning("user %s gets no LDAP groups: %s", user.name, e)
            self._refused.add(user.id)
            groups = set()  # a name alone is no identity: whatever it held is taken away
        except Unreachable as e:
            if not self._down:
                log.warning("the LDAP directory cannot be reached; memberships kept: %s", e)
            self._down = True
            self._retry_at = time.monotonic() + BACKOFF_S
            return False
        else:
            self._refused.discard(user.id)
            if self._down:
                log.info("the LDAP directory answers again")
            self._down = False
        await self._signin.apply_groups(user, groups, "ldap")
        return True

    async def signed_in(self, user: User) -> None:
        """At a sign-in (SignIn's after): the directory's groups read again, unless a read
        failed less than BACKOFF_S ago (what was known kept: no sign-in waits on a dead one)."""
        if self._down and time.monotonic() < self._retry_at:
            return
        await self.refresh(user)

    async def refresh_all(self) -> None:
        """Every active, approved user's memberships by the directory (one waiting for staff's
        approval gets none yet); stops at the first failure."""
        for user in await self._people.users():
            if user.active and user.approved and not await self.refresh(user):
                return

    async def run(self) -> None:
        """refresh_all at once, then every refresh_s, while this control plane leads."""
        due = 0.0
        while True:
            if self._leading() and time.monotonic() >= due:
                due = time.monotonic() + self._settings.refresh_s
                try:
                    await self.refresh_all()
                except Exception:  # the store, say: tried again next time
                    log.exception("reading the LDAP directory's groups failed")
            await asyncio.sleep(min(self._settings.refresh_s, LEAD_CHECK_S))
