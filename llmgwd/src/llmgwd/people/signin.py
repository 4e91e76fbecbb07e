"""A verified OIDC sign-in applied to the people: the user found (by the provider's subject,
or a provisioned user's external id: people.links) or made (source oidc), the allowed groups
checked, and the group rules turned into memberships (set by the group; a role set by hand is
never rewritten, one of a group left is removed)."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any

from llmgw.config import GroupRule, Oidc
from llmgwd.people.directory import Directory
from llmgwd.people.links import Links, subject_link
from llmgwd.people.oidc import SignInError
from llmgwd.people.records import MEMBER_ROLES, GroupSource, MemberRole, Scope, User
from llmgwd.people.rules import NAME_RE, PeopleError, rank
from llmgwd.store import Store

# A group rule's role as a MemberRole: config.GroupRule allows these names only.
ROLE_OF: dict[str, MemberRole] = {role: role for role in MEMBER_ROLES}


def groups_of(claims: dict[str, Any], claim: str) -> set[str]:
    """The groups a token's claim lists (a list of names, or one name)."""
    value = claims.get(claim, [])
    items = [value] if isinstance(value, str) else value if isinstance(value, list) else []
    return {str(g) for g in items}


def login_name(claims: dict[str, Any]) -> str:
    """The name a new user is given: preferred_username, else the email's local part, else
    the subject, made a valid name."""
    raw = claims.get("preferred_username") or str(claims.get("email", "")).partition("@")[0]
    name = re.sub(r"[^a-z0-9._-]", "-", str(raw or claims["sub"]).lower()).lstrip("._-")[:64]
    if not NAME_RE.fullmatch(name):
        raise SignInError(403, "no_usable_name", "the provider gave no name usable here")
    return name


def _scope(rule: GroupRule) -> Scope:
    if rule.team:
        return Scope(org=rule.org, kind="team", name=rule.team)
    if rule.project:
        return Scope(org=rule.org, kind="project", name=rule.project)
    return Scope(org=rule.org)


class SignIn:
    """Sign-ins against the directory, by the settings' allowed groups and rules."""

    def __init__(
        self, store: Store, settings: Oidc, after: Callable[[User], Awaitable[None]] | None = None
    ) -> None:
        self._store = store
        self._people = Directory(store)
        self._links = Links(store, self._people)
        self._settings = settings
        self._after = after  # run at each sign-in, once the token's groups are applied (LDAP's)

    async def user_for(self, claims: dict[str, Any]) -> User:
        """The user of the token's subject: found (by its link, else as the provisioned user
        with its external id), or made (source oidc) on first sign-in."""
        groups = groups_of(claims, self._settings.groups_claim)
        allowed = self._settings.allowed_groups
        if allowed and not groups & set(allowed):
            raise SignInError(
                403, "not_in_allowed_groups", "you are in none of the groups allowed to sign in"
            )
        link = subject_link(self._settings.issuer, str(claims["sub"]))
        user = await self._links.linked(link)
        if user is None:
            found = await self._links.provisioned(claims, self._settings.link_claim)
            user = await (self._links.link(link, found) if found else self._make(claims, link))
        if not user.active:
            raise SignInError(403, "user_deactivated", f"user {user.name} is deactivated")
        if not user.approved:
            raise SignInError(
                403, "waiting_for_approval",
                f"your account {user.name} waits for staff's approval; sign in again once "
                "they have approved it",
            )  # fmt: skip
        email = str(claims.get("email", "")) if claims.get("email_verified") is not False else ""
        if email and email != user.email:  # one the provider says it has not verified: not kept
            user = await self._people.change_user(user.id, email=email)
        await self.apply_groups(user, groups)
        if self._after is not None:
            await self._after(user)
        return user

    async def _make(self, claims: dict[str, Any], link: str) -> User:
        """A new user of source oidc, linked to the sign-in; waiting for approval when the
        settings ask for it."""
        name = login_name(claims)
        try:
            approved = not self._settings.approval_required
            user = await self._people.create_user(name, source="oidc", approved=approved)
        except PeopleError:
            raise SignInError(
                409, "name_taken",
                f"a user named {name} exists and is not this sign-in's (staff can link them: "
                f"their external_id set to this sign-in's {self._settings.link_claim or 'sub'})",
            ) from None  # fmt: skip
        return await self._links.link(link, user)

    async def apply_groups(
        self, user: User, groups: set[str], source: GroupSource = "oidc"
    ) -> None:
        """Each rule's membership for a group held; one this source's groups set, of a group
        left, removed (OIDC's, SCIM's and LDAP's groups each add and remove only their own)."""
        held: dict[tuple[str, str, str], MemberRole] = {}
        # the strongest rule for a place last, so that it is the one kept
        for rule in sorted(self._settings.rules, key=lambda r: rank(ROLE_OF[r.role])):
            if rule.group in groups:
                scope = _scope(rule)
                role = ROLE_OF[rule.role]
                try:
                    await self._people.set_member(
                        "", user.id, scope, role, "group", rule.group, source
                    )
                except PeopleError:
                    continue  # its organization, team or project does not exist (yet)
                held[(scope.org, scope.kind, scope.name)] = role
        for org in {r.org for r in self._settings.rules}:
            for m in await self._people.members(org):
                place = (m.scope.org, m.scope.kind, m.scope.name)
                if m.user == user.id and m.set_by == "group" and place not in held:
                    await self._people.remove_member("", user.id, m.scope, "group", source)
