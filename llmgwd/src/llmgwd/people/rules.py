"""The people model's rules, without the store: names, role ranks, a group rule against a hand's
choice, and an organization admin who would take their own admin role away."""

from __future__ import annotations

import re
from typing import Literal

import msgspec

from llmgwd.people.records import MEMBER_ROLES, GroupSource, MemberRole, Membership

NAME_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")  # as a model's name: safe in a store key
EMAIL_RE = re.compile(r"[^@\s]{1,64}@[^@\s]{1,255}")
MAX_TITLE = 200
MAX_EXTERNAL_ID = 256

Kind = Literal["invalid", "not_found", "conflict", "forbidden"]


class PeopleError(Exception):
    """A change refused; the message is shown to the caller (it names no secret)."""

    def __init__(self, kind: Kind, message: str, param: str = "") -> None:
        super().__init__(message)
        self.kind = kind
        self.param = param


def check_name(param: str, value: str) -> str:
    """value if it is a valid name (1-64 of a-z 0-9 . _ -, a letter or digit first)."""
    if not NAME_RE.fullmatch(value):
        why = f"{param}: must be 1-64 of a-z 0-9 . _ - and start with a letter or digit"
        raise PeopleError("invalid", why, param)
    return value


def check_title(value: str) -> str:
    """A title shown to people: printable, at most MAX_TITLE characters."""
    if len(value) > MAX_TITLE or not value.isprintable():
        raise PeopleError(
            "invalid", f"title: must be at most {MAX_TITLE} printable characters", "title"
        )
    return value


def check_email(value: str) -> str:
    """An email address ("" for none), loosely checked: one @, no spaces."""
    if value and not EMAIL_RE.fullmatch(value):
        raise PeopleError("invalid", "email: must look like name@domain", "email")
    return value


def check_external_id(value: str) -> str:
    """An identity provider's id for a person ("" for none): printable, at most 256."""
    if len(value) > MAX_EXTERNAL_ID or not value.isprintable() or value != value.strip():
        why = f"external_id: must be at most {MAX_EXTERNAL_ID} printable characters, unpadded"
        raise PeopleError("invalid", why, "external_id")
    return value


def rank(role: MemberRole | None) -> int:
    """A membership role's strength: 0 for none, then member < manager < admin."""
    return 0 if role is None else MEMBER_ROLES.index(role) + 1


def merged(old: Membership | None, new: Membership) -> Membership | None:
    """What to store when new is set over old; None: keep old (a group rule never rewrites a
    role set by hand, so a manager stays a manager at every sign-in)."""
    if old is not None and old.set_by == "hand" and new.set_by == "group":
        return None
    if old is None or old.set_by == "hand" or new.set_by == "hand" or not new.sources:
        return new
    sources = {**old.sources, **new.sources}  # OIDC's and SCIM's each kept
    group = new.group if rank(new.role) >= rank(_strongest(sources)) else old.group
    return msgspec.structs.replace(new, role=_strongest(sources), sources=sources, group=group)


def without(old: Membership, source: GroupSource) -> Membership | None:
    """What is left of a group's membership once source's groups no longer give it: the other
    source's, or None (nothing: remove it)."""
    rest = {s: r for s, r in old.sources.items() if s != source}
    if not rest:
        return None
    return msgspec.structs.replace(old, role=_strongest(rest), sources=rest)


def _strongest(sources: dict[GroupSource, MemberRole]) -> MemberRole:
    return max(sources.values(), key=rank) if sources else "member"


def check_not_own_admin(actor: str, old: Membership | None, role: MemberRole | None) -> None:
    """Refuse an organization admin taking their own admin role away (role None: removal)."""
    if old is None or not actor or old.user != actor:
        return
    if old.scope.kind == "org" and old.role == "admin" and role != "admin":
        raise PeopleError(
            "forbidden",
            "an organization's admin cannot take their own admin "
            "role away: another admin of it may",
            "role",
        )
