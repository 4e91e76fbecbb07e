"""People kept in the store (SQLite or etcd, through the Store Protocol), every change a
compare-and-set so that two at once are both kept or one is refused, never lost."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from typing import Any, TypeVar

import msgspec

from llmgwd.accounting import level_keys as lv
from llmgwd.people import rules
from llmgwd.people.records import (
    GroupSource,
    MemberRole,
    Membership,
    Org,
    Project,
    Scope,
    SetBy,
    Source,
    Staff,
    StaffRole,
    Team,
    User,
)
from llmgwd.people.rules import PeopleError, check_name
from llmgwd.store import KV, Compare, Delete, Get, Put, Store, prefix_end

ROOT = "/people/"
USERS = ROOT + "users/"  # + id
LOGINS = ROOT + "logins/"  # + a user's name: their id (names are unique)
ORGS = ROOT + "orgs/"  # + org
TEAMS = ROOT + "teams/"  # + org/team
PROJECTS = ROOT + "projects/"  # + org/project
MEMBERS = ROOT + "members/"  # + org/kind/name-or-"-"/user
STAFF = ROOT + "staff/"  # + user
OIDC_LINKS = ROOT + "oidc/"  # + sha256(issuer, subject): the user's id (people.links)
OIDC_LINKED = ROOT + "oidc-linked/"  # + a user's id: their link's key (one sign-in a user)
SCIM_USERS = ROOT + "scim/users/"  # + a user's id: SCIM's attributes beside it (llmgwd.scim)

R = TypeVar("R", bound=msgspec.Struct)
_enc = msgspec.json.Encoder()


def _dec(kind: type[R], kv: KV) -> R:
    return msgspec.json.decode(kv.value, type=kind)


def scope_key(scope: Scope) -> str:
    """The record a scope names (its organization, team or project)."""
    if scope.kind == "org":
        return ORGS + scope.org
    return (TEAMS if scope.kind == "team" else PROJECTS) + f"{scope.org}/{scope.name}"


def member_key(scope: Scope, user: str) -> str:
    """Where a user's membership in scope is kept."""
    return MEMBERS + f"{scope.org}/{scope.kind}/{scope.name or '-'}/{user}"


def _missing(what: str, name: str) -> PeopleError:
    return PeopleError("not_found", f"no {what} {name!r}")


def _exists(key: str) -> Compare:
    return Compare(key, "version", ">", 0)


def _absent(key: str) -> Compare:
    return Compare(key, "version", "=", 0)


def _unchanged(key: str, kv: KV | None) -> Compare:
    return Compare(key, "mod", "=", kv.mod_revision) if kv is not None else _absent(key)


class Directory:
    """Users, organizations, teams, projects, memberships and staff roles; read from the store
    each time (changes are rare; the request path reads a few keys by name)."""

    def __init__(self, store: Store) -> None:
        self._store = store

    async def _list(self, kind: type[R], prefix: str) -> list[R]:
        kvs, _ = await self._store.range(prefix, prefix_end(prefix))
        return [_dec(kind, kv) for kv in kvs]

    async def _get(self, kind: type[R], key: str) -> R | None:
        kv = await self._store.get(key)
        return _dec(kind, kv) if kv is not None else None

    async def _create(self, key: str, record: msgspec.Struct, *guards: Compare) -> bool:
        """Put record at key if key is new and every guard holds."""
        res = await self._store.txn([_absent(key), *guards], [Put(key, _enc.encode(record))])
        return res.succeeded

    async def _change(self, kind: type[R], key: str, change: Callable[[R], R], what: str) -> R:
        """Apply change to the record at key with compare-and-set, again until it holds."""
        while True:
            kv = await self._store.get(key)
            if kv is None:
                raise _missing(what, key.rsplit("/", 1)[-1])
            new = change(_dec(kind, kv))
            res = await self._store.txn([_unchanged(key, kv)], [Put(key, _enc.encode(new))])
            if res.succeeded:
                return new

    # Users

    async def create_user(
        self,
        name: str,
        email: str = "",
        source: Source = "staff",
        external_id: str = "",
        approved: bool = True,
    ) -> User:
        """A new user (approved False: waiting for staff's approval); a name taken is a
        conflict."""
        user = User(
            id=secrets.token_hex(6),
            name=check_name("name", name),
            email=rules.check_email(email),
            source=source,
            created_at=time.time(),
            external_id=rules.check_external_id(external_id),
            approved=approved,
        )
        login = Put(LOGINS + name, user.id.encode())
        res = await self._store.txn(
            [_absent(LOGINS + name), _absent(USERS + user.id)],
            [Put(USERS + user.id, _enc.encode(user)), login],
        )
        if not res.succeeded:
            raise PeopleError("conflict", f"a user named {name!r} exists", "name")
        return user

    async def user(self, ident: str) -> User | None:
        """A user by id, else by name."""
        found = await self._get(User, USERS + ident)
        if found is not None:
            return found
        kv = await self._store.get(LOGINS + ident) if rules.NAME_RE.fullmatch(ident) else None
        return await self._get(User, USERS + kv.value.decode()) if kv is not None else None

    async def users(self) -> list[User]:
        """Every user, by id."""
        return await self._list(User, USERS)

    async def change_user(self, user_id: str, **changes: Any) -> User:
        """Change a user's email, external id, active or approved flag; concurrent changes
        are each kept."""
        if "email" in changes:
            rules.check_email(str(changes["email"]))
        if "external_id" in changes:
            rules.check_external_id(str(changes["external_id"]))
        return await self._change(
            User, USERS + user_id, lambda u: msgspec.structs.replace(u, **changes), "user"
        )

    async def delete_user(self, user_id: str) -> User:
        """A user gone with their name, memberships, staff role, limits, sign-in links and
        SCIM attributes, at once (their keys are the catalog's: the caller revokes them)."""
        while True:
            kv = await self._store.get(USERS + user_id)
            if kv is None:
                raise _missing("user", user_id)
            user = _dec(User, kv)
            members, _ = await self._store.range(MEMBERS, prefix_end(MEMBERS))
            links, _ = await self._store.range(OIDC_LINKS, prefix_end(OIDC_LINKS))
            ops: list[Put | Delete | Get] = [
                Delete(kv.key),
                Delete(LOGINS + user.name),
                Delete(STAFF + user_id),
                Delete(SCIM_USERS + user_id),
                Delete(OIDC_LINKED + user_id),
                Delete(lv.LEVELS + lv.user_level(user_id)),
                *[Delete(m.key) for m in members if _dec(Membership, m).user == user_id],
                *[Delete(link.key) for link in links if link.value.decode() == user_id],
            ]
            if (await self._store.txn([_unchanged(kv.key, kv)], ops)).succeeded:
                return user

    async def rename_user(self, user_id: str, name: str) -> User:
        """Give a user a new unique name (SCIM's userName); a name taken is a conflict."""
        check_name("name", name)
        while True:
            kv = await self._store.get(USERS + user_id)
            if kv is None:
                raise _missing("user", user_id)
            old = _dec(User, kv)
            if old.name == name:
                return old
            new = msgspec.structs.replace(old, name=name)
            guards = [_unchanged(kv.key, kv), _absent(LOGINS + name)]
            ops: list[Put | Delete | Get] = [
                Put(kv.key, _enc.encode(new)),
                Delete(LOGINS + old.name),
                Put(LOGINS + name, user_id.encode()),
            ]
            if (await self._store.txn(guards, ops)).succeeded:
                return new
            if await self._store.get(LOGINS + name) is not None:
                raise PeopleError("conflict", f"a user named {name!r} exists", "name")

    # Organizations, teams, projects

    async def create_org(self, name: str, title: str = "") -> Org:
        """A new organization."""
        org = Org(
            name=check_name("name", name), title=rules.check_title(title), created_at=time.time()
        )
        if not await self._create(ORGS + name, org):
            raise PeopleError("conflict", f"an organization named {name!r} exists", "name")
        return org

    async def org(self, name: str) -> Org | None:
        """An organization by name."""
        return await self._get(Org, ORGS + name)

    async def orgs(self) -> list[Org]:
        """Every organization, by name."""
        return await self._list(Org, ORGS)

    async def delete_org(self, name: str) -> None:
        """An organization gone, with its teams, projects, memberships and the limits and
        models of each (one made again with its name starts bare), at once."""
        ranges = [p + name + "/" for p in (TEAMS, PROJECTS, MEMBERS)] + list(lv.in_org(name))
        deletes = [Delete(p, prefix_end(p)) for p in ranges]
        ops: list[Put | Delete | Get] = [
            Delete(ORGS + name),
            Delete(lv.LEVELS + lv.org_level(name)),
            *deletes,
        ]
        res = await self._store.txn([_exists(ORGS + name)], ops)
        if not res.succeeded:
            raise _missing("organization", name)

    async def create_team(self, org: str, name: str, title: str = "") -> Team:
        """A new team in org."""
        team = Team(
            org=org,
            name=check_name("name", name),
            title=rules.check_title(title),
            created_at=time.time(),
        )
        if await self._create(TEAMS + f"{org}/{name}", team, _exists(ORGS + org)):
            return team
        if await self.org(org) is None:
            raise _missing("organization", org)
        raise PeopleError("conflict", f"{org} has a team named {name!r}", "name")

    async def teams(self, org: str) -> list[Team]:
        """An organization's teams, by name."""
        return await self._list(Team, TEAMS + org + "/")

    async def delete_team(self, org: str, name: str) -> None:
        """A team gone with its memberships, limits and models; refused while a project is in
        it (a project made in it meanwhile touches the team, so this compare catches it)."""
        key = TEAMS + f"{org}/{name}"
        while True:
            kv = await self._store.get(key)
            if kv is None:
                raise _missing("team", f"{org}/{name}")
            if any(p.team == name for p in await self.projects(org)):
                raise PeopleError(
                    "conflict", f"team {org}/{name} has projects: move or delete them first"
                )
            members = MEMBERS + f"{org}/team/{name}/"
            ops: list[Put | Delete | Get] = [
                Delete(key),
                Delete(members, prefix_end(members)),
                Delete(lv.LEVELS + lv.team_level(org, name)),
            ]
            if (await self._store.txn([_unchanged(key, kv)], ops)).succeeded:
                return

    async def create_project(self, org: str, name: str, team: str = "", title: str = "") -> Project:
        """A new project in org, in team if given (the team must exist, and stays while the
        project is in it: its record is touched in the same transaction)."""
        project = Project(
            org=org,
            name=check_name("name", name),
            team=team,
            title=rules.check_title(title),
            created_at=time.time(),
        )
        key = PROJECTS + f"{org}/{name}"
        while True:
            guards = [_exists(ORGS + org)]
            touch: list[Put | Delete | Get] = []
            if team:
                tkv = await self._store.get(TEAMS + f"{org}/{team}")
                if tkv is None:
                    raise _missing("team", f"{org}/{team}")
                guards.append(_unchanged(tkv.key, tkv))
                touch.append(Put(tkv.key, tkv.value))
            ops = [Put(key, _enc.encode(project)), *touch]
            if (await self._store.txn([_absent(key), *guards], ops)).succeeded:
                return project
            if await self.org(org) is None:
                raise _missing("organization", org)
            if await self._store.get(key) is not None:
                raise PeopleError("conflict", f"{org} has a project named {name!r}", "name")

    async def projects(self, org: str) -> list[Project]:
        """An organization's projects, by name."""
        return await self._list(Project, PROJECTS + org + "/")

    async def delete_project(self, org: str, name: str) -> None:
        """A project gone with its memberships, limits and models."""
        key, members = PROJECTS + f"{org}/{name}", MEMBERS + f"{org}/project/{name}/"
        ops: list[Put | Delete | Get] = [
            Delete(key),
            Delete(members, prefix_end(members)),
            Delete(lv.LEVELS + lv.project_level(org, name)),
        ]
        if not (await self._store.txn([_exists(key)], ops)).succeeded:
            raise _missing("project", f"{org}/{name}")

    # Memberships

    async def set_member(
        self,
        actor: str,
        user: str,
        scope: Scope,
        role: MemberRole,
        set_by: SetBy = "hand",
        group: str = "",
        source: GroupSource | None = None,
    ) -> Membership:
        """Give user role in scope, as actor (a user's id, "" for staff or a key), by hand or
        by a group of source (OIDC's, SCIM's: each keeps its own); returns what is kept: a
        group rule never rewrites a role set by hand."""
        if await self._get(User, USERS + user) is None:
            raise _missing("user", user)
        sources: dict[GroupSource, MemberRole] = {source: role} if source else {}
        want = Membership(user=user, scope=scope, role=role, set_by=set_by, group=group,
                          sources=sources, updated_at=time.time())  # fmt: skip
        key = member_key(scope, user)
        while True:
            kv = await self._store.get(key)
            old = _dec(Membership, kv) if kv is not None else None
            rules.check_not_own_admin(actor, old, role)
            new = rules.merged(old, want)
            if new is None:  # a role set by hand: kept
                return old or want
            guards = [_unchanged(key, kv), _exists(scope_key(scope))]
            if (await self._store.txn(guards, [Put(key, _enc.encode(new))])).succeeded:
                return new
            await self._scope_or_404(scope)

    async def remove_member(
        self,
        actor: str,
        user: str,
        scope: Scope,
        set_by: SetBy = "hand",
        source: GroupSource | None = None,
    ) -> bool:
        """Take user's membership in scope away (by a group of source: only what that source
        gave, the other's stays); False if there was none, or if a group rule would take away
        a role set by hand or by the other source (it stays)."""
        key = member_key(scope, user)
        while True:
            kv = await self._store.get(key)
            if kv is None:
                return False
            old = _dec(Membership, kv)
            rules.check_not_own_admin(actor, old, None)
            left = None
            if set_by == "group":
                if old.set_by == "hand" or (old.sources and source not in old.sources):
                    return False
                left = rules.without(old, source) if source else None
            op = Delete(key) if left is None else Put(key, _enc.encode(left))
            if (await self._store.txn([_unchanged(key, kv)], [op])).succeeded:
                return True

    async def _scope_or_404(self, scope: Scope) -> None:
        if await self._store.get(scope_key(scope)) is None:
            name = scope.org if scope.kind == "org" else f"{scope.org}/{scope.name}"
            raise _missing({"org": "organization"}.get(scope.kind, scope.kind), name)

    async def members(self, org: str) -> list[Membership]:
        """Every membership in an organization and its teams and projects."""
        return await self._list(Membership, MEMBERS + org + "/")

    async def orgs_of(self, user: str) -> set[str]:
        """The organizations user holds a membership in (of it, or a team or project of it)."""
        kvs, _ = await self._store.range(MEMBERS, prefix_end(MEMBERS))
        return {m.scope.org for m in (_dec(Membership, kv) for kv in kvs) if m.user == user}

    async def role_in(
        self, user: str, org: str, team: str = "", project: str = ""
    ) -> MemberRole | None:
        """user's strongest role over a path naming org (and a team or project of it): its
        organization role, or its role in that team or project."""
        scopes = [Scope(org=org)]
        scopes += [Scope(org=org, kind="team", name=team)] if team else []
        scopes += [Scope(org=org, kind="project", name=project)] if project else []
        roles = [await self._get(Membership, member_key(s, user)) for s in scopes]
        held = [m.role for m in roles if m is not None]
        return max(held, key=rules.rank) if held else None

    # Cluster staff

    async def set_staff(self, user: str, role: StaffRole | None) -> Staff | None:
        """Give user a staff role, or take it away (None)."""
        if await self._get(User, USERS + user) is None:
            raise _missing("user", user)
        if role is None:
            await self._store.delete(STAFF + user)
            return None
        staff = Staff(user=user, role=role, updated_at=time.time())
        await self._store.put(STAFF + user, _enc.encode(staff))
        return staff

    async def staff_role(self, user: str) -> StaffRole | None:
        """user's staff role, or None."""
        staff = await self._get(Staff, STAFF + user)
        return staff.role if staff is not None else None
