"""Which user an OIDC sign-in is: the one its subject is linked to; else the one user, made by
staff or provisioned by SCIM, whose external id equals the token's link claim (by default the
subject), linked then for good. Never by a name or an email, which a person may choose at some
providers: a sign-in must not take over someone else's account."""

from __future__ import annotations

import hashlib
import logging
from typing import Any

from llmgwd.people.directory import OIDC_LINKED, OIDC_LINKS, Directory
from llmgwd.people.oidc import SignInError
from llmgwd.people.records import User
from llmgwd.store import Compare, Delete, Get, Put, Store

log = logging.getLogger(__name__)


def subject_link(issuer: str, subject: str) -> str:
    """The store key that links the provider's subject to a user."""
    return OIDC_LINKS + hashlib.sha256(f"{issuer} {subject}".encode()).hexdigest()[:32]


class Links:
    """Sign-in links between a provider's subjects and users, one subject a user."""

    def __init__(self, store: Store, people: Directory) -> None:
        self._store = store
        self._people = people

    async def linked(self, link: str) -> User | None:
        """The user the link names, if any."""
        kv = await self._store.get(link)
        return await self._people.user(kv.value.decode()) if kv is not None else None

    async def provisioned(self, claims: dict[str, Any], claim: str) -> User | None:
        """The one user made by staff or SCIM whose external id is the token's claim; None
        where there is none (or no claim); two such users are refused, not guessed between."""
        value = claims.get(claim) if claim else None
        if not isinstance(value, str) or not value:
            return None
        found = [
            u for u in await self._people.users() if u.external_id == value and u.source != "oidc"
        ]
        if len(found) > 1:
            names = ", ".join(sorted(u.name for u in found))
            raise SignInError(
                409, "external_id_ambiguous",
                f"users {names} share this sign-in's external id; staff must keep it on one",
            )  # fmt: skip
        return found[0] if found else None

    async def link(self, link: str, user: User) -> User:
        """Link the subject to user, who must have no other link; the user linked to the
        subject is answered (another sign-in of the same subject at once may have won)."""
        mine = OIDC_LINKED + user.id
        guards = [Compare(link, "version", "=", 0), Compare(mine, "version", "=", 0)]
        ops: list[Put | Delete | Get] = [Put(link, user.id.encode()), Put(mine, link.encode())]
        if (await self._store.txn(guards, ops)).succeeded:
            log.info("sign-in linked to user %s (%s, made by %s)", user.id, user.name, user.source)
            return user
        now = await self.linked(link)
        if now is not None:
            return now
        raise SignInError(
            409, "user_linked", f"user {user.name} signs in as another person at the provider"
        )
